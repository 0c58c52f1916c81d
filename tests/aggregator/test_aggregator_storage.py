"""Bounded storage: closed rounds keep update metadata only, old model versions are pruned by
the retention policy (410 when read), and the SQLite file really shrinks after compaction."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import text

from fedrecgel.model import ModelConfig
from fedrecgel.wire import decode_model, encode_updates
from harness.aggregator import AggregatorFactory
from services.aggregator.db import Database
from services.aggregator.settings import Settings
from services.aggregator.storage import Compactor, RetentionPolicy, StorageKeeper
from tests.aggregator.migrating import alembic_connection, at_revision
from tests.support.aggregator import (
    bearer,
    operator_headers,
    post_run,
    random_update,
    register,
    service_of,
    sqlite_url,
    upload_headers,
)

MODEL = ModelConfig(n_items=300, kind="ncf", factor=8, layers=2)
RUN = {"n_items": 300, "factor": 8, "layers": 2, "rounds": 9, "fraction": 0.25, "seed": 5}
KEEP: dict[str, Any] = {"keep_latest_versions": 2, "keep_every_versions": 3}


def play_round(client: TestClient, token: str, rng: np.random.Generator) -> tuple[int, bytes]:
    """Upload the whole cohort of the open round (it closes); the round and one body."""
    cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
    assert cur["state"] == "open", cur
    round_id = int(cur["round_id"])
    bodies = [
        encode_updates(round_id, [random_update(MODEL, c, rng, n_rows=60)]) for c in cur["cohort"]
    ]
    for body in bodies:
        r = client.post(
            f"/v1/rounds/{round_id}/updates", content=body, headers=upload_headers(token)
        )
        assert r.status_code == 200, r.text
    assert client.get(f"/v1/rounds/{round_id}").json()["state"] == "closed"
    return round_id, bodies[0]


def start_run(client: TestClient) -> str:
    """Register clients 0..19 and start :data:`RUN`; their token."""
    token = register(client, list(range(20)))
    post_run(client, RUN)
    return token


@pytest.fixture
def started(aggregator: AggregatorFactory, database_url: str) -> tuple[TestClient, str]:
    client = aggregator(database_url=database_url, **KEEP)
    return client, start_run(client)


def stored(client: TestClient, sql: str) -> list[tuple[object, ...]]:
    with service_of(client).db.transaction() as s:
        return [tuple(row) for row in s.execute(text(sql))]


# ----------------------------------------------------------------------------- policy


def test_retention_policy_keeps_the_latest_and_every_kth() -> None:
    policy = RetentionPolicy(keep_latest=3, keep_every=10)
    kept = [v for v in range(0, 35) if policy.keeps(v, latest=34)]
    assert kept == [0, 10, 20, 30, 32, 33, 34]
    assert [v for v in range(6) if RetentionPolicy(1, 0).keeps(v, latest=5)] == [5]
    with pytest.raises(ValueError):
        RetentionPolicy(keep_latest=0)


def test_settings_refuse_a_policy_that_drops_the_latest_version() -> None:
    with pytest.raises(ValueError):
        Settings(keep_latest_versions=0)


# ----------------------------------------------------------------------------- rounds


def test_closed_rounds_keep_metadata_and_versions_follow_the_policy(
    started: tuple[TestClient, str],
) -> None:
    client, token = started
    rng = np.random.default_rng(0)
    for _ in range(7):
        play_round(client, token, rng)
    service_of(client).storage.free()  # what the background thread does after a close
    # every update row is there (digests answer retries), only the open round keeps bodies
    rows = stored(
        client,
        "SELECT r.state, COUNT(*) FROM updates u JOIN rounds r ON r.id = u.round_pk "
        "GROUP BY r.state",
    )
    assert rows == [("closed", 7 * 5)]
    assert stored(client, "SELECT COUNT(*) FROM update_blobs") == [(0,)]
    versions = stored(
        client,
        "SELECT v.version, "
        "EXISTS (SELECT 1 FROM version_blobs b WHERE b.version_pk = v.id AND b.kind = 'params'),"
        " EXISTS (SELECT 1 FROM version_blobs b WHERE b.version_pk = v.id"
        " AND b.kind = 'optimizer_state'), v.pruned_at IS NOT NULL"
        " FROM model_versions v ORDER BY v.version",
    )
    kept = [0, 3, 6, 7]  # multiples of 3, and the newest 2
    assert [v for v, *_ in versions] == list(range(8))
    for v, has_params, has_state, pruned in versions:
        assert bool(has_params) == (v in kept) == (not pruned), v
        assert bool(has_state) == (v == 7), v
    for v in range(8):
        r = client.get(f"/v1/models/{v}", headers=bearer(token))
        if v in kept:
            assert r.status_code == 200 and decode_model(r.content)[2] == v
        else:
            assert r.status_code == 410, v
            assert r.json()["error"] == "version_pruned"
    # pruned versions keep their round's result in the history
    history = client.get("/v1/runs/current/history").json()["rounds"]
    assert [h["model_version"] for h in history] == list(range(1, 8))


def test_a_version_another_replica_pruned_is_gone_here_too(
    aggregator: AggregatorFactory, database_url: str
) -> None:
    """Replicas on one database: a version pruned by one is answered 410 by the others,
    also by one that kept its bytes in memory (it served them with 200 until they left its
    cache of encoded versions)."""
    a, b = (aggregator(database_url=database_url, **KEEP) for _ in "ab")
    token = start_run(a)
    rng = np.random.default_rng(0)
    play_round(a, token, rng)
    r = b.get("/v1/models/1", headers=bearer(token))  # b keeps version 1's bytes
    assert r.status_code == 200 and decode_model(r.content)[2] == 1
    for _ in range(2):
        play_round(a, token, rng)
    # a's storage pass prunes version 1: this call's, or its background thread's after the
    # last close when that came first (then this call finds nothing left to prune)
    assert service_of(a).storage.free() in ({1: [1]}, {})
    pruned = "SELECT version FROM model_versions WHERE pruned_at IS NOT NULL ORDER BY version"
    assert stored(a, pruned) == [(1,)]
    r = b.get("/v1/models/1", headers=bearer(token))
    assert r.status_code == 410, r.status_code
    assert r.json()["error"] == "version_pruned"
    assert b.get("/v1/models/3", headers=bearer(token)).status_code == 200


def test_retry_after_close_is_still_a_duplicate(started: tuple[TestClient, str]) -> None:
    client, token = started
    rng = np.random.default_rng(1)
    round_id, body = play_round(client, token, rng)
    for _ in range(3):  # a few more rounds: the first round's versions get pruned too
        play_round(client, token, rng)
    service_of(client).storage.free()
    r = client.post(f"/v1/rounds/{round_id}/updates", content=body, headers=upload_headers(token))
    assert r.status_code == 200, r.text
    assert [x["status"] for x in r.json()["results"]] == ["duplicate"]


def test_a_restart_resumes_from_the_kept_state(
    aggregator: AggregatorFactory, database_url: str
) -> None:
    rng = np.random.default_rng(2)
    client = aggregator(database_url=database_url, **KEEP)
    token = start_run(client)
    for _ in range(4):
        play_round(client, token, rng)
    service_of(client).storage.free()
    aggregator.stop(client)
    client = aggregator(database_url=database_url, **KEEP)
    for _ in range(5):
        play_round(client, token, rng)
    cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
    assert cur["state"] == "finished" and cur["model_version"] == 9


# ----------------------------------------------------------------------------- SQLite file


def _file_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def test_sqlite_file_shrinks_after_compaction(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    path = tmp_path / "aggregator.db"
    rng = np.random.default_rng(3)
    client = aggregator(
        database_url=aggregator.url(),
        keep_latest_versions=1,
        keep_every_versions=0,
        compact_interval_s=3600,
    )
    token = start_run(client)
    for _ in range(6):
        play_round(client, token, rng)
    service = service_of(client)
    service.storage.free()  # (the background thread may have done it already)
    with service.db.transaction() as s:
        assert s.execute(text("PRAGMA auto_vacuum")).scalar_one() == 2  # incremental
        # FAST (2): the freed pages are not zeroed and written through the WAL again
        assert s.execute(text("PRAGMA secure_delete")).scalar_one() == 2
        free_before = s.execute(text("PRAGMA freelist_count")).scalar_one()
    assert free_before > 0  # the released blobs
    before = _file_bytes(path)
    service.storage.compactor.run()
    with service.db.transaction() as s:
        assert s.execute(text("PRAGMA freelist_count")).scalar_one() == 0
    after = _file_bytes(path)
    assert after < before, (before, after)
    assert (path.parent / (path.name + "-wal")).stat().st_size == 0


def _schema_growth(tmp_path: Path, revision: str) -> int:
    """The bytes an empty SQLite file grows by from ``revision`` to head (new tables and
    indexes take pages of their own)."""
    sizes = []
    for target in (revision, "head"):
        path = tmp_path / f"empty-{target}.db"
        with at_revision(f"sqlite:///{path}", target):
            pass
        with sqlite3.connect(path) as raw:
            raw.execute("VACUUM")
        sizes.append(path.stat().st_size)
    return sizes[1] - sizes[0]


def test_an_old_sqlite_file_is_converted_and_pruned_by_the_migration(tmp_path: Path) -> None:
    """A file made by revision 0002 without auto-vacuum: the upgrade keeps the bodies of the
    open round only, frees the old version's optimizer state, and the file turns incremental;
    the downgrade puts the kept body back."""
    path = tmp_path / "old.db"
    with at_revision(f"sqlite:///{path}", "0002") as (conn, _):
        for pk, state in ((1, "closed"), (2, "open")):
            conn.execute(
                text(
                    "INSERT INTO rounds (id, run_id, round_id, attempt, state, cohort, "
                    "base_version, opened_at, deadline) VALUES (:pk, 1, :pk, 0, :state, '[1]', "
                    ":v, '2025-01-01', '2025-01-02')"
                ),
                {"pk": pk, "state": state, "v": pk - 1},
            )
            conn.execute(
                text(
                    "INSERT INTO updates (round_pk, run_id, round_id, client_id, digest, "
                    "n_samples, loss, blob, created_at) VALUES (:pk, 1, :pk, 1, 'd', 1, 0, "
                    ":blob, '2025-01-01')"
                ),
                {"pk": pk, "blob": b"\x01" * 100_000},
            )
        for v in (0, 1):
            conn.execute(
                text(
                    "INSERT INTO model_versions (run_id, version, round_id, params, "
                    "optimizer_state, digest, n_updates, created_at) VALUES (1, :v, :v, :p, :p, "
                    "'d', 1, '2025-01-01')"
                ),
                {"v": v, "p": b"\x02" * 100_000},
            )
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    size_before = path.stat().st_size
    db = Database(f"sqlite:///{path}")
    db.migrate()
    db.dispose()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        kept = raw.execute("SELECT round_pk, length(blob) FROM update_blobs").fetchall()
        assert kept == [(2, 100_000)]  # the open round's body only
        assert raw.execute("SELECT COUNT(*) FROM updates").fetchone() == (2,)
        states = raw.execute(
            "SELECT v.version, b.kind, length(b.blob) FROM version_blobs b "
            "JOIN model_versions v ON v.id = b.version_pk ORDER BY 1, 2"
        )
        assert states.fetchall() == [
            (0, "params", 100_000),  # the older version's optimizer state was freed
            (1, "optimizer_state", 100_000),
            (1, "params", 100_000),
        ]
    # 200 kB of bodies freed, less the pages of the tables the later revisions add
    assert path.stat().st_size < size_before - 150_000 + _schema_growth(tmp_path, "0002")
    with alembic_connection(f"sqlite:///{path}") as (conn, cfg):
        command.downgrade(cfg, "0002")
        rows = conn.execute(text("SELECT round_pk, length(blob) FROM updates ORDER BY 1"))
        assert rows.fetchall() == [(1, 0), (2, 100_000)]
        command.upgrade(cfg, "head")


def test_compaction_runs_only_after_something_was_freed(tmp_path: Path) -> None:
    db = Database(sqlite_url(tmp_path))
    db.migrate()
    keeper = StorageKeeper(db, RetentionPolicy(), compact_interval_s=0)
    assert not keeper.maintain()  # nothing freed yet
    keeper.compactor.mark_due()
    assert keeper.compactor.run_if_due()
    assert not keeper.compactor.run_if_due()
    slow = Compactor(db, interval_s=3600)
    slow.mark_due()
    assert not slow.run_if_due()  # due, but not before the interval
    db.dispose()


def test_another_services_database_is_refused_before_any_migration(tmp_path: Path) -> None:
    # FEDREC_AGG_DATABASE_URL pointed at a worker's store by mistake: nothing is added to it
    from services.aggregator.db import ForeignDatabase
    from services.client_sim.store import WorkerStore

    path = tmp_path / "worker-0.db"
    WorkerStore(path).close()
    with sqlite3.connect(path) as raw:
        before = raw.execute("SELECT name FROM sqlite_master ORDER BY 1").fetchall()
    db = Database(f"sqlite:///{path}")
    with pytest.raises(ForeignDatabase, match="is not an aggregator database"):
        db.migrate()
    db.dispose()
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT name FROM sqlite_master ORDER BY 1").fetchall() == before


@pytest.mark.postgres
def test_postgres_vacuums_the_tables_the_pass_frees(
    aggregator: AggregatorFactory, postgres_url: str
) -> None:
    """On PostgreSQL a deleted body keeps its space until VACUUM: the compaction after a pass
    vacuums every table the pass frees rows of, the update bodies' own table first."""
    rng = np.random.default_rng(4)
    client = aggregator(database_url=postgres_url, **KEEP, compact_interval_s=3600)
    token = start_run(client)
    for _ in range(4):
        play_round(client, token, rng)
    service = service_of(client)
    service.storage.free()
    service.storage.compactor.run()
    with service.db.read() as s:
        vacuumed: dict[str, int] = dict(
            s.execute(
                text(
                    "SELECT relname, vacuum_count FROM pg_stat_user_tables WHERE relname IN "
                    "('update_blobs', 'evaluations', 'model_versions', 'version_blobs')"
                )
            ).all()
        )
    # (manual VACUUMs only: autovacuum counts apart; the background thread's passes count too)
    tables = {"update_blobs", "evaluations", "model_versions", "version_blobs"}
    assert set(vacuumed) == tables, vacuumed
    assert min(vacuumed.values()) >= 1, vacuumed


