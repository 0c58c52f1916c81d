"""The worker's demo HTTP API: recommendations for the users of its shard, asked as a device would.

``GET /v1/users/{user_id}/recommendations?k=10`` reads the user's private vector from this
worker's own store, leaves out the user's training items and sends recommend_api exactly the
request a device sends (``POST /v1/recommendations``); the answer (model version, item ids,
scores) comes back unchanged. The vector goes to recommend_api only, never into an answer or a
log line here. ``GET /healthz`` is 200 while the store answers.

There is no authentication: the endpoint stands in for the users' own devices, so serve it only
inside the deployment (``http_host`` defaults to 127.0.0.1). The app is built by
:func:`create_app` (nothing connects until its lifespan starts) and served next to the worker
loop by :class:`HttpServer`, uvicorn in a background thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
import httpx
import uvicorn
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from fedrecgel.data import Split, load_split
from services.client_sim.store import StoreError, WorkerStore
from services.client_sim.worker import WorkerError, WorkerSettings

log = logging.getLogger(__name__)

MAX_K = 1000
RECOMMEND_PATH = "/v1/recommendations"


class ScoredItem(BaseModel):
    """One recommended item: its id as recommend_api names it, and its score."""

    item: str
    score: float


class Recommendations(BaseModel):
    """recommend_api's answer: the model version it used and the ranked items."""

    model_version: int
    items: list[ScoredItem]


class ErrorBody(BaseModel):
    """Every error answer."""

    error: str
    detail: str


class ApiError(Exception):
    """An error answered as ``{"error": code, "detail": detail}`` with ``status_code``."""

    def __init__(self, status_code: int, code: str, detail: str) -> None:
        super().__init__(f"{status_code} {code}: {detail}")
        self.status_code = status_code
        self.code = code
        self.detail = detail


ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody} for s in (404, 422, 502, 503)}


@dataclass
class AppState:
    """What the lifespan opens and the routes use."""

    settings: WorkerSettings
    store: WorkerStore
    labels: Sequence[str] | None
    users: frozenset[int]
    client: httpx.AsyncClient


def get_state(request: Request) -> AppState:
    """The state opened by the lifespan."""
    state: AppState = request.app.state.worker_http
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def item_labels(settings: WorkerSettings, split: Split | None = None) -> list[str] | None:
    """Item ids as recommend_api names them: the dataset's own ids (loaded from ``split`` or
    the worker's dataset), or None for catalogue indices as strings."""
    if settings.recommend_item_ids == "index":
        return None
    if split is None:
        split = load_split(settings.dataset, settings.data_dir, validation=settings.validation)
    return [str(x) for x in split.item_labels.tolist()]


def device_request(
    store: WorkerStore, labels: Sequence[str] | None, user_id: int, k: int
) -> dict[str, Any]:
    """The body a user's device sends to recommend_api: its vector, k, its training items."""
    try:
        state = store.load_states([user_id])
    except StoreError as err:
        raise ApiError(
            503, "no_private_state", f"user {user_id} has no private state yet (no run joined)"
        ) from err
    train = store.train_items(user_id)
    if train is None:  # pragma: no cover - the user set is checked before
        raise ApiError(404, "unknown_user", f"user {user_id} is not in this worker's store")
    seen = sorted({int(i) for i in train.tolist()})
    exclude = [str(i) if labels is None else labels[i] for i in seen]
    user = {name: t[0].tolist() for name, t in state.params.items()}
    return {"user": user, "k": k, "exclude": exclude}


def _upstream_error(resp: httpx.Response) -> ApiError:
    """Map a non-200 answer of recommend_api: 503 passes through, anything else is a 502."""
    code, detail = "http_error", resp.reason_phrase or ""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        code = str(body.get("error", code))
        detail = str(body.get("detail", detail))
    if resp.status_code == 503:
        return ApiError(503, code, f"recommend_api: {detail}")
    return ApiError(
        502, "recommend_error", f"recommend_api answered {resp.status_code} {code}: {detail}"
    )


def create_app(
    settings: WorkerSettings,
    store: WorkerStore,
    labels: Sequence[str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """Build the worker's demo API over ``store``; ``transport`` reaches recommend_api (tests
    pass an ``httpx.ASGITransport`` of the real app). Nothing connects until the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        users = await anyio.to_thread.run_sync(store.user_ids)
        async with httpx.AsyncClient(
            base_url=settings.recommend_url, transport=transport, timeout=settings.timeout_s
        ) as client:
            app.state.worker_http = AppState(
                settings, store, labels, frozenset(int(u) for u in users.tolist()), client
            )
            yield

    app = FastAPI(title="FedRecGEL worker (demo)", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.code, "detail": exc.detail}, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
            for e in exc.errors()
        )
        return JSONResponse({"error": "validation_error", "detail": detail}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        body = {"error": codes.get(exc.status_code, "http_error"), "detail": str(exc.detail)}
        return JSONResponse(body, exc.status_code)

    @app.get("/v1/users/{user_id}/recommendations", responses=ERRORS)
    async def recommendations(
        user_id: int,
        state: StateDep,
        k: Annotated[int, Query(ge=1, le=MAX_K, description="how many items")] = 10,
    ) -> Recommendations:
        """Top-``k`` items for one user of this shard, from recommend_api."""
        s = state.settings
        if user_id not in state.users:
            raise ApiError(
                404, "unknown_user", f"user {user_id} is not in shard {s.shard} of {s.shards}"
            )
        body = await anyio.to_thread.run_sync(device_request, state.store, state.labels, user_id, k)
        try:
            resp = await state.client.post(RECOMMEND_PATH, json=body)
        except httpx.HTTPError as err:
            raise ApiError(
                502, "recommend_unavailable", f"recommend_api: {type(err).__name__}: {err}"
            ) from err
        if resp.status_code != 200:
            raise _upstream_error(resp)
        try:
            return Recommendations.model_validate(resp.json())
        except (ValueError, ValidationError) as err:
            raise ApiError(
                502, "recommend_error", "recommend_api answered an unexpected body"
            ) from err

    @app.get("/healthz")
    async def healthz(state: StateDep) -> JSONResponse:
        """200 while the store answers (the worker loop's health is the process's), else 503;
        ``registered`` tells an operator whether this shard's users can join a run yet."""
        s = state.settings
        try:
            token = await anyio.to_thread.run_sync(state.store.get_meta, "token")
            store_ok = True
        except Exception:  # any database failure means "not healthy", whatever its type
            log.exception("store check failed")
            token, store_ok = None, False
        body = {
            "status": "ok" if store_ok else "error",
            "store": "ok" if store_ok else "error",
            "registered": token is not None,
            "shard": s.shard,
            "shards": s.shards,
            "users": len(state.users),
        }
        return JSONResponse(body, 200 if store_ok else 503)

    return app


class HttpServer:
    """Serves an app with uvicorn in a daemon thread, next to the worker loop."""

    def __init__(self, app: FastAPI, host: str, port: int, log_level: str = "info") -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower())
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
    settings: WorkerSettings, store: WorkerStore, split: Split | None = None
) -> HttpServer:
    """Start the demo API of a worker on ``settings.http_host:http_port``."""
    if settings.http_port is None:
        raise WorkerError("no http_port configured")
    app = create_app(settings, store, item_labels(settings, split))
    server = HttpServer(app, settings.http_host, settings.http_port, settings.log_level)
    server.start()
    return server
