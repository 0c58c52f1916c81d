"""HEAD for every GET route of the services, in one place.

FastAPI routes a method only to the routes that declare it, so a HEAD to a GET route would
answer 405. HTTP asks a server that answers GET to answer HEAD too, with the status and headers
of that GET and no body. :class:`HeadAsGetMiddleware` hands a HEAD request to the app as a GET
and sends the answer's start (status and headers, ``Content-Length`` included) without its body;
a 405 whose ``Allow`` names GET names HEAD as well. The routes (and the OpenAPI document, which
lists each operation once) are unchanged.

Installed innermost (:func:`services.web_assets.service_app` adds it first), so the middleware
around it (the Host check, the device token, the body bound, the timing) sees the request as the
client sent it, a HEAD; a route's own checks (a bearer token) run as they do for its GET.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def _allow_head(message: Message) -> Message:
    """A 405's start with HEAD added to an ``Allow`` that names GET without it."""
    headers = list(message.get("headers", ()))
    for i, (name, value) in enumerate(headers):
        if name.lower() == b"allow":
            methods = {m.strip().upper() for m in value.split(b",")}
            if b"GET" in methods and b"HEAD" not in methods:
                headers[i] = (name, value + b", HEAD")
                return {**message, "headers": headers}
    return message


class HeadAsGetMiddleware:
    """Pure ASGI middleware: a HEAD is served as the GET of the same URL, without the body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = scope["method"] == "HEAD"

        async def answer(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                await send(_allow_head(message) if message["status"] == 405 else message)
            elif head and kind in ("http.response.body", "http.response.pathsend"):
                # its headers went out with the start; its bytes (or its file) do not
                more = bool(message.get("more_body", False))
                await send({"type": "http.response.body", "body": b"", "more_body": more})
            else:
                await send(message)

        await self.app({**scope, "method": "GET"} if head else scope, receive, answer)
