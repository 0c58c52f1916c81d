"""The popularity prior in a DP run: how much of the budget its counts should take
(``dp_prior_share``), against the same private run without it and DP popularity.

    nice -n 5 .venv/bin/python -m bench.dp_prior [--epsilon 3] [--shares 0,0.25,0.5,0.75,0.9]
        [--seeds 1,2,3] [--tuning-seed 100] [--datasets filmtrust/paper,...]
        [--out bench/results/dp_prior.json]

Each arm is the `private` preset (what ``fedrec train --target-epsilon E`` runs with no preset)
with ``dp_prior_share`` set to one of ``--shares``: the item counts released once with Gaussian
noise spending that share of epsilon alone (at most the preset's ``dp_prior_items`` items a
user), the rounds' noise calibrated so that release and rounds together spend epsilon (delta =
1/users); share 0 is the preset without the prior. Recorded per run: test and validation
HR@10 at the validation-selected round, the prior's chosen weight, the model's own test
figure, and the noise multipliers. The tuning seed's validation figures choose the share; the
other seeds report it. References per data set: popularity, and DP popularity (same k) at the
whole epsilon and at each share's part of it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from bench.bench_cli import (
    FloatList,
    Floats,
    IntList,
    Ints,
    OutFile,
    default_data_dir,
    fail,
    in_fresh_processes,
    validation_split,
    write_result,
)
from bench.dp_defaults import private_run

OUT = Path(__file__).resolve().parent / "results" / "dp_prior.json"


def _one(job: dict[str, Any]) -> dict[str, Any]:
    """One run, in a worker process."""
    sim, res, t0 = private_run(job, "private", {"dp_prior_share": job["share"]})
    sel = res.selected()
    assert sel is not None and sim.privacy is not None  # validation items; a DP run
    chosen = next(r for r in res.rounds if r.round == sel["round"])
    return {
        **{k: v for k, v in job.items() if k != "data_dir"},
        "test_hr@10": sel["hr@10"],
        "val_hr@10": chosen.val["hr@10"],
        "model_test_hr@10": sel.get("model.hr@10", sel["hr@10"]),
        "prior_weight": sel.get("prior_weight"),
        "round": sel["round"],
        "noise": sim.privacy.noise,
        "prior_noise": sim.privacy.prior_noise,
        "epsilon_spent": res.epsilon_spent(),
        "seconds": time.perf_counter() - t0,
    }


def _references(
    name: str, data_dir: Path | None, epsilon: float, shares: list[float], seeds: list[int]
) -> dict[str, Any]:
    from fedrecgel.baselines import popularity
    from fedrecgel.config import DEFAULTS
    from fedrecgel.dp_popularity import dp_popularity, plan_release

    split = validation_split(name, data_dir)
    k = DEFAULTS.dp_prior_items

    def at(eps: float) -> list[float]:
        release = plan_release(split.n_users, max_items=k, target_epsilon=eps)
        return [dp_popularity(split, release, s).rounds[0].test["hr@10"] for s in seeds]

    return {
        "popularity": popularity(split).rounds[0].test["hr@10"],
        "dp_popularity": at(epsilon),
        "dp_popularity_at_share": {str(s): at(s * epsilon) for s in shares if s > 0},
        "users": split.n_users,
        "k": k,
    }


def main(
    epsilon: float = 3.0,
    shares: FloatList = Floats([0.0, 0.25, 0.5, 0.75, 0.9]),
    seeds: IntList = Ints([1, 2, 3]),
    tuning_seed: int = 100,
    datasets: str = "filmtrust/paper,lastfm-2k/clean,amazon-video/paper",
    data_dir: Path | None = default_data_dir(),
    eval_every: int = 10,
    out: OutFile = OUT,
) -> None:
    if not 0 < epsilon < math.inf:
        raise fail(f"--epsilon must be a number > 0, got {epsilon}")
    if any(not 0 <= s < 1 for s in shares):
        raise fail(f"--shares must lie in [0, 1), got {shares}")
    names = [d.strip() for d in datasets.split(",") if d.strip()]
    if not names:
        raise fail("--datasets names no data set")
    common = {"epsilon": epsilon, "eval_every": eval_every, "data_dir": data_dir}
    jobs = [
        {**common, "dataset": d, "share": share, "seed": s}
        for d in names
        for share in shares
        for s in [tuning_seed, *seeds]
    ]
    t0 = time.perf_counter()
    runs = in_fresh_processes(_one, jobs)
    for r in runs:
        print(
            f"{r['dataset']} share {r['share']:g} seed {r['seed']}: test "
            f"{100 * r['test_hr@10']:.2f} val {100 * r['val_hr@10']:.2f} w {r['prior_weight']}"
        )
    refs = {d: _references(d, data_dir, epsilon, shares, seeds) for d in names}
    from fedrecgel.prior import CHOICE

    settings = {
        "epsilon": epsilon,
        "shares": shares,
        "seeds": seeds,
        "tuning_seed": tuning_seed,
        "eval_every": eval_every,
        "prior_choice": CHOICE,
    }
    write_result(out, {"settings": settings, "runs": runs, "references": refs}, t0)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
