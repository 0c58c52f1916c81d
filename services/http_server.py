"""uvicorn as every service runs it: with a bound on the time a request's headers may take.

uvicorn has no header-read timeout of its own: its keep-alive timer runs only between two
requests, and is cancelled by the first byte of the next one, so a connection that sends
half a request line (or nothing at all) and then waits is held open for as long as the
client likes, and a few thousand such connections (slowloris) hold the server's sockets.

The protocols here arm a timer when a connection opens and again when the first byte of
each further request arrives, and cancel it when that request's headers are complete. When
it fires, the connection is closed: with a 408 :class:`~services.contract.ErrorBody` when
part of a request had arrived, silently when nothing had. The bound is one setting for all
services, ``FEDREC_HEADER_TIMEOUT_S`` (seconds, default :data:`DEFAULT_HEADER_TIMEOUT_S`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from services.contract import ErrorBody

#: the environment variable that sets the bound, for every service
HEADER_TIMEOUT_ENV = "FEDREC_HEADER_TIMEOUT_S"
#: seconds from a connection's opening (or a request's first byte) to its complete headers
DEFAULT_HEADER_TIMEOUT_S = 5.0
#: the largest bound accepted (an hour: beyond that it is no bound)
MAX_HEADER_TIMEOUT_S = 3600.0


def header_timeout_s(environ: dict[str, str] | None = None) -> float:
    """The bound from :data:`HEADER_TIMEOUT_ENV`, or the default; a value that is not a
    number of seconds in (0, 3600] stops the service with one line (``SystemExit``)."""
    raw = (os.environ if environ is None else environ).get(HEADER_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_HEADER_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_HEADER_TIMEOUT_S:  # also refuses nan
        raise SystemExit(
            f"{HEADER_TIMEOUT_ENV}={raw!r}: expected seconds, more than 0 and at most "
            f"{MAX_HEADER_TIMEOUT_S:g}"
        )
    return value


#: the exit status of a service that cannot listen (uvicorn's own when its bind fails)
CANNOT_LISTEN = 3


def cannot_listen(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` (a port in use, an address that is not
    this machine's, a privileged port), or None when it could. Bound as asyncio binds (reusing
    an address left in TIME_WAIT; an IPv6 socket for IPv6 only); port 0 (any free one) is
    not checked."""
    if port == 0:
        return None
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as err:  # socket.gaierror: a host name that does not resolve
        return f"cannot resolve {host!r}: {err.strerror or err}"
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(address)
            except OSError as err:
                return (err.strerror or str(err)).lower()
    return None


def check_listen(host: str, port: int, option: str, code: int = CANNOT_LISTEN) -> None:
    """Stop the service before anything starts, with one line naming ``option`` and the exit
    status ``code``, when it could not listen on ``host:port`` (:func:`cannot_listen`):
    uvicorn binds only after the app's startup, and said "Application startup complete"
    before it failed."""
    why = cannot_listen(host, port)
    if why is not None:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        hint = " (stop what uses it, or choose another port)" if "in use" in why else ""
        sys.stderr.write(f"error: {option}: cannot listen on {where}: {why}{hint}\n")
        raise SystemExit(code)


def _timeout_answer(timeout_s: float) -> bytes:
    """The raw 408 answer, with a close (the connection is closed right after it)."""
    body = (
        ErrorBody(
            error="request_timeout",
            detail=f"the request headers did not arrive within {timeout_s:g} s",
        )
        .model_dump_json()
        .encode()
    )
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _HeaderTimer(asyncio.Protocol):
    """The timer of one connection (a mixin of the protocols below), armed when it opens."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    _header_timer: asyncio.TimerHandle | None = None
    _request_begun = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._request_begun = False

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._request_begun:
            self.transport.write(_timeout_answer(self.header_timeout_s))
        self.transport.close()


def _httptools_protocol() -> type[asyncio.Protocol] | None:
    """The httptools protocol with the timer (None where httptools is not installed)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        return None

    class HeaderTimeoutHttpTools(_HeaderTimer, HttpToolsProtocol):
        """httptools' parser calls ``on_message_begin`` at a request's first byte and
        ``on_headers_complete`` at the end of its headers."""

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._request_begun = True
            self._arm_header_timer()

        def on_headers_complete(self) -> None:
            self._cancel_header_timer()
            super().on_headers_complete()

    return HeaderTimeoutHttpTools


class HeaderTimeoutH11(_HeaderTimer, H11Protocol):
    """h11 reads the headers while the peer's state is ``IDLE``; any later state (a body, or
    the request done) means they are complete."""

    def data_received(self, data: bytes) -> None:
        waiting = self.conn.their_state is h11.IDLE
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            if waiting and data:
                self._request_begun = True
                self._arm_header_timer()
        else:
            self._cancel_header_timer()


def protocol_class(timeout_s: float) -> type[asyncio.Protocol]:
    """The HTTP protocol uvicorn would pick (httptools where installed, else h11), with the
    header timer set to ``timeout_s``."""
    base = _httptools_protocol() or HeaderTimeoutH11
    return type(base.__name__, (base,), {"header_timeout_s": timeout_s})


def server_config(
    app: Any,
    *,
    host: str,
    port: int,
    log_level: str,
    timeout_s: float | None = None,
    **kwargs: Any,
) -> uvicorn.Config:
    """A ``uvicorn.Config`` for a service: the header bound is ``timeout_s`` when given, else
    :func:`header_timeout_s`; ``kwargs`` are further uvicorn settings."""
    bound = header_timeout_s() if timeout_s is None else timeout_s
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, http=protocol_class(bound), **kwargs
    )


def serve(app: Any, *, host: str, port: int, log_level: str, **kwargs: Any) -> None:
    """Run ``app`` with uvicorn until it is stopped (as ``uvicorn.run`` does), headers
    bounded as the module says."""
    uvicorn.Server(server_config(app, host=host, port=port, log_level=log_level, **kwargs)).run()
