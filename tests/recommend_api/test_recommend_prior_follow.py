"""Following the aggregator's popularity prior (``GET /v1/runs/current/prior``): ETag polls,
swaps without re-decoding the model, failures that keep the serving state, 404 as no prior,
and the prior's weight in the recommendation answer, /healthz, /livez and /metrics."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from fedrecgel.model import init_shared
from services.recommend_api.follow import PRIOR_PATH, ModelFollower
from services.recommend_api.ranking import ModelHolder
from tests.recommend_api.test_recommend_app import (
    CFG,
    LABELS,
    FakeAggregator,
    _serve,
    _settings,
    _user,
    _wait_for,
)
from tests.recommend_api.test_recommend_ranking import _brute_force

COUNTS = np.random.default_rng(0).integers(0, 500, CFG.n_items)


class PriorAggregator(FakeAggregator):
    """The model routes of :class:`FakeAggregator` plus ``GET /v1/runs/current/prior`` (ETag,
    304); ``prior`` None answers 404 ``no_run``; ``prior_fail`` answers that status instead,
    ``prior_raw`` that body (with its own ETag)."""

    def __init__(self) -> None:
        super().__init__()
        self.prior: dict[str, Any] | None = None
        self.prior_fail: int | None = None
        self.prior_raw: bytes | None = None
        self.prior_gets: list[str | None] = []  # the If-None-Match of each prior request
        self.prior_bodies = 0  # 200 answers

    def set_prior(self, weight: float | None, complete: bool = True, **kw: Any) -> None:
        counts = kw.pop("counts", COUNTS)
        self.prior = {
            "run_id": 1,
            "enabled": True,  # the aggregator's extra fields are ignored
            "complete": complete,
            "counts": [int(c) for c in counts] if complete else None,
            "weight": weight,
            "weight_version": 1,
            **kw,
        }

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != PRIOR_PATH:
            return super().handler(request)
        self.prior_gets.append(request.headers.get("If-None-Match"))
        if self.prior_fail is not None:
            return httpx.Response(self.prior_fail, json={"error": "internal", "detail": "boom"})
        if self.prior is None and self.prior_raw is None:
            return httpx.Response(404, json={"error": "not_found", "code": "no_run"})
        body = self.prior_raw if self.prior_raw is not None else json.dumps(self.prior).encode()
        etag = f'"{hashlib.sha256(body).hexdigest()[:16]}"'
        if request.headers.get("If-None-Match") == etag:
            return httpx.Response(304, headers={"ETag": etag})
        self.prior_bodies += 1
        return httpx.Response(200, content=body, headers={"ETag": etag})


def _want(holder: ModelHolder, weight: float | None, seed: int = 0) -> list[str]:
    """The top 5 by logit + weight * log1p(count), computed directly from the served model."""
    snap = holder.snapshot
    assert snap is not None
    shared = init_shared(CFG, snap.version)  # FakeAggregator.publish(v) serves seed v
    served = _brute_force(CFG, shared, _user(seed))
    if weight:
        served = served + weight * np.log1p(COUNTS.astype(np.float64))
    return [LABELS[i] for i in np.argsort(-served, kind="stable")[:5]]


def _top(holder: ModelHolder, seed: int = 0) -> list[str]:
    user = _user(seed)
    return [i for i, _ in holder.recommend(user["user_gmf"], user["user_mlp"], k=5).items]


def test_the_follower_picks_up_prior_changes_by_etag_without_redecoding_the_model() -> None:
    agg = PriorAggregator()
    agg.publish(1)
    agg.set_prior(None, complete=False)
    assert _want_differs()

    async def go() -> None:
        async with httpx.AsyncClient(transport=agg.transport(), base_url="http://agg") as client:
            holder = ModelHolder(labels=LABELS)
            follower = ModelFollower(holder, client, poll_interval_s=1.0)
            await follower.poll_once()
            assert holder.version == 1 and holder.prior_weight is None
            assert holder.prior_note is not None and "not complete" in holder.prior_note
            assert _top(holder) == _want(holder, None)
            agg.set_prior(None)  # counts complete, no weight chosen yet
            await follower.poll_once()
            assert holder.prior_weight is None and "no prior weight" in str(holder.prior_note)
            agg.set_prior(0.5)
            await follower.poll_once()
            snap = holder.snapshot
            assert holder.prior_weight == 0.5 and snap is not None
            assert _top(holder) == _want(holder, 0.5)
            bodies, swaps = agg.prior_bodies, holder.prior_swaps
            await follower.poll_once()  # unchanged: a 304, nothing swapped
            assert agg.prior_bodies == bodies and holder.prior_swaps == swaps
            assert agg.prior_gets[-1] is not None and holder.snapshot is snap
            agg.set_prior(2.0)  # a new weight: a new snapshot of the same decoded model
            await follower.poll_once()
            new = holder.snapshot
            assert new is not None and new is not snap and new.scorer is snap.scorer
            assert holder.prior_weight == 2.0 and _top(holder) == _want(holder, 2.0)
            assert agg.downloads == 1  # the model was downloaded once
            agg.publish(2)  # a new version is built with the prior already
            await follower.poll_once()
            assert holder.version == 2 and holder.prior_weight == 2.0
            assert _top(holder) == _want(holder, 2.0)
            assert agg.prior_bodies == bodies + 1  # only the weight change was downloaded
            agg.prior = None  # 404: no run, or an aggregator without the route
            await follower.poll_once()
            assert holder.prior_weight is None and _top(holder) == _want(holder, None)
            assert holder.version == 2

    asyncio.run(go())


def _want_differs() -> bool:
    """The fixture is worth testing: the prior changes the model's top 5."""
    holder = ModelHolder(labels=LABELS)
    holder.swap(holder.build(CFG, init_shared(CFG, 1), 1))
    return _want(holder, 2.0) != _want(holder, None) and _want(holder, 0.5) != _want(holder, None)


