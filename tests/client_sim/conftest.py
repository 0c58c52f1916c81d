"""The real aggregator app served by uvicorn on a free loopback port, in this process."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from services.aggregator.app import create_app
from tests.support.aggregator import make_settings, sqlite_url
from tests.support.loopback import free_port

LiveAggregator = Callable[..., contextlib.AbstractContextManager[str]]


@contextlib.contextmanager
def serve_aggregator(directory: Path, **overrides: Any) -> Iterator[str]:
    """Serve the aggregator (test settings over a SQLite file in ``directory``, with
    ``overrides``) until the block ends; yields its base URL."""
    settings = make_settings(sqlite_url(directory), **overrides)
    port = free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("aggregator did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture()
def live_aggregator(tmp_path: Path) -> LiveAggregator:
    """``with live_aggregator(population=60) as url:`` serves a real aggregator."""

    def start(**overrides: Any) -> contextlib.AbstractContextManager[str]:
        return serve_aggregator(tmp_path, **overrides)

    return start
