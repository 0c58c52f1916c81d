"""A round's deadline counts only time an aggregator was running (services/aggregator/
deadlines.py): a restart after longer than the deadline continues the same attempt with the
same cohort; while an aggregator runs (a replica), or once it is back, deadlines expire as
before."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
from fastapi.testclient import TestClient

from fedrecgel.model import ModelConfig
from fedrecgel.wire import encode_updates
from harness.aggregator import AggregatorFactory
from tests.support.aggregator import (
    FakeClock,
    current_cohort,
    operator_headers,
    post_run,
    random_update,
    register,
    service_of,
    upload_headers,
)

MODEL = ModelConfig(n_items=50, kind="ncf", factor=4, layers=2)
RUN = {"n_items": 50, "factor": 4, "layers": 2, "rounds": 2, "fraction": 0.5, "seed": 3}
N_CLIENTS = 24
DEADLINE_S = 10.0
#: the deadline task runs (every second, on the fake clock): its marks say an aggregator runs
POLL_S = 1.0


def _upload(client: TestClient, token: str, clients: list[int]) -> None:
    rng = np.random.default_rng(0)
    for c in clients:
        body = encode_updates(1, [random_update(MODEL, c, rng)])
        r = client.post("/v1/rounds/1/updates", content=body, headers=upload_headers(token))
        assert r.status_code == 200, r.text


def _current(client: TestClient) -> dict[str, object]:
    body: dict[str, object] = client.get("/v1/rounds/current", headers=operator_headers()).json()
    return body


def _deadline(client: TestClient) -> datetime:
    return datetime.fromisoformat(str(_current(client)["deadline"]))


def _started(aggregator: AggregatorFactory, clock: FakeClock) -> tuple[TestClient, str, list[int]]:
    client = aggregator(clock=clock, database_url=aggregator.url(), deadline_poll_s=POLL_S)
    token = register(client, list(range(N_CLIENTS)))
    post_run(client, {**RUN, "deadline_s": DEADLINE_S, "quorum": 1.0})
    return client, token, current_cohort(client)


def test_a_restart_after_longer_than_the_deadline_continues_the_same_attempt(
    aggregator: AggregatorFactory,
) -> None:
    clock = FakeClock()
    client, token, cohort = _started(aggregator, clock)
    _upload(client, token, cohort[:3])
    clock.advance(4)
    assert service_of(client).tick() is None  # marks the round alive at 4 s
    before = _deadline(client)
    aggregator.stop(client)  # the aggregator is gone for 50 s, five deadlines
    clock.advance(50)
    client = aggregator(clock=clock, database_url=aggregator.url(), deadline_poll_s=POLL_S)
    after = _current(client)
    assert (after["round_id"], after["attempt"], after["state"]) == (1, 0, "open")
    assert sorted(after["cohort"]) == sorted(cohort)  # type: ignore[call-overload]
    assert _deadline(client) == before + timedelta(seconds=50)
    assert service_of(client).tick() is None
    clock.advance(5)
    service_of(client).tick()
    assert _current(client)["attempt"] == 0  # 9 s of the 10 have run
    _upload(client, token, cohort[3:])  # the last one closes the round
    service_of(client).tick()
    history = client.get("/v1/runs/current/history").json()["rounds"]
    assert [(r["round_id"], r["n_updates"]) for r in history] == [(1, len(cohort))]
    assert client.get("/v1/rounds/1").json()["attempt"] == 0


def test_after_a_restart_the_deadline_expires_with_the_uptime(
    aggregator: AggregatorFactory,
) -> None:
    clock = FakeClock()
    client, token, cohort = _started(aggregator, clock)
    _upload(client, token, cohort[:3])
    clock.advance(4)
    service_of(client).tick()  # marks the round alive at 4 s
    aggregator.stop(client)
    clock.advance(30)
    client = aggregator(clock=clock, database_url=aggregator.url(), deadline_poll_s=POLL_S)
    for _ in range(5):
        clock.advance(1)
        service_of(client).tick()  # marks it alive each second
        assert _current(client)["attempt"] == 0
    clock.advance(1.5)  # 4 + 6.5 s of uptime: past the 10 s
    service_of(client).tick()  # (or the deadline task did)
    assert _current(client)["attempt"] == 1


def test_a_restart_while_a_replica_ran_moves_nothing(aggregator: AggregatorFactory) -> None:
    clock = FakeClock()
    a, _, _ = _started(aggregator, clock)
    b = aggregator(clock=clock, database_url=aggregator.url(), deadline_poll_s=POLL_S)
    before = _deadline(a)
    aggregator.stop(a)
    for _ in range(8):  # the replica b runs the deadline task meanwhile
        clock.advance(1)
        service_of(b).tick()
    c = aggregator(
        clock=clock, database_url=aggregator.url(), deadline_poll_s=POLL_S
    )  # a's restart
    assert _deadline(c) == before
    clock.advance(2.5)
    service_of(c).tick()  # (or the deadline task did)
    assert _current(c)["attempt"] == 1


def test_a_resumed_round_is_not_moved_by_its_pause(aggregator: AggregatorFactory) -> None:
    clock = FakeClock()
    client, _, _ = _started(aggregator, clock)
    assert client.post("/v1/runs/current/pause", headers=operator_headers()).status_code == 200
    clock.advance(100)
    assert client.post("/v1/runs/current/resume", headers=operator_headers()).status_code == 200
    resumed = _deadline(client)
    assert resumed == clock() + timedelta(seconds=DEADLINE_S)
    aggregator.stop(client)
    client = aggregator(clock=clock, database_url=aggregator.url(), deadline_poll_s=POLL_S)
    assert _deadline(client) == resumed
