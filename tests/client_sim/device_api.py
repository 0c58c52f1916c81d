"""Set-up shared by the tests of the worker's demo HTTP API: a shard-0 store, a recommend_api
model holder, and the worker API calling the real recommend_api app in one process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from fedrecgel.data.types import Split
from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.sam import PrivateState
from fedrecgel.synthetic import synthetic_split
from services.client_sim.server import create_app
from services.client_sim.settings import WorkerSettings
from services.client_sim.store import WorkerStore
from services.recommend_api.app import create_app as create_recommend_app
from services.recommend_api.ranking import ModelHolder
from services.recommend_api.settings import Settings as RecommendSettings
from tests.fake_aggregator import worker_settings

CFG = ModelConfig(n_items=30, factor=4, layers=2)
SEED = 7
DEVICE_TOKEN = "device-token-0123456789abcdef"
LABELS = [f"film-{i}" for i in range(CFG.n_items)]


def device_split() -> Split:
    """12 users over the 30 items of ``CFG``."""
    return synthetic_split(n_users=12, n_items=CFG.n_items, seed=3, n_test_negatives=10)


def settings_for(tmp_path: Path, **kw: Any) -> WorkerSettings:
    return worker_settings(tmp_path, **{"recommend_url": "http://rec", **kw})


def shard_store(tmp_path: Path, split: Split, with_state: bool = True) -> WorkerStore:
    """Shard 0 of 2 (the even users), with fresh private states unless ``with_state`` is off."""
    store = WorkerStore(tmp_path / "w.db")
    users = [u for u in range(split.n_users) if u % 2 == 0]
    store.add_users(split, users)
    if with_state:
        store.reset_states(users, PrivateState.fresh(CFG, SEED, np.asarray(users)))
    return store


def model_holder(version: int | None = 4) -> ModelHolder:
    """A recommend_api holder over ``LABELS``, with a model of ``version`` (None: no model)."""
    holder = ModelHolder(labels=LABELS)
    if version is not None:
        holder.swap(holder.build(CFG, init_shared(CFG, 1), version))
    return holder


@asynccontextmanager
async def worker_api(
    settings: WorkerSettings,
    store: WorkerStore,
    rec_transport: httpx.AsyncBaseTransport,
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, store, LABELS, transport=rec_transport)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1:8710"
        ) as client:
            yield client


@asynccontextmanager
async def both(
    settings: WorkerSettings, store: WorkerStore, holder: ModelHolder
) -> AsyncIterator[httpx.AsyncClient]:
    """The worker API calling the real recommend_api app (lifespan started, no aggregator)."""
    rec = create_recommend_app(RecommendSettings(aggregator_url=None, workers=2), holder=holder)
    async with (
        rec.router.lifespan_context(rec),
        worker_api(settings, store, httpx.ASGITransport(app=rec)) as client,
    ):
        yield client


def get(
    settings: WorkerSettings, store: WorkerStore, holder: ModelHolder, path: str, **params: Any
) -> httpx.Response:
    """One GET of ``path`` (with the query ``params``) on the worker API of ``both``."""

    async def go() -> httpx.Response:
        async with both(settings, store, holder) as c:
            return await c.get(path, params=params or None)

    return asyncio.run(go())


#: the header of a request with the device token, and one with a wrong token
WITH_TOKEN = {"Authorization": f"Bearer {DEVICE_TOKEN}"}
WRONG_TOKEN = {"Authorization": "Bearer x"}


def behind_token(
    tmp_path: Path, split: Split, calls: Sequence[tuple[str, Mapping[str, str] | None]]
) -> list[httpx.Response]:
    """GET each (path, headers) of ``calls`` in turn on a worker API bound beyond loopback with
    :data:`DEVICE_TOKEN` set (over ``split``'s shard store, recommend_api's model loaded)."""
    store = shard_store(tmp_path, split)
    settings = settings_for(tmp_path, http_host="0.0.0.0", device_token=DEVICE_TOKEN)

    async def go() -> list[httpx.Response]:
        async with both(settings, store, model_holder()) as c:
            return [await c.get(path, headers=headers) for path, headers in calls]

    return asyncio.run(go())
