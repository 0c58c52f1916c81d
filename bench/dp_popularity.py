"""The private popularity reference point: test HR@10 / NDCG@10 of noisy item counts at user-level
(epsilon, delta)-DP, beside plain popularity and chance.

    nice -n 10 .venv/bin/python -m bench.dp_popularity [--data-dir ../shared/datasets]
        [--datasets filmtrust/paper,amazon-video/paper,lastfm-2k/clean] [--epsilons 1,3,8]
        [--seeds 0,1,2] [--tuning-seed 100] [--out bench/results/dp_popularity.json]

What ``fedrec train --method popularity --target-epsilon E --dp-max-items K`` computes
(:mod:`fedrecgel.dp_popularity`): each user counts at most K of its distinct training items,
Gaussian noise of std z*sqrt(K) on every item's count, z calibrated by the RDP accountant to
spend exactly E at delta = 1/users in one release. For each dataset and epsilon, K is chosen
from ``--k-grid`` by validation HR@10 on the tuning seed only (ties: the smaller K); the
reported seeds are apart from it, and their test figures are those of the one "round" the
ranking has (validation-selected trivially). The same seeds at the shipped default K
(``DEFAULT_MAX_ITEMS``) are reported too, and ``default_choice`` is the K with the best mean
validation HR@10 over every dataset and epsilon on the tuning seed (how the default was chosen).
Choosing K on validation items is not charged to the budget (as no tuning of the federated
runs is).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import numpy as np

from bench.bench_cli import (
    FloatList,
    IntList,
    OutFile,
    default_data_dir,
    fail,
    float_list,
    int_list,
    opt,
    run,
    validation_split,
)
from fedrecgel.baselines import popularity, random_ranking
from fedrecgel.data import Split
from fedrecgel.dp_popularity import DEFAULT_MAX_ITEMS, dp_popularity, plan_release

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "dp_popularity.json"
DATASETS = "filmtrust/paper,amazon-video/paper,lastfm-2k/clean"
K_GRID = "1,2,5,10,20,50,100,200"


def _figures(rows: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": len(rows)}
    for key in ("hr@10", "ndcg@10"):
        vals = [r[key] for r in rows]
        out[f"{key}.mean"] = float(np.mean(vals))
        out[f"{key}.std"] = float(np.std(vals))
    return out


def _test(split: Split, eps: float, k: int, seeds: list[int]) -> dict[str, Any]:
    release = plan_release(split.n_users, k, target_epsilon=eps)
    rows = []
    for seed in seeds:
        sel = dp_popularity(split, release, seed).selected()
        assert sel is not None  # the split has validation items
        rows.append({"seed": seed, "hr@10": sel["hr@10"], "ndcg@10": sel["ndcg@10"]})
    return {
        "k": k,
        "noise_multiplier": release.noise,
        "noise_std": release.noise_std,
        "epsilon": release.epsilon,
        "delta": release.delta,
        "runs": rows,
        **_figures(rows),
    }


def _dataset(split: Split, args: SimpleNamespace) -> dict[str, Any]:
    plain = popularity(split)
    chance = [random_ranking(split, seed=s).selected() for s in args.seeds]
    entry: dict[str, Any] = {
        "users": split.n_users,
        "items": split.n_items,
        "popularity": _figures([plain.selected() or {}]),
        "random": _figures([c for c in chance if c is not None]),
        "epsilons": {},
    }
    for eps in args.epsilons:
        val: dict[str, float] = {}
        for k in args.k_grid:
            release = plan_release(split.n_users, k, target_epsilon=eps)
            res = dp_popularity(split, release, args.tuning_seed)
            val[str(k)] = res.rounds[0].val["hr@10"]
        best = max(args.k_grid, key=lambda k: (val[str(k)], -k))
        entry["epsilons"][f"{eps:g}"] = {
            "validation_hr@10_by_k": val,
            "chosen_k": best,
            "tuned": _test(split, eps, best, args.seeds),
            "default": _test(split, eps, DEFAULT_MAX_ITEMS, args.seeds),
        }
        print(
            f"{split.name} epsilon {eps:g}: k {best} (validation HR@10 {val[str(best)]:.4f}) "
            f"test HR@10 {entry['epsilons'][f'{eps:g}']['tuned']['hr@10.mean']:.4f}",
            flush=True,
        )
    return entry


def _default_choice(results: dict[str, Any], grid: list[int]) -> dict[str, Any]:
    """The K with the best mean validation HR@10 over every dataset and epsilon."""
    cells = [e for d in results.values() for e in d["epsilons"].values()]
    mean = {k: float(np.mean([c["validation_hr@10_by_k"][str(k)] for c in cells])) for k in grid}
    return {"mean_validation_hr@10_by_k": mean, "k": max(grid, key=lambda k: (mean[k], -k))}


def main(
    data_dir: Path | None = default_data_dir(),
    datasets: Annotated[str, opt("name/protocol, comma-separated")] = DATASETS,
    epsilons: FloatList = float_list("1,3,8"),
    k_grid: IntList = int_list(K_GRID),
    seeds: IntList = int_list("0,1,2"),
    tuning_seed: int = 100,
    out: OutFile = OUT,
) -> None:
    args = SimpleNamespace(**locals())
    if args.tuning_seed in args.seeds:
        raise fail("--tuning-seed must be apart from the reported --seeds")
    if min(args.k_grid) < 1:
        raise fail("--k-grid: every K must be at least 1")
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    for key in args.datasets.split(","):
        split = validation_split(key, args.data_dir)
        results[key] = _dataset(split, args)
    payload = {
        "settings": {
            "epsilons": args.epsilons,
            "delta": "1 / users",
            "k_grid": args.k_grid,
            "seeds": args.seeds,
            "tuning_seed": args.tuning_seed,
            "shipped_default_k": DEFAULT_MAX_ITEMS,
        },
        "datasets": results,
        "default_choice": _default_choice(results, args.k_grid),
        "seconds": time.perf_counter() - t0,
    }
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run(main)
