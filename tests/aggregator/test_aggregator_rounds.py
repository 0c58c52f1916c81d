"""Round lifecycle: determinism against the simulator, restart, deadlines, quorum, retries."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from fedrecgel.cohort import client_groups, groups_summary, select_cohort
from fedrecgel.model import ModelConfig
from harness.aggregator import AggregatorFactory
from tests.aggregator.scenarios import (
    federated_matches_simulator,
    restart_mid_round_matches_simulator,
)
from tests.support.aggregator import (
    FakeClock,
    bearer,
    current_cohort,
    make_settings,
    operator_headers,
    post_run,
    post_updates,
    random_update,
    register,
    service_of,
    sqlite_url,
)

Clocked = tuple[TestClient, FakeClock, str]
MODEL = ModelConfig(n_items=40, kind="ncf", factor=4, layers=2)
RUN = {
    "n_items": 40,
    "factor": 4,
    "layers": 2,
    "rounds": 2,
    "fraction": 0.3,
    "seed": 1,
    "deadline_s": 30.0,
}


def test_federated_run_over_http_equals_the_simulator(tmp_path: Path) -> None:
    federated_matches_simulator(make_settings(sqlite_url(tmp_path)))


def test_restart_mid_round_resumes_with_acknowledged_updates(tmp_path: Path) -> None:
    restart_mid_round_matches_simulator(lambda: make_settings(sqlite_url(tmp_path)))


@pytest.fixture
def clocked(aggregator: AggregatorFactory) -> Clocked:
    clock = FakeClock()
    client = aggregator(clock=clock)
    return client, clock, register(client, list(range(20)))


def _start(client: TestClient, **overrides: object) -> list[int]:
    post_run(client, {**RUN, **overrides})
    return current_cohort(client)


def _upload(client: TestClient, token: str, round_id: int, ids: list[int]) -> None:
    rng = np.random.default_rng(round_id)
    r = post_updates(client, token, round_id, [random_update(MODEL, c, rng) for c in ids])
    assert r.status_code == 200, r.text


def _tick(client: TestClient) -> str | None:
    return service_of(client).tick()


def test_only_the_upload_that_closes_a_round_is_answered_with_the_next_round(
    clocked: Clocked,
) -> None:
    client, _, token = clocked
    cohort = _start(client)
    rng = np.random.default_rng(0)
    first, last = cohort[:-1], cohort[-1:]
    r = post_updates(client, token, 1, [random_update(MODEL, c, rng) for c in first])
    assert r.status_code == 200 and r.json()["current"] is None  # round 1 still open
    r = post_updates(client, token, 1, [random_update(MODEL, c, rng) for c in last])
    assert r.status_code == 200, r.text
    announced = r.json()["current"]
    polled = client.get("/v1/rounds/current", headers=bearer(token)).json()
    assert announced == polled
    assert (announced["round_id"], announced["state"], announced["model_version"]) == (2, "open", 1)
    # the last round's closing upload answers the finished run
    cohort = current_cohort(client)
    r = post_updates(client, token, 2, [random_update(MODEL, c, rng) for c in cohort])
    assert r.json()["current"]["state"] == "finished"


def test_deadline_with_quorum_closes_with_the_updates_received(clocked: Clocked) -> None:
    client, clock, token = clocked
    cohort = _start(client, quorum=0.5)
    assert len(cohort) == 6
    _upload(client, token, 1, cohort[:3])
    assert _tick(client) is None  # before the deadline nothing happens
    clock.advance(31)
    assert _tick(client) == "closed"
    info = client.get("/v1/rounds/1").json()
    assert info["state"] == "closed" and info["model_version"] == 1
    assert client.get("/v1/runs/current/history").json()["rounds"][0]["n_updates"] == 3
    cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
    assert cur["round_id"] == 2 and cur["attempt"] == 0 and cur["model_version"] == 1


def test_a_round_says_whose_clients_have_not_uploaded_by_shard(
    aggregator: AggregatorFactory,
) -> None:
    """Two shards: shard 0 uploads its cohort members, shard 1 none (a stopped worker). The
    open round counts the missing ones per shard, the round closes without shard 1 at the
    deadline with quorum, and still says whose clients it closed without."""
    clock = FakeClock()
    client = aggregator(clock=clock)
    tokens = [register(client, [u for u in range(20) if u % 2 == s], s, 2) for s in (0, 1)]
    cohort = _start(client, quorum=0.3)
    mine = [c for c in cohort if c % 2 == 0]
    theirs = [c for c in cohort if c % 2 == 1]
    assert mine and theirs
    info = client.get("/v1/rounds/1").json()
    assert info["missing_by_shard"] == {"0/2": len(mine), "1/2": len(theirs)}
    _upload(client, tokens[0], 1, mine)
    info = client.get("/v1/rounds/1").json()
    assert info["state"] == "open" and info["missing_by_shard"] == {"1/2": len(theirs)}
    clock.advance(31)
    assert _tick(client) == "closed"
    info = client.get("/v1/rounds/1").json()
    assert info["state"] == "closed" and info["missing_by_shard"] == {"1/2": len(theirs)}
    # the next round, complete: nobody missing once it closed
    nxt = current_cohort(client)
    for shard in (0, 1):
        _upload(client, tokens[shard], 2, [c for c in nxt if c % 2 == shard])
    info = client.get("/v1/rounds/2").json()
    assert info["state"] == "closed" and info["missing_by_shard"] == {}


def test_below_quorum_at_deadline_retries_with_a_new_cohort(clocked: Clocked) -> None:
    client, clock, token = clocked
    cohort = _start(client, quorum=1.0)
    _upload(client, token, 1, cohort[:2])
    clock.advance(31)
    assert _tick(client) == "retried"
    cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
    assert cur["round_id"] == 1 and cur["attempt"] == 1 and cur["model_version"] == 0
    want = select_cohort(np.arange(20), 0.3, 1, 1, 1).tolist()
    assert cur["cohort"] == want
    info = client.get("/v1/rounds/1").json()
    assert info["attempt"] == 1 and info["updates_received"] == 0  # failed attempt dropped
    models = client.get("/v1/models/latest", headers=bearer(token))
    assert models.headers["X-Model-Version"] == "0"
    _upload(client, token, 1, want)
    assert client.get("/v1/rounds/1").json()["state"] == "closed"


def test_a_run_with_cohort_groups_draws_whole_groups(
    clocked: Clocked, caplog: pytest.LogCaptureFixture
) -> None:
    client, _, _ = clocked
    with caplog.at_level(logging.INFO, logger="services.aggregator.runs"):
        cohort = _start(client, fraction=0.5, cohort_groups=4)
    # the operator reads how large the groups are (and of clients alone in theirs)
    assert groups_summary(np.arange(20), 4, 1) in caplog.text
    want = select_cohort(np.arange(20), 0.5, 1, 1, groups=4).tolist()
    assert cohort == want
    groups = client_groups(np.arange(20), 4, 1)
    drawn = set(groups[cohort].tolist())
    assert len(drawn) == 2 and cohort == [c for c in range(20) if groups[c] in drawn]


def test_nothing_received_at_deadline_retries(clocked: Clocked) -> None:
    client, clock, _ = clocked
    _start(client, quorum=0.0)
    clock.advance(31)
    assert _tick(client) == "retried"
    assert client.get("/v1/rounds/1").json()["attempt"] == 1


def test_paused_round_does_not_close_at_its_deadline(clocked: Clocked) -> None:
    client, clock, token = clocked
    cohort = _start(client, quorum=0.5)
    _upload(client, token, 1, cohort[:3])
    client.post("/v1/runs/current/pause", headers=operator_headers())
    clock.advance(100)
    assert _tick(client) is None
    assert client.get("/v1/rounds/1").json()["state"] == "paused"
    client.post("/v1/runs/current/resume", headers=operator_headers())
    assert _tick(client) is None  # a fresh deadline after resuming
    clock.advance(31)
    assert _tick(client) == "closed"


def test_last_round_finishes_the_run(clocked: Clocked) -> None:
    client, _, token = clocked
    cohort = _start(client, rounds=1)
    _upload(client, token, 1, cohort)
    cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
    assert cur["state"] == "finished" and cur["model_version"] == 1
    # the lost-answer retry of the very last upload is still only a duplicate
    rng = np.random.default_rng(1)
    retry = post_updates(client, token, 1, [random_update(MODEL, c, rng) for c in cohort])
    assert retry.status_code == 200
    assert {x["status"] for x in retry.json()["results"]} == {"duplicate"}
    # a finished run no longer blocks a new one
    post_run(client, RUN)


class TickRecorder:
    """Stands in for the service's ``tick`` and records the outcome of every call the app's
    deadline task makes."""

    def __init__(self, tick: Callable[[], str | None]) -> None:
        self._tick = tick
        self.outcomes: list[str | None] = []
        self._changed = threading.Condition()

    def __call__(self) -> str | None:
        outcome = self._tick()
        with self._changed:
            self.outcomes.append(outcome)
            self._changed.notify_all()
        return outcome

    def wait_for(self, done: Callable[[list[str | None]], bool], timeout_s: float = 60.0) -> None:
        """Block until ``done(outcomes)``; a generous bound, not a timing claim."""
        with self._changed:
            assert self._changed.wait_for(lambda: done(self.outcomes), timeout_s), self.outcomes


def test_background_task_closes_and_retries_at_the_deadline(
    aggregator: AggregatorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's own deadline task (polling every 50 ms; the test never ticks) leaves a round
    open before its deadline, closes it with quorum once the deadline has passed, and retries
    the next one when nothing came. The clock only moves when the test moves it, so what
    happens does not depend on how fast the machine runs."""
    clock = FakeClock()
    client = aggregator(clock=clock, deadline_poll_s=0.05)
    service = service_of(client)
    ticks = TickRecorder(service.tick)
    monkeypatch.setattr(service, "tick", ticks)
    token = register(client, list(range(20)))
    cohort = _start(client, quorum=0.5)  # a 30 s deadline on the fake clock
    _upload(client, token, 1, cohort[:4])
    seen = len(ticks.outcomes)
    ticks.wait_for(lambda out: len(out) >= seen + 3)  # three checks after the upload
    assert ticks.outcomes[seen:] == [None] * (len(ticks.outcomes) - seen)
    assert client.get("/v1/rounds/1").json()["state"] == "open"

    clock.advance(31)
    ticks.wait_for(lambda out: "closed" in out)
    info = client.get("/v1/rounds/1").json()
    assert info["state"] == "closed" and info["model_version"] == 1
    assert client.get("/v1/runs/current/history").json()["rounds"][0]["n_updates"] == 4
    cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
    assert cur["round_id"] == 2 and cur["attempt"] == 0

    clock.advance(31)  # round 2's deadline passes with nothing received
    ticks.wait_for(lambda out: "retried" in out)
    cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
    assert cur["round_id"] == 2 and cur["attempt"] == 1 and cur["state"] == "open"


