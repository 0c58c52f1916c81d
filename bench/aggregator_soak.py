"""Aggregator soak: the resident memory of a real aggregator process over many short rounds.

    .venv/bin/python -m bench.aggregator_soak [--rounds 1000] [--warmup 100] [--cohort 60]
        [--workers 4] [--env NAME=VALUE ...] [--out bench/results/aggregator_soak.json]

One aggregator process (``python -m services.aggregator``, SQLite in a temporary folder, its
default settings) with a FilmTrust-sized population (1,508 clients, 2,071 items); one run of
``--rounds`` rounds, each drawing a cohort of about ``--cohort`` clients (the fraction is set
to give it). This process plays ``--workers`` workers over HTTP, in parallel threads with a
connection and a client token each (worker ``i`` holds the clients ``c % workers == i``), as
real ones do each round: poll the current round, download the model, upload each cohort
member's update (random values on 60 item rows of each table and the dense score network;
per-client uploads, 8 clients a body), the last upload closing the round, then report
evaluation sums of all their clients for the new version. After each round the aggregator's
resident set size (``VmRSS`` from /proc) is read.

The verdict: after ``--warmup`` rounds the RSS stays within 10% of its value at the end of
the warm-up (``flat``). ``--env`` sets the aggregator's environment (e.g.
``MALLOC_ARENA_MAX=2``) to compare allocator settings; the JSON keeps them.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import numpy as np

from bench.aggregator_ingest import wait_healthy
from bench.bench_cli import OutFile, Positive, fail, opt, positive
from fedrecgel.metrics import METRIC_NAMES
from fedrecgel.model import ModelConfig
from fedrecgel.wire import encode_updates
from harness.aggregator import random_update
from harness.loopback import free_port
from services.enrolment import enrolment_token

RESULTS = Path(__file__).resolve().parent / "results" / "aggregator_soak.json"
POPULATION = 1508  # FilmTrust's users
N_ITEMS = 2071  # and items
ROWS = 60  # item rows of each table in one upload
PER_BODY = 8  # clients in one upload body
OPERATOR = "soak-operator-token-3b9f0d7e51a2c6"
SECRET = "soak-enrolment-secret-7c1e4a9d2f6b08"
#: the most the RSS may rise above its value at the end of the warm-up
FLAT_WITHIN = 0.10


def rss_mb(pid: int) -> float:
    """The resident set size of ``pid`` (MB), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def start_aggregator(folder: Path, port: int, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The aggregator process on ``port`` (its log in ``folder``)."""
    env = {
        **os.environ,
        "FEDREC_AGG_ENVIRONMENT": "test",
        "FEDREC_AGG_DATABASE_URL": f"sqlite:///{folder}/aggregator.db",
        "FEDREC_AGG_OPERATOR_TOKEN": OPERATOR,
        "FEDREC_AGG_ENROLMENT_SECRET": SECRET,
        "FEDREC_AGG_POPULATION": str(POPULATION),
        "FEDREC_AGG_POPULATION_ITEMS": str(N_ITEMS),
        "FEDREC_AGG_PORT": str(port),
        "FEDREC_AGG_LOG_LEVEL": "warning",
        **extra_env,
    }
    log = (folder / "aggregator.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "services.aggregator"], env=env, stdout=log, stderr=log
    )


def checked(r: httpx.Response, *ok: int) -> dict[str, Any]:
    """The JSON of an answer with one of the ``ok`` statuses (RuntimeError otherwise)."""
    if r.status_code not in ok:
        raise RuntimeError(f"{r.request.method} {r.request.url}: {r.status_code} {r.text[:300]}")
    body: dict[str, Any] = r.json() if r.headers.get("content-type") == "application/json" else {}
    return body


class Worker:
    """One worker's side of each round, over its own connection: the clients ``c`` with
    ``c % shards == shard``, registered under their own client token."""

    def __init__(self, base: str, shard: int, shards: int, cfg: ModelConfig, seed: int) -> None:
        self.http = httpx.Client(base_url=base, timeout=300)
        enrol = {"Authorization": f"Bearer {enrolment_token(SECRET, shard, shards)}"}
        ids = list(range(shard, POPULATION, shards))
        answer = checked(
            self.http.post("/v1/clients", json={"client_ids": ids}, headers=enrol), 201
        )
        self.auth = {"Authorization": f"Bearer {answer['token']}"}
        self.ids = ids
        self.cfg = cfg
        self.rng = np.random.default_rng([seed, shard])

    def train(self) -> tuple[int, int, int | None]:
        """Poll, download, upload the cohort members' updates (the last upload of the round
        closes it); (round id, members, the new version when this worker's upload closed)."""
        current = checked(self.http.get("/v1/rounds/current", headers=self.auth), 200)
        round_id, cohort = int(current["round_id"]), [int(c) for c in current["cohort"]]
        checked(self.http.get("/v1/models/latest", headers=self.auth), 200)
        updates = [random_update(self.cfg, c, self.rng, ROWS) for c in cohort]
        headers = {**self.auth, "Content-Type": "application/octet-stream"}
        version = None
        for start in range(0, len(updates), PER_BODY):
            body = encode_updates(round_id, updates[start : start + PER_BODY])
            url = f"/v1/rounds/{round_id}/updates"
            answer = checked(self.http.post(url, content=body, headers=headers), 200)
            version = (answer.get("current") or {}).get("model_version", version)
        return round_id, len(cohort), version

    def evaluate(self, version: int) -> None:
        """Report evaluation sums of all this worker's clients for ``version``."""
        report = {
            "model_version": version,
            "sums": {name: 0.5 * len(self.ids) for name in METRIC_NAMES},
            "count": len(self.ids),
            "client_ids": self.ids,
        }
        checked(self.http.post("/v1/evaluations", json=report, headers=self.auth), 202)


def one_round(pool: ThreadPoolExecutor, workers: list[Worker]) -> int:
    """One round, the workers in parallel as real ones are; the cohort's size."""
    results = list(pool.map(lambda w: w.train(), workers))
    versions = [v for _, _, v in results if v is not None]
    if versions:
        list(pool.map(lambda w: w.evaluate(max(versions)), workers))
    return sum(n for _, n, _ in results)


def verdict(series: list[float], warmup: int) -> dict[str, Any]:
    """Whether the RSS after the warm-up stays within FLAT_WITHIN of its warm-up value."""
    base = series[warmup - 1]
    after = series[warmup:]
    peak = max(after)
    tenth = max(1, len(after) // 10)
    return {
        "rss_at_warmup_mb": round(base, 1),
        "rss_peak_after_warmup_mb": round(peak, 1),
        "rss_end_mb": round(series[-1], 1),
        "rss_first_mb": round(series[0], 1),
        "growth_after_warmup": round(peak / base - 1, 4),
        # the mean of the last tenth against the first tenth after the warm-up (MB)
        "drift_mb": round(statistics.fmean(after[-tenth:]) - statistics.fmean(after[:tenth]), 1),
        "flat": peak <= base * (1 + FLAT_WITHIN),
    }


def main(
    rounds: Positive = 1000,
    warmup: Positive = 100,
    cohort: Annotated[int, opt("clients a round, about", parser=positive)] = 60,
    workers: Annotated[int, opt("workers uploading in parallel", parser=positive)] = 4,
    seed: int = 0,
    env: Annotated[list[str] | None, opt("aggregator env", metavar="NAME=VALUE")] = None,
    out: OutFile = RESULTS,
) -> None:
    """Run the soak and write its JSON."""
    if warmup >= rounds:
        raise fail("--warmup must be below --rounds")
    extra = dict(e.split("=", 1) for e in env or [] if "=" in e)
    if len(extra) != len(env or []):
        raise fail("--env takes NAME=VALUE")
    cfg = ModelConfig(n_items=N_ITEMS)
    run_body = {
        "dataset": "filmtrust",
        "n_items": N_ITEMS,
        "rounds": rounds,
        "fraction": min(1.0, cohort / POPULATION),
        "seed": seed,
        "deadline_s": 3600.0,
    }
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        folder, port = Path(tmp), free_port()
        proc = start_aggregator(folder, port, extra)
        try:
            base = f"http://127.0.0.1:{port}"
            http = httpx.Client(base_url=base, timeout=120)
            wait_healthy(f"{base}/healthz", proc, 120.0, folder / "aggregator.log")
            clients = [Worker(base, i, workers, cfg, seed) for i in range(workers)]
            operator = {"Authorization": f"Bearer {OPERATOR}"}
            checked(http.post("/v1/runs", json=run_body, headers=operator), 201)
            pool = ThreadPoolExecutor(workers)
            series: list[float] = []
            cohorts: list[int] = []
            seconds: list[float] = []
            for r in range(rounds):
                start = time.perf_counter()
                size = one_round(pool, clients)
                seconds.append(time.perf_counter() - start)
                cohorts.append(size)
                series.append(round(rss_mb(proc.pid), 2))
                if (r + 1) % 100 == 0:
                    print(f"round {r + 1}: RSS {series[-1]:.1f} MB", flush=True)
            final = checked(http.get("/v1/rounds/current", headers=operator), 200)
            pool.shutdown()
            for w in clients:
                w.http.close()
            http.close()
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    result = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "rounds": rounds,
        "warmup": warmup,
        "population": POPULATION,
        "n_items": N_ITEMS,
        "cohort_mean": round(statistics.fmean(cohorts), 1),
        "workers": workers,
        "upload": {"rows_per_table": ROWS, "clients_per_body": PER_BODY},
        "aggregator_env": extra,
        "final_state": final.get("state"),
        "round_s_median": round(statistics.median(seconds), 4),
        "wall_s": round(time.monotonic() - t0, 1),
        "flat_within": FLAT_WITHIN,
        **verdict(series, warmup),
        "rss_mb": series,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"RSS {result['rss_first_mb']} -> {result['rss_at_warmup_mb']} (round {warmup}) "
        f"-> peak {result['rss_peak_after_warmup_mb']} MB, end {result['rss_end_mb']} MB: "
        f"{'flat' if result['flat'] else 'grows'}; {result['wall_s']:.0f} s"
    )


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
