"""With Redis: version events are published, and two instances close a round once."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from harness.aggregator import AggregatorFactory
from services.aggregator.events import (
    CREDENTIALS_CHANNEL,
    VERSIONS_CHANNEL,
    RedisBus,
    close_lock_name,
)
from services.aggregator.settings import Settings
from tests.aggregator.races import start_race_run, two_instances_close_once, upload_whole_cohort
from tests.support.aggregator import (
    FakeClock,
    bearer,
    operator_headers,
    register,
    report_sums,
    service_of,
)
from tests.support.loopback import REDIS_MISSING, free_port, stop_process, wait_for_port

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


def test_a_closed_round_publishes_a_version_event(
    aggregator: AggregatorFactory, redis_url: str
) -> None:
    pubsub = _subscribe(redis_url)
    client = aggregator(redis_url=redis_url)
    assert client.get("/healthz").json() == {"status": "ok", "database": "ok", "redis": "ok"}
    token, _ = start_race_run(client)
    upload_whole_cohort(client, token, 1, np.random.default_rng(0))
    run_id = client.get("/v1/rounds/current", headers=bearer(token)).json()["run_id"]
    aggregator.stop(client)
    assert _events(pubsub, 1) == [{"run_id": run_id, "version": 1, "round_id": 1}]


def test_two_instances_on_one_database_and_redis_close_a_round_once(
    aggregator: AggregatorFactory, redis_url: str
) -> None:
    pubsub = _subscribe(redis_url)
    clock = FakeClock()
    a, b = (
        aggregator(clock=clock, database_url=aggregator.url(), redis_url=redis_url) for _ in "ab"
    )
    two_instances_close_once(a, b, clock)
    aggregator.stop_all()
    assert [e["version"] for e in _events(pubsub, 1)] == [1]


def test_a_held_closing_lock_defers_the_close(
    aggregator: AggregatorFactory, redis_url: str
) -> None:
    client = aggregator(clock=FakeClock(), redis_url=redis_url, redis_lock_wait_s=0.2)
    token, run = start_race_run(client)
    lock = redis.Redis.from_url(redis_url).lock(close_lock_name(run["run_id"], 1), timeout=30)
    assert lock.acquire(blocking=False)
    # another replica "holds" the round: the in-request close waits briefly, then leaves it
    upload_whole_cohort(client, token, 1, np.random.default_rng(0))
    assert client.get("/v1/rounds/1").json()["state"] == "open"
    lock.release()
    assert service_of(client).tick() == "closed"
    assert client.get("/v1/rounds/1").json()["state"] == "closed"


#: a replica that takes a round's closing lock and then waits inside its close
_HOLDER = """
import sys, time
from services.aggregator.events import RedisBus
bus = RedisBus(sys.argv[1], float(sys.argv[2]))
with bus.close_lock(int(sys.argv[3]), 1) as held:
    print("held" if held else "not held", flush=True)
    time.sleep(600)
"""


def test_a_replica_killed_while_closing_holds_the_round_up_for_the_lock_timeout_only(
    aggregator: AggregatorFactory, redis_url: str
) -> None:
    """A replica SIGKILLed inside a close leaves its closing lock in Redis; the other replicas
    close the round once it expires. Its default lifetime was 60 s, so a dead replica stalled
    the run for a minute: now it is 10 s, renewed while a live close runs."""
    default = Settings.model_fields["redis_lock_timeout_s"].default
    client = aggregator(clock=FakeClock(), redis_url=redis_url, redis_lock_wait_s=0.2)
    token, run = start_race_run(client)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, redis_url, str(default), str(run["run_id"])],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    finally:
        holder.kill()
        holder.wait()
    killed = time.monotonic()
    upload_whole_cohort(client, token, 1, np.random.default_rng(0))
    assert client.get("/v1/rounds/1").json()["state"] == "open"  # the dead replica's lock
    outcome, began = None, killed
    while outcome != "closed" and time.monotonic() - killed < 30:
        time.sleep(0.2)
        began = time.monotonic()  # the close itself takes seconds on a busy machine
        outcome = service_of(client).tick()
    waited = began - killed
    assert outcome == "closed" and waited < default + 3, (outcome, waited)
    assert client.get("/v1/rounds/1").json()["state"] == "closed"


def test_a_close_that_outlasts_the_lock_timeout_keeps_its_lock(redis_url: str) -> None:
    """The lock of a live close is renewed: a close longer than ``redis_lock_timeout_s`` (a
    large model on a busy machine) is not joined by a second replica halfway."""
    bus, other = RedisBus(redis_url, 0.6, 0.0), RedisBus(redis_url, 0.6, 0.0)
    with bus.close_lock(7, 1) as held:
        assert held
        time.sleep(2.0)
        with other.close_lock(7, 1) as also:
            assert not also
    with other.close_lock(7, 1) as after:  # released at the end of the close
        assert after


def _refused_within(client: Any, headers: dict[str, str], wait_s: float) -> float | None:
    """Seconds until ``client`` refuses ``headers`` (401) on a client read, None if it
    still accepts them after ``wait_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait_s:
        if client.get("/v1/rounds/current", headers=headers).status_code == 401:
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def test_a_release_on_one_replica_takes_effect_on_the_others_at_once(
    aggregator: AggregatorFactory, redis_url: str
) -> None:
    """Each replica keeps the credentials it answered for in memory; the operator's release
    on one replica used to leave the released token working on the others for up to 30 s
    (their cache's lifetime), long enough for it to upload for users a new worker
    registered meanwhile. Now the release is announced on Redis and every replica forgets
    its cache."""
    url = aggregator.url()
    a, b = (aggregator(database_url=url, redis_url=redis_url) for _ in "ab")
    token = register(a, [0, 1, 2])
    assert b.get("/v1/rounds/current", headers=bearer(token)).status_code == 200  # b caches it
    released = a.post(
        "/v1/clients/release", json={"client_ids": [0, 1, 2]}, headers=operator_headers()
    )
    assert released.status_code == 200, released.text
    assert a.get("/v1/rounds/current", headers=bearer(token)).status_code == 401
    waited = _refused_within(b, bearer(token), wait_s=5.0)
    assert waited is not None and waited < 2.0, waited
    # registered again under a new token through b, the ids work through a at once
    new = register(b, [0, 1, 2])
    assert a.get("/v1/rounds/current", headers=bearer(new)).status_code == 200
    assert _refused_within(a, bearer(token), wait_s=0.5) is not None


