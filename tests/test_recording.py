"""The recording transport of the wire tests and the secure-aggregation benchmark keeps every
body it carries, or with ``keep_bodies=False`` only their sizes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from harness.recording import RecordingTransport


class Echo(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(2 * len(body)))
        self.end_headers()
        self.wfile.write(body * 2)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("keep", [True, False])
def test_the_bodies_or_only_their_sizes_are_recorded(echo_url: str, keep: bool) -> None:
    recorder = RecordingTransport(keep_bodies=keep)
    with httpx.Client(base_url=echo_url, transport=recorder) as client:
        assert client.post("/x", content=b"abc").content == b"abcabc"  # the answer is whole
    (ex,) = recorder.exchanges
    assert (ex.method, ex.path, ex.status) == ("POST", "/x", 200)
    assert (ex.request_bytes, ex.response_bytes) == (3, 6)
    assert (ex.request_body, ex.response_body) == ((b"abc", b"abcabc") if keep else (b"", b""))
