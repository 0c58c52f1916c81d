"""The ``Host`` check of the services a browser on this machine can reach without a credential.

Such a service (the worker's device API without a device token, the dashboard) answers any
caller that reaches its port. A web page opened on the same machine reaches 127.0.0.1 too, by
pointing a DNS name of its own at 127.0.0.1 (DNS rebinding); the browser's same-origin rule
then lets that page read the answers (users' training items, the run's state). Its requests
carry its own name in ``Host``, which is what :class:`HostCheckMiddleware` refuses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from services.error_handlers import error_response


def host_name(host_header: str) -> str:
    """The name of a ``Host`` header (``name[:port]``, ``[v6]:port``), lower case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address: a bind address, a ``Host`` header's name) is this
    machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, not known to be private


class HostCheckMiddleware:
    """Pure ASGI middleware: a request whose ``Host`` is neither a loopback name or address
    nor one of ``allowed`` (``*``: any) is refused with 403 ``host_not_allowed``, except on
    ``open_paths`` (health probes)."""

    def __init__(
        self,
        app: ASGIApp,
        allowed: Collection[str] = (),
        open_paths: Collection[str] = ("/healthz",),
        hint: str = "",
    ) -> None:
        self.app = app
        self.allowed = frozenset(a.strip().lower() for a in allowed if a.strip())
        self.open_paths = frozenset(open_paths)
        self.hint = hint

    def _allowed(self, scope: Scope) -> bool:
        hosts = [v for k, v in scope.get("headers", ()) if k == b"host"]
        if len(hosts) != 1:
            return False
        name = host_name(hosts[0].decode("latin-1"))
        return "*" in self.allowed or name in self.allowed or is_loopback(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        detail = (
            "this service answers requests addressed to this machine only (Host: 127.0.0.1, "
            "localhost or [::1])" + (f"; {self.hint}" if self.hint else "")
        )
        await error_response(403, "host_not_allowed", detail)(scope, receive, send)
