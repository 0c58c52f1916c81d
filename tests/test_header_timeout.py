"""Connections that do not finish their request headers in time are closed (services/http_server.py).

Real sockets against real uvicorn servers: a half-sent request line, a connection that
sends nothing, and the second request of a kept-alive connection are closed once the bound
has passed; a request whose headers are complete is not, however slowly its body comes. The
bounds on waiting are generous (the assertions are about closed against still open)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request

from harness.procs import spawned
from services.http_server import (
    HEADER_TIMEOUT_ENV,
    HeaderTimeoutH11,
    header_timeout_s,
    server_config,
)
from tests.support.loopback import free_port, wait_for_port

BOUND_S = 1.0
#: how long a test waits for the close before calling the connection held (bound + slack)
CLOSE_WITHIN_S = 15.0


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    return app


@contextlib.contextmanager
def _served(http: type | None) -> Iterator[int]:
    """The test app served in a thread with a header bound of BOUND_S; yields the port."""
    port = free_port()
    config = server_config(
        _app(), host="127.0.0.1", port=port, log_level="critical", timeout_s=BOUND_S
    )
    if http is not None:
        config.http = http
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_for_port(port), "the server did not start"
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


def _read_until_closed(sock: socket.socket, within_s: float) -> tuple[bool, bytes]:
    """(closed by the server within ``within_s``, everything it sent before)."""
    sock.settimeout(0.5)
    got = b""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, got
        if not chunk:
            return True, got
        got += chunk
    return False, got


def _still_open(sock: socket.socket, for_s: float) -> bool:
    """Whether the server neither closed nor answered ``sock`` for ``for_s`` seconds."""
    closed, got = _read_until_closed(sock, for_s)
    return not closed and not got


#: the protocol each server runs: what server_config picks (httptools where installed), and h11
PROTOCOLS: dict[str, type | None] = {
    "default": None,
    "h11": type("H11", (HeaderTimeoutH11,), {"header_timeout_s": BOUND_S}),
}


@pytest.fixture(params=sorted(PROTOCOLS))
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    with _served(PROTOCOLS[request.param]) as p:
        yield p


def test_half_sent_request_line_is_answered_408_and_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /pi")
        closed, got = _read_until_closed(sock, CLOSE_WITHIN_S)
    assert closed, "a half-sent request line kept its connection open"
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert b'"error":"request_timeout"' in got and b"connection: close" in got.lower()


def test_half_sent_headers_are_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n")
        for _ in range(3):  # trickling more header lines does not keep it open
            time.sleep(BOUND_S / 3)
            with contextlib.suppress(OSError):
                sock.sendall(b"X-More: 1\r\n")
        closed, got = _read_until_closed(sock, CLOSE_WITHIN_S)
    assert closed and got.startswith(b"HTTP/1.1 408 "), got


def test_connection_sending_nothing_is_closed_without_an_answer(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        closed, got = _read_until_closed(sock, CLOSE_WITHIN_S)
    assert closed, "a connection that sent nothing was kept open"
    assert got == b""


def test_complete_headers_with_a_slow_body_are_not_cut(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
        assert _still_open(sock, 3 * BOUND_S), "the header bound cut a request past its headers"
        sock.sendall(b"67890")
        sock.settimeout(CLOSE_WITHIN_S)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b'{"bytes":10}'), answer


def test_second_request_of_a_kept_alive_connection_is_bounded_too(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(CLOSE_WITHIN_S)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        time.sleep(2 * BOUND_S)  # idle past the bound, within keep-alive: still usable
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /pi")
        closed, got = _read_until_closed(sock, CLOSE_WITHIN_S)
    assert closed and got.startswith(b"HTTP/1.1 408 "), got


def test_the_setting() -> None:
    assert header_timeout_s({}) == 5.0
    assert header_timeout_s({HEADER_TIMEOUT_ENV: " 2.5 "}) == 2.5
    for bad in ("0", "-1", "nan", "inf", "soon", "7200"):
        with pytest.raises(SystemExit, match=HEADER_TIMEOUT_ENV):
            header_timeout_s({HEADER_TIMEOUT_ENV: bad})


def _dashboard(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "services.dashboard",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


def test_a_service_process_closes_half_sent_headers(tmp_path: Path) -> None:
    """The dashboard as its command starts it, the bound set by the environment."""
    port = free_port()
    env = {**os.environ, HEADER_TIMEOUT_ENV: "1"}
    with (tmp_path / "dash.log").open("w") as log, spawned(_dashboard(port), log, env=env):
        assert wait_for_port(port, 60), (tmp_path / "dash.log").read_text()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            closed, got = _read_until_closed(sock, CLOSE_WITHIN_S)
    assert closed and got.startswith(b"HTTP/1.1 408 "), got


def test_a_service_refuses_a_bound_that_is_not_seconds() -> None:
    env = {**os.environ, HEADER_TIMEOUT_ENV: "soon"}
    done = subprocess.run(
        _dashboard(free_port()), env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert f"{HEADER_TIMEOUT_ENV}='soon': expected seconds" in done.stderr
    assert "Traceback" not in done.stderr
