"""A model version's params and optimizer state live in ``version_blobs``, apart from its row:
writing its metrics or freeing its optimizer state no longer rewrites megabytes (SQLite
writes a whole row again on every update of it), and migration 0006 moves old rows' blobs."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, text

from services.aggregator.db import Database
from services.aggregator.repository import Repository
from tests.aggregator.migrating import alembic_connection
from tests.support.aggregator import sqlite_url

NOW = datetime(2026, 12, 1, tzinfo=UTC)
BLOB = 4 * 1024 * 1024  # bytes of each of a version's two blobs


def _wal_bytes(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def test_metrics_and_freed_states_do_not_rewrite_the_blobs(tmp_path: Path) -> None:
    db = Database(sqlite_url(tmp_path))
    db.migrate()
    with db.transaction() as s:
        repo = Repository(s)
        run = repo.add_run({}, NOW)
        for v in (0, 1):
            blob = bytes([v + 1]) * BLOB
            repo.add_version(run.id, v, v, blob, blob, "d", 1, None, NOW)
    path = tmp_path / "aggregator.db"
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert _wal_bytes(path) == 0
    with db.transaction() as s:
        repo = Repository(s)
        assert repo.set_version_metrics(run.id, 0, {"hr@10": 0.5})
        repo.drop_old_optimizer_states(run.id, 1)
        repo.prune_versions(run.id, [0], NOW)
    # a few pages of rows and free-list, not the 16 MB of two rows rewritten (and their
    # freed overflow pages) that the blobs inside the version rows cost
    assert _wal_bytes(path) < 2 * 1024 * 1024, _wal_bytes(path)
    with db.read() as s:
        repo = Repository(s)
        old, new = repo.version_with_blobs(run.id, 0), repo.version_with_blobs(run.id, 1)
        assert old is not None and new is not None
        assert old[0].metrics == {"hr@10": 0.5} and old[0].pruned_at is not None
        assert old[1] == {}  # pruned: params and optimizer state freed
        assert new[1] == {"params": b"\x02" * BLOB, "optimizer_state": b"\x02" * BLOB}
        assert repo.version_with_blobs(run.id, 1, kinds=("params",)) == (
            new[0],
            {"params": b"\x02" * BLOB},
        )


def _migration_roundtrip(url: str) -> None:
    """At revision 0005, versions with both blobs, params only and neither; upgraded as the
    aggregator upgrades (foreign keys enforced), the blobs are rows of ``version_blobs`` and
    the columns gone; downgraded, they are back where they were."""
    rows = ((0, b"p0", None), (1, b"p1", b"s1"), (2, None, None))  # (version, params, state)
    t = datetime(2025, 1, 1, tzinfo=UTC)
    with alembic_connection(url) as (conn, cfg):
        command.upgrade(cfg, "0005")
        conn.execute(
            text(
                "INSERT INTO runs (id, config, state, active, created_at) "
                "VALUES (1, '{}', 'running', :a, :t)"
            ),
            {"a": True, "t": t},
        )
        for v, params, state in rows:
            conn.execute(
                text(
                    "INSERT INTO model_versions (run_id, version, round_id, params, "
                    "optimizer_state, digest, n_updates, created_at) VALUES (1, :v, :v, :p, :s, "
                    "'d', 1, :t)"
                ),
                {"v": v, "p": params, "s": state, "t": t},
            )
    db = Database(url)
    db.migrate()
    db.dispose()
    with alembic_connection(url) as (conn, cfg):
        moved = conn.execute(
            text(
                "SELECT v.version, b.kind, b.blob FROM version_blobs b "
                "JOIN model_versions v ON v.id = b.version_pk ORDER BY 1, 2"
            )
        ).fetchall()
        assert [(v, k, bytes(b)) for v, k, b in moved] == [
            (0, "params", b"p0"),
            (1, "optimizer_state", b"s1"),
            (1, "params", b"p1"),
        ]
        columns = {c["name"] for c in inspect(conn).get_columns("model_versions")}
        assert not columns & {"params", "optimizer_state"}
        command.downgrade(cfg, "0005")
        back = conn.execute(
            text("SELECT version, params, optimizer_state FROM model_versions ORDER BY 1")
        ).fetchall()
        assert [
            (v, None if p is None else bytes(p), None if st is None else bytes(st))
            for v, p, st in back
        ] == list(rows)


def test_migration_0006_moves_the_blobs_and_downgrades(tmp_path: Path) -> None:
    _migration_roundtrip(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_migration_0006_on_postgres(postgres_url: str) -> None:
    _migration_roundtrip(postgres_url)
