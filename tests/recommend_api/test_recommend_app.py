"""HTTP contract of the recommendation API, hot swap under load, and Redis-driven swaps."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
import torch
from pydantic import SecretStr

from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.wire import encode_model
from services.recommend_api.app import create_app
from services.recommend_api.ranking import ModelHolder
from services.recommend_api.settings import Settings

CFG = ModelConfig(n_items=40, factor=4, layers=2)
LABELS = [f"item-{i}" for i in range(CFG.n_items)]


def _user(seed: int = 0) -> dict[str, list[float]]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(d, generator=g).tolist() for n, d in CFG.private_dims().items()}


@asynccontextmanager
async def _serve(
    settings: Settings,
    holder: ModelHolder | None = None,
    transport: httpx.MockTransport | None = None,
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, holder=holder, transport=transport)
    async with app.router.lifespan_context(app):
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rec")
        async with client:
            yield client


def _settings(**kw: object) -> Settings:
    base: dict[str, object] = {"aggregator_url": None, "workers": 4}
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


class FakeAggregator:
    """Serves ``GET /v1/models/latest`` like the aggregator (ETag, 304, X-Model-Version)."""

    def __init__(self) -> None:
        self.blob: bytes | None = None
        self.version = -1
        self.downloads = 0

    def publish(self, version: int, seed: int | None = None, blob: bytes | None = None) -> None:
        shared = init_shared(CFG, version if seed is None else seed)
        self.blob = blob if blob is not None else encode_model(CFG, shared, version)
        self.version = version

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path != "/v1/models/latest" or self.blob is None:
            return httpx.Response(404, json={"error": "not_found", "detail": "no model"})
        etag = f'"{hashlib.sha256(self.blob).hexdigest()}"'
        headers = {"ETag": etag, "X-Model-Version": str(self.version)}
        if request.headers.get("If-None-Match") == etag:
            return httpx.Response(304, headers=headers)
        self.downloads += 1
        return httpx.Response(200, content=self.blob, headers=headers)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)


def _loaded_holder(version: int = 5) -> ModelHolder:
    holder = ModelHolder(labels=LABELS)
    holder.swap(holder.build(CFG, init_shared(CFG, 0), version))
    return holder


async def _wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def test_recommendations_name_the_version_and_dataset_item_ids() -> None:
    async def go() -> None:
        holder = _loaded_holder(5)
        async with _serve(_settings(), holder) as c:
            r = await c.post("/v1/recommendations", json={"user": _user(), "k": 3})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["model_version"] == 5
            assert len(body["items"]) == 3 and all(i["item"] in LABELS for i in body["items"])
            ref = holder.recommend(_user()["user_gmf"], _user()["user_mlp"], 3)
            assert [(i["item"], i["score"]) for i in body["items"]] == [
                (i, pytest.approx(s)) for i, s in ref.items
            ]
            r = await c.post(
                "/v1/recommendations",
                json={"user": _user(), "k": 100, "exclude": [body["items"][0]["item"]]},
            )
            items = [i["item"] for i in r.json()["items"]]
            assert len(items) == CFG.n_items - 1 and body["items"][0]["item"] not in items
            r = await c.post("/v1/recommendations", json={"user": _user(), "k": 3, "exact": True})
            assert r.status_code == 200 and r.json()["items"] == body["items"]

    asyncio.run(go())


JSON = {"content-type": "application/json"}


def test_bad_requests_get_422_with_error_and_detail(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        async with _serve(_settings(), _loaded_holder()) as c:
            u, bound = _user(), _settings().max_k
            short = {"user_gmf": u["user_gmf"][:-1], "user_mlp": u["user_mlp"]}
            cases = [
                ({"user": short, "k": 3}, "invalid_user_vector", "user_gmf has length 3"),
                ({"user": u, "k": 0}, "invalid_request", "k must be positive"),
                ({"user": u, "k": bound + 1}, "k_too_large", f"k must be at most {bound}"),
                ({"user": u, "k": 2, "exclude": ["item-1", "nope"]}, "unknown_items", "'nope'"),
                # a long unknown id is cut in the answer (it was echoed whole)
                ({"user": u, "k": 2, "exclude": ["y" * 50_000]}, "unknown_items", "'yyyy"),
                ({"k": 2}, "invalid_request", "user: Field required"),
                ({"user": {"user_gmf": "x"}, "k": 2}, "invalid_request", "user.user_gmf"),
            ]
            for body, code, detail in cases:
                r = await c.post("/v1/recommendations", json=body)
                assert r.status_code == 422, r.text
                assert r.json()["error"] == code and detail in r.json()["detail"], r.json()
                assert len(r.text) < 1000
            r = await c.post("/v1/recommendations", content=b"", headers=JSON)  # no body at all
            assert r.json() == {"error": "invalid_request", "detail": "body: Field required"}
            raw = json.dumps({"user": u, "k": 2}).replace(str(u["user_mlp"][0]), "NaN", 1)
            r = await c.post("/v1/recommendations", content=raw, headers=JSON)
            assert r.status_code == 422 and "NaN or Inf" in r.json()["detail"]

    with caplog.at_level(logging.DEBUG):
        asyncio.run(go())
    secret = repr(_user()["user_gmf"][1])
    assert secret not in caplog.text  # the user vector is never logged


def test_no_model_yet_gives_503_everywhere() -> None:
    async def go() -> None:
        async with _serve(_settings(), ModelHolder()) as c:
            r = await c.post("/v1/recommendations", json={"user": _user(), "k": 3})
            assert r.status_code == 503 and r.json()["error"] == "no_model"
            h = await c.get("/healthz")
            assert h.status_code == 503 and h.json()["model"] == "none"

    asyncio.run(go())


def test_polling_follows_new_versions_and_keeps_old_on_bad_blob() -> None:
    agg = FakeAggregator()
    agg.publish(1)

    async def go() -> None:
        settings = _settings(aggregator_url="http://agg", poll_interval_s=0.05)
        holder = ModelHolder(labels=LABELS)
        async with _serve(settings, holder, agg.transport()) as c:
            await _wait_for(lambda: holder.version == 1)
            h = (await c.get("/healthz")).json()
            assert h == {
                "status": "ok",
                "model": "loaded",
                "model_version": 1,
                "aggregator": "ok",
                "prior_weight": None,  # this aggregator has no prior route (404): model alone
                "prior": "the aggregator publishes no prior: serving the model alone",
            }
            await asyncio.sleep(0.3)
            assert agg.downloads == 1  # unchanged ETag -> 304, no re-download
            agg.publish(2, blob=b"garbage")
            await _wait_for(lambda: holder.swap_failures >= 1)
            r = await c.post("/v1/recommendations", json={"user": _user(), "k": 2})
            assert r.json()["model_version"] == 1
            agg.publish(3)
            await _wait_for(lambda: holder.version == 3)
            metrics = (await c.get("/metrics")).text
            assert "fedrec_rec_model_version 3.0" in metrics
            assert "fedrec_rec_model_swaps_total 2.0" in metrics
            assert "fedrec_rec_model_swap_failures_total" in metrics
            assert 'fedrec_rec_request_seconds_count{route="/v1/recommendations"' in metrics

    asyncio.run(go())


def test_hot_swap_under_load_loses_no_request() -> None:
    async def go() -> None:
        holder = _loaded_holder(0)
        published = {0}
        swapped_at: dict[int, float] = {}
        async with _serve(_settings(workers=4), holder) as c:
            stop = asyncio.Event()
            answers: list[tuple[float, float, int]] = []

            async def caller(seed: int) -> None:
                while not stop.is_set():
                    t0 = time.monotonic()
                    r = await c.post("/v1/recommendations", json={"user": _user(seed), "k": 5})
                    assert r.status_code == 200, r.text
                    answers.append((t0, time.monotonic(), r.json()["model_version"]))

            async def publisher() -> None:
                for v in range(1, 21):
                    snap = await asyncio.to_thread(holder.build, CFG, init_shared(CFG, v), v)
                    published.add(v)
                    holder.swap(snap)
                    swapped_at[v] = time.monotonic()
                    await asyncio.sleep(0.01)
                stop.set()

            await asyncio.gather(publisher(), *(caller(s) for s in range(16)))
        assert len(answers) > 50
        assert {v for _, _, v in answers} <= published
        for start, _, v in answers:  # a request started after swap to v sees >= v
            newest_before = (
                max(w for w, t in swapped_at.items() if t <= start)
                if any(t <= start for t in swapped_at.values())
                else 0
            )
            assert v >= newest_before
        assert any(v == 20 for _, _, v in answers) or holder.version == 20

    asyncio.run(go())


@pytest.mark.redis
def test_redis_version_event_triggers_swap(redis_url: str) -> None:
    from redis import Redis

    agg = FakeAggregator()
    agg.publish(1)

    async def go() -> None:
        # A poll interval far longer than the test: only the event can cause the swap.
        settings = _settings(
            aggregator_url="http://agg", redis_url=redis_url, poll_interval_s=600.0
        )
        holder = ModelHolder(labels=LABELS)
        async with _serve(settings, holder, agg.transport()) as c:
            await _wait_for(lambda: holder.version == 1)
            agg.publish(2)
            pub = Redis.from_url(redis_url)
            t0 = time.monotonic()
            while holder.version != 2:
                msg = json.dumps({"run_id": 1, "version": 2, "round_id": 2})
                pub.publish("fedrec:versions", msg)
                if time.monotonic() - t0 > 10:
                    raise AssertionError("no swap after the version event")
                await asyncio.sleep(0.1)
            pub.close()
            r = await c.post("/v1/recommendations", json={"user": _user(), "k": 2})
            assert r.json()["model_version"] == 2

    asyncio.run(go())


def test_request_bodies_over_the_bound_are_refused_with_413_unparsed() -> None:
    async def go() -> None:
        async with _serve(_settings(max_body_bytes=4096), _loaded_holder()) as c:
            big = {"user": _user(), "k": 3, "exclude": ["item-1"] * 2000}
            r = await c.post("/v1/recommendations", json=big)
            assert r.status_code == 413, r.text
            assert r.json()["error"] == "body_too_large" and "4096" in r.json()["detail"]

            # a chunked body declares no length: it is counted as it arrives
            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(100):
                    yield b" " * 100

            r = await c.post(
                "/v1/recommendations",
                content=chunks(),
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 413 and r.json()["error"] == "body_too_large", r.text
            # under the bound, as usual
            r = await c.post("/v1/recommendations", json={"user": _user(), "k": 3})
            assert r.status_code == 200, r.text

    asyncio.run(go())


def test_the_default_body_bound_is_one_mebibyte() -> None:
    async def go() -> None:
        async with _serve(_settings(), _loaded_holder()) as c:
            body = json.dumps({"user": _user(), "k": 3, "exclude": [" " * (1 << 20)]})
            r = await c.post(
                "/v1/recommendations", content=body, headers={"content-type": "application/json"}
            )
            assert r.status_code == 413, r.text

    asyncio.run(go())


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"k": "10"}, "k"),
        ({"k": True}, "k"),
        ({"k": 3.0}, "k"),
        ({"exclude": [1]}, "exclude.0"),
        ({"exact": "yes"}, "exact"),
        ({"exact": 1}, "exact"),
        ({"user": {"user_gmf": [True] * 4, "user_mlp": [0.1] * 8}}, "user.user_gmf.0"),
        ({"user": {"user_gmf": ["0.1"] * 4, "user_mlp": [0.1] * 8}}, "user.user_gmf.0"),
    ],
)
def test_request_types_are_strict(change: dict[str, object], where: str) -> None:
    async def go() -> None:
        async with _serve(_settings(), _loaded_holder()) as c:
            body = {"user": _user(), "k": 3, **change}
            r = await c.post("/v1/recommendations", json=body)
            assert r.status_code == 422, r.text
            assert r.json()["error"] == "invalid_request" and where in r.json()["detail"]
            # integers are numbers for a float field
            ints = {n: [1, 0] * (d // 2) for n, d in CFG.private_dims().items()}
            r = await c.post("/v1/recommendations", json={"user": ints, "k": 3})
            assert r.status_code == 200, r.text

    asyncio.run(go())


@pytest.mark.parametrize(("value", "must_overflow"), [(3e38, False), (-3e38, False), (1e39, True)])
def test_a_vector_whose_scores_overflow_is_a_422_never_a_null_score(
    value: float, must_overflow: bool
) -> None:
    """Near float32's largest value, whether a score overflows depends on the order the
    machine's kernels add in (one CPU gave finite scores for -3e38 where another overflowed):
    either way the answer is a 422 or finite scores, never a null. 1e39 is no float32 at all:
    always a 422."""

    async def go() -> None:
        async with _serve(_settings(), _loaded_holder()) as c:
            user = {n: [value] * d for n, d in CFG.private_dims().items()}
            r = await c.post("/v1/recommendations", json={"user": user, "k": 5})
            if r.status_code == 200 and not must_overflow:
                # (a 200 may hold other nulls: "prior_weight" is null without a prior)
                scores = [i["score"] for i in r.json()["items"]]
                assert len(scores) == 5, r.text
                assert all(x is not None and math.isfinite(x) for x in scores), r.text
                return
            assert r.status_code == 422, r.text
            assert r.json()["error"] == "invalid_user_vector", r.json()

    asyncio.run(go())


def test_unknown_paths_and_methods_answer_an_error_body_and_405_names_allowed_methods() -> None:
    async def go() -> None:
        async with _serve(_settings(), _loaded_holder()) as c:
            r = await c.get("/v1/recommendations")
            assert r.status_code == 405 and r.headers["allow"] == "POST", r.headers
            assert r.json()["error"] == "method_not_allowed"
            r = await c.delete("/healthz")
            assert r.status_code == 405 and set(r.headers["allow"].split(", ")) >= {"GET"}
            r = await c.get("/v2/nothing")
            assert r.status_code == 404 and r.json()["error"] == "not_found"

    asyncio.run(go())


@pytest.mark.parametrize("token", ["REPLACE_ME", "changethis", "short-token"])
def test_a_placeholder_aggregator_token_is_refused_unless_in_development(token: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="FEDREC_REC_AGGREGATOR_TOKEN"):
        Settings(aggregator_token=SecretStr(token), workers=1)  # production is the default
    with pytest.raises(ValidationError, match="FEDREC_REC_AGGREGATOR_TOKEN"):
        Settings(environment="test", aggregator_token=SecretStr(token), workers=1)
    assert Settings(
        environment="development", aggregator_token=SecretStr(token), workers=1
    ).aggregator_token
    assert Settings(
        aggregator_token=SecretStr("a-real-reader-token-0123456789"), workers=1
    ).aggregator_token


def test_a_mistyped_redis_url_is_a_settings_error() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="a Redis URL starts with redis://"):
        Settings(environment="development", redis_url="localhost:6379", workers=1)


@pytest.mark.parametrize("port", [-1, 65536])
def test_a_port_outside_tcp_is_a_settings_error(port: int) -> None:
    # uvicorn would otherwise fail after start-up with "Servname not supported"
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="port"):
        Settings(environment="development", port=port, workers=1)


def test_the_server_refuses_a_placeholder_token_with_a_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import subprocess
    import sys

    env = {"FEDREC_REC_AGGREGATOR_TOKEN": "REPLACE_ME", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-m", "services.recommend_api", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "placeholder" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_candidate_stage_settings_reach_the_ranking(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.recommend_api.app import holder_from_settings

    monkeypatch.setenv("FEDREC_REC_ANN_INDEX", "ivf")
    monkeypatch.setenv("FEDREC_REC_ANN_SCAN_CANDIDATES", "1234")
    cfg = holder_from_settings(Settings(aggregator_url=None, workers=1)).config
    assert (cfg.ann_index, cfg.ann_scan_candidates) == ("ivf", 1234)
    shape = cfg.shortlist_config()
    assert (shape.index, shape.scan_candidates) == ("ivf", 1234)
    given = Settings(aggregator_url=None, workers=1, ann_index="auto")  # wins over the env
    assert holder_from_settings(given).config.ann_index == "auto"
    with pytest.raises(ValueError):
        Settings(aggregator_url=None, workers=1, ann_index="hnsw")  # type: ignore[arg-type]


def test_a_refusal_repeated_at_every_poll_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    # before the first run every poll gets the same 404: one warning, not one every 2 s
    from services.recommend_api.follow import ModelFollower

    agg = FakeAggregator()

    async def go() -> None:
        async with httpx.AsyncClient(transport=agg.transport(), base_url="http://agg") as client:
            follower = ModelFollower(ModelHolder(labels=LABELS), client, poll_interval_s=1.0)
            for _ in range(5):
                assert not await follower.refresh()
            agg.publish(1)
            assert await follower.refresh()
            agg.blob = None  # the same refusal again after a success: news again
            assert not await follower.refresh()

    with caplog.at_level(logging.WARNING, logger="services.recommend_api.follow"):
        asyncio.run(go())
    warnings = [r for r in caplog.records if "answered 404" in r.getMessage()]
    assert len(warnings) == 2, [r.getMessage() for r in caplog.records]
