"""The JSON error answers of the services: every refusal is a :class:`~services.contract.ErrorBody`.

A :class:`~services.contract.ServiceError` is answered with its own status and code; a request
that fails validation with 422 and the locations and messages of its errors (never the input
itself, which may be a user's private vector), as is a body that is not JSON at all; an
unknown path or method with ``not_found`` / ``method_not_allowed`` (a 405 keeps its ``Allow``
header). :class:`BodyLimitMiddleware` bounds the size of request bodies (413
``body_too_large``) before any of it is parsed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.contract import ErrorBody, ServiceError

HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}

#: the default bound of a JSON request body (1 MiB)
DEFAULT_MAX_JSON_BYTES = 1024 * 1024


def error_response(
    status_code: int, code: str, detail: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """An :class:`ErrorBody` answer."""
    return JSONResponse(ErrorBody(error=code, detail=detail).model_dump(), status_code, headers)


def validation_detail(exc: RequestValidationError, *, skip_body: bool = False) -> str:
    """``loc: message`` of every error, joined, each once (a parameter that the endpoint and a
    dependency both declare is reported by each); ``skip_body`` leaves ``body`` out of
    locations."""
    parts: list[str] = []
    for e in exc.errors():
        if e.get("type") == "json_invalid":  # its location is a character offset, not a field
            where = e.get("loc", ())[-1:] or ("?",)
            reason = (e.get("ctx") or {}).get("error", "cannot be parsed")
            parts.append(f"the body is not valid JSON ({reason} at character {where[0]})")
            continue
        loc = ".".join(str(p) for p in e.get("loc", ()) if not (skip_body and p == "body"))
        # a validator's own words, without pydantic's "Value error, " before them
        why = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc or 'body'}: {why}")
    return "; ".join(dict.fromkeys(parts))


def not_json_media(request: Request) -> str | None:
    """Why a JSON body is refused under the request's Content-Type (None: application/json or
    a +json type)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    got = media or "no Content-Type"
    return f"the body is JSON: send it with Content-Type: application/json (got {got})"


def not_sent_as_json(request: Request, exc: RequestValidationError) -> str | None:
    """Why a JSON body was refused when it came under another media type (FastAPI reads a body
    as JSON only under application/json or +json, and reports any other, or none, as a body
    of the wrong type, which does not say what to change), else None."""
    if not any(
        tuple(e.get("loc", ())) == ("body",) and e.get("type") != "missing" for e in exc.errors()
    ):
        return None
    return not_json_media(request)


#: told of each refusal the handlers answer that is about the request itself (a
#: :class:`ServiceError` raised by the app, with that error; a body that fails validation or
#: cannot be read, with None), with its error code: a service counts them (the aggregator, the
#: refused uploads)
OnRefusal = Callable[[Request, str, ServiceError | None], None]


def install_error_handlers(
    app: FastAPI,
    *,
    validation_code: str = "validation_error",
    skip_body: bool = False,
    http_errors: bool = True,
    on_refusal: OnRefusal | None = None,
    internal_detail: str | None = None,
) -> None:
    """Answer ServiceError and validation errors (and, with ``http_errors``, unknown paths and
    methods, keeping headers such as a 405's ``Allow``) as :class:`ErrorBody`; with
    ``internal_detail``, any other exception as a 500 ``internal_error`` saying that."""

    def refused(request: Request, code: str, exc: ServiceError | None = None) -> None:
        if on_refusal is not None:
            on_refusal(request, code, exc)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        refused(request, exc.code, exc)
        return error_response(exc.status_code, exc.code, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        if (why := not_sent_as_json(request, exc)) is not None:
            refused(request, "unsupported_media_type")
            return error_response(415, "unsupported_media_type", why)
        refused(request, validation_code)
        detail = validation_detail(exc, skip_body=skip_body) or "invalid request"
        return error_response(422, validation_code, detail)

    if http_errors:

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
            if exc.status_code == 400 and isinstance(exc.__cause__, ServiceError):
                # raised while FastAPI read the body (a body over its bound, cut off by a
                # middleware): FastAPI reports any failure there as "error parsing the body"
                return await service_error(request, exc.__cause__)
            if exc.status_code == 400:  # a body that cannot be decoded at all (not UTF-8 JSON)
                refused(request, validation_code)
                return error_response(422, validation_code, f"body: {exc.detail}")
            code = HTTP_CODES.get(exc.status_code, "http_error")
            return error_response(exc.status_code, code, str(exc.detail), exc.headers)

    if internal_detail is not None:

        @app.exception_handler(Exception)
        async def internal_error(request: Request, exc: Exception) -> JSONResponse:
            # logged by the server error middleware, which calls this for the answer
            return error_response(500, "internal_error", internal_detail)


class BodyTooLarge(ServiceError):
    """A request body over the bound of its endpoint."""

    status_code = 413
    code = "body_too_large"


#: the bound of one request (bytes; None: unbounded, the body is not touched)
BodyBound = int | Callable[[Scope], int | None]


class BodyLimitMiddleware:
    """Pure ASGI middleware: refuse a request body larger than its bound with 413 JSON.

    A declared ``Content-Length`` over the bound is refused before anything is read; any other
    body is read (at most bound + one chunk) before the app sees it, so a chunked body cannot
    get past the bound either, and the app then reads the buffered bytes. ``max_bytes`` is a
    number, or a function of the request scope (e.g. by path) giving the bound or None for
    "no bound here" (such a body streams to the app untouched).
    """

    def __init__(self, app: ASGIApp, max_bytes: BodyBound = DEFAULT_MAX_JSON_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def bound(self, scope: Scope) -> int | None:
        """The bound of this request."""
        return self.max_bytes(scope) if callable(self.max_bytes) else self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.bound(scope)
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(scope, receive, send, limit)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body = message.get("body", b"")
            total += len(body)
            if total > limit:
                await self._refuse(scope, receive, send, limit)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        buffered: list[Message] = [{"type": "http.request", "body": b"".join(chunks)}]

        async def replay() -> Message:
            return buffered.pop() if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        detail = f"the request body is larger than {limit} bytes"
        response = error_response(413, BodyTooLarge.code, detail, {"Connection": "close"})
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    """The declared ``Content-Length`` (None when absent or not a number)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None


def limit_request_bodies(app: FastAPI, max_bytes: BodyBound = DEFAULT_MAX_JSON_BYTES) -> None:
    """Bound every request body of ``app`` (413 :class:`ErrorBody` above ``max_bytes``)."""
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_bytes)
