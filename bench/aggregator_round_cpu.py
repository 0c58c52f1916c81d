"""The aggregator's CPU for one FilmTrust-sized round, by request kind, in two SQLite
settings: ``--compare secure-delete`` (the default), ``secure_delete`` as the aggregator
sets it (FAST) and as Python's SQLite is built (ON); ``--compare page-size``, the page size
the aggregator gives a new file (64 KB) and SQLite's default (4 KB).

An in-process aggregator (SQLite file, 1,300 registered clients under two credentials, a
run of ``fraction`` 0.1 with ``upload_grouping=worker``) is driven through the requests of a
round as two workers make them, called on the service in this thread: two downloads and
polls, two partial-sum uploads of random values over 1,500 item rows (the second closes the
round), the storage pass that frees what the close left (run here rather than in its
thread, so that its CPU is counted on its own), two evaluation reports of 650 clients and a
history read. The CPU time of this process is summed per kind over ``--rounds`` rounds after
``--warmup`` rounds, for each setting in turn, ``--repeats`` times interleaved; the JSON
gives the per-kind medians per round. HTTP, FastAPI's validation and the workers are left
out: this is the service's own work.

    python -m bench.aggregator_round_cpu [--rounds 20] [--repeats 3]
        [--compare secure-delete|page-size] [--out bench/results/aggregator_round_cpu.json]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from sqlalchemy import event

from bench.bench_cli import OutFile, Positive, fail, one_of
from fedrecgel.model import ModelConfig
from fedrecgel.uploads import PartialSum
from fedrecgel.wire import encode_partial
from harness.aggregator import AggregatorFactory, operator_headers, register, service_of
from services.aggregator import db
from services.contract import EvaluationRequest

RESULTS = Path(__file__).resolve().parent / "results" / "aggregator_round_cpu.json"
#: the two settings each comparison measures: label -> (secure_delete, page size of the file)
COMPARISONS = {
    "secure-delete": {"FAST": ("FAST", 4096), "ON": ("ON", 4096)},
    "page-size": {"64K": ("FAST", 65536), "4K": ("FAST", 4096)},
}
POPULATION = 1300
N_ITEMS = 2071  # FilmTrust's catalogue
ROWS = 1500  # item rows a worker's partial sum touches in a FilmTrust round
KINDS = ("download", "poll", "upload", "close", "storage", "report", "history")


class Driver:
    """An aggregator and two credentials, in one setting of ``secure_delete`` and of the
    page size its new SQLite file gets."""

    def __init__(self, directory: Path, secure_delete: str, page_size: int, rounds: int) -> None:
        self.factory = AggregatorFactory(directory)
        db.SQLITE_PAGE_SIZE = page_size
        self.client = self.factory(population=POPULATION, max_register_per_request=POPULATION)
        self.svc = service_of(self.client)
        self.svc.storage.stop()  # its passes run in :meth:`round`, counted on their own
        self.svc.storage.notify = lambda: None  # type: ignore[method-assign]
        if secure_delete != "FAST":

            def _pragma(conn: Any, _record: Any) -> None:
                conn.execute(f"PRAGMA secure_delete={secure_delete}")

            event.listen(self.svc.db.engine, "connect", _pragma)
            self.svc.db.engine.dispose()  # pooled connections reopen with the setting
        self.ids = {s: list(range(s, POPULATION, 2)) for s in (0, 1)}
        tokens = {s: register(self.client, self.ids[s], shard=s, shards=2) for s in (0, 1)}
        self.callers = {s: self.svc.credentials.authenticate(t) for s, t in tokens.items()}
        run = {
            "n_items": N_ITEMS,
            "factor": 32,
            "layers": 3,
            "rounds": rounds + 1,
            "fraction": 0.1,
            "seed": 7,
            "upload_grouping": "worker",
        }
        r = self.client.post("/v1/runs", json=run, headers=operator_headers())
        if r.status_code != 201:
            raise SystemExit(f"cannot start the run: {r.text}")
        self.model = ModelConfig(n_items=N_ITEMS, kind="ncf", factor=32, layers=3)
        self.rng = np.random.default_rng(0)

    def partial_sum(self, members: list[int]) -> PartialSum:
        shapes = self.model.shared_shapes()
        idx = torch.from_numpy(np.sort(self.rng.choice(N_ITEMS, ROWS, replace=False)))
        rows = {
            t: (idx, torch.from_numpy(self.rng.normal(0, 0.01, (ROWS, shapes[t][1]))).float())
            for t in self.model.item_tables()
        }
        dense = {
            n: torch.from_numpy(self.rng.normal(0, 0.01, shapes[n])).float()
            for n in self.model.dense_names()
        }
        return PartialSum(tuple(members), tuple([130] * len(members)), rows, dense, 1.0)

    def round(self, cpu: dict[str, float]) -> None:
        """One round's requests; each one's CPU seconds added to ``cpu`` under its kind."""
        svc, callers = self.svc, self.callers

        def timed(kind: str, call: Callable[[], Any]) -> Any:
            t0 = time.process_time()
            out = call()
            cpu[kind] += time.process_time() - t0
            return out

        cur = {s: svc.reads.current_round(callers[s]) for s in (0, 1)}
        rid, v = cur[0].round_id, cur[0].model_version
        assert rid is not None and v is not None
        bodies = {s: encode_partial(rid, self.partial_sum(sorted(cur[s].cohort))) for s in (0, 1)}
        for caller in callers.values():
            timed("download", lambda: svc.reads.model_blob(v))
            timed("poll", partial(svc.reads.current_round, caller))
        timed("upload", lambda: svc.ingest.accept_and_close(callers[0], rid, bodies[0]))
        timed("close", lambda: svc.ingest.accept_and_close(callers[1], rid, bodies[1]))
        timed("storage", svc.storage.maintain)
        for s in (0, 1):
            n = len(self.ids[s])
            req = EvaluationRequest(
                model_version=v,
                sums={"hr@10": 0.5 * n, "ndcg@10": 0.3 * n},
                count=n,
                client_ids=self.ids[s],
            )
            timed("report", partial(svc.evaluations.report, callers[s], req))
        timed("history", lambda: svc.reads.history(0, 50))

    def close(self) -> None:
        self.factory.stop_all()


def measure(setting: tuple[str, int], rounds: int, warmup: int) -> dict[str, float]:
    """CPU seconds per round by kind, ``rounds`` rounds after ``warmup``."""
    with tempfile.TemporaryDirectory(prefix="fedrec-bench-") as tmp:
        driver = Driver(Path(tmp), *setting, rounds + warmup)
        try:
            cpu: dict[str, float] = defaultdict(float)
            for _ in range(warmup):
                driver.round(cpu)
            cpu.clear()
            for _ in range(rounds):
                driver.round(cpu)
        finally:
            driver.close()
    per_round = {k: cpu[k] / rounds for k in KINDS}
    per_round["total"] = sum(per_round.values())
    return per_round


def main(
    rounds: Positive = 20,
    warmup: int = 5,
    repeats: Positive = 3,
    compare: Annotated[str, one_of(sorted(COMPARISONS))] = "secure-delete",
    out: OutFile = RESULTS,
) -> None:
    """Measure both settings interleaved and write the JSON."""
    if warmup < 0:
        raise fail(f"--warmup must be at least 0, got {warmup}")
    torch.set_num_threads(1)
    compared = COMPARISONS[compare]
    settings = tuple(compared)
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in settings}
    for rep in range(repeats):
        for s in settings if rep % 2 == 0 else settings[::-1]:
            runs[s].append(measure(compared[s], rounds, warmup))
            print(f"[{rep}] {compare} {s}: {runs[s][-1]['total'] * 1e3:.1f} ms a round")
    medians = {
        s: {k: statistics.median(r[k] for r in runs[s]) for k in (*KINDS, "total")}
        for s in settings
    }
    result = {
        "command": "python -m bench.aggregator_round_cpu " + " ".join(sys.argv[1:]),
        "date": datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_avg_1m_at_end": os.getloadavg()[0],
        },
        "config": {
            "population": POPULATION,
            "n_items": N_ITEMS,
            "rows_per_partial": ROWS,
            "rounds": rounds,
            "warmup": warmup,
            "repeats": repeats,
            "compare": compare,
            "settings": {
                k: {"secure_delete": v[0], "page_size": v[1]} for k, v in compared.items()
            },
        },
        "cpu_seconds_per_round_median": medians,
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for s in settings:
        line = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in medians[s].items())
        print(f"{compare} {s} (ms a round): {line}")


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
