"""Evaluation of every Amazon-Video user (1 test item + 99 negatives each), timed in one run.

Three evaluations of the same users on the trained Amazon-Video model of
bench/trained_models.py, interleaved, several times:

* ``reference``: :meth:`Scorer.score` (advanced indexing, a new tensor per step) over users
  in batches of 4,096;
* ``previous``: the evaluation before the chunked one (``candidate_logits`` over batches of
  512 users, a new (512, 100, H) tensor per step), kept here to be timed in the same run;
* ``fast``: :func:`fedrecgel.metrics.metric_sums` as it is (chunks of about
  :data:`fedrecgel.metrics.CHUNK_PAIRS` pairs, item rows gathered as one-row embedding
  bags, the layers' outputs in buffers allocated once).

The JSON has every time, both as wall seconds and as the CPU seconds of the (single) thread
(less sensitive to other processes on a shared machine), the medians, the same-run ratios,
the load average, whether the per-user ranks and the logits are identical to the reference's,
the FLOP of the score network against the same-run matmul rate, and a profile of one fast
evaluation (where the time goes).

    python -m bench.evaluation [--reps 5] [--threads 1]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch

from bench import trained_models
from bench.bench_cli import Positive, opt
from bench.roofline import matmul_rate
from fedrecgel.metrics import (
    CHUNK_PAIRS,
    KS,
    candidate_logits,
    metric_sums,
    per_user_metrics,
    rank_of_positive,
)
from fedrecgel.model import Scorer

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "bench" / "results" / "evaluation.json"
MATMUL_OPS = ("aten::mm", "aten::addmm")
GATHER_OPS = ("aten::index_select", "aten::_embedding_bag", "aten::_embedding_bag_forward_only")


def _candidates(items: np.ndarray, negs: np.ndarray) -> np.ndarray:
    return np.concatenate([items[:, None], negs], axis=1).astype(np.int64)


@torch.no_grad()
def reference(
    scorer: Scorer, private: dict[str, torch.Tensor], items: np.ndarray, negs: np.ndarray
) -> torch.Tensor:
    """Per-user ranks from Scorer.score in batches of 4,096 users."""
    ranks = []
    for start in range(0, len(items), 4096):
        sl = slice(start, start + 4096)
        logits = scorer.score(
            {k: v[sl] for k, v in private.items()},
            torch.from_numpy(_candidates(items[sl], negs[sl])),
        )
        ranks.append(rank_of_positive(logits[:, 0], logits[:, 1:]))
    return torch.cat(ranks)


@torch.no_grad()
def _previous_logits(
    scorer: Scorer, private: dict[str, torch.Tensor], items: torch.Tensor
) -> torch.Tensor:
    """The evaluation's logits before the chunked buffers (one batch, new tensors per step)."""
    s, cfg = scorer.shared, scorer.cfg
    u, c = items.shape
    flat = items.reshape(-1)
    gmf = torch.index_select(s["item_gmf"], 0, flat).view(u, c, -1)
    gmf.mul_(private["user_gmf"][:, None, :])
    assert scorer.item_first is not None
    user_half = torch.nn.functional.linear(private["user_mlp"], scorer.user_w0, s["tower.0.bias"])
    h = torch.index_select(scorer.item_first, 0, flat).view(u, c, -1)
    h.add_(user_half[:, None, :]).relu_()
    for k in range(1, cfg.layers):
        h = torch.nn.functional.linear(h, s[f"tower.{k}.weight"], s[f"tower.{k}.bias"]).relu_()
    z = torch.cat([gmf, h], dim=-1)
    return torch.nn.functional.linear(z, s["predict.weight"], s["predict.bias"]).squeeze(-1)


@torch.no_grad()
def previous(
    scorer: Scorer, private: dict[str, torch.Tensor], items: np.ndarray, negs: np.ndarray
) -> dict[str, float]:
    """The evaluation before the chunked one: batches of 512 users, sums per batch."""
    totals = {f"{m}@{k}": 0.0 for k in KS for m in ("hr", "ndcg")}
    for start in range(0, len(items), 512):
        sl = slice(start, start + 512)
        cand = torch.from_numpy(_candidates(items[sl], negs[sl]))
        logits = _previous_logits(scorer, {k: v[sl] for k, v in private.items()}, cand)
        ranks = rank_of_positive(logits[:, 0], logits[:, 1:])
        for name, vals in per_user_metrics(ranks, KS).items():
            totals[name] += float(vals.sum())
    return totals


