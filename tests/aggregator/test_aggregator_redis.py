"""With Redis: version events are published, and two instances close a round once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from fastapi.testclient import TestClient

from fedrecgel.wire import encode_updates
from services.aggregator.app import create_app
from services.aggregator.events import VERSIONS_CHANNEL, close_lock_name
from tests.aggregator.races import (
    RACE_MODEL,
    RACE_RUN,
    service_of,
    two_instances_close_once,
)
from tests.support.aggregator import (
    FakeClock,
    bearer,
    make_settings,
    operator_headers,
    random_update,
    register,
    sqlite_url,
    upload_headers,
)

pytestmark = pytest.mark.redis


def _events(pubsub: redis.client.PubSub, expect: int, wait_s: float = 5.0) -> list[dict[str, int]]:
    """Messages until ``expect`` arrived (or ``wait_s``), plus any stragglers within 0.3 s."""
    out: list[dict[str, int]] = []
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        msg = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if msg is not None and msg["type"] == "message":
            out.append(json.loads(msg["data"]))
        if len(out) >= expect:
            deadline = min(deadline, time.monotonic() + 0.3)
    return out


def _subscribe(url: str) -> redis.client.PubSub:
    pubsub = redis.Redis.from_url(url).pubsub()
    pubsub.subscribe(VERSIONS_CHANNEL)
    assert pubsub.get_message(timeout=2) is not None  # the subscription confirmation
    return pubsub


def test_a_closed_round_publishes_a_version_event(tmp_path: Path, redis_url: str) -> None:
    pubsub = _subscribe(redis_url)
    app = create_app(make_settings(sqlite_url(tmp_path), redis_url=redis_url))
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok", "database": "ok", "redis": "ok"}
        token = register(client, list(range(20)))
        assert client.post("/v1/runs", json=RACE_RUN, headers=operator_headers()).status_code == 201
        cohort = client.get("/v1/rounds/current", headers=bearer(token)).json()["cohort"]
        rng = np.random.default_rng(0)
        body = encode_updates(1, [random_update(RACE_MODEL, c, rng) for c in cohort])
        assert (
            client.post(
                "/v1/rounds/1/updates", content=body, headers=upload_headers(token)
            ).status_code
            == 200
        )
        run_id = client.get("/v1/rounds/current", headers=bearer(token)).json()["run_id"]
    assert _events(pubsub, 1) == [{"run_id": run_id, "version": 1, "round_id": 1}]


def test_two_instances_on_one_database_and_redis_close_a_round_once(
    tmp_path: Path, redis_url: str
) -> None:
    pubsub = _subscribe(redis_url)
    clock = FakeClock()
    settings = make_settings(sqlite_url(tmp_path), redis_url=redis_url)
    with (
        TestClient(create_app(settings, clock=clock)) as a,
        TestClient(create_app(settings, clock=clock)) as b,
    ):
        two_instances_close_once(a, b, clock)
    assert [e["version"] for e in _events(pubsub, 1)] == [1]


def test_a_held_closing_lock_defers_the_close(tmp_path: Path, redis_url: str) -> None:
    clock = FakeClock()
    settings = make_settings(sqlite_url(tmp_path), redis_url=redis_url, redis_lock_wait_s=0.2)
    with TestClient(create_app(settings, clock=clock)) as client:
        token = register(client, list(range(20)))
        run = client.post("/v1/runs", json=RACE_RUN, headers=operator_headers()).json()
        service = service_of(client)
        lock = redis.Redis.from_url(redis_url).lock(close_lock_name(run["run_id"], 1), timeout=30)
        assert lock.acquire(blocking=False)
        cohort = client.get("/v1/rounds/current", headers=bearer(token)).json()["cohort"]
        rng = np.random.default_rng(0)
        body = encode_updates(1, [random_update(RACE_MODEL, c, rng) for c in cohort])
        # another replica "holds" the round: the in-request close waits briefly, then leaves it
        assert (
            client.post(
                "/v1/rounds/1/updates", content=body, headers=upload_headers(token)
            ).status_code
            == 200
        )
        assert client.get("/v1/rounds/1").json()["state"] == "open"
        lock.release()
        assert service.tick() == "closed"
        assert client.get("/v1/rounds/1").json()["state"] == "closed"


def test_without_redis_rounds_close_and_health_is_degraded(
    tmp_path: Path, redis_server: Any
) -> None:
    """Redis is optional for progress: with it down, /healthz answers 200 "degraded", rounds
    still close (the database's guard alone) and their versions are served; an aggregator
    also starts while it is down (regression: 503 and no round ever closed)."""
    settings = make_settings(sqlite_url(tmp_path), redis_url=redis_server.url)
    with TestClient(create_app(settings)) as client:
        token = register(client, list(range(20)))
        assert client.post("/v1/runs", json=RACE_RUN, headers=operator_headers()).status_code == 201
        redis_server.process.terminate()
        redis_server.process.wait(timeout=10)
        r = client.get("/healthz")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "degraded" and r.json()["database"] == "ok"
        assert r.json()["redis"].startswith("error")
        rng = np.random.default_rng(0)
        for round_id in (1, 2):
            cohort = client.get("/v1/rounds/current", headers=bearer(token)).json()["cohort"]
            body = encode_updates(round_id, [random_update(RACE_MODEL, c, rng) for c in cohort])
            r = client.post(
                f"/v1/rounds/{round_id}/updates", content=body, headers=upload_headers(token)
            )
            assert r.status_code == 200, r.text
            assert client.get(f"/v1/rounds/{round_id}").json()["state"] == "closed"
        latest = client.get("/v1/models/latest", headers=bearer(token))
        assert latest.status_code == 200 and latest.headers["X-Model-Version"] == "2"
    # a restart while Redis is still down: serves, and says it is degraded
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").json()["status"] == "degraded"
        assert client.get("/v1/rounds/2").json()["state"] == "closed"
