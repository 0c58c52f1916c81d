"""Upload ingest: group commit, the per-round counter, the cached run, and their invariants."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import text

from fedrecgel.model import ModelConfig
from fedrecgel.wire import encode_updates
from harness.aggregator import AggregatorFactory
from services.aggregator.errors import AggregatorError, Conflict, Forbidden
from services.aggregator.groupcommit import GroupCommit
from services.aggregator.schemas import UploadResult
from services.aggregator.service import AggregatorService, Caller
from tests.aggregator.migrating import at_revision
from tests.support.aggregator import (
    FakeClock,
    current_cohort,
    operator_headers,
    post_run,
    random_update,
    register,
    service_of,
    sqlite_url,
    upload_headers,
)

MODEL = ModelConfig(n_items=50, kind="ncf", factor=4, layers=2)
RUN = {"n_items": 50, "factor": 4, "layers": 2, "rounds": 2, "fraction": 1.0, "seed": 3}
N_CLIENTS = 24


# ----------------------------------------------------------------------------- GroupCommit


def test_group_commit_batches_concurrent_submits_and_answers_each() -> None:
    batches: list[list[int]] = []

    def commit(items: Sequence[int]) -> list[int | Exception]:
        batches.append(list(items))
        time.sleep(0.02)  # a slow "fsync": the others queue up meanwhile
        return [i * 10 for i in items]

    gc: GroupCommit[int, int] = GroupCommit(commit)
    results: dict[int, int] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, gc.submit(i))) for i in range(40)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: i * 10 for i in range(40)}
    assert sorted(i for b in batches for i in b) == list(range(40))  # each item exactly once
    assert len(batches) < 40 and gc.batches == len(batches) and gc.items == 40


def test_group_commit_refuses_one_item_without_failing_the_others() -> None:
    gate = threading.Event()

    def commit(items: Sequence[int]) -> list[int | Exception]:
        if 0 in items:
            gate.wait(5)  # hold the first batch so that the rest form one batch
        return [ValueError(f"bad {i}") if i == 3 else i for i in items]

    gc: GroupCommit[int, int] = GroupCommit(commit)
    out: dict[int, object] = {}

    def submit(i: int) -> None:
        try:
            out[i] = gc.submit(i)
        except ValueError as err:
            out[i] = err

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    time.sleep(0.05)
    rest = [threading.Thread(target=submit, args=(i,)) for i in range(1, 6)]
    for t in rest:
        t.start()
    time.sleep(0.05)
    gate.set()
    for t in [first, *rest]:
        t.join()
    assert isinstance(out.pop(3), ValueError)
    assert out == {0: 0, 1: 1, 2: 2, 4: 4, 5: 5}
    assert gc.batches == 2


def test_a_failed_batch_transaction_is_retried_item_by_item() -> None:
    calls: list[list[int]] = []

    def commit(items: Sequence[int]) -> list[int | Exception]:
        calls.append(list(items))
        if 2 in items:
            raise RuntimeError("rolled back")  # e.g. an IntegrityError of one item
        return list(items)

    gc: GroupCommit[int, int] = GroupCommit(commit)
    outcomes = gc._run([1, 2, 3])
    assert outcomes[0] == 1 and outcomes[2] == 3 and isinstance(outcomes[1], RuntimeError)
    assert calls == [[1, 2, 3], [1], [2], [3]]


# ----------------------------------------------------------------------------- the service


@pytest.fixture
def app(aggregator: AggregatorFactory) -> tuple[TestClient, AggregatorService, str]:
    client = aggregator(database_url=aggregator.url())
    token = register(client, list(range(N_CLIENTS)))
    return client, service_of(client), token


def _start(client: TestClient, **overrides: object) -> list[int]:
    post_run(client, {**RUN, **overrides})
    return current_cohort(client)


def _body(client_id: int, round_id: int = 1, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed * 1000 + client_id)
    return encode_updates(round_id, [random_update(MODEL, client_id, rng)])


def _slow_writer(service: AggregatorService, delay: float = 0.03) -> list[int]:
    """Slow every batch down (so concurrent uploads queue up); returns the batch sizes."""
    sizes: list[int] = []
    original: Callable[[Sequence[Any]], list[Any]] = service.ingest.writer._commit_batch

    def slow(items: Sequence[Any]) -> list[Any]:
        sizes.append(len(items))
        time.sleep(delay)
        return original(items)

    service.ingest.writer._commit_batch = slow
    return sizes


def _upload_concurrently(
    service: AggregatorService, bodies: dict[int, bytes], round_id: int = 1
) -> dict[int, list[UploadResult] | AggregatorError]:
    caller = Caller(frozenset(range(N_CLIENTS)))
    out: dict[int, list[UploadResult] | AggregatorError] = {}
    barrier = threading.Barrier(len(bodies))

    def upload(key: int, body: bytes) -> None:
        barrier.wait()
        try:
            out[key] = service.ingest.accept(caller, round_id, body)
        except AggregatorError as err:
            out[key] = err

    threads = [threading.Thread(target=upload, args=kv) for kv in bodies.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _counts(db_path: Path) -> list[tuple[int, int, int]]:
    """(round pk, updates_received, COUNT of stored updates) of every round attempt."""
    with sqlite3.connect(db_path) as conn:
        return list(
            conn.execute(
                "SELECT r.id, r.updates_received, "
                "(SELECT COUNT(*) FROM updates u WHERE u.round_pk = r.id) FROM rounds r"
            )
        )


def test_concurrent_uploads_are_all_acknowledged_stored_and_close_the_round(
    app: tuple[TestClient, AggregatorService, str], tmp_path: Path
) -> None:
    client, service, _ = app
    cohort = _start(client)
    assert len(cohort) == N_CLIENTS
    sizes = _slow_writer(service)
    out = _upload_concurrently(service, {c: _body(c) for c in cohort})
    assert all(not isinstance(r, Exception) for r in out.values()), out
    assert {c: [x.status for x in r] for c, r in out.items()} == {  # type: ignore[union-attr]
        c: ["accepted"] for c in cohort
    }
    assert sum(sizes) == N_CLIENTS and max(sizes) > 1  # some uploads shared a commit
    history = client.get("/v1/runs/current/history").json()["rounds"]
    assert history[0]["n_updates"] == N_CLIENTS  # the last upload closed the round
    assert all(counter == rows for _, counter, rows in _counts(tmp_path / "aggregator.db"))


def test_refused_uploads_in_a_batch_do_not_fail_the_others(
    app: tuple[TestClient, AggregatorService, str], tmp_path: Path
) -> None:
    client, service, token = app
    cohort = _start(client, fraction=0.5)
    outsider = next(c for c in range(N_CLIENTS) if c not in cohort)
    first, fresh = cohort[0], cohort[1:5]
    r = client.post("/v1/rounds/1/updates", content=_body(first), headers=upload_headers(token))
    assert r.status_code == 200
    sizes = _slow_writer(service, delay=0.2)
    bodies = {c: _body(c) for c in fresh}
    bodies[first] = _body(first, seed=1)  # a different update: conflict
    bodies[outsider] = _body(outsider)  # not in the cohort
    bodies[-1] = _body(first)  # the same update again: duplicate
    out = _upload_concurrently(service, bodies)
    conflict, foreign = out[first], out[outsider]
    assert isinstance(conflict, Conflict) and conflict.code == "conflicting_update"
    assert isinstance(foreign, Forbidden) and foreign.code == "not_in_cohort"
    assert [x.status for x in out[-1]] == ["duplicate"]  # type: ignore[union-attr]
    for c in fresh:
        assert [x.status for x in out[c]] == ["accepted"]  # type: ignore[union-attr]
    assert max(sizes) >= 3  # the refused and accepted uploads shared a transaction
    assert client.get("/v1/rounds/1").json()["updates_received"] == 1 + len(fresh)
    assert all(counter == rows for _, counter, rows in _counts(tmp_path / "aggregator.db"))


def test_counter_follows_the_rows_through_a_retried_attempt(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    clock = FakeClock()
    client = aggregator(clock=clock, database_url=aggregator.url())
    token = register(client, list(range(N_CLIENTS)))
    cohort = _start(client, quorum=0.9, deadline_s=10)
    for c in cohort[:3]:
        r = client.post("/v1/rounds/1/updates", content=_body(c), headers=upload_headers(token))
        assert r.status_code == 200
    assert _counts(tmp_path / "aggregator.db") == [(1, 3, 3)]
    clock.advance(11)
    assert service_of(client).tick() == "retried"
    assert _counts(tmp_path / "aggregator.db") == [(1, 0, 0), (2, 0, 0)]


def test_acknowledged_batched_uploads_survive_a_restart(aggregator: AggregatorFactory) -> None:
    client = aggregator(database_url=aggregator.url())
    token = register(client, list(range(N_CLIENTS)))
    cohort = _start(client)
    service = service_of(client)
    _slow_writer(service)
    half = cohort[: N_CLIENTS // 2]
    out = _upload_concurrently(service, {c: _body(c) for c in half})
    assert all(not isinstance(r, Exception) for r in out.values())
    aggregator.stop(client)
    client = aggregator(database_url=aggregator.url())  # a fresh process on the same database
    assert client.get("/v1/rounds/1").json()["updates_received"] == len(half)
    for c in cohort:
        r = client.post("/v1/rounds/1/updates", content=_body(c), headers=upload_headers(token))
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["status"] == ("duplicate" if c in half else "accepted")
    history = client.get("/v1/runs/current/history").json()["rounds"]
    assert history[0]["n_updates"] == N_CLIENTS


def test_a_run_started_by_a_replica_is_picked_up_by_a_stale_cache(
    aggregator: AggregatorFactory,
) -> None:
    a, b = aggregator(database_url=aggregator.url()), aggregator(database_url=aggregator.url())
    token = register(a, list(range(N_CLIENTS)))
    cohort = _start(a)
    r = a.post("/v1/rounds/1/updates", content=_body(cohort[0]), headers=upload_headers(token))
    assert r.status_code == 200  # a now caches run 1
    assert b.post("/v1/runs/current/stop", headers=operator_headers()).status_code == 200
    bigger = {**RUN, "n_items": 60}
    assert b.post("/v1/runs", json=bigger, headers=operator_headers()).status_code == 201
    rng = np.random.default_rng(0)
    body = encode_updates(1, [random_update(ModelConfig(60, "ncf", 4, 2), cohort[1], rng)])
    r = a.post("/v1/rounds/1/updates", content=body, headers=upload_headers(token))
    assert r.status_code == 200, r.text  # decoded again with run 2's model
    assert a.get("/v1/rounds/1").json()["updates_received"] == 1


def test_migration_0002_backfills_the_counter_and_downgrades(tmp_path: Path) -> None:
    with at_revision(sqlite_url(tmp_path), "0001") as (conn, cfg):
        conn.execute(
            text(
                "INSERT INTO rounds (id, run_id, round_id, attempt, state, cohort, base_version,"
                " opened_at, deadline) VALUES (1, 1, 1, 0, 'open', '[1,2]', 0, '2025-01-01',"
                " '2025-01-02')"
            )
        )
        for c in (1, 2):
            conn.execute(
                text(
                    "INSERT INTO updates (round_pk, run_id, round_id, client_id, digest,"
                    " n_samples, loss, blob, created_at) VALUES (1, 1, 1, :c, 'd', 1, 0, x'00',"
                    " '2025-01-01')"
                ),
                {"c": c},
            )
        command.upgrade(cfg, "head")
        assert conn.execute(text("SELECT updates_received FROM rounds")).scalar_one() == 2
        command.downgrade(cfg, "0001")
        columns = [row[1] for row in conn.execute(text("PRAGMA table_info(rounds)"))]
        assert "updates_received" not in columns
        command.upgrade(cfg, "head")
