"""The app factory: ``create_app(settings)`` with a lifespan that owns the DB, Redis and the
deadline task (nothing connects at import)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.aggregator.db import Database
from services.aggregator.errors import BodyTooLarge, Unavailable
from services.aggregator.events import RedisBus
from services.aggregator.metrics import AggregatorMetrics
from services.aggregator.models import utcnow
from services.aggregator.routes import router
from services.aggregator.service import AggregatorService
from services.aggregator.settings import Population, Settings, resolve_population
from services.contract import ServiceError
from services.error_handlers import error_response, install_error_handlers
from services.web_assets import service_app

log = logging.getLogger(__name__)

_UPLOAD_RE = re.compile(r"^/v1/rounds/[^/]+/(updates|secagg/masked(_b)?)$")
#: seconds a client is told to wait (Retry-After) when the database does not answer
DATABASE_RETRY_AFTER_S = 5


def _is_upload(scope: Scope) -> bool:
    return scope.get("method") == "POST" and bool(_UPLOAD_RE.match(scope.get("path", "")))


class BodyLimitMiddleware:
    """Refuses bodies over the limit: by Content-Length up front (413), else while read.
    Uploads may carry ``max_bytes``, every other request (JSON) ``max_json_bytes``."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, metrics: AggregatorMetrics, max_json_bytes: int
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_json_bytes = max_json_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = _is_upload(scope)
        limit = self.max_bytes if upload else min(self.max_bytes, self.max_json_bytes)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            if upload:
                self.metrics.updates_refused.labels(reason=BodyTooLarge.code).inc()
            body = {
                "error": BodyTooLarge.code,
                "detail": f"body of {int(declared)} bytes exceeds the limit of {limit}",
            }
            await JSONResponse(body, status_code=413)(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(f"body exceeds the limit of {limit} bytes")
            return message

        await self.app(scope, limited_receive, send)


async def _deadline_loop(service: AggregatorService, interval: float) -> None:
    """Close rounds at their deadline / on quorum, retry below quorum, forever."""
    while True:
        try:
            await anyio.to_thread.run_sync(service.tick)
        except Exception:
            log.exception("deadline check failed")
        await asyncio.sleep(interval)


def _install_error_handlers(app: FastAPI, metrics: AggregatorMetrics) -> None:
    """The services' error answers (:mod:`services.error_handlers`), counting refused uploads,
    and 503 with Retry-After while the database does not answer."""

    def count_refusal(request: Request, code: str, exc: ServiceError | None) -> None:
        # the service counts what it refuses itself; count the rest (auth, body size) here
        if exc is not None and exc.status_code not in (401, 413):
            return
        if _is_upload(request.scope):
            metrics.updates_refused.labels(reason=code).inc()

    install_error_handlers(
        app, on_refusal=count_refusal, internal_detail="the aggregator failed; see its log"
    )

    async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable: %s", type(exc).__name__)
        return error_response(
            Unavailable.status_code,
            "database_unavailable",
            "the database does not answer",
            {"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )

    for exc_type in (OperationalError, InterfaceError, PoolTimeoutError):
        app.add_exception_handler(exc_type, database_unavailable)


def create_app(
    settings: Settings | None = None,
    *,
    clock: Callable[[], datetime] | None = None,
    population: int | Population | None = None,
    migrated: bool = False,
) -> FastAPI:
    """Build the aggregator app; connections open in its lifespan, not here. ``population``
    (a number of clients, or a :class:`Population`) overrides the settings' (else resolved at
    start, see :func:`resolve_population`). ``migrated``: the caller brought the schema to the
    latest revision just before (``python -m services.aggregator`` does, to stop on a database
    it cannot use with one line), so the lifespan does not migrate again."""
    settings = settings or Settings()
    metrics = AggregatorMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = Database(settings.database_url)
        bus: RedisBus | None = None
        task: asyncio.Task[None] | None = None
        try:
            if not migrated:
                await anyio.to_thread.run_sync(db.migrate)
            resolved = Population(population) if isinstance(population, int) else population
            if resolved is None:
                resolved = await anyio.to_thread.run_sync(resolve_population, settings)
            if settings.redis_url:
                bus = RedisBus(
                    settings.redis_url, settings.redis_lock_timeout_s, settings.redis_lock_wait_s
                )
                try:
                    await anyio.to_thread.run_sync(bus.ping)
                except RedisError as err:  # optional: rounds close without it
                    log.warning("redis does not answer (%s); starting without it for now", err)
            service = AggregatorService(
                db, settings, metrics, bus, clock or utcnow, population=resolved
            )
            await anyio.to_thread.run_sync(service.warm)
            if bus is not None:  # a release on another replica empties this one's cache
                bus.follow_credentials(service.credentials.forget_all)
            app.state.service = service
            task = asyncio.create_task(_deadline_loop(service, settings.deadline_poll_s))
            # woken by every close; the period only catches rounds closed by a replica
            service.storage.start(max(1.0, settings.compact_interval_s))
            log.info(
                "aggregator ready (database %s, redis %s, population %s)",
                db.engine.dialect.name,
                "on" if bus else "off",
                resolved.n_users if resolved else None,
            )
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await anyio.to_thread.run_sync(service.storage.stop)
            if bus is not None:
                bus.close()
            db.dispose()

    app = service_app("FedRecGEL aggregator", "1.0", lifespan)  # /docs without a CDN
    app.state.settings = settings
    app.state.metrics = metrics
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        metrics=metrics,
        max_json_bytes=settings.max_json_bytes,
    )
    _install_error_handlers(app, metrics)
    app.include_router(router)
    return app