def test_clients_added_to_a_token_on_one_replica_are_its_own_on_the_others_at_once(
    aggregator: AggregatorFactory, redis_url: str
) -> None:
    """A worker that registers more users under the token it chose (through any replica)
    holds them on every replica at once, not once the others' cached copy of its token
    expired (403 not_owned until then)."""
    url = aggregator.url()
    a, b = (aggregator(database_url=url, redis_url=redis_url) for _ in "ab")
    chosen = secrets.token_urlsafe(32)
    register(a, [0, 1], token=chosen)
    report = {"model_version": 0, "sums": report_sums(1.0), "count": 1, "client_ids": [2]}
    refused = b.post("/v1/evaluations", json=report, headers=bearer(chosen))
    assert refused.status_code == 403, refused.text  # b caches the token: clients 0 and 1
    register(a, [2], token=chosen)
    deadline = time.monotonic() + 2.0
    while (
        answer := b.post("/v1/evaluations", json=report, headers=bearer(chosen))
    ).status_code == 403:
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.05)
    assert answer.json()["error"] == "no_run", answer.text  # past the ownership check


def test_without_redis_rounds_close_and_health_is_degraded(
    aggregator: AggregatorFactory, redis_server: Any
) -> None:
    """Redis is optional for progress: with it down, /healthz answers 200 "degraded", rounds
    still close (the database's guard alone) and their versions are served; an aggregator
    also starts while it is down (regression: 503 and no round ever closed)."""
    url = aggregator.url()
    client = aggregator(database_url=url, redis_url=redis_server.url)
    token, _ = start_race_run(client)
    redis_server.process.terminate()
    redis_server.process.wait(timeout=10)
    r = client.get("/healthz")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "degraded" and r.json()["database"] == "ok"
    assert r.json()["redis"].startswith("error")
    rng = np.random.default_rng(0)
    for round_id in (1, 2):
        upload_whole_cohort(client, token, round_id, rng)
        assert client.get(f"/v1/rounds/{round_id}").json()["state"] == "closed"
    latest = client.get("/v1/models/latest", headers=bearer(token))
    assert latest.status_code == 200 and latest.headers["X-Model-Version"] == "2"
    aggregator.stop(client)
    # a restart while Redis is still down: serves, and says it is degraded
    client = aggregator(database_url=url, redis_url=redis_server.url)
    assert client.get("/healthz").json()["status"] == "degraded"
    assert client.get("/v1/rounds/2").json()["state"] == "closed"


def _redis_on(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip(REDIS_MISSING)
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
    proc = subprocess.Popen(
        [*cmd, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert wait_for_port(port), "redis-server did not start"
    return proc


def _until(calls: list[float], n: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while len(calls) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(calls) >= n


def test_credentials_are_followed_again_when_redis_comes_back(tmp_path: Path) -> None:
    """The credentials follower subscribes again by the retry policy (services/retry.py)
    after Redis went away and came back on the same address (each subscription tells the
    replica to forget its cached credentials), and stops at once when closed while Redis is
    away."""
    port = free_port()
    server = _redis_on(port, tmp_path)
    bus = RedisBus(f"redis://127.0.0.1:{port}/0")
    calls: list[float] = []
    try:
        bus.follow_credentials(lambda: calls.append(time.monotonic()))
        assert _until(calls, 1, 10.0)  # the subscription's confirmation
        stop_process(server)
        time.sleep(1.5)  # away: the follower's tries fail, each wait longer
        server = _redis_on(port, tmp_path)
        assert _until(calls, 2, 15.0), "not subscribed again"
        redis.Redis(port=port).publish(CREDENTIALS_CHANNEL, b"changed")
        assert _until(calls, 3, 5.0), "the announcement after coming back was missed"
        stop_process(server)
        time.sleep(0.5)
        followers = list(bus._followers)
        t0 = time.monotonic()
        bus.close()  # while Redis is away: no retry outlives it
        assert time.monotonic() - t0 < 3.0
        assert followers and not any(f._thread.is_alive() for f in followers)
    finally:
        bus.close()
        stop_process(server)
