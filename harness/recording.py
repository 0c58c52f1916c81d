"""Recording the bodies of a run on the wire: an HTTP transport that keeps every request and
response body it carries (the wire-privacy tests look for anything private in them,
``tests/e2e/wire_record.py``; the secure-aggregation benchmark counts their bytes)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Exchange:
    """One recorded HTTP exchange: the request and the response, bodies as sent (empty when
    the transport keeps sizes only)."""

    method: str
    path: str
    request_type: str
    request_body: bytes
    status: int
    response_type: str
    response_body: bytes
    #: wall seconds from sending the request to reading the whole response
    seconds: float = 0.0
    #: the bodies' sizes in bytes (kept whether or not the bodies are)
    request_bytes: int = 0
    response_bytes: int = 0

    def bodies(self) -> list[tuple[str, str, bytes]]:
        """(direction, content type, body) of the non-empty bodies."""
        out = []
        if self.request_body:
            out.append(("request", self.request_type, self.request_body))
        if self.response_body:
            out.append(("response", self.response_type, self.response_body))
        return out


class RecordingTransport(httpx.HTTPTransport):
    """A real HTTP transport that keeps every request and response body it carries, or with
    ``keep_bodies=False`` only their sizes (a benchmark that counts bytes should not hold a
    whole run's bodies in memory: fresh memory for every body is a cost of its own)."""

    def __init__(self, keep_bodies: bool = True) -> None:
        super().__init__()
        self.keep_bodies = keep_bodies
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and record both bodies."""
        request_body = request.read()
        start = time.perf_counter()
        response = super().handle_request(request)
        # the aggregator uses no content-encoding: these are the bytes of the wire
        response_body = response.read()
        response.close()
        seconds = time.perf_counter() - start
        keep = self.keep_bodies
        with self._lock:
            self.exchanges.append(
                Exchange(
                    request.method,
                    request.url.path,
                    request.headers.get("content-type", ""),
                    request_body if keep else b"",
                    response.status_code,
                    response.headers.get("content-type", ""),
                    response_body if keep else b"",
                    seconds,
                    len(request_body),
                    len(response_body),
                )
            )
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            content=response_body,
            extensions=response.extensions,
        )
