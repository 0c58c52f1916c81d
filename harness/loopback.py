"""Loopback helpers of the tests and the benchmarks: a free port, waiting for a port to accept
connections, an ASGI app served in a thread, and a throw-away redis-server."""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections (32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:``port`` now (TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(consecutive: int = 1) -> int:
    """The first of ``consecutive`` TCP ports on 127.0.0.1 that were free a moment ago.

    Drawn below the kernel's range for outgoing connections, so that no client socket of the
    test (or of the services it starts) can take the port before the server listens on it, and
    never twice in one process (``fedrec up`` gives its second worker the first worker's port
    plus one: ``free_port(2)``)."""
    low, high = 10_000, _ephemeral_low() - consecutive
    draw = random.SystemRandom()
    for _ in range(1000):
        first = draw.randrange(low, high)
        span = range(first, first + consecutive)
        if _HANDED_OUT.isdisjoint(span) and all(bindable(p) for p in span):
            _HANDED_OUT.update(span)
            return first
    raise RuntimeError(f"no {consecutive} consecutive free ports below {high}")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a server started by a fixture, SIGKILL it when it has not ended in 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_port(port: int, timeout: float = 15.0) -> bool:
    """Whether 127.0.0.1:``port`` accepts connections within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def serve_app(
    app: object, timeout_s: float = 60.0, log_level: str = "critical", lifespan: str = "on"
) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn in a thread on a free 127.0.0.1 port until the
    block ends; yields its base URL."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host="127.0.0.1",
        port=port,
        log_level=log_level,
        lifespan=lifespan,  # type: ignore[arg-type]
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"served-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the served app did not start (see its log)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the served app did not start in {timeout_s:.0f}s")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


#: why a test that needs Redis is skipped on a machine without it
REDIS_MISSING = "redis-server is not installed (apt-get install -y redis-server)"


class RedisUnavailable(RuntimeError):
    """redis-server is not installed, or did not start."""


@dataclass(frozen=True)
class RedisServer:
    """A running redis-server: its port and URL."""

    port: int
    url: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[RedisServer]:
    """A fresh redis-server (no persistence) on a free loopback port, stopped at the end."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailable(REDIS_MISSING)
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not wait_for_port(port):
            raise RedisUnavailable(f"redis-server did not start on port {port}")
        yield RedisServer(port=port, url=f"redis://127.0.0.1:{port}/0", process=proc)
    finally:
        stop_process(proc)