@pytest.mark.postgres
def test_postgres_stores_the_blobs_uncompressed(postgres_url: str) -> None:
    """Float tensors do not compress: the blob columns are EXTERNAL (out of line, no pglz
    attempt on every insert); a downgrade gives them PostgreSQL's default back."""
    query = text(
        "SELECT c.relname || '.' || a.attname, a.attstorage FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid WHERE a.atttypid = 'bytea'::regtype "
        "AND c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace"
    )
    with alembic_connection(postgres_url) as (conn, cfg):
        command.upgrade(cfg, "head")
        storage: dict[str, str] = dict(tuple(row) for row in conn.execute(query))
        command.downgrade(cfg, "0007")
        downgraded: dict[str, str] = dict(tuple(row) for row in conn.execute(query))
    # every bytea column of the schema, none missed
    assert storage == {
        "update_blobs.blob": "e",
        "version_blobs.blob": "e",
        "secagg_messages.body": "e",
        "secagg_totals.total": "e",
        # integer counts, written once a run (or once a sparse secure round until the
        # prior is fixed), do compress: PostgreSQL's default
        "run_priors.counts": "x",
        "round_item_counts.counts": "x",
        "round_item_counts.exposure": "x",
    }, storage
    assert set(downgraded.values()) == {"x"}, downgraded


