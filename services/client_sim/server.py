"""The worker's inbound side: its device API, served next to the worker loop.

The routes (:mod:`services.client_sim.routes`) answer for the users of the worker's shard as
their devices would. They listen on 127.0.0.1 unless ``http_host`` says otherwise; with a
``device_token`` (required off loopback) every request but ``/healthz`` must carry
``Authorization: Bearer <token>`` (401 otherwise). Request bodies are bounded (413). The app is built by :func:`create_app`
(nothing connects until its lifespan starts) and served by :class:`DeviceApiServer`, uvicorn in
a background thread.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
import httpx
import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from fedrecgel.data import Split, load_split
from services.client_sim.routes import AppState, FittedVector, router, shard_user_ids
from services.client_sim.settings import WorkerError, WorkerSettings
from services.client_sim.store import WorkerStore
from services.error_handlers import error_response, install_error_handlers, limit_request_bodies
from services.host_check import HostCheckMiddleware
from services.http_server import server_config
from services.web_assets import service_app

log = logging.getLogger(__name__)


def item_labels(settings: WorkerSettings, split: Split | None = None) -> list[str] | None:
    """Item ids as recommend_api names them: the dataset's own ids (loaded from ``split`` or
    the worker's dataset), or None for catalogue indices as strings."""
    if settings.recommend_item_ids == "index":
        return None
    if split is None:
        split = load_split(settings.dataset, settings.data_dir, validation=settings.validation)
    return [str(x) for x in split.item_labels.tolist()]


def user_labels(settings: WorkerSettings, split: Split | None = None) -> list[str] | None:
    """Users' ids in the data, by number (``GET /v1/users?id=`` looks them up), as
    :func:`item_labels` names items: the dataset's own ids, or None (``recommend_item_ids`` is
    ``index``) for the numbers in decimal."""
    if settings.recommend_item_ids == "index":
        return None
    if split is None:
        split = load_split(settings.dataset, settings.data_dir, validation=settings.validation)
    return [str(x) for x in split.user_labels.tolist()]


def create_app(
    settings: WorkerSettings,
    store: WorkerStore,
    labels: Sequence[str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    fitted: FittedVector | None = None,
    users: Sequence[str] | None = None,
) -> FastAPI:
    """Build the worker's device API over ``store``; ``labels`` and ``users`` are the items'
    and the users' ids in the data, by number (:func:`item_labels`, :func:`user_labels`; None:
    the numbers in decimal); ``transport`` reaches recommend_api (tests pass an
    ``httpx.ASGITransport`` of the real app); ``fitted`` gives a user's embeddings as
    fitted to the newest evaluated version (the worker's evaluation, when the run fits them).
    Nothing connects until the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ids = await anyio.to_thread.run_sync(store.user_ids)
        shard = frozenset(int(u) for u in ids.tolist())
        async with httpx.AsyncClient(
            base_url=settings.recommend_url, transport=transport, timeout=settings.timeout_s
        ) as client:
            app.state.worker_http = AppState(
                settings=settings,
                store=store,
                labels=labels,
                users=shard,
                user_ids=shard_user_ids(shard, users),
                client=client,
                fitted=fitted,
            )
            yield

    app = service_app("FedRecGEL worker (demo)", "0.1.0", lifespan)  # /docs without a CDN
    install_error_handlers(app)
    app.include_router(router)
    limit_request_bodies(app, settings.http_max_body_bytes)
    if settings.device_token is not None:
        app.add_middleware(DeviceTokenMiddleware, token=settings.device_token.get_secret_value())
    else:  # open on loopback: only to requests addressed to this machine (DNS rebinding)
        hint = "set FEDREC_WORKER_DEVICE_TOKEN to serve other names"
        app.add_middleware(HostCheckMiddleware, open_paths=OPEN_PATHS, hint=hint)
    return app


#: paths answered without the device token (the orchestrator's probes)
OPEN_PATHS = frozenset({"/healthz"})


class DeviceTokenMiddleware:
    """Pure ASGI middleware: every request but :data:`OPEN_PATHS` needs ``Authorization:
    Bearer <token>`` (compared in constant time); 401 ``unauthorized`` otherwise."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(
            401,
            "unauthorized",
            "send the device token as 'Authorization: Bearer <token>'",
            {"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        given = [v for k, v in scope.get("headers", ()) if k == b"authorization"]
        return len(given) == 1 and hmac.compare_digest(given[0], self._expected)


class DeviceApiServer:
    """Serves an app with uvicorn in a daemon thread, next to the worker loop."""

    def __init__(self, app: FastAPI, host: str, port: int, log_level: str = "info") -> None:
        config = server_config(app, host=host, port=port, log_level=log_level.lower())
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="worker-http", daemon=True)
        self.host = host

    def start(self, timeout_s: float = 15.0) -> None:
        """Start serving; return once the socket listens (WorkerError if it cannot)."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise WorkerError(f"HTTP API did not start on {self.host}:{self._requested}")
            time.sleep(0.01)
        log.info("HTTP API on %s:%d", self.host, self.port)

    @property
    def _requested(self) -> int:
        return int(self._server.config.port)

    @property
    def port(self) -> int:
        """The port it listens on (the real one when 0 was asked for)."""
        for server in self._server.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return self._requested

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to finish and wait for the thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)


def serve_in_thread(
    settings: WorkerSettings,
    store: WorkerStore,
    split: Split | None = None,
    fitted: FittedVector | None = None,
) -> DeviceApiServer:
    """Start the device API of a worker on ``settings.http_host:http_port``."""
    if settings.http_port is None:
        raise WorkerError("no http_port configured")
    if split is None and settings.recommend_item_ids != "index":
        split = load_split(settings.dataset, settings.data_dir, validation=settings.validation)
    items, users = item_labels(settings, split), user_labels(settings, split)
    app = create_app(settings, store, items, fitted=fitted, users=users)
    server = DeviceApiServer(app, settings.http_host, settings.http_port, settings.log_level)
    server.start()
    return server
