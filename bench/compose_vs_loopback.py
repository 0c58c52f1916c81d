"""The same federated run under `docker compose` and under `fedrec up`, on the same machine.

Both runs: FilmTrust, 20 rounds, fraction 0.1, seed 0, two client workers with one torch thread
each (what ``fedrec up`` gives each of two workers on this machine is printed too), Redis for
version events.

* compose: ``docker compose up`` of the repository's compose file under its own project name
  and free host ports (PostgreSQL, Redis, aggregator, two workers, recommend-api, and the demo
  service, which starts the run), images built beforehand (``docker compose build`` or
  ``scripts/compose-smoke.sh``); ``docker compose down -v`` at the end;
* loopback: ``fedrec up`` as a user runs it (SQLite, local processes), with ``--redis-url`` to a
  throw-away redis-server.

Both are measured the same way, from outside, by polling the aggregator every 0.1 s: the run
starts when ``GET /v1/rounds/1`` first answers, it ends when every round is closed and has its
global metrics. The round time is the steady state from the aggregator's own clock:
``(closed_at[last] - closed_at[first]) / (rounds - 1)``. For compose, the time from
``docker compose up`` to the first closed round is recorded too (images already built).
Each run also records where a worker's round goes: the median over its rounds (after the
first) of each phase's wall and CPU seconds from the workers' ``round timings`` log lines
(services/client_sim/timings.py). Writes ``bench/results/compose_vs_loopback.json`` (targets:
compose round <= 1.2x loopback, ``docker compose up`` to the first closed round <= 45 s).

Where the time went, on our machines: not events, polling, DNS or PostgreSQL commits (a round
closes within a second of its last upload, and the workers start the next at once), but CPU.
There the other processes sit in the root CPU cgroup (cgroup v1, no systemd), and the engine put
every container under one ``/docker`` group that weighs as much as ONE process: under load all
containers together got the CPU of one process, so training in a container ran 2-3x slower.
``scripts/compose-smoke.sh`` starts the engine with ``--cgroup-parent=/`` on such machines (each
container a top-level cgroup, weighing as much as one process); the JSON records the CPU cgroup
of the aggregator's container (``/docker/<id>`` or ``/<id>``). Smaller costs removed on the way:
health probes in Python every few seconds (now bash builtins), and the demo's polling.

    python -m bench.compose_vs_loopback [--rounds 20] [--repeats 1]
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.bench_cli import OutFile, Positive
from fedrecgel.config import DEFAULTS, RunParams
from harness.loopback import free_port, redis_server
from harness.postgres import pg_bindir, postgres_cluster
from services.launcher import run_complete

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "bench" / "results" / "compose_vs_loopback.json"
TARGET = 1.2
#: seconds from `docker compose up` (images built) to the first closed round
FIRST_ROUND_TARGET_S = 45.0
PROJECT = "fedrecgel-bench"


def watch_run(
    agg_url: str, rounds: int, alive: Callable[[], None], timeout_s: float = 1800.0
) -> dict[str, Any]:
    """Poll the aggregator until the run's ``rounds`` are closed and evaluated; timings on the
    monotonic clock (``started``, ``first_closed``, ``done``) and the history."""
    started = first_closed = None
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=agg_url, timeout=5.0) as client:
        while time.monotonic() < deadline:
            alive()
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if started is None:
                    if client.get("/v1/rounds/1").status_code == 200:
                        started = time.monotonic()
                else:
                    history = client.get("/v1/runs/current/history").json()
                    if history.get("rounds") and first_closed is None:
                        first_closed = time.monotonic()
                    if run_complete(history, RunParams(rounds=rounds)):
                        return {
                            "started": started,
                            "first_closed": first_closed,
                            "done": time.monotonic(),
                            "history": history,
                        }
            time.sleep(0.1)
    raise RuntimeError(f"the run did not complete within {timeout_s:.0f} s")


def worker_phases(logs: str) -> dict[str, float]:
    """Median over the workers' rounds after the first of each phase's wall and CPU seconds
    (the ``round timings`` log lines, services/client_sim/timings.py), and of the round's
    span in the worker (``span``: from the poll answer it started from to its end)."""
    rows = [
        json.loads(line.split("round timings ", 1)[1])
        for line in logs.splitlines()
        if "round timings {" in line
    ]
    rows = [r for r in rows if r["round"] > 1]
    if not rows:
        return {}
    keys = sorted({k for r in rows for k in r} - {"round", "seen", "end"})
    out = {k: statistics.median(float(r.get(k, 0.0)) for r in rows) for k in keys}
    out["span"] = statistics.median(float(r["end"]) - float(r["seen"]) for r in rows)
    out["worker_rounds"] = float(len(rows))
    return out


def summarise(watch: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Round times from the aggregator's timestamps, and the wall times seen from outside."""
    closed = [datetime.fromisoformat(r["closed_at"]) for r in watch["history"]["rounds"][:rounds]]
    steady = (closed[-1] - closed[0]).total_seconds() / max(1, rounds - 1)
    return {
        "round_seconds": steady,
        "round_seconds_each": [r["seconds"] for r in watch["history"]["rounds"][:rounds]],
        "run_wall_seconds": watch["done"] - watch["started"],
        "first_round_seconds": watch["first_closed"] - watch["started"],
        "final_metrics": watch["history"]["rounds"][rounds - 1]["metrics"],
    }


