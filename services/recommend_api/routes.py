"""HTTP routes of the recommendation API; each reads the state the app's lifespan opened."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest

from services.contract import (
    ErrorBody,
    RecommendationRequest,
    RecommendationResponse,
    ScoredItem,
)
from services.recommend_api.follow import ModelFollower
from services.recommend_api.ranking import ModelHolder
from services.recommend_api.settings import Settings

router = APIRouter()

# 413: a body over FEDREC_REC_MAX_BODY_BYTES; 415: a body not sent as application/json
ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody} for s in (413, 415, 422, 503)}


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


def get_state(request: Request) -> AppState:
    """The application state opened by the lifespan."""
    state: AppState = request.app.state.rec
    return state


StateDep = Annotated[AppState, Depends(get_state)]


@router.post("/v1/recommendations", responses=ERRORS)
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
        body.exact,
    )
    return RecommendationResponse(
        model_version=ranked.version,
        items=[ScoredItem(item=i, score=s) for i, s in ranked.items],
        prior_weight=ranked.prior_weight,
    )


@router.get("/healthz")
async def healthz(state: StateDep) -> JSONResponse:
    """200 when a model is loaded (aggregator reachability reported); 503 otherwise. Also the
    popularity prior's weight in the served scores (``prior_weight``, null: the model alone)
    and what the serving model does with the aggregator's prior (``prior``)."""
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
        "prior_weight": state.holder.prior_weight,
        "prior": state.holder.prior_note,
    }
    if version is not None and aggregator not in ("ok", "disabled"):
        body["status"] = "degraded"  # still serving the last good model
    return JSONResponse(body, 200 if version is not None else 503)


@router.get("/livez")
async def livez(state: StateDep) -> dict[str, object]:
    """200 while the process serves, model or not (liveness; /healthz is readiness)."""
    holder = state.holder
    return {"status": "alive", "model_version": holder.version, "prior_weight": holder.prior_weight}


@router.get("/metrics", response_class=Response)
async def metrics(state: StateDep) -> Response:
    """Prometheus metrics of this app."""
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)
