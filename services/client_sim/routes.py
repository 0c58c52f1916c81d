"""Routes of the worker's device API: recommendations for the users of its shard, asked as a
device would, and the health check.

``GET /v1/users/{user_id}/recommendations?k=10`` reads the user's private vector from this
worker's own store, leaves out the user's training items (unless ``include_training=true``) and
sends recommend_api exactly the request a device sends (``POST /v1/recommendations``); the
answer (model version, item ids, scores) comes back unchanged. The vector goes to recommend_api
only, never into an answer or a log line here.

``GET /v1/users/{user_id}/training-items`` answers the user's own training items, as the
device holds them: data that stays on the device's side (this API), never sent to the
aggregator.

``GET /v1/users?id=<data id>`` finds a user of this shard by its id in the data (a CSV's
``alice``) and answers its number in the split, the ``user_id`` the two routes above take.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
import httpx
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, ValidationError

from services.client_sim.settings import WorkerError, WorkerSettings
from services.client_sim.store import StoreError, WorkerStore
from services.contract import (
    DEVICE_MAX_K,
    K_TOO_LARGE,
    ErrorBody,
    RecommendationRequest,
    RecommendationResponse,
    ServiceError,
    TrainingItems,
    UserLookup,
    UserVector,
    read_error,
)

log = logging.getLogger(__name__)

MAX_K = DEVICE_MAX_K
#: the longest data id ``GET /v1/users?id=`` looks up (422 beyond)
MAX_ID_CHARS = 256
RECOMMEND_PATH = "/v1/recommendations"

router = APIRouter()

#: a user id -> its fitted embeddings by name, or None (then its stored ones are sent)
FittedVector = Callable[[int], dict[str, list[float]] | None]

# 401: no device token, when one is set; 403 host_not_allowed: another Host, when none is
ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorBody} for s in (401, 403, 404, 413, 422, 502, 503)
}


@dataclass
class AppState:
    """What the lifespan opens and the routes use."""

    settings: WorkerSettings
    store: WorkerStore
    labels: Sequence[str] | None
    users: frozenset[int]
    #: the shard's users by their ids in the data (:func:`shard_user_ids`)
    user_ids: Mapping[str, int]
    client: httpx.AsyncClient
    #: a user's embeddings fitted to the newest evaluated version, when the run fits them
    #: before ranking (``rank_fit_steps``; None: its stored ones are sent)
    fitted: FittedVector | None = None


def get_state(request: Request) -> AppState:
    """The state opened by the lifespan."""
    state: AppState = request.app.state.worker_http
    return state


StateDep = Annotated[AppState, Depends(get_state)]

_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")


def _decimal(value: object) -> object:
    """A path or query integer is written in plain decimal digits: ``10``, not ``10.0``,
    ``+10``, ``1_0``, `` 10`` or ``010`` (which a lax integer parser would take)."""
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        raise ValueError(
            "must be a non-negative integer in plain decimal digits (no sign, leading zero, "
            "point or separator; at most 19 digits)"
        )
    return value


Decimal = Annotated[int, BeforeValidator(_decimal)]


def _k(value: object) -> object:
    """``k`` is a plain decimal integer from 1 to :data:`MAX_K`: any other value (``0``,
    ``-1``, ``1001``, ``ten``, ``010``) is refused with the same message, naming the range."""
    if isinstance(value, str) and _DECIMAL.fullmatch(value) and 1 <= int(value) <= MAX_K:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_K:
        return value
    raise ValueError(
        f"must be an integer from 1 to {MAX_K}, in plain decimal digits (one user's list; "
        "recommend_api takes longer ones itself)"
    )


#: how many items a device asks for (recommend_api's own bound is ``FEDREC_REC_MAX_K``)
TopK = Annotated[int, BeforeValidator(_k)]


def _plain_bool(value: object) -> object:
    """A query flag is ``true`` or ``false``, nothing a lax parser would also take."""
    if isinstance(value, str) and value not in ("true", "false"):
        raise ValueError("must be true or false")
    return value


PlainBool = Annotated[bool, BeforeValidator(_plain_bool)]


def device_request(
    store: WorkerStore,
    labels: Sequence[str] | None,
    user_id: int,
    k: int,
    include_training: bool = False,
    fitted: FittedVector | None = None,
) -> dict[str, Any]:
    """The body a user's device sends to recommend_api: its vector (as ``fitted`` to the model
    when the run fits it, else as stored), k and its training items to leave out (none with
    ``include_training``)."""
    vector = None if fitted is None else fitted(user_id)
    if vector is None:
        try:
            state = store.load_states([user_id])
        except StoreError as err:
            raise ServiceError(
                f"user {user_id} has no private state yet (no run joined)",
                "no_private_state",
                503,
            ) from err
        vector = {name: t[0].tolist() for name, t in state.params.items()}
    exclude = [] if include_training else training_items(store, labels, user_id)
    user = UserVector(**vector)
    body = RecommendationRequest(user=user, k=k, exclude=exclude)
    return body.model_dump(exclude_none=True)


def training_items(store: WorkerStore, labels: Sequence[str] | None, user_id: int) -> list[str]:
    """The user's training items as recommend_api names them, in catalogue order."""
    train = store.train_items(user_id)
    if train is None:  # pragma: no cover - the user set is checked before
        raise ServiceError(f"user {user_id} is not in this worker's store", "unknown_user", 404)
    seen = sorted({int(i) for i in train.tolist()})
    return [str(i) if labels is None else labels[i] for i in seen]


