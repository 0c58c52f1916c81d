"""What drawing negatives from a public per-round pool (``negative_pool``) costs in accuracy.

    nice -n 5 .venv/bin/python -m bench.negative_pool [--pools 0,128,256] [--seeds 0,1]
        [--rounds 100]

FilmTrust at the default settings (``fedrec train``, validation held out), once per pool size
(0: uniform negatives over the whole catalogue, today's draws) and seed; each run's test HR@10
and NDCG@10 at the round chosen on validation HR@10. Same seeds, so the cohorts and the models'
initialisation are the same; only the negatives differ. Writes
bench/results/negative_pool.json (after each pool size).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from bench.bench_cli import ROOT, IntList, Ints, Positive
from fedrecgel.config import DEFAULTS

OUT = ROOT / "bench" / "results" / "negative_pool.json"


def train(pool: int, seeds: list[int], rounds: int, folder: Path) -> dict[str, Any]:
    """One ``fedrec train`` over ``seeds``: its selected-on-validation figures per seed."""
    cmd = [sys.executable, "-m", "fedrecgel.cli", "train", "--quiet", "--overwrite"]
    cmd += ["--seeds", ",".join(map(str, seeds)), "--rounds", str(rounds), "--out", str(folder)]
    if pool:
        cmd += ["--negative-pool", str(pool)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    doc = json.loads((folder / "results.json").read_text())
    runs = []
    for run in doc["runs"]:
        sel = run["selected_on_validation"]
        runs.append(
            {
                "seed": run["config"]["seed"],
                "round": sel["round"],
                "hr@10": sel["hr@10"],
                "ndcg@10": sel["ndcg@10"],
                "wall_seconds": run["wall_seconds"],
            }
        )
    return {
        "pool": pool or None,
        "command": " ".join(["fedrec", *cmd[3:]]),
        "runs": runs,
        "mean_hr@10": float(np.mean([r["hr@10"] for r in runs])),
        "mean_ndcg@10": float(np.mean([r["ndcg@10"] for r in runs])),
    }


def main(
    pools: IntList = Ints([0, 128, 256]),
    seeds: IntList = Ints([0, 1]),
    rounds: Positive = DEFAULTS.rounds,
) -> None:
    args = SimpleNamespace(pools=pools, seeds=seeds, rounds=rounds)
    out: dict[str, Any] = {"dataset": "filmtrust", "rounds": args.rounds, "pools": []}
    with tempfile.TemporaryDirectory() as tmp:
        for pool in args.pools:
            res = train(pool, args.seeds, args.rounds, Path(tmp) / f"pool-{pool}")
            out["pools"].append(res)
            OUT.parent.mkdir(parents=True, exist_ok=True)
            OUT.write_text(json.dumps(out, indent=2) + "\n")
            print(json.dumps({k: res[k] for k in ("pool", "mean_hr@10")}), flush=True)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