@pytest.mark.parametrize(
    "failure",
    ["500", "unreachable", "not json", "negative count", "NaN weight", "string weight"],
)
def test_a_failed_prior_refresh_keeps_the_serving_state(
    failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    agg = PriorAggregator()
    agg.publish(1)
    agg.set_prior(0.5)
    down = False

    def handler(request: httpx.Request) -> httpx.Response:
        if down and request.url.path == PRIOR_PATH:
            raise httpx.ConnectError("connection refused")
        return agg.handler(request)

    async def go() -> None:
        nonlocal down
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport, base_url="http://agg") as client:
            holder = ModelHolder(labels=LABELS)
            follower = ModelFollower(holder, client, poll_interval_s=1.0)
            await follower.poll_once()
            snap = holder.snapshot
            assert holder.prior_weight == 0.5 and snap is not None
            if failure == "500":
                agg.prior_fail = 500
            elif failure == "unreachable":
                down = True
            elif failure == "not json":
                agg.prior_raw = b"<html>gateway</html>"
            elif failure == "negative count":
                agg.set_prior(2.0, counts=[-1] * CFG.n_items)
            elif failure == "NaN weight":
                agg.prior_raw = json.dumps({**(agg.prior or {}), "weight": float("nan")}).encode()
            else:
                agg.set_prior("2.0")  # type: ignore[arg-type]
            for _ in range(3):  # never raised; the same problem warned about once
                assert not await follower.refresh_prior()
                await follower.poll_once()
            assert holder.snapshot is snap and holder.prior_weight == 0.5
            assert _top(holder) == _want(holder, 0.5)
            warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(warned) == 1 and "prior unchanged" in warned[0].getMessage(), warned
            agg.prior_fail, agg.prior_raw, down = None, None, False
            agg.set_prior(2.0)  # the next good body is taken
            assert await follower.refresh_prior() and holder.prior_weight == 2.0

    with caplog.at_level(logging.DEBUG, logger="services.recommend_api.follow"):
        asyncio.run(go())


def test_a_prior_of_another_length_serves_the_model_alone() -> None:
    agg = PriorAggregator()
    agg.publish(1)
    agg.set_prior(2.0, counts=COUNTS[:-1])

    async def go() -> None:
        async with httpx.AsyncClient(transport=agg.transport(), base_url="http://agg") as client:
            holder = ModelHolder(labels=LABELS)
            await ModelFollower(holder, client, poll_interval_s=1.0).poll_once()
            assert holder.version == 1 and holder.prior_weight is None
            assert f"but the model has {CFG.n_items}" in str(holder.prior_note)
            assert _top(holder) == _want(holder, None)

    asyncio.run(go())


