"""Fixtures of the aggregator tests: in-process aggregators on SQLite files (or a database the
test names), started with some settings overridden and stopped at the end of the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.aggregator.app import create_app
from tests.aggregator.started_run import MAX_BODY_BYTES, Ctx, start_run
from tests.support.aggregator import make_settings, sqlite_url


class AggregatorFactory:
    """``aggregator(**settings)``: a started in-process aggregator. Each call gets a fresh
    SQLite file unless it names ``database_url`` (two calls on one URL are two instances on
    one database); ``clock`` replaces the aggregator's UTC clock."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._clients: list[TestClient] = []
        self._started = 0

    def url(self, name: str = "aggregator.db") -> str:
        """The URL of a SQLite file of this test, for several calls on one database."""
        return sqlite_url(self.directory, name)

    def __call__(
        self,
        *,
        clock: Callable[[], datetime] | None = None,
        database_url: str | None = None,
        **overrides: Any,
    ) -> TestClient:
        url = database_url or self.url(f"a{self._started}.db")
        self._started += 1
        client = TestClient(create_app(make_settings(url, **overrides), clock=clock))
        client.__enter__()
        self._clients.append(client)
        return client

    def stop(self, client: TestClient) -> None:
        """Stop one aggregator now (its lifespan ends as at a process exit)."""
        self._clients.remove(client)
        client.__exit__(None, None, None)

    def stop_all(self) -> None:
        """Stop every aggregator still running, newest first."""
        while self._clients:
            self.stop(self._clients[-1])


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[AggregatorFactory]:
    """Starts in-process aggregators (see :class:`AggregatorFactory`); all stopped after."""
    factory = AggregatorFactory(tmp_path)
    yield factory
    factory.stop_all()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of each backend: a SQLite file, or a database of the test PostgreSQL
    server."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    url: str = request.getfixturevalue("postgres_url")
    assert url.startswith("postgresql+psycopg://")
    return url


@pytest.fixture
def app_client(aggregator: AggregatorFactory) -> TestClient:
    """An aggregator of the API tests (on ``aggregator.db``), nothing registered."""
    return aggregator(database_url=aggregator.url(), max_body_bytes=MAX_BODY_BYTES)


@pytest.fixture
def ctx(app_client: TestClient) -> Ctx:
    """:func:`~tests.aggregator.started_run.start_run` on :func:`app_client`."""
    return start_run(app_client)
