"""The real aggregator app served by uvicorn on a free loopback port, in this process."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.aggregator.app import create_app
from tests.support.aggregator import make_settings, sqlite_url
from tests.support.loopback import serve_app

LiveAggregator = Callable[..., contextlib.AbstractContextManager[str]]


@contextlib.contextmanager
def serve_aggregator(directory: Path, **overrides: Any) -> Iterator[str]:
    """Serve the aggregator (test settings over a SQLite file in ``directory``, with
    ``overrides``) until the block ends; yields its base URL."""
    settings = make_settings(sqlite_url(directory), **overrides)
    with serve_app(create_app(settings), timeout_s=30, log_level="warning") as url:
        yield url


@pytest.fixture()
def live_aggregator(tmp_path: Path) -> LiveAggregator:
    """``with live_aggregator(population=60) as url:`` serves a real aggregator."""

    def start(**overrides: Any) -> contextlib.AbstractContextManager[str]:
        return serve_aggregator(tmp_path, **overrides)

    return start
