"""The loopback helpers under the names the tests import them by; they live in
:mod:`harness.loopback`, which the benchmarks import too."""

from __future__ import annotations

from harness.loopback import (
    REDIS_MISSING,
    RedisServer,
    RedisUnavailable,
    bindable,
    free_port,
    redis_server,
    serve_app,
    stop_process,
    wait_for_port,
)

__all__ = [
    "REDIS_MISSING",
    "RedisServer",
    "RedisUnavailable",
    "bindable",
    "free_port",
    "redis_server",
    "serve_app",
    "stop_process",
    "wait_for_port",
]