# ---------------------------------------------------------------- compose


def _compose(*args: str, env: dict[str, str], check: bool = True) -> str:
    cmd = ["docker", "compose", "-p", PROJECT, *args]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {out.returncode}:\n{out.stderr[-3000:]}")
    return out.stdout


@contextlib.contextmanager
def compose_stack(env: dict[str, str]) -> Iterator[None]:
    """The compose project, always taken down with its volumes."""
    _compose("down", "-v", "--remove-orphans", env=env, check=False)
    try:
        yield
    finally:
        _compose("down", "-v", "--remove-orphans", env=env, check=False)


def compose_run(rounds: int, threads: int) -> dict[str, Any]:
    """``docker compose up`` with the demo training ``rounds`` rounds."""
    ports = {
        "FEDREC_AGGREGATOR_PORT": free_port(),
        "FEDREC_RECOMMEND_PORT": free_port(),
        "FEDREC_WORKER0_PORT": free_port(),
        "FEDREC_WORKER1_PORT": free_port(),
    }
    env = {
        **os.environ,
        **{k: str(v) for k, v in ports.items()},
        "FEDREC_DEMO_ROUNDS": str(rounds),
        # what the loopback run takes too: every round evaluated, one upload per client (the
        # run settings' defaults; the compose demo's own are every 10th and per-worker sums)
        "FEDREC_DEMO_EVAL_EVERY": str(DEFAULTS.eval_every),
        "FEDREC_DEMO_UPLOAD_GROUPING": DEFAULTS.upload_grouping,
        "FEDREC_WORKER_THREADS": str(threads),
    }
    agg_url = f"http://127.0.0.1:{ports['FEDREC_AGGREGATOR_PORT']}"
    with compose_stack(env):
        t_up = time.monotonic()
        # detached: returns once the demo has started (after every service is healthy)
        _compose("up", "-d", "--no-build", "--quiet-pull", env=env)
        t_healthy = time.monotonic()

        def alive() -> None:
            if time.monotonic() - t_up > 1800:
                raise RuntimeError("compose run took too long")

        watch = watch_run(agg_url, rounds, alive)
        demo = _compose("logs", "--no-color", "--no-log-prefix", "demo", env=env)
        workers = _compose("logs", "--no-color", "--no-log-prefix", "worker-0", "worker-1", env=env)
        pid = _compose("ps", "-q", "aggregator", env=env).strip()
        pid = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Pid}}", pid], capture_output=True, text=True
        ).stdout.strip()
        cgroup = next(
            (
                ln.split(":", 2)[2]
                for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if "cpu" in ln.split(":")[1].split(",")
            ),
            "?",
        )
        sql = "select pg_database_size('fedrec')"
        db_bytes = _compose(
            "exec", "-T", "postgres", "psql", "-U", "fedrec", "-d", "fedrec", "-tAc", sql, env=env
        )
    out = summarise(watch, rounds)
    out.update(
        {
            "up_to_healthy_seconds": t_healthy - t_up,
            "up_to_run_start_seconds": watch["started"] - t_up,
            "up_to_first_closed_round_seconds": watch["first_closed"] - t_up,
            "database_bytes_after_run": int(db_bytes.strip()),
            # "/docker/<id>": every container under one group; "/<id>": one at the top each
            "container_cpu_cgroup": cgroup,
            "demo_log_tail": demo.strip().splitlines()[-3:],
            "worker_phases": worker_phases(workers),
        }
    )
    return out


# ---------------------------------------------------------------- loopback


