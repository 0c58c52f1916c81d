"""Checks of the connection URLs in the services' settings, so that a mistyped one is refused
as an invalid setting, with its name, before a service starts (rather than as a traceback from
the client library when the service first connects), the other setting types the services
share (log level, thread counts)."""

from __future__ import annotations

from typing import Annotated

import httpx
from pydantic import AfterValidator, Field
from redis.connection import parse_url
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

#: the schemes the redis client accepts
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _redis_url(url: str | None) -> str | None:
    if url is not None and not url.startswith(REDIS_SCHEMES):
        raise ValueError(f"a Redis URL starts with {', '.join(REDIS_SCHEMES)}")
    if url is not None:
        try:
            # as the client will (a port that is not a number, say); redis-py: unannotated
            parse_url(url)  # type: ignore[no-untyped-call]
        except ValueError as err:
            raise ValueError(f"not a Redis URL: {err}") from None
    return url


_DATABASE_URL_FORMS = (
    "sqlite:///path/to/file.db or postgresql+psycopg://user:password@host/database"
)


def check_database_url(url: str) -> str:
    """``url`` when SQLAlchemy can parse it and has its driver here, else ValueError saying why."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError(f"not a database URL ({_DATABASE_URL_FORMS})") from None
    try:  # as the engine will at the first connection: an unknown or absent driver
        parsed.get_dialect().import_dbapi()
    except (ArgumentError, ImportError):
        raise ValueError(
            f"no database driver for {parsed.drivername!r} here ({_DATABASE_URL_FORMS})"
        ) from None
    return url


def check_http_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host, else ValueError saying why."""
    if not url.startswith(("http://", "https://")):
        raise ValueError("an HTTP URL starts with http:// or https://")
    try:
        host = httpx.URL(url).host
    except httpx.InvalidURL as err:
        raise ValueError(f"not an HTTP URL: {err}") from None
    if not host:
        raise ValueError("an HTTP URL names a host (http://host:port)")
    return url


#: the levels both logging and uvicorn know
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def check_log_level(level: str) -> str:
    """``level`` when logging and uvicorn both know it (any case), else ValueError."""
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"a log level is one of {', '.join(LOG_LEVELS)}, got {level!r}")
    return level


#: the most threads a thread-count setting may ask for: 100000 made torch fail to map its
#: libraries (the worker's store then could not even open) instead of being refused
MAX_THREADS = 1024
#: a thread-count setting (torch's intra-op threads, a scoring pool)
Threads = Annotated[int, Field(ge=1, le=MAX_THREADS)]
#: a log level setting
LogLevel = Annotated[str, AfterValidator(check_log_level)]
#: the base URL of another service (http:// or https://, with a host)
HttpUrl = Annotated[str, AfterValidator(check_http_url)]
#: an optional Redis URL setting
RedisUrl = Annotated[str | None, AfterValidator(_redis_url)]
#: an SQLAlchemy database URL setting
DatabaseUrl = Annotated[str, AfterValidator(check_database_url)]