def test_a_prior_that_cannot_be_applied_is_retried_and_the_model_keeps_serving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agg = PriorAggregator()
    agg.publish(1)

    async def go() -> None:
        async with httpx.AsyncClient(transport=agg.transport(), base_url="http://agg") as client:
            holder = ModelHolder(labels=LABELS)
            follower = ModelFollower(holder, client, poll_interval_s=1.0)
            await follower.poll_once()
            snap = holder.snapshot
            assert snap is not None and holder.prior_weight is None

            def no_memory(*args: Any) -> Any:
                raise MemoryError("no room for the index")

            monkeypatch.setattr(holder, "with_prior", no_memory)
            agg.set_prior(0.5)
            assert not await follower.refresh_prior()
            await follower.poll_once()  # the same body again (not marked as seen): same failure
            assert holder.snapshot is snap and holder.published_prior is None
            assert agg.prior_gets[-1] is None  # asked unconditionally: nothing was kept
            monkeypatch.undo()
            assert await follower.refresh_prior() and holder.prior_weight == 0.5

    asyncio.run(go())


def test_the_app_reports_the_prior_weight_in_answers_health_and_metrics() -> None:
    agg = PriorAggregator()
    agg.publish(1)

    async def go() -> None:
        settings = _settings(aggregator_url="http://agg", poll_interval_s=0.05)
        holder = ModelHolder(labels=LABELS)
        async with _serve(settings, holder, agg.transport()) as c:
            await _wait_for(lambda: holder.version == 1 and len(agg.prior_gets) > 0)
            r = (await c.post("/v1/recommendations", json={"user": _user(), "k": 5})).json()
            assert r["prior_weight"] is None and r["model_version"] == 1
            logits = [i["score"] for i in r["items"]]
            agg.set_prior(0.5)
            await _wait_for(lambda: holder.prior_weight == 0.5)
            r = (await c.post("/v1/recommendations", json={"user": _user(), "k": 5})).json()
            assert r["prior_weight"] == 0.5 and r["model_version"] == 1
            assert [i["item"] for i in r["items"]] == _want(holder, 0.5)
            # the scores are the served ones: logit + 0.5 * log1p(count)
            items = [LABELS.index(i["item"]) for i in r["items"]]
            ref = _brute_force(CFG, init_shared(CFG, 1), _user())[items]
            served = ref + 0.5 * np.log1p(COUNTS[items].astype(np.float64))
            np.testing.assert_allclose([i["score"] for i in r["items"]], served, rtol=1e-5)
            assert logits != [i["score"] for i in r["items"]]
            h = (await c.get("/healthz")).json()
            assert h["prior_weight"] == 0.5 and "weight 0.5" in h["prior"]
            assert h["status"] == "ok" and h["model_version"] == 1
            assert (await c.get("/livez")).json()["prior_weight"] == 0.5
            metrics = (await c.get("/metrics")).text
            assert "fedrec_rec_prior_weight 0.5" in metrics
            assert "fedrec_rec_prior_swaps_total 1.0" in metrics
            agg.set_prior(0.0)  # the model alone was chosen
            await _wait_for(lambda: holder.prior_weight is None)
            r = (await c.post("/v1/recommendations", json={"user": _user(), "k": 5})).json()
            assert r["prior_weight"] is None and [i["score"] for i in r["items"]] == logits
            schema = (await c.get("/openapi.json")).json()["components"]["schemas"]
            assert "prior_weight" in schema["RecommendationResponse"]["properties"]

    asyncio.run(go())


def test_snapshot_refuses_a_prior_its_index_does_not_hold() -> None:
    from dataclasses import replace

    from services.recommend_api.prior import PriorBody, fit_prior, publish
    from services.recommend_api.ranking import RankingConfig

    holder = ModelHolder(RankingConfig(ann_threshold=0, ann_index="scan"), labels=LABELS)
    holder.swap(holder.build(CFG, init_shared(CFG, 1), 1))
    snap = holder.snapshot
    assert snap is not None and snap.shortlist is not None
    body = PriorBody(run_id=1, complete=True, counts=COUNTS.tolist(), weight=1.0)
    served = fit_prior(publish(body), CFG.n_items).served
    assert served is not None and served.bias.dtype == torch.float32
    with pytest.raises(ValueError, match="does not hold the served prior"):
        replace(snap, prior=served)
