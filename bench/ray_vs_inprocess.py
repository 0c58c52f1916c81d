"""The same run in process and on the ray backend (``fedrec train --backend ray``), wall time.

FilmTrust with the shipped ``default`` preset's client and server settings as TrainConfig's
defaults give them, ``--rounds`` rounds (default 20), fraction 0.1, seed 0, ``--shards`` shards
(default 2) and ``upload_grouping=worker`` on both sides, evaluated every round:

* inprocess: :class:`fedrecgel.simulate.Simulator` in this process (torch's default threads);
* ray: :class:`fedrecgel.ray_backend.RaySimulator` on a local Ray with a CPU per shard (or the
  cluster at ``--address``), one actor per shard (one torch thread each, Ray's default).

Recorded: each side's run time and median round time, the ray side's time to start Ray and its
actors, whether the two final models are the same bytes (they must be), the machine's load
average. Writes ``bench/results/ray_vs_inprocess.json``.

    python -m bench.ray_vs_inprocess [--rounds 20] [--shards 2] [--address auto]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import torch

from bench.bench_cli import OutFile, Positive, fail, opt, run
from fedrecgel.config import DEFAULTS
from fedrecgel.data import load_split
from fedrecgel.simulate import RunResult, Simulator, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "ray_vs_inprocess.json"


def _side(res: RunResult, wall: float) -> dict[str, Any]:
    return {
        "run_s": round(wall, 3),
        "median_round_s": round(statistics.median(r.seconds for r in res.rounds), 4),
        "final_hr@10": res.rounds[-1].test.get("hr@10"),
    }


def main(
    rounds: Positive = 20,
    shards: Positive = 2,
    fraction: float = DEFAULTS.fraction,
    address: Annotated[str | None, opt("a Ray cluster to join (default: local)")] = None,
    out: OutFile = RESULTS,
) -> None:
    from fedrecgel.ray_backend import RaySimulator, ray_cluster, ray_missing

    if (missing := ray_missing()) is not None:
        raise fail(missing)
    split = load_split("filmtrust")
    cfg = TrainConfig(rounds=rounds, fraction=fraction, shards=shards, upload_grouping="worker")

    t0 = time.perf_counter()
    local = Simulator(split, cfg)
    local_res = local.run()
    local_wall = time.perf_counter() - t0

    t0 = time.perf_counter()
    with ray_cluster(address, shards) as resources, tempfile.TemporaryDirectory() as d:
        ray_start = time.perf_counter() - t0
        t1 = time.perf_counter()
        with RaySimulator(split, cfg, Path(d)) as sim:
            actors_start = time.perf_counter() - t1
            t2 = time.perf_counter()
            ray_res = sim.run()
            ray_wall = time.perf_counter() - t2
    same = all(torch.equal(sim.shared[k], v) for k, v in local.shared.items()) and [
        (r.loss, r.test) for r in ray_res.rounds
    ] == [(r.loss, r.test) for r in local_res.rounds]
    result = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "torch_threads_inprocess": torch.get_num_threads(),
        },
        "config": {
            "dataset": split.name,
            "rounds": rounds,
            "fraction": fraction,
            "shards": shards,
            "cluster": address or "local",
            "cluster_cpus": resources.get("CPU"),
        },
        "inprocess": _side(local_res, local_wall),
        "ray": {
            **_side(ray_res, ray_wall),
            "ray_start_s": round(ray_start, 3),
            "actors_start_s": round(actors_start, 3),
        },
        "ray_over_inprocess_run": round(ray_wall / local_wall, 3),
        "identical": same,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    run(main)
