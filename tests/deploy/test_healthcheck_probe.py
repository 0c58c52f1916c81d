"""deploy/healthcheck.sh, the containers' health probe, against a real HTTP server."""

from __future__ import annotations

import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[2] / "deploy" / "healthcheck.sh"
STATUS = {"/healthz": 200, "/livez": 204, "/down": 503}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        code = STATUS.get(self.path, 404)
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(PROBE), *args], capture_output=True, text=True, timeout=30, env=env
    )


@pytest.mark.parametrize(("path", "healthy"), [("/healthz", True), ("/livez", True)])
def test_2xx_is_healthy(server: str, path: str, healthy: bool) -> None:
    assert (_probe(f"{server}{path}").returncode == 0) is healthy


@pytest.mark.parametrize(("path", "code"), [("/down", "503"), ("/missing", "404"), ("", "404")])
def test_other_answers_are_unhealthy_and_say_why(server: str, path: str, code: str) -> None:
    out = _probe(f"{server}{path}")
    assert out.returncode == 1 and f"answered {code}" in out.stderr


def test_no_server_and_bad_urls_are_unhealthy(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    with _closed_port() as closed:
        assert closed != port
        out = _probe(f"http://127.0.0.1:{closed}/healthz")
    assert out.returncode == 1 and "no connection" in out.stderr
    out = _probe("https://127.0.0.1/healthz")
    assert out.returncode == 1 and "not an http:// URL" in out.stderr


def test_the_url_defaults_to_the_environment(server: str) -> None:
    out = _probe(env={"HEALTHCHECK_URL": f"{server}/healthz", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    out = _probe(env={"HEALTHCHECK_URL": f"{server}/down", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 1


class _closed_port:
    """A port that nothing listens on (bound, never listened to, for the block)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