def _profile(fn: Any) -> dict[str, Any]:
    """Where one call of ``fn`` goes: matrix products, gathers, other torch ops, the rest."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    mm_s = mm_flops = gather_s = other_s = 0.0
    calls = 0
    for ev in prof.key_averages():
        self_s = ev.self_cpu_time_total / 1e6
        calls += ev.count
        if ev.key in MATMUL_OPS:
            mm_s += self_s
            mm_flops += float(ev.flops or 0)
        elif ev.key in GATHER_OPS:
            gather_s += self_s
        else:
            other_s += self_s
    return {
        "wall_s_profiled": round(wall, 3),
        "matmul_share": round(mm_s / wall, 3),
        "matmul_gflops_inside": round(mm_flops / max(mm_s, 1e-12) / 1e9, 1),
        "gather_share": round(gather_s / wall, 3),
        "other_torch_ops_share": round(other_s / wall, 3),
        "outside_torch_ops_share": round(max(0.0, 1.0 - (mm_s + gather_s + other_s) / wall), 3),
        "torch_op_calls": calls,
    }


def _timed(fn: Any) -> tuple[float, float]:
    """(wall seconds, this thread's CPU seconds) of one call."""
    w0, c0 = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - w0, time.thread_time() - c0


def main(
    reps: Positive = 5,
    threads: Annotated[int, opt("torch threads (default: torch's)")] = 0,
) -> None:
    """Time the three evaluations and write the JSON result."""
    if threads:
        torch.set_num_threads(threads)
    data = trained_models.load("amazon-video")
    scorer = Scorer(data["cfg"], data["shared"])
    private = data["private"]
    items, negs = data["test_items"].numpy(), data["test_negatives"].numpy()
    load0 = os.getloadavg()[0]

    # the same numbers: per-user ranks, logits bit for bit, metric sums
    ref_ranks = reference(scorer, private, items, negs)
    ref = {k: float(v.sum()) for k, v in per_user_metrics(ref_ranks, KS).items()}
    fast_logits = candidate_logits(scorer, private, torch.from_numpy(_candidates(items, negs)))
    fast_ranks = rank_of_positive(fast_logits[:, 0], fast_logits[:, 1:])
    ref_logits = torch.cat(
        [
            scorer.score(
                {k: v[s : s + 4096] for k, v in private.items()},
                torch.from_numpy(_candidates(items[s : s + 4096], negs[s : s + 4096])),
            )
            for s in range(0, len(items), 4096)
        ]
    )
    fast = metric_sums(scorer, private, items, negs, KS)
    fast.pop("count")
    prev = previous(scorer, private, items, negs)

    runs: dict[str, Any] = {
        "reference": lambda: reference(scorer, private, items, negs),
        "previous": lambda: previous(scorer, private, items, negs),
        "fast": lambda: metric_sums(scorer, private, items, negs, KS),
    }
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    rates = []
    for _ in range(reps):
        rates.append(matmul_rate())
        for name, fn in runs.items():
            w, c = _timed(fn)
            wall[name].append(w)
            cpu[name].append(c)
        print(" ".join(f"{k} {wall[k][-1]:.3f}s ({cpu[k][-1]:.3f} cpu)" for k in runs), flush=True)
    profile = _profile(runs["fast"])

    cfg = data["cfg"]
    pairs = float(negs.shape[0] * (1 + negs.shape[1]))
    # the tower after its first layer (whose item half is precomputed per item) and the
    # predict layer over concat(GMF, tower): 2 FLOP per multiply-add, per (user, candidate)
    tower = sum(2.0 * i * o for i, o in cfg.tower_sizes()[1:]) + 2.0 * 2 * cfg.factor
    gflop = pairs * tower / 1e9
    rate = statistics.median(rates)
    floor = gflop * 1e9 / rate
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    result = {
        "command": " ".join(["python -m bench.evaluation", *sys.argv[1:]]),
        "dataset": "amazon-video",
        "users": len(items),
        "candidates_per_user": 1 + negs.shape[1],
        "chunk_pairs": CHUNK_PAIRS,
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": [load0, os.getloadavg()[0]],
        "gflop_matmul_work": round(gflop, 3),
        "matmul_gflops_same_run_median": round(rate / 1e9, 2),
        "matmul_floor_seconds": round(floor, 3),
        "fast_over_matmul_floor": round(med["fast"] / floor, 2),
        "fast_fraction_of_matmul_rate": round(floor / med["fast"], 2),
        "reference_seconds": [round(t, 3) for t in wall["reference"]],
        "previous_seconds": [round(t, 3) for t in wall["previous"]],
        "fast_seconds": [round(t, 3) for t in wall["fast"]],
        "reference_cpu_seconds": [round(t, 3) for t in cpu["reference"]],
        "previous_cpu_seconds": [round(t, 3) for t in cpu["previous"]],
        "fast_cpu_seconds": [round(t, 3) for t in cpu["fast"]],
        "reference_median_s": round(med["reference"], 3),
        "previous_median_s": round(med["previous"], 3),
        "fast_median_s": round(med["fast"], 3),
        "previous_cpu_median_s": round(med_cpu["previous"], 3),
        "fast_cpu_median_s": round(med_cpu["fast"], 3),
        "fast_min_s": round(min(wall["fast"]), 3),
        "speedup_same_run": round(med["reference"] / med["fast"], 2),
        "speedup_over_previous_same_run": round(med["previous"] / med["fast"], 2),
        "speedup_over_previous_cpu_same_run": round(med_cpu["previous"] / med_cpu["fast"], 2),
        "ranks_identical_to_reference": bool(torch.equal(fast_ranks, ref_ranks)),
        "logits_identical_to_reference": bool(torch.equal(fast_logits, ref_logits)),
        "max_abs_metric_difference": max(abs(ref[k] - fast[k]) / len(items) for k in ref),
        "max_abs_metric_difference_previous": max(abs(ref[k] - prev[k]) / len(items) for k in ref),
        "fast_profile": profile,
        "target_seconds_quiet_machine": 0.5,
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
