"""What sparse secure aggregation's popularity prior (the counts its rounds unmask, fixed once
they counted the clients twice over: :class:`fedrecgel.prior.RoundPrior`) serves at the
defaults, against the exact counts' prior and the model alone.

    nice -n 5 .venv/bin/python -m bench.secagg_prior [--seeds 0] [--datasets ...] [--rounds N]
        [--cohorts clients,groups] [--pool 128 --out bench/results/secagg_prior.json]

A sparse secure round in the simulator costs about 21 s on Amazon-Video here (807 clients each
masking its rows with 16 neighbours, one after another: 2026-12-07, idle machine, 2 torch
threads), against 0.3 s plain, so 300 rounds of it per run do not fit a bench. Its mean is the
plain mean to within its fixed-point step (``tests/core/test_secagg_sparse.py``) and its
instance A unmasks exactly the plain count of the cohort's items outside the round's pool
(``harness/union_attack.observe`` checks it against the protocol), so each run here is a plain
run of the default preset with the public pool of 128 a sparse run needs, its cohorts drawn
client by client or as whole groups of about 10 users (``cohort_groups``, what hides single
items' holders: ``bench/secagg_union.py``). Every evaluation ranks twice, with:

* *round prior*: the prior a sparse secure run fixes (the same cohorts' counts outside the same
  pools, into the simulator's own :class:`~fedrecgel.prior.RoundPrior`, as
  ``tests/core/test_round_prior.py`` checks a secure run does);
* *exact prior*: the training counts, what a plain run ranks with.

The model alone is each run's own figure at the same round (what a secure run served before
the round prior). Test HR@10 at the round chosen on the model's validation HR@10 (the same
round for both priors). Writes bench/results/secagg_prior.json.
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
    Positive,
    default_data_dir,
    in_fresh_processes,
    run,
    subset,
    write_result,
)
from bench.secagg_union import GROUP_SIZE, POOL

OUT = ROOT / "bench" / "results" / "secagg_prior.json"
DATASETS = ("filmtrust/paper", "lastfm-2k/clean", "amazon-video/paper")
ARMS = ("round", "exact")
#: how each job's cohorts are drawn: clients one by one, or whole groups (``cohort_groups``)
COHORTS = ("clients", "groups")


def _one(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One plain run in a worker process, each evaluation ranked with both arms' priors: a row
    an arm, at the same round (chosen on the model's own validation HR@10, which no prior
    moves)."""
    import torch

    from fedrecgel.presets import run_settings
    from fedrecgel.prior import RoundCounts, RoundPrior, choose, log_prior
    from fedrecgel.simulate import Simulator, TrainConfig
    from harness.union_attack import observe

    torch.set_num_threads(1)
    split = load(job["dataset"], job["data_dir"])
    name = job["dataset"].split("/")[0]
    settings = run_settings("default", name)
    if job["rounds"]:
        settings["rounds"] = job["rounds"]
    groups = max(2, round(split.n_users / GROUP_SIZE)) if job["cohorts"] == "groups" else None
    cfg = TrainConfig(
        **settings, seed=job["seed"], eval_every=10, negative_pool=job["pool"], cohort_groups=groups
    )
    sim = Simulator(split, cfg)
    # the prior the sparse run fixes: instance A's counts of the same cohorts and pools
    held = [split.user_train(u) for u in range(split.n_users)]
    acc, fixed_at, prior = RoundPrior(split.n_items), None, None
    for obs in observe(held, split.n_items, cfg, cfg.rounds):
        acc.add(RoundCounts(obs.counts, obs.pool, len(obs.cohort)))
        if acc.covers(split.n_users):
            fixed_at, prior = obs.round_id, log_prior(acc.estimate(split.n_users))
            break
    exact, evaluate = sim.prior, sim.evaluate
    with_exact: dict[int, tuple[dict[str, float], dict[str, float]]] = {}

    def both() -> tuple[dict[str, float], dict[str, float]]:
        sim.prior = exact
        with_exact[sim.round_id] = evaluate()
        # fixed after that round's counts, as the secure run fixes it
        fixed = fixed_at is not None and sim.round_id >= fixed_at
        sim.prior = prior if fixed else None
        return evaluate()

    sim.evaluate = both  # type: ignore[method-assign]
    t0 = time.perf_counter()
    res = sim.run()
    at = res.selected()
    assert at is not None  # the split has validation items
    other = choose(*with_exact[at["round"]], n_val=split.n_users)
    served = {
        "round": {k: at[k] for k in ("round", "hr@10", "ndcg@10")},
        "exact": {"round": at["round"], **{k: other.test[k] for k in ("hr@10", "ndcg@10")}},
    }
    weights = {"round": at.get("prior_weight"), "exact": other.weight}
    model = {k: at.get(f"model.{k}", at[k]) for k in ("round", "hr@10", "ndcg@10")}
    seconds = time.perf_counter() - t0
    head = {k: v for k, v in job.items() if k != "data_dir"}
    return [
        {
            **head,
            "cohort_groups": groups,
            "arm": arm,
            "prior_fixed_at": fixed_at if arm == "round" else None,
            "served": served[arm],
            "weight": weights[arm],
            "model_alone": model,
            "seconds": seconds,
        }
        for arm in ARMS
    ]


def main(
    seeds: IntList = Ints([0]),
    datasets: str = ",".join(DATASETS),
    cohorts: str = ",".join(COHORTS),
    rounds: int = 0,
    pool: Positive = POOL,
    out: Path = OUT,
    data_dir: Path | None = default_data_dir(),
) -> None:
    """``--pool`` and ``--out``: a probe of another pool, written apart (the report reads
    bench/results/secagg_prior.json only)."""
    chosen = subset(datasets, DATASETS, "--datasets")
    kinds = subset(cohorts, COHORTS, "--cohorts")
    jobs = [
        {
            "dataset": d,
            "cohorts": c,
            "seed": s,
            "data_dir": data_dir,
            "rounds": rounds,
            "pool": pool,
        }
        for d in chosen
        for c in kinds
        for s in seeds
    ]
    t0 = time.perf_counter()
    runs = [row for rows in in_fresh_processes(_one, jobs) for row in rows]
    for r in runs:
        print(
            f"{r['dataset']} {r['cohorts']} {r['arm']} seed {r['seed']}: "
            f"served {100 * r['served']['hr@10']:.2f} (w {r['weight']}), "
            f"model alone {100 * r['model_alone']['hr@10']:.2f}"
        )
    from fedrecgel.baselines import popularity

    refs = {d: {"popularity": popularity(load(d, data_dir)).rounds[0].test} for d in chosen}
    command = f"python -m bench.secagg_prior --seeds {','.join(map(str, seeds))}"
    if chosen != list(DATASETS):
        command += f" --datasets {','.join(chosen)}"
    if kinds != list(COHORTS):
        command += f" --cohorts {','.join(kinds)}"
    if pool != POOL or out != OUT:
        command += f" --pool {pool} --out {out}"
    from fedrecgel.prior import CHOICE

    settings = {
        "seeds": seeds,
        "pool": pool,
        "group_size": GROUP_SIZE,
        "rounds": rounds or None,
        "command": command,
        "prior_choice": CHOICE,
    }
    write_result(out, {"settings": settings, "runs": runs, "references": refs}, t0)


if __name__ == "__main__":
    run(main)
