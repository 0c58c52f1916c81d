"""The recommendation API: ``create_app(settings)`` with a typed lifespan."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.recommend_api.errors import RecommendError
from services.recommend_api.follow import ModelFollower
from services.recommend_api.ranking import (
    ModelHolder,
    RankingConfig,
    dataset_labels,
    read_labels_file,
)
from services.recommend_api.schemas import (
    ErrorBody,
    RecommendationRequest,
    RecommendationResponse,
    ScoredItem,
)
from services.recommend_api.settings import Settings

log = logging.getLogger(__name__)

ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorBody},
    503: {"model": ErrorBody},
}


@dataclass
class AppState:
    """What the lifespan opens and the routes use."""

    settings: Settings
    holder: ModelHolder
    pool: ThreadPoolExecutor
    registry: CollectorRegistry
    latency: Histogram
    client: httpx.AsyncClient | None = None
    follower: ModelFollower | None = None


class _HolderCollector(Collector):
    """Exports the holder's version and swap counters at scrape time."""

    def __init__(self, holder: ModelHolder) -> None:
        self.holder = holder

    def collect(self) -> Iterable[Metric]:
        version = self.holder.version
        g = GaugeMetricFamily(
            "fedrec_rec_model_version", "Model version serving now (-1: none loaded)"
        )
        g.add_metric([], -1 if version is None else version)
        yield g
        yield CounterMetricFamily(
            "fedrec_rec_model_swaps", "Model versions swapped in", value=self.holder.swaps
        )
        yield CounterMetricFamily(
            "fedrec_rec_model_swap_failures",
            "Model versions that failed to load (the old one kept serving)",
            value=self.holder.swap_failures,
        )


class _LatencyMiddleware:
    """Pure ASGI timing middleware: records route and status only, never bodies."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            state: AppState | None = getattr(scope["app"].state, "rec", None)
            if state is not None:
                path = getattr(scope.get("route"), "path", "unmatched")
                state.latency.labels(path, str(status)).observe(time.perf_counter() - start)


def labels_from_settings(settings: Settings) -> list[str] | None:
    """Item labels from ``item_labels`` (a file) or ``dataset``; None: ids are indices."""
    if settings.item_labels is not None:
        return read_labels_file(settings.item_labels)
    if settings.dataset is not None:
        return dataset_labels(settings.dataset, settings.data_dir)
    return None


def holder_from_settings(settings: Settings) -> ModelHolder:
    """An empty holder configured from ``settings``."""
    cfg = RankingConfig(
        ann_threshold=settings.ann_threshold,
        ann_shortlist=settings.ann_shortlist,
        ann_fit_samples=settings.ann_fit_samples,
        max_k=settings.max_k,
    )
    return ModelHolder(cfg, labels_from_settings(settings))


def get_state(request: Request) -> AppState:
    """The application state opened by the lifespan."""
    state: AppState = request.app.state.rec
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def create_app(
    settings: Settings | None = None,
    holder: ModelHolder | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """Build the app; nothing connects until the lifespan starts.

    ``holder``: serve this holder (tests feed it directly); ``transport``: the httpx
    transport used to reach the aggregator (e.g. an ``httpx.MockTransport`` in tests).
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        the_holder = holder if holder is not None else holder_from_settings(settings)
        registry = CollectorRegistry()
        registry.register(_HolderCollector(the_holder))
        latency = Histogram(
            "fedrec_rec_request_seconds",
            "Request latency by route",
            ["route", "status"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        pool = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="rank")
        state = AppState(settings, the_holder, pool, registry, latency)
        redis = None
        if settings.aggregator_url is not None:
            headers = {}
            if settings.aggregator_token is not None:
                token = settings.aggregator_token.get_secret_value()
                headers["Authorization"] = f"Bearer {token}"
            state.client = httpx.AsyncClient(
                base_url=settings.aggregator_url,
                headers=headers,
                timeout=settings.fetch_timeout_s,
                transport=transport,
            )
            if settings.redis_url is not None:
                from redis.asyncio import Redis

                redis = Redis.from_url(settings.redis_url)
            state.follower = ModelFollower(
                the_holder,
                state.client,
                settings.poll_interval_s,
                redis=redis,
                channel=settings.versions_channel,
                redis_poll_factor=settings.redis_poll_factor,
            )
            state.follower.start()
        app.state.rec = state
        try:
            yield
        finally:
            if state.follower is not None:
                await state.follower.stop()
            if state.client is not None:
                await state.client.aclose()
            if redis is not None:
                await redis.aclose()
            pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="FedRecGEL recommendations", version="0.1.0", lifespan=lifespan)

    app.add_middleware(_LatencyMiddleware)

    @app.exception_handler(RecommendError)
    async def domain_error(request: Request, exc: RecommendError) -> JSONResponse:
        return JSONResponse({"error": exc.code, "detail": exc.detail}, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Only locations and messages: pydantic's "input" would echo the user vector back.
        parts = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{loc}: {e.get('msg', 'invalid')}")
        return JSONResponse({"error": "invalid_request", "detail": "; ".join(parts)}, 422)

    @app.post("/v1/recommendations", responses=ERRORS)
    async def recommend(body: RecommendationRequest, state: StateDep) -> RecommendationResponse:
        """Top-K items for the user vector in the body (used for this answer only)."""
        loop = asyncio.get_running_loop()
        ranked = await loop.run_in_executor(
            state.pool,
            state.holder.recommend,
            body.user.user_gmf,
            body.user.user_mlp,
            body.k,
            body.exclude,
        )
        return RecommendationResponse(
            model_version=ranked.version,
            items=[ScoredItem(item=i, score=s) for i, s in ranked.items],
        )

    @app.get("/healthz")
    async def healthz(state: StateDep) -> JSONResponse:
        """200 when a model is loaded (aggregator reachability reported); 503 otherwise."""
        version = state.holder.version
        aggregator = "disabled"
        if state.client is not None:
            try:
                resp = await state.client.get("/healthz", timeout=2.0)
                aggregator = "ok" if resp.status_code < 500 else f"error {resp.status_code}"
            except httpx.HTTPError:
                aggregator = "unreachable"
        body = {
            "status": "ok" if version is not None else "no_model",
            "model": "loaded" if version is not None else "none",
            "model_version": version,
            "aggregator": aggregator,
        }
        if version is not None and aggregator not in ("ok", "disabled"):
            body["status"] = "degraded"  # still serving the last good model
        return JSONResponse(body, 200 if version is not None else 503)

    @app.get("/metrics")
    async def metrics(state: StateDep) -> Response:
        """Prometheus metrics of this app."""
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    return app