def test_closes_in_quick_succession_share_one_background_pass(tmp_path: Path) -> None:
    """Each pass costs queries whatever it frees: the thread runs at most one per gap, and
    stopping it does not wait the gap out."""
    db = Database(sqlite_url(tmp_path))
    db.migrate()
    keeper = StorageKeeper(db, RetentionPolicy(), compact_interval_s=3600)
    passes = threading.Semaphore(0)

    def counted_pass() -> bool:
        passes.release()
        return False

    keeper.maintain = counted_pass  # type: ignore[method-assign]
    keeper.start(poll_s=3600, min_gap_s=3600)
    assert passes.acquire(timeout=10)  # the first pass, at start
    for _ in range(20):  # rounds closing during the gap
        keeper.notify()
    time.sleep(0.3)
    assert not passes.acquire(blocking=False), "a pass ran inside the gap"
    t0 = time.monotonic()
    keeper.stop(timeout_s=30)
    assert time.monotonic() - t0 < 10, "stop waited the gap out"
    keeper.start(poll_s=3600, min_gap_s=0)  # without a gap every close gets its pass
    assert passes.acquire(timeout=10)
    keeper.notify()
    assert passes.acquire(timeout=10)
    keeper.stop()


def test_runs_past_the_newest_keep_runs_lose_their_versions_params(
    aggregator: AggregatorFactory, database_url: str
) -> None:
    """Every `docker compose up` of the demo starts a run; storage grew by each run's kept
    versions for ever. Runs older than the newest KEEP_RUNS keep rows, not params."""
    assert RetentionPolicy(keep_runs=2).old_runs([3, 1, 2, 5]) == {1, 2}
    with pytest.raises(ValueError):
        RetentionPolicy(keep_runs=0)
    client = aggregator(database_url=database_url, **KEEP, keep_runs=2)
    token, rng = start_run(client), np.random.default_rng(1)
    for run in (1, 2, 3):
        if run > 1:
            assert client.post("/v1/runs/current/stop", headers=operator_headers()).is_success
            post_run(client, RUN)
        play_round(client, token, rng)
        service_of(client).storage.free()
        assert stored(client, "SELECT MAX(id) FROM runs") == [(run,)]
    params = stored(
        client,
        "SELECT v.run_id, COUNT(b.version_pk) FROM model_versions v LEFT JOIN version_blobs b "
        "ON b.version_pk = v.id AND b.kind = 'params' GROUP BY v.run_id ORDER BY v.run_id",
    )
    assert params == [(1, 0), (2, 2), (3, 2)]  # versions 0 and 1 of the newest two runs
    states = stored(client, "SELECT COUNT(*) FROM version_blobs WHERE kind = 'optimizer_state'")
    assert states == [(2,)]  # the newest version's of each kept run: run 1 resumes no more
    old = client.get("/v1/runs/1/models/1", headers=bearer(token))
    assert old.status_code == 410 and old.json()["error"] == "version_pruned", old.text
    kept = client.get("/v1/runs/2/models/1", headers=bearer(token))
    assert kept.status_code == 200 and decode_model(kept.content)[2] == 1
    assert stored(client, "SELECT COUNT(*) FROM model_versions WHERE run_id = 1") == [(2,)]
