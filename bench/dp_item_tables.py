"""DP at 100,000 users with spectral item tables (``dp_item_share``) against DP with trained ones.

    nice -n 5 .venv/bin/python -m bench.dp_item_tables [--users 100000] [--rounds 20]
        [--epsilon 3] [--shares 0.33] [--seeds 0] [--out bench/results/dp_item_tables.json]

The split is ``bench.dp_scale``'s (the synthetic taste groups at ``--users`` users, 1,000
items, a validation item per user). Each arm is the shipped default preset (server Adam, the
score network's weight decay, 5 local steps, the rank fit) with Poisson cohorts of 1%, uploads
clipped to C = 0.25 and ``--target-epsilon``, and ``dp_item_share`` s: the item tables start from
one release of the item co-occurrence spending s*epsilon alone and stay fixed, the rounds'
noise (on the score network only) calibrated to what is left. Recorded: validation and test
HR@10 every 10 rounds, the test HR@10 at the validation-selected round, the noise multipliers
and the epsilon spent. References on the same split: popularity, DP popularity at epsilon
(k = 2, the k ``bench.dp_scale`` chose), and the private co-occurrence ranking at epsilon
(``fedrec train --method cooccurrence --target-epsilon``: one release, the rank on validation).
The same arms with trained item tables are ``bench.dp_scale``'s DP rows (100 rounds).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.bench_cli import (
    FloatList,
    Floats,
    IntList,
    Ints,
    OutFile,
    Positive,
    fail,
    in_fresh_processes,
    write_result,
)
from bench.dp_scale import DP_CLIP, DP_POPULARITY_K, _split

OUT = Path(__file__).resolve().parent / "results" / "dp_item_tables.json"


def _one(job: dict[str, Any]) -> dict[str, Any]:
    """One arm and seed, in a worker process."""
    import torch

    from fedrecgel.presets import run_settings
    from fedrecgel.simulate import Simulator, TrainConfig

    torch.set_num_threads(1)
    preset = run_settings("default", "synthetic")
    cfg = TrainConfig(
        **{
            **preset,
            "rounds": job["rounds"],
            "fraction": 0.01,
            "sampling": "poisson",
            "eval_every": 10,
            "seed": job["seed"],
            "dp_clip": DP_CLIP,
            "target_epsilon": job["epsilon"],
            "dp_item_share": job["share"],
            "grouped_uploads": True,
        }
    )
    t0 = time.perf_counter()
    sim = Simulator(_split(job["users"]), cfg)
    res = sim.run()
    sel = res.selected()
    assert sel is not None and sim.privacy is not None
    curve = [
        {"round": r.round, "val_hr@10": r.val["hr@10"], "test_hr@10": r.test["hr@10"]}
        for r in res.rounds
        if r.val
    ]
    return {
        **job,
        "test_hr@10": sel["hr@10"],
        "test_ndcg@10": sel["ndcg@10"],
        "round": sel["round"],
        "curve": curve,
        "noise": sim.privacy.noise,
        "item_noise": sim.privacy.item_noise,
        "epsilon_spent": res.epsilon_spent(),
        "seconds": time.perf_counter() - t0,
    }


def _references(users: int, epsilon: float, seeds: list[int]) -> dict[str, Any]:
    from fedrecgel.accountant import calibrate_release
    from fedrecgel.baselines import popularity
    from fedrecgel.cooccurrence import cooccurrence
    from fedrecgel.dp_popularity import dp_popularity, plan_release

    split = _split(users)
    release = plan_release(split.n_users, max_items=DP_POPULARITY_K, target_epsilon=epsilon)
    z = calibrate_release(epsilon, 1.0 / split.n_users)
    return {
        "popularity": popularity(split).rounds[0].test["hr@10"],
        "dp_popularity": [dp_popularity(split, release, s).rounds[0].test["hr@10"] for s in seeds],
        "dp_cooccurrence": [
            cooccurrence(split, noise=z, seed=s).rounds[0].test["hr@10"] for s in seeds
        ],
    }


def main(
    users: Positive = 100_000,
    rounds: Positive = 20,
    epsilon: float = 3.0,
    shares: FloatList = Floats([0.33]),
    seeds: IntList = Ints([0]),
    out: OutFile = OUT,
) -> None:
    if not 0 < epsilon <= 1000:
        raise fail(f"--epsilon must be in (0, 1000], got {epsilon}")
    if any(not 0 < s < 1 for s in shares):
        raise fail(f"--shares must lie in (0, 1), got {shares}")
    jobs = [
        {"users": users, "rounds": rounds, "epsilon": epsilon, "share": share, "seed": seed}
        for share in shares
        for seed in seeds
    ]
    t0 = time.perf_counter()
    runs = in_fresh_processes(_one, jobs)
    for r in runs:
        print(
            f"share {r['share']:g} seed {r['seed']}: test HR@10 {100 * r['test_hr@10']:.2f} "
            f"(round {r['round']})",
            flush=True,
        )
    settings = {"users": users, "rounds": rounds, "epsilon": epsilon, "shares": shares}
    refs = _references(users, epsilon, seeds)
    write_result(out, {"settings": {**settings, "seeds": seeds}, "runs": runs, **refs}, t0)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
