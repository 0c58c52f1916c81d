"""Aggregator ingest with one replica and with three behind haproxy, same run, interleaved.

    .venv/bin/python -m bench.aggregator_replicas [--uploads 400] [--concurrency 32]
        [--trials 3] [--replicas 3]

One PostgreSQL cluster and one redis-server (throw-away, on loopback), ``--replicas``
``fedrec aggregator`` processes over them, and two haproxy instances: one balancing over the
first replica alone, one round-robin over all of them (health checks on ``/healthz``, as in
``tests/e2e/test_aggregator_replicas.py``). Each trial starts a run whose round 1 takes every
registered client (more than the load, so that it stays open), sends ``--uploads`` distinct
clients' realistic FilmTrust-size updates (``bench/aggregator_ingest.py``), ``--concurrency``
at a time, through one balancer, reads back how many were stored (lost = acknowledged -
stored) and stops the run; the two set-ups alternate, and which goes first alternates too.

Besides uploads/s and latency, each trial records where the CPU went (the replicas, the
PostgreSQL processes, haproxy, this load generator, and the machine as a whole: other jobs
included) and, sampled every 20 ms from ``pg_stat_activity``, how many PostgreSQL backends were
busy and how many of them were waiting for a lock (every upload batch locks its round's row to
count its uploads, ``Repository.touch_open_round``). Writes
bench/results/aggregator_replicas.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import numpy as np

from bench.aggregator_ingest import MODEL, drive, realistic_update, wait_healthy
from bench.bench_cli import OutFile, Positive, fail, opt, positive
from fedrecgel.wire import encode_updates
from harness.haproxy import HAPROXY_MISSING, Balancer, balancer
from harness.loopback import REDIS_MISSING, free_port, redis_server
from harness.postgres import POSTGRES_MISSING, pg_bindir, postgres_cluster
from harness.procs import FEDREC_MODULE, descendants, spawned
from services.enrolment import enrolment_token

ROOT = Path(__file__).resolve().parents[1]

#: uploads of the unrecorded first pass through each balancer (connections, caches)
WARMUP_UPLOADS = 40
#: seconds between two samples of pg_stat_activity
SAMPLE_S = 1 / 50


def missing() -> str | None:
    """What this machine lacks to run the benchmark (one line), else None."""
    if shutil.which("haproxy") is None:
        return HAPROXY_MISSING
    if shutil.which("redis-server") is None:
        return REDIS_MISSING
    if pg_bindir() is None:
        return POSTGRES_MISSING
    return None


# ----------------------------------------------------------------------------- CPU


def _ticks(pid: int) -> int:
    """User + system clock ticks a process used so far (0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every CPU so far (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def _postmaster(port: int) -> int | None:
    """The PostgreSQL server listening on ``port`` (its command line names the port)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"postgres") and b"-p" in argv:
            i = argv.index(b"-p")
            if i + 1 < len(argv) and argv[i + 1] == str(port).encode():
                return int(entry.name)
    return None


class CpuMeter:
    """CPU seconds of named groups of processes between :meth:`start` and :meth:`stop`."""

    def __init__(self, groups: dict[str, Any]) -> None:
        self.groups = groups  # name -> callable returning the group's pids now
        self.hz = os.sysconf("SC_CLK_TCK")
        self._before: dict[str, dict[int, int]] = {}
        self._machine = (0, 0)

    def _sample(self) -> dict[str, dict[int, int]]:
        return {name: {p: _ticks(p) for p in pids()} for name, pids in self.groups.items()}

    def start(self) -> None:
        self._before = self._sample()
        self._machine = _machine_ticks()

    def stop(self, wall_s: float) -> dict[str, float]:
        after = self._sample()
        busy, total = _machine_ticks()
        out = {}
        for name, ticks in after.items():
            before = self._before.get(name, {})
            out[f"{name}_cpu_s"] = sum(t - before.get(p, 0) for p, t in ticks.items()) / self.hz
        b0, t0 = self._machine
        cores = os.cpu_count() or 1
        out["machine_busy_cores"] = cores * (busy - b0) / max(1, total - t0)
        out["wall_s"] = wall_s
        return out


class LockSampler:
    """Samples pg_stat_activity in a thread: the PostgreSQL backends in a transaction (not
    idle), those waiting for a lock (``wait_event_type = 'Lock'``: a row another transaction
    holds), idle in a transaction (the aggregator works between two statements) and waiting
    for I/O, per sample."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.busy: list[int] = []  # in a transaction (running, waiting or idle in it)
        self.waiting: list[int] = []  # waiting for a lock
        self.in_transaction: list[int] = []  # idle in a transaction: the aggregator's turn
        self.io: list[int] = []  # waiting for I/O (WAL writes and flushes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        query = (
            "SELECT count(*) FILTER (WHERE state <> 'idle'), "
            "count(*) FILTER (WHERE wait_event_type = 'Lock'), "
            "count(*) FILTER (WHERE state = 'idle in transaction'), "
            "count(*) FILTER (WHERE wait_event_type = 'IO') FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not self._stop.wait(SAMPLE_S):
                row = conn.execute(query).fetchone()
                assert row is not None
                self.busy.append(int(row[0]))
                self.waiting.append(int(row[1]))
                self.in_transaction.append(int(row[2]))
                self.io.append(int(row[3]))

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def summary(self) -> dict[str, float]:
        n = max(1, len(self.busy))
        return {
            "pg_samples": len(self.busy),
            "pg_busy_backends_mean": sum(self.busy) / n,
            "pg_lock_waiting_backends_mean": sum(self.waiting) / n,
            "pg_samples_with_a_lock_wait": sum(1 for w in self.waiting if w) / n,
            "pg_idle_in_transaction_mean": sum(self.in_transaction) / n,
            "pg_io_waiting_backends_mean": sum(self.io) / n,
            "pg_samples_with_a_transaction": sum(1 for b in self.busy if b) / n,
        }


# ----------------------------------------------------------------------------- the run


def trial(
    lb: Balancer,
    operator: dict[str, str],
    token: str,
    bodies: list[tuple[int, bytes]],
    concurrency: int,
    meter: CpuMeter,
    pg_port: int,
) -> dict[str, Any]:
    """One run through ``lb``: start it, upload ``bodies``, count what was stored, stop it."""
    cfg = {"n_items": MODEL.n_items, "rounds": 1, "fraction": 1.0, "seed": 0, "deadline_s": 3600}
    r = httpx.post(f"{lb.url}/v1/runs", json=cfg, headers=operator, timeout=60)
    assert r.status_code == 201, r.text
    meter.start()
    t0 = time.perf_counter()
    with LockSampler(pg_port) as locks:
        res: dict[str, Any] = asyncio.run(drive(lb.url, bodies, token, concurrency))
    cpu = meter.stop(time.perf_counter() - t0)
    stored = int(httpx.get(f"{lb.url}/v1/rounds/1", timeout=30).json()["updates_received"])
    r = httpx.post(f"{lb.url}/v1/runs/current/stop", headers=operator, timeout=60)
    assert r.status_code == 200, r.text
    return {**res, "stored": stored, "lost": int(res["ok"]) - stored, **cpu, **locks.summary()}


def main(
    uploads: Positive = 400,
    concurrency: Positive = 32,
    trials: Annotated[int, opt("trials of each set-up", parser=positive)] = 3,
    replicas: Annotated[int, opt("replicas of the larger set-up", parser=positive)] = 3,
    out: OutFile = ROOT / "bench" / "results" / "aggregator_replicas.json",
) -> None:
    """Start everything, run the interleaved trials, write the JSON."""
    if replicas < 2:
        raise fail(f"--replicas: the larger set-up needs at least 2, got {replicas}")
    if (why := missing()) is not None:  # before anything is started
        print(f"error: this benchmark runs real services: {why}", file=sys.stderr)
        sys.exit(2)
    rng = np.random.default_rng(0)
    n_clients = uploads + 100  # the cohort is every client: the round stays open
    bodies = [(c, encode_updates(1, [realistic_update(c, rng)])) for c in range(uploads)]
    warmup = [(c, encode_updates(1, [realistic_update(c, rng)])) for c in range(WARMUP_UPLOADS)]
    operator_token, secret = secrets.token_hex(16), secrets.token_hex(32)
    operator = {"Authorization": f"Bearer {operator_token}"}
    names = [f"aggregator-{i}" for i in range(replicas)]
    results: dict[str, Any] = {
        "uploads": uploads,
        "concurrency": concurrency,
        "trials": trials,
        "replicas": replicas,
        "mean_body_kb": statistics.mean(len(b) for _, b in bodies) / 1024,
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
    }
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        pg = stack.enter_context(postgres_cluster())
        (tmp / "redis").mkdir()
        rs = stack.enter_context(redis_server(tmp / "redis"))
        ports = {name: free_port() for name in names}
        env = {
            **os.environ,
            "FEDREC_AGG_DATABASE_URL": pg.url(),
            "FEDREC_AGG_REDIS_URL": rs.url,
            "FEDREC_AGG_OPERATOR_TOKEN": operator_token,
            "FEDREC_AGG_ENROLMENT_SECRET": secret,
            "FEDREC_AGG_POPULATION": str(n_clients),
            "FEDREC_AGG_LOG_LEVEL": "warning",
        }
        procs = {}
        for name, port in ports.items():
            log = stack.enter_context((tmp / f"{name}.log").open("ab"))
            args_ = [sys.executable, "-m", FEDREC_MODULE, "aggregator", "--port", str(port)]
            procs[name] = stack.enter_context(spawned(args_, log, grace_s=20, env=env))
        for port in ports.values():
            wait_healthy(f"http://127.0.0.1:{port}/healthz", timeout_s=180.0)
        (tmp / "one").mkdir()
        (tmp / "all").mkdir()
        setups = {
            1: stack.enter_context(balancer(tmp / "one", {names[0]: ports[names[0]]})),
            replicas: stack.enter_context(balancer(tmp / "all", ports)),
        }
        for lb in setups.values():
            for name in lb.servers():
                lb.wait_status(name, "UP")
        enrol = {"Authorization": f"Bearer {enrolment_token(secret, 0, 1)}"}
        r = httpx.post(
            f"{setups[1].url}/v1/clients",
            json={"client_ids": list(range(n_clients))},
            headers=enrol,
            timeout=60,
        )
        assert r.status_code == 201, r.text
        token = r.json()["token"]
        postmaster = _postmaster(pg.port)
        meter = CpuMeter(
            {
                "replicas": lambda: [p.pid for p in procs.values()],
                "postgres": lambda: (
                    [] if postmaster is None else [postmaster, *descendants(postmaster)]
                ),
                "haproxy": lambda: [lb.process.pid for lb in setups.values()],
                "load_generator": lambda: [os.getpid()],
            }
        )
        for lb in setups.values():  # connections, caches, the first run's allocations
            trial(lb, operator, token, warmup, concurrency, meter, pg.port)
        runs = []
        for t in range(trials):
            order = list(setups) if t % 2 == 0 else list(setups)[::-1]
            for n in order:
                res = trial(setups[n], operator, token, bodies, concurrency, meter, pg.port)
                runs.append({"replicas": n, "trial": t, **res})
                print(
                    f"trial {t}, {n} replica(s): {res['per_s']:.0f} uploads/s, "
                    f"p50 {res['p50_ms']:.0f} ms, lost {res['lost']}, "
                    f"lock waits in {100 * res['pg_samples_with_a_lock_wait']:.0f}% of samples",
                    flush=True,
                )
        served = {name: int(row["stot"]) for name, row in setups[replicas].servers().items()}
    results["runs"] = runs
    results["requests_per_replica_through_the_larger_balancer"] = served
    summary = {}
    for n in setups:
        mine = [r for r in runs if r["replicas"] == n]
        summary[str(n)] = {
            "median_per_s": statistics.median(r["per_s"] for r in mine),
            "per_s": [r["per_s"] for r in mine],
            "median_p50_ms": statistics.median(r["p50_ms"] for r in mine),
            "lost": sum(r["lost"] for r in mine),
            "errors": sum(r["errors"] for r in mine),
            "median_machine_busy_cores": statistics.median(r["machine_busy_cores"] for r in mine),
            "median_pg_samples_with_a_lock_wait": statistics.median(
                r["pg_samples_with_a_lock_wait"] for r in mine
            ),
        }
    results["summary"] = summary
    results["ratio"] = summary[str(replicas)]["median_per_s"] / summary["1"]["median_per_s"]
    results["loadavg_after"] = os.getloadavg()
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps({"summary": summary, "ratio": results["ratio"]}, indent=1))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