def shard_user_ids(users: Iterable[int], user_labels: Sequence[str] | None) -> dict[str, int]:
    """The shard's ``users`` by their ids in the data: ``user_labels[u]`` (the split's
    ``user_labels``, by number), or the number in plain decimal without labels (the worker
    names items by catalogue index, and users likewise)."""
    if user_labels is None:
        return {str(u): u for u in users}
    ids: dict[str, int] = {}
    for u in users:
        if not 0 <= u < len(user_labels):
            raise WorkerError(f"user {u} of the store is not one of the split's {len(user_labels)}")
        ids[user_labels[u]] = u
    return ids


def _check_user(state: AppState, user_id: int) -> None:
    """404 ``unknown_user`` unless the user is one of this shard's."""
    if user_id not in state.users:
        s = state.settings
        raise ServiceError(
            f"user {user_id} is not in shard {s.shard} of {s.shards}", "unknown_user", 404
        )


def _upstream_error(resp: httpx.Response) -> ServiceError:
    """Map a non-200 answer of recommend_api: 503 passes through, and a ``k`` over its bound
    (lower than this API's, :data:`MAX_K`) is the request's 422; anything else is a 502."""
    body = read_error(resp)
    if resp.status_code == 503:
        return ServiceError(f"recommend_api: {body.detail}", body.error, 503)
    if resp.status_code == 422 and body.error == K_TOO_LARGE:
        detail = f"query.k: recommend_api serves shorter lists than this API takes ({body.detail})"
        return ServiceError(detail, K_TOO_LARGE, 422)
    return ServiceError(
        f"recommend_api answered {resp.status_code} {body.error}: {body.detail}",
        "recommend_error",
        502,
    )


@router.get("/v1/users/{user_id}/recommendations", responses=ERRORS)
async def recommendations(
    user_id: Decimal,
    state: StateDep,
    k: Annotated[
        TopK,
        Query(
            ge=1,
            le=MAX_K,
            description=f"how many items, 1 to {MAX_K} (one user's list), and at most "
            "recommend_api's own bound when that is lower (422 k_too_large)",
        ),
    ] = 10,
    include_training: Annotated[
        PlainBool, Query(description="rank the user's training items too (left out by default)")
    ] = False,
) -> RecommendationResponse:
    """Top-``k`` items for one user of this shard, from recommend_api."""
    _check_user(state, user_id)
    body = await anyio.to_thread.run_sync(
        device_request, state.store, state.labels, user_id, k, include_training, state.fitted
    )
    try:
        resp = await state.client.post(RECOMMEND_PATH, json=body)
    except httpx.HTTPError as err:
        raise ServiceError(
            f"recommend_api: {type(err).__name__}: {err}", "recommend_unavailable", 502
        ) from err
    if resp.status_code != 200:
        raise _upstream_error(resp)
    try:
        return RecommendationResponse.model_validate(resp.json())
    except (ValueError, ValidationError) as err:
        raise ServiceError(
            "recommend_api answered an unexpected body", "recommend_error", 502
        ) from err


@router.get("/v1/users/{user_id}/training-items", responses=ERRORS)
async def user_training_items(user_id: Decimal, state: StateDep) -> TrainingItems:
    """The user's own training items (the device's data: this API only, never the aggregator)."""
    _check_user(state, user_id)
    items = await anyio.to_thread.run_sync(training_items, state.store, state.labels, user_id)
    return TrainingItems(user_id=user_id, items=items)


@router.get("/v1/users", responses=ERRORS)
async def find_user(
    state: StateDep,
    data_id: Annotated[
        str,
        Query(
            alias="id",
            min_length=1,
            max_length=MAX_ID_CHARS,
            description="the user's id in the data (a CSV's user column; the number in decimal "
            "when the worker names items by catalogue index)",
        ),
    ],
) -> UserLookup:
    """The number in the split (the ``user_id`` the other ``/v1/users`` routes take) of this
    shard's user of this id in the data."""
    user_id = state.user_ids.get(data_id)
    if user_id is None:
        s = state.settings
        raise ServiceError(
            f"no user of id {data_id!r} in shard {s.shard} of {s.shards}", "unknown_user", 404
        )
    return UserLookup(user_id=user_id, id=data_id)


@router.get("/healthz")
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