def test_an_earlier_runs_models_answer_by_run_id(clocked: Clocked) -> None:
    """``/v1/models/{v}`` serves the newest run; ``/v1/runs/{id}/models/{v}`` any run's, an
    earlier one's too, with the same bytes and ETag as when it was the newest."""
    client, _, token = clocked
    cohort = _start(client, rounds=1)
    _upload(client, token, 1, cohort)
    first = client.get("/v1/models/1", headers=bearer(token))
    assert first.status_code == 200
    post_run(client, {**RUN, "seed": 2})  # run 2: version 0 only
    assert client.get("/v1/models/1", headers=bearer(token)).status_code == 404
    again = client.get("/v1/runs/1/models/1", headers=bearer(token))
    assert again.status_code == 200 and again.content == first.content
    assert again.headers["ETag"] == first.headers["ETag"]
    assert again.headers["X-Model-Version"] == "1"
    etag = {"If-None-Match": first.headers["ETag"], **bearer(token)}
    assert client.get("/v1/runs/1/models/1", headers=etag).status_code == 304
    run2 = client.get("/v1/runs/2/models/0", headers=bearer(token))
    assert run2.content == client.get("/v1/models/0", headers=bearer(token)).content
    missing = client.get("/v1/runs/1/models/5", headers=bearer(token))
    assert missing.status_code == 404 and "model version 5" in missing.text
    no_run = client.get("/v1/runs/9/models/0", headers=bearer(token))
    assert no_run.status_code == 404 and "run 9 does not exist" in no_run.text
    assert client.get("/v1/runs/0/models/0", headers=bearer(token)).status_code == 422
    assert client.get("/v1/runs/1/models/1").status_code == 401
