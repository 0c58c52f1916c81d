"""Size of the aggregator's database over a long federated run, with the default settings.

Starts the aggregator and two client workers as local processes through the launcher's helpers
(what ``fedrec up`` runs), trains ``--rounds`` FilmTrust rounds over HTTP, and records the
database's size as every round closes: for SQLite the bytes of the database file with its WAL
and shared-memory files, for PostgreSQL ``pg_database_size``. After the last round it waits
until the aggregator's compaction ran (at most ``compact_interval_s`` after a close), then
stops the services and writes, per backend, the peak and final size and the final size of each
table (SQLite ``dbstat``; PostgreSQL ``pg_total_relation_size``, TOAST and indexes included)
to ``bench/results/aggregator_storage.json``.

    python -m bench.aggregator_storage [--rounds 100] [--backend sqlite --backend postgres]
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
from sqlalchemy import create_engine, text

from bench.bench_cli import OutFile, Positive, one_of
from fedrecgel.config import DEFAULTS, RunParams
from fedrecgel.data import load_split
from harness.loopback import free_port
from harness.parity import start_workers
from harness.postgres import postgres_cluster
from services.aggregator.settings import Settings
from services.launcher import UpOptions, cluster

RESULTS = Path(__file__).resolve().parent / "results" / "aggregator_storage.json"
TARGET_MB = 150.0
BACKENDS = ["sqlite", "postgres"]
MB = 1024 * 1024


def sqlite_files_bytes(path: Path) -> int:
    """The database file plus its ``-wal`` and ``-shm`` files, as on disk now."""
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


def sqlite_tables(path: Path) -> dict[str, int]:
    """Bytes of every table (its indexes included) and of the free pages."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT COALESCE(m.tbl_name, d.name), SUM(d.pgsize) FROM dbstat d "
            "LEFT JOIN sqlite_master m ON m.name = d.name GROUP BY 1"
        ).fetchall()
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    out = {str(name): int(size) for name, size in rows}
    out["(free pages)"] = int(page * free)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def postgres_sizes(url: str) -> tuple[int, dict[str, int]]:
    """``pg_database_size`` and every public table's total size."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            total = int(
                conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
            )
            rows = conn.execute(
                text(
                    "SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables "
                    "ORDER BY 2 DESC"
                )
            ).fetchall()
    finally:
        engine.dispose()
    return total, {str(name): int(size) for name, size in rows}


def default(name: str) -> Any:
    """An aggregator setting's default (the settings object itself is not built here: in its
    default environment it refuses the placeholder secrets, which the launcher replaces)."""
    return Settings.model_fields[name].default


def federated_run(
    backend: str, rounds: int, workdir: Path, database_url: str | None
) -> dict[str, Any]:
    """One run of ``rounds`` FilmTrust rounds; the sizes seen."""
    split = load_split("filmtrust")
    opts = UpOptions(
        run=RunParams(dataset="filmtrust", rounds=rounds, deadline_s=3600.0),
        workers=2,
        aggregator_port=free_port(),
        workdir=workdir,
        recommend=False,
        database_url=database_url,
        worker_poll_max_s=0.5,
        startup_timeout_s=300.0,
    )
    db_path = workdir / "aggregator.db"

    def measure() -> int:
        if database_url is None:
            return sqlite_files_bytes(db_path)
        return postgres_sizes(database_url)[0]

    per_round: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with cluster(opts) as c:
        c.start_aggregator()
        start_workers(c, split.n_users)
        c.start_run(split.n_items)
        seen = 0
        deadline = time.monotonic() + 3600.0
        while seen < rounds:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {seen} of {rounds} rounds closed in an hour")
            c.check_alive()
            c.check_workers()
            closed = len(c.history()["rounds"])  # read a page at a time
            if closed > seen:
                seen = closed
                sample = {"round": seen, "bytes": measure()}
                if database_url is None:
                    wal = db_path.parent / (db_path.name + "-wal")
                    sample["wal_bytes"] = wal.stat().st_size if wal.exists() else 0
                per_round.append(sample)
            time.sleep(0.05)
        c.wait_complete(timeout_s=600.0, poll_s=0.2)
        train_s = time.perf_counter() - t0
        at_end = measure()
        # the background task compacts at most compact_interval_s after the last close
        settle = default("compact_interval_s") + 3 * default("deadline_poll_s") + 2.0
        time.sleep(settle)
        compacted = measure()
        version = httpx.get(
            f"{c.agg_url}/v1/models/latest", headers=c.operator_headers(), timeout=30
        ).headers["X-Model-Version"]
    if database_url is None:
        after_stop, tables = sqlite_files_bytes(db_path), sqlite_tables(db_path)
    else:
        after_stop, tables = postgres_sizes(database_url)
    peak = max([r["bytes"] for r in per_round] + [at_end, compacted])
    return {
        "backend": backend,
        "rounds": rounds,
        "final_model_version": int(version),
        "wall_s": train_s,
        "peak_mb": peak / MB,
        "end_of_run_mb": at_end / MB,
        "after_compaction_mb": compacted / MB,
        "after_stop_mb": after_stop / MB,
        "within_target": peak / MB < TARGET_MB,
        "tables_mb": {k: v / MB for k, v in tables.items()},
        "per_round_mb": [
            {k: (v if k == "round" else round(v / MB, 2)) for k, v in r.items()} for r in per_round
        ],
    }


def main(
    rounds: Positive = DEFAULTS.rounds,
    chosen: Annotated[list[str] | None, one_of(BACKENDS, "--backend")] = None,
    out: OutFile = RESULTS,
) -> None:
    """Run the benchmark for every requested backend (``--backend``, repeated; default: both)
    and write the JSON."""
    backends = chosen or BACKENDS
    results: list[dict[str, Any]] = []
    # a run of some backends keeps the others' results of the same configuration
    previous = json.loads(out.read_text()) if out.exists() else {}
    for backend in backends:
        with tempfile.TemporaryDirectory(prefix=f"fedrec-storage-{backend}-") as tmp:
            if backend == "sqlite":
                res = federated_run(backend, rounds, Path(tmp), None)
            else:
                with postgres_cluster() as pg:
                    res = federated_run(backend, rounds, Path(tmp), pg.url())
        print(json.dumps({k: v for k, v in res.items() if k != "per_round_mb"}, indent=1))
        results.append(res)
    settings = {
        k: default(k) for k in ("keep_latest_versions", "keep_every_versions", "compact_interval_s")
    }
    if previous.get("rounds") == rounds and previous.get("settings") == settings:
        results += [b for b in previous.get("backends", []) if b["backend"] not in backends]
    results.sort(key=lambda b: str(b["backend"]))
    result = {
        "dataset": "filmtrust",
        "rounds": rounds,
        "workers": 2,
        "target_mb": TARGET_MB,
        "settings": settings,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "backends": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
