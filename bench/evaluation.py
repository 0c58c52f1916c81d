"""Evaluation of every Amazon-Video user (1 test item + 99 negatives each), timed in one run.

``reference``: the evaluation as it was, :meth:`Scorer.score` (advanced indexing, a new
tensor per step) over users in batches of 4,096; ``fast``: :func:`fedrecgel.metrics.metric_sums`
(:func:`~fedrecgel.metrics.candidate_logits`, batches of 512). Both run on the trained
Amazon-Video model of bench/trained_models.py, interleaved, several times; the JSON has every
time, the medians, their ratio (the figure that survives a shared, loaded machine), the load
average, and whether the two give the same metrics.

    python bench/evaluation.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import trained_models  # noqa: E402
from roofline import matmul_rate  # noqa: E402

from fedrecgel.metrics import KS, metric_sums, per_user_metrics, rank_of_positive  # noqa: E402
from fedrecgel.model import Scorer  # noqa: E402

OUT = ROOT / "bench" / "results" / "evaluation.json"


@torch.no_grad()
def reference(
    scorer: Scorer, private: dict[str, torch.Tensor], items: np.ndarray, negs: np.ndarray
) -> dict[str, float]:
    """The evaluation before: Scorer.score in batches of 4,096 users."""
    totals: dict[str, float] = {}
    for start in range(0, len(items), 4096):
        sl = slice(start, start + 4096)
        cand = np.concatenate([items[sl, None], negs[sl]], axis=1).astype(np.int64)
        logits = scorer.score({k: v[sl] for k, v in private.items()}, torch.from_numpy(cand))
        ranks = rank_of_positive(logits[:, 0], logits[:, 1:])
        for name, vals in per_user_metrics(ranks, KS).items():
            totals[name] = totals.get(name, 0.0) + float(vals.sum())
    return totals


def main() -> None:
    """Time both evaluations and write the JSON result."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data = trained_models.load("amazon-video")
    scorer = Scorer(data["cfg"], data["shared"])
    private = data["private"]
    items, negs = data["test_items"].numpy(), data["test_negatives"].numpy()
    load0 = os.getloadavg()[0]
    ref = reference(scorer, private, items, negs)
    fast = metric_sums(scorer, private, items, negs, KS)
    fast.pop("count")
    t_ref, t_fast, rates = [], [], []
    for _ in range(args.reps):
        rates.append(matmul_rate())
        t0 = time.perf_counter()
        reference(scorer, private, items, negs)
        t1 = time.perf_counter()
        metric_sums(scorer, private, items, negs, KS)
        t2 = time.perf_counter()
        t_ref.append(t1 - t0)
        t_fast.append(t2 - t1)
        print(f"reference {t_ref[-1]:.3f}s fast {t_fast[-1]:.3f}s", flush=True)
    cfg = data["cfg"]
    pairs = float(negs.shape[0] * (1 + negs.shape[1]))
    # the tower after its first layer (whose item half is precomputed per item) and the
    # predict layer over concat(GMF, tower): 2 FLOP per multiply-add, per (user, candidate)
    tower = sum(2.0 * i * o for i, o in cfg.tower_sizes()[1:]) + 2.0 * 2 * cfg.factor
    gflop = pairs * tower / 1e9
    rate = statistics.median(rates)
    result = {
        "command": " ".join(["python bench/evaluation.py", *sys.argv[1:]]),
        "dataset": "amazon-video",
        "gflop_matmul_work": round(gflop, 3),
        "matmul_gflops_same_run_median": round(rate / 1e9, 2),
        "matmul_floor_seconds": round(gflop * 1e9 / rate, 3),
        "fast_over_matmul_floor": round(statistics.median(t_fast) / (gflop * 1e9 / rate), 2),
        "users": len(items),
        "candidates_per_user": 1 + negs.shape[1],
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": [load0, os.getloadavg()[0]],
        "reference_seconds": [round(t, 3) for t in t_ref],
        "fast_seconds": [round(t, 3) for t in t_fast],
        "reference_median_s": round(statistics.median(t_ref), 3),
        "fast_median_s": round(statistics.median(t_fast), 3),
        "speedup_same_run": round(statistics.median(t_ref) / statistics.median(t_fast), 2),
        "max_abs_metric_difference": max(abs(ref[k] - fast[k]) / len(items) for k in ref),
        "target_seconds_quiet_machine": 0.5,
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
