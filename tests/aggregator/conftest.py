"""Fixtures of the aggregator tests: an in-process aggregator on a SQLite file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.aggregator.app import create_app
from tests.support.aggregator import make_settings, sqlite_url

#: starts an aggregator with some settings overridden; stopped at the end of the test
AggregatorFactory = Callable[..., TestClient]


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[AggregatorFactory]:
    """``aggregator(**settings)``: a started in-process aggregator on a fresh SQLite file."""
    clients: list[TestClient] = []

    def start(**overrides: Any) -> TestClient:
        url = overrides.pop("database_url", None) or sqlite_url(tmp_path, f"a{len(clients)}.db")
        client = TestClient(create_app(make_settings(url, **overrides)))
        client.__enter__()
        clients.append(client)
        return client

    yield start
    for client in reversed(clients):
        client.__exit__(None, None, None)
