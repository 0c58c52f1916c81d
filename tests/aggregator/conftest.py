"""Fixtures of the aggregator tests: in-process aggregators on SQLite files (or a database the
test names), started with some settings overridden and stopped at the end of the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from harness.aggregator import AggregatorFactory, sqlite_url
from tests.aggregator.started_run import MAX_BODY_BYTES, Ctx, start_run


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
