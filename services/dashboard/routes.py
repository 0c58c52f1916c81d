"""Routes of the dashboard: the page (``/ui/``), its live data (``/ui/api/state``, polled with
ETag), the recommendation panels and the operator actions, each passed to the service that
owns it.

The operator actions carry the operator token in the request's own ``Authorization`` header,
set by the page's script from the tab's session storage; the dashboard forwards that header to
the aggregator and keeps nothing, so an action without the token is refused by the aggregator
(401), whatever the page shows. A header, never a cookie: another site cannot make a browser
send it (no cross-site request forgery), and it never appears in a URL or an access log.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from services.contract import DEVICE_MAX_K, ErrorBody, ServiceError
from services.dashboard.runform import form_presets, run_form_groups
from services.dashboard.settings import DashboardSettings
from services.dashboard.upstream import OPERATOR_ACTIONS, Answer, Upstream
from services.error_handlers import not_json_media
from services.web_assets import CHART_JS

TEMPLATES = Jinja2Templates(directory=Path(__file__).resolve().parent / "templates")
#: the largest user id or k the page forwards (the workers bound k themselves)
MAX_USER = 2**31 - 1
MAX_K = DEVICE_MAX_K  # the workers' own bound
#: the page's own policy: scripts, styles and data from this origin only
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
# the dashboard's own refusals (403 host_not_allowed, 413, 422) and the upstream answers it
# passes on as they are (the aggregator's and recommend_api's refusals)
ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorBody} for s in (401, 403, 404, 409, 410, 413, 415, 422, 502, 503)
}
#: the refusals of a read of the dashboard's own (no upstream answer passed on)
OWN_ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody} for s in (403, 413, 422)}

router = APIRouter()


def get_upstream(request: Request) -> Upstream:
    """The clients opened by the lifespan."""
    upstream: Upstream = request.app.state.upstream
    return upstream


UpstreamDep = Annotated[Upstream, Depends(get_upstream)]


def _answer(a: Answer) -> JSONResponse:
    return JSONResponse(a.body, a.status, headers={"Cache-Control": "no-store"})


async def _body(request: Request) -> bytes:
    """The request body, bounded (the app's body limit answers 413 first), sent as JSON (the
    services refuse another media type; a form or text/plain post from another site's page
    would pass a browser's CORS without a preflight)."""
    if (why := not_json_media(request)) is not None:
        raise ServiceError(why, "unsupported_media_type", 415)
    return await request.body()


@router.get("/", include_in_schema=False)
async def root() -> RedirectResponse:
    """The dashboard is the root page."""
    return RedirectResponse("/ui/")


@router.get("/ui", include_in_schema=False)
async def ui_no_slash() -> RedirectResponse:
    """``/ui`` -> ``/ui/``."""
    return RedirectResponse("/ui/")


@router.get("/ui/", include_in_schema=False)
async def page(request: Request) -> Response:
    """The dashboard page; its script fills it from ``/ui/api/state``."""
    s: DashboardSettings = request.app.state.settings
    context = {
        "groups": run_form_groups(),
        "presets": list(form_presets()),
        "presets_json": json.dumps(form_presets()),
        "chart_js": CHART_JS,
        "poll_ms": int(s.poll_interval_s * 1000),
        "workers": len(s.workers),
        "has_recommend": s.recommend_url is not None,
        "max_k": MAX_K,
    }
    response = TEMPLATES.TemplateResponse(request, "index.html", context)
    response.headers.update(PAGE_HEADERS)
    return response


@router.get("/ui/api/state", responses=OWN_ERRORS)
async def state(
    upstream: UpstreamDep,
    if_none_match: Annotated[str | None, Header()] = None,
    history_since: Annotated[
        str | None,
        Query(
            max_length=64,
            description="The history_token of an earlier answer: only the rounds new or "
            "changed since are sent (history_full false); else every round (true).",
        ),
    ] = None,
) -> Response:
    """The run as the page shows it; ``ETag`` of its content, 304 when unchanged."""
    snapshot = await upstream.snapshot()
    # read with the token in one step (no await between): a refresh cannot come in between
    rounds, full = upstream.history.since(history_since)
    snapshot = {
        **snapshot,
        "history": rounds,
        "history_full": full,
        "history_token": upstream.history.token,
    }
    body = json.dumps(snapshot, sort_keys=True, default=str).encode()
    etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if if_none_match is not None and etag in {t.strip() for t in if_none_match.split(",")}:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


@router.get("/ui/api/users/{user_id}/recommendations", responses=ERRORS)
async def user_recommendations(
    upstream: UpstreamDep,
    user_id: Annotated[int, PathParam(ge=0, le=MAX_USER)],
    k: Annotated[int, Query(ge=1, le=MAX_K)] = 10,
    include_training: bool = False,
) -> JSONResponse:
    """The user's top-k, from its worker (the device's side): the worker's answer as it is.
    The worker leaves the user's training items out unless ``include_training``."""
    return _answer(await upstream.user_recommendations(user_id, k, include_training))


@router.get("/ui/api/users/{user_id}/training-items", responses=ERRORS)
async def user_training_items(
    upstream: UpstreamDep, user_id: Annotated[int, PathParam(ge=0, le=MAX_USER)]
) -> JSONResponse:
    """The user's own training items, from its worker's device API, as it answers them."""
    return _answer(await upstream.training_items(user_id))


@router.post("/ui/api/recommendations", responses=ERRORS)
async def recommend(upstream: UpstreamDep, body: Annotated[bytes, Depends(_body)]) -> JSONResponse:
    """A pasted recommendation request (a user vector), sent to recommend_api as it is."""
    return _answer(await upstream.recommend(body))


@router.post("/ui/api/runs", responses=ERRORS)
async def start_run(
    upstream: UpstreamDep,
    body: Annotated[bytes, Depends(_body)],
    authorization: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    """Start a run (the operator token in ``Authorization``; the aggregator checks it)."""
    return _answer(await upstream.operator("/v1/runs", authorization, body))


@router.post("/ui/api/runs/current/{action}", responses=ERRORS)
async def run_action(
    upstream: UpstreamDep,
    action: str,
    authorization: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    """Pause, resume or stop the run (the operator token in ``Authorization``)."""
    if action not in OPERATOR_ACTIONS:
        raise ServiceError(f"unknown action {action!r}", "not_found", 404)
    return _answer(await upstream.operator(f"/v1/runs/current/{action}", authorization, None))


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The dashboard itself answers (its upstreams are shown on the page)."""
    return {"status": "ok"}
