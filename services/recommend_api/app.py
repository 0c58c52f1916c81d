"""The recommendation API: ``create_app(settings)`` with a typed lifespan; the routes are in
:mod:`services.recommend_api.routes`."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.error_handlers import install_error_handlers, limit_request_bodies
from services.recommend_api.follow import ModelFollower
from services.recommend_api.ranking import (
    ModelHolder,
    RankingConfig,
    dataset_labels,
    read_labels_file,
)
from services.recommend_api.routes import AppState, router
from services.recommend_api.settings import Settings
from services.web_assets import service_app

log = logging.getLogger(__name__)


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
        yield GaugeMetricFamily(
            "fedrec_rec_prior_weight",
            "Popularity prior weight in the served scores (0: the model alone)",
            value=self.holder.prior_weight or 0.0,
        )
        yield CounterMetricFamily(
            "fedrec_rec_prior_swaps",
            "Snapshots swapped in for a changed popularity prior (the model unchanged)",
            value=self.holder.prior_swaps,
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
        ann_variance=settings.ann_variance,
        ann_nprobe=settings.ann_nprobe,
        ann_index=settings.ann_index,
        ann_scan_candidates=settings.ann_scan_candidates,
        max_k=settings.max_k,
    )
    return ModelHolder(cfg, labels_from_settings(settings))


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

    app = service_app("FedRecGEL recommendations", "0.1.0", lifespan)  # /docs without a CDN
    limit_request_bodies(app, settings.max_body_bytes)
    app.add_middleware(_LatencyMiddleware)  # added last: outermost, so a 413 is timed too
    # only locations and messages: pydantic's "input" would echo the user vector back
    install_error_handlers(app, validation_code="invalid_request", skip_body=True)
    app.include_router(router)
    return app