def aggregator_stages(agg_url: str) -> dict[str, dict[str, float]]:
    """The aggregator's own account of where its time went over the run, from its Prometheus
    histograms: per stage of an upload or a close (``fedrec_agg_stage_seconds``: validate,
    commit, aggregate, encode_model, publish) and the whole close
    (``fedrec_agg_round_close_seconds``), the count and mean seconds; empty when the
    aggregator was already gone."""
    try:
        text = httpx.get(f"{agg_url}/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return {}
    families = {m.name: m for m in text_string_to_metric_families(text)}
    found: dict[str, dict[str, float]] = {}
    for family, label in (
        ("fedrec_agg_stage_seconds", "stage"),
        ("fedrec_agg_round_close_seconds", None),
    ):
        if family not in families:
            continue
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        for sample in families[family].samples:
            key = sample.labels.get(label, "") if label else "close"
            if sample.name.endswith("_sum"):
                sums[key] = sample.value
            elif sample.name.endswith("_count"):
                counts[key] = sample.value
        for key, count in counts.items():
            if count:
                found[key] = {"count": count, "mean_seconds": sums.get(key, 0.0) / count}
    return found


def loopback_run(rounds: int, postgres: bool = False) -> dict[str, Any]:
    """``fedrec up`` (local processes) with a throw-away redis-server for events; the
    aggregator on SQLite, or with ``postgres`` on a throw-away PostgreSQL cluster (default
    settings, as the compose file's) to tell the database's share from the containers'."""
    fedrec = Path(sys.executable).with_name("fedrec")
    with (
        tempfile.TemporaryDirectory(prefix="fedrec-bench-") as tmp,
        redis_server(Path(tmp)) as redis,
        postgres_cluster() if postgres else contextlib.nullcontext() as pg,
    ):
        agg_port = free_port()
        cmd = [
            str(fedrec),
            "up",
            "--rounds",
            str(rounds),
            "--eval-every",  # every round, as the compose arm (watch_run waits for each)
            str(DEFAULTS.eval_every),
            "--workers",
            "2",
            "--aggregator-port",
            str(agg_port),
            "--recommend-port",
            str(free_port()),
            "--worker-http-port",
            str(free_port(2)),
            "--workdir",
            str(Path(tmp) / "up"),
            "--redis-url",
            redis.url,
            *(["--database-url", pg.url()] if pg is not None else []),
        ]
        log = open(Path(tmp) / "fedrec-up.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:

            def alive() -> None:
                if proc.poll() is not None and proc.returncode != 0:
                    tail = (Path(tmp) / "fedrec-up.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"fedrec up exited with {proc.returncode}:\n{tail}")

            watch = watch_run(f"http://127.0.0.1:{agg_port}", rounds, alive)
            stages = aggregator_stages(f"http://127.0.0.1:{agg_port}")
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
            log.close()
        workers = "\n".join(
            p.read_text(errors="replace") for p in sorted((Path(tmp) / "up").glob("worker*.log"))
        )
    return {
        **summarise(watch, rounds),
        "worker_phases": worker_phases(workers),
        "aggregator_stages": stages,
    }


def main(rounds: Positive = 20, repeats: Positive = 1, out: OutFile = RESULTS) -> None:
    """Alternate compose and loopback runs; write medians and every run."""
    threads = max(1, (os.cpu_count() or 1) // 2)  # what `fedrec up` gives each of 2 workers
    # fedrec up on PostgreSQL too where its binaries are here: the database's share
    kinds = ("compose", "loopback") + (("loopback_postgres",) if pg_bindir() else ())
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for i in range(repeats):
        for kind in kinds:
            run = (
                compose_run(rounds, threads)
                if kind == "compose"
                else loopback_run(rounds, postgres=kind == "loopback_postgres")
            )
            runs[kind].append(run)
            print(
                f"[{i + 1}/{repeats}] {kind}: {run['round_seconds']:.2f} s a round, "
                f"run {run['run_wall_seconds']:.1f} s"
                + (
                    f", up -> first closed round {run['up_to_first_closed_round_seconds']:.1f} s"
                    if kind == "compose"
                    else ""
                ),
                flush=True,
            )
    compose_round = statistics.median(r["round_seconds"] for r in runs["compose"])
    loop_round = statistics.median(r["round_seconds"] for r in runs["loopback"])
    pg_round = (
        statistics.median(r["round_seconds"] for r in runs["loopback_postgres"])
        if runs.get("loopback_postgres")
        else None
    )
    ratio = compose_round / loop_round
    up_first = statistics.median(r["up_to_first_closed_round_seconds"] for r in runs["compose"])
    docker = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True
    ).stdout.strip()
    compose_version = subprocess.run(
        ["docker", "compose", "version", "--short"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "dataset": "filmtrust",
        "config": {
            "rounds": rounds,
            "fraction": 0.1,
            "seed": 0,
            "workers": 2,
            "worker_torch_threads": threads,
            "compose": "postgres + redis + aggregator + 2 workers + recommend-api (+ demo)",
            # the compose file's default, or what FEDREC_AGGREGATOR_REPLICAS asked for
            "aggregator_replicas": int(os.environ.get("FEDREC_AGGREGATOR_REPLICAS", "3")),
            "loopback": "fedrec up: sqlite + 2 workers + recommend-api, redis for events",
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "docker_engine": docker,
            "compose": compose_version,
            "load_avg_1m_at_end": os.getloadavg()[0],
        },
        "compose_round_seconds": compose_round,
        "loopback_round_seconds": loop_round,
        "round_ratio": ratio,
        # fedrec up with its aggregator on PostgreSQL: compose's database without containers
        "loopback_postgres_round_seconds": pg_round,
        "round_ratio_target": TARGET,
        "round_ratio_within_target": ratio <= TARGET,
        "compose_up_to_first_closed_round_seconds": up_first,
        "up_to_first_closed_round_target_seconds": FIRST_ROUND_TARGET_S,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"compose {compose_round:.2f} s a round, loopback {loop_round:.2f} s, ratio {ratio:.2f} "
        f"(target <= {TARGET}); up -> first closed round {up_first:.1f} s -> {out}"
    )


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
