"""What sparse secure aggregation's popularity prior (the counts its rounds unmask, fixed once
they counted the clients twice over: :class:`fedrecgel.prior.RoundPrior`) serves at the
defaults, against the exact counts' prior and the model alone.

    nice -n 5 .venv/bin/python -m bench.secagg_prior [--seeds 0] [--datasets ...] [--rounds N]

A sparse secure round in the simulator costs about 50 s on Amazon-Video here (807 clients each
masking its rows with 16 neighbours), against about 1 s plain, so 300 rounds of it do not fit a
bench. Its mean is the plain mean to within its fixed-point step
(``tests/core/test_secagg_sparse.py``) and its instance A unmasks exactly the plain count of
the cohort's items outside the round's pool (``harness/union_attack.observe`` checks it against
the protocol), so each arm here is a plain run of the default preset with the public pool of
128 a sparse run needs, ranked with:

* *round prior*: the prior a sparse secure run fixes (the same cohorts' counts outside the same
  pools, into the simulator's own :class:`~fedrecgel.prior.RoundPrior`, as
  ``tests/core/test_round_prior.py`` checks a secure run does);
* *exact prior*: the training counts, what a plain run ranks with.

The model alone is each run's own figure at the same round (what a secure run served before
the round prior). Test HR@10 at the round chosen on the model's validation HR@10.
Writes bench/results/secagg_prior.json.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.accuracy_diagnosis import load
from bench.bench_cli import (
    ROOT,
    IntList,
    Ints,
    default_data_dir,
    in_fresh_processes,
    run,
    subset,
    write_result,
)
from bench.secagg_union import POOL

OUT = ROOT / "bench" / "results" / "secagg_prior.json"
DATASETS = ("filmtrust/paper", "lastfm-2k/clean", "amazon-video/paper")
ARMS = ("round", "exact")


def _one(job: dict[str, Any]) -> dict[str, Any]:
    """One plain run in a worker process, ranked with the arm's prior."""
    import numpy as np
    import torch

    from fedrecgel.presets import run_settings
    from fedrecgel.prior import RoundCounts, RoundPrior, log_prior
    from fedrecgel.simulate import Simulator, TrainConfig
    from harness.union_attack import observe

    torch.set_num_threads(1)
    split = load(job["dataset"], job["data_dir"])
    name = job["dataset"].split("/")[0]
    settings = run_settings("default", name)
    if job["rounds"]:
        settings["rounds"] = job["rounds"]
    cfg = TrainConfig(**settings, seed=job["seed"], eval_every=10, negative_pool=POOL)
    sim = Simulator(split, cfg)
    fixed_at = None
    if job["arm"] == "round":
        # the prior the sparse run fixes: instance A's counts of the same cohorts and pools
        held = [split.user_train(u) for u in range(split.n_users)]
        acc = RoundPrior(split.n_items)
        for obs in observe(held, split.n_items, cfg, cfg.rounds):
            acc.add(RoundCounts(obs.counts, obs.pool, len(obs.cohort)))
            if acc.covers(split.n_users):
                fixed_at, prior = obs.round_id, log_prior(acc.estimate(split.n_users))
                break
        sim.prior, train = None, sim._train

        def counted_train(r: int, cohort: np.ndarray) -> float:
            loss = train(r, cohort)
            if r == fixed_at:  # fixed after that round's counts, as the secure run fixes it
                sim.prior = prior
            return loss

        sim._train = counted_train  # type: ignore[method-assign]
    t0 = time.perf_counter()
    res = sim.run()
    served = res.selected()
    assert served is not None  # the split has validation items
    return {
        **{k: v for k, v in job.items() if k != "data_dir"},
        "prior_fixed_at": fixed_at,
        "served": {k: served[k] for k in ("round", "hr@10", "ndcg@10")},
        "weight": served.get("prior_weight"),
        "model_alone": {
            k: served.get(f"model.{k}", served[k]) for k in ("round", "hr@10", "ndcg@10")
        },
        "seconds": time.perf_counter() - t0,
    }


def main(
    seeds: IntList = Ints([0]),
    datasets: str = ",".join(DATASETS),
    rounds: int = 0,
    data_dir: Path | None = default_data_dir(),
) -> None:
    chosen = subset(datasets, DATASETS, "--datasets")
    jobs = [
        {"dataset": d, "arm": arm, "seed": s, "data_dir": data_dir, "rounds": rounds}
        for d in chosen
        for s in seeds
        for arm in ARMS
    ]
    t0 = time.perf_counter()
    runs = in_fresh_processes(_one, jobs)
    for r in runs:
        print(
            f"{r['dataset']} {r['arm']} seed {r['seed']}: served {100 * r['served']['hr@10']:.2f} "
            f"(w {r['weight']}), model alone {100 * r['model_alone']['hr@10']:.2f}"
        )
    from fedrecgel.baselines import popularity

    refs = {d: {"popularity": popularity(load(d, data_dir)).rounds[0].test} for d in chosen}
    command = f"python -m bench.secagg_prior --seeds {','.join(map(str, seeds))}"
    settings = {"seeds": seeds, "pool": POOL, "rounds": rounds or None, "command": command}
    write_result(OUT, {"settings": settings, "runs": runs, "references": refs}, t0)


if __name__ == "__main__":
    run(main)
