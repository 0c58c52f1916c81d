"""The JSON error answers of the services: every refusal is a :class:`~services.contract.ErrorBody`.

A :class:`~services.contract.ServiceError` is answered with its own status and code; a request
that fails validation with 422 and the locations and messages of its errors (never the input
itself, which may be a user's private vector); an unknown path or method with ``not_found`` /
``method_not_allowed``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.contract import ErrorBody, ServiceError

HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def error_response(status_code: int, code: str, detail: str) -> JSONResponse:
    """An :class:`ErrorBody` answer."""
    return JSONResponse(ErrorBody(error=code, detail=detail).model_dump(), status_code)


def validation_detail(exc: RequestValidationError, *, skip_body: bool = False) -> str:
    """``loc: message`` of every error, joined; ``skip_body`` leaves ``body`` out of locations."""
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e.get("loc", ()) if not (skip_body and p == "body"))
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def install_error_handlers(
    app: FastAPI,
    *,
    validation_code: str = "validation_error",
    skip_body: bool = False,
    http_errors: bool = True,
) -> None:
    """Answer ServiceError and validation errors (and, with ``http_errors``, unknown paths and
    methods) as :class:`ErrorBody`."""

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc.status_code, exc.code, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, validation_code, validation_detail(exc, skip_body=skip_body))

    if http_errors:

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
            code = HTTP_CODES.get(exc.status_code, "http_error")
            return error_response(exc.status_code, code, str(exc.detail))
