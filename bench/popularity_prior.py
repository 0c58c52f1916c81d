"""What the popularity prior (fedrecgel/prior.py) changes in what `fedrec train` serves at the
defaults: the model alone against the model's logit + w * log(1 + item count), w chosen on
validation, beside popularity and the same NCF trained centrally (with and without the prior).

    nice -n 5 .venv/bin/python -m bench.popularity_prior [--seeds 0,1,2]
        [--datasets amazon-video/paper,...] [--arms federated,central]
        [--out bench/results/popularity_prior.json]

Each run is one training and both figures come from it, at the round with the best validation
HR@10 of the model's own ranking: *model alone*, the model's test figures there; *served*, the
test figures of the ranking served there (the prior at the weight that round's evaluation
chose on validation). Federated runs take the default preset (no preset named, as `fedrec
train` does); central runs take the step size and epochs `bench/central.py` chose on validation
(bench/results/central.json). The synthetic sets are bench/accuracy_diagnosis.py's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.accuracy_diagnosis import load
from bench.bench_cli import (
    IntList,
    Ints,
    OutFile,
    default_data_dir,
    fail,
    in_fresh_processes,
    subset,
    write_result,
)
from bench.report_common import load_result, mean_std, prior_choice_note, runs_by

if TYPE_CHECKING:
    from fedrecgel.data import Split
    from fedrecgel.full_ranking import ServedModel
    from fedrecgel.simulate import RunResult

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "popularity_prior.json"
DATASETS = (
    "amazon-video/paper",
    "filmtrust/paper",
    "lastfm-2k/clean",
    "lastfm-2k/paper",
    "synthetic-tastes/paper",
    "synthetic/paper",
    "synthetic-holdout/paper",
)
ARMS = ("federated", "central")


def arm_jobs(
    chosen: list[str], arms: list[str], seeds: list[int], data_dir: Path | None
) -> list[dict[str, Any]]:
    """One job per data set, arm and seed; a central one with the step size and epochs
    `bench/central.py` chose (bench/results/central.json), refused when it chose none."""
    central_of = json.loads((RESULTS / "central.json").read_text())["datasets"]
    missing = [d for d in chosen if d not in central_of]
    if "central" in arms and missing:
        raise fail(f"bench/results/central.json has no step size for {', '.join(missing)}")
    return [
        {"dataset": d, "arm": arm, "seed": s, "data_dir": data_dir}
        | (
            {"lr": central_of[d]["lr"], "epochs": central_of[d]["epochs"]}
            if arm == "central"
            else {}
        )
        for d in chosen
        for arm in arms
        for s in seeds
    ]


def train_arm(job: dict[str, Any], split: Split, kept: ServedModel | None = None) -> RunResult:
    """A job's training on ``split``: federated at the default preset (evaluated every 10
    rounds), or central at the job's step size and epochs (evaluated every epoch); ``kept``,
    when given, keeps the model of the round the run serves."""
    import torch

    from fedrecgel.baselines import CentralConfig, central
    from fedrecgel.presets import run_settings
    from fedrecgel.simulate import Simulator, TrainConfig

    torch.set_num_threads(1)
    name = job["dataset"].split("/")[0]
    cfg = TrainConfig(**run_settings("default", name), seed=job["seed"], eval_every=10)
    if job["arm"] == "federated":
        sim = Simulator(split, cfg)
        return sim.run(None if kept is None else kept.follow(sim))
    central_cfg = CentralConfig(
        cfg.model(split.n_items), seed=job["seed"], lr=job["lr"], epochs=job["epochs"]
    )
    return central(split, central_cfg, on_model=None if kept is None else kept.offer)


def _one(job: dict[str, Any]) -> dict[str, Any]:
    """One run in a worker process: the served and the model-alone figures."""
    split = load(job["dataset"], job["data_dir"])
    t0 = time.perf_counter()
    res = train_arm(job, split)
    served = res.selected()
    assert served is not None  # the split has validation items
    return {
        **{k: v for k, v in job.items() if k != "data_dir"},
        "served": {k: served[k] for k in ("round", "hr@10", "ndcg@10")},
        "weight": served.get("prior_weight", 0.0),
        # the same round; without a prior weight the served figures are the model's
        "model_alone": {
            k: served.get(f"model.{k}", served[k]) for k in ("round", "hr@10", "ndcg@10")
        },
        "seconds": time.perf_counter() - t0,
    }


def main(
    seeds: IntList = Ints([0, 1, 2]),
    datasets: str = ",".join(DATASETS),
    arms: str = ",".join(ARMS),
    data_dir: Path | None = default_data_dir(),
    out: OutFile = OUT,
) -> None:
    chosen = subset(datasets, DATASETS, "--datasets")
    jobs = arm_jobs(chosen, subset(arms, ARMS, "--arms"), seeds, data_dir)
    t0 = time.perf_counter()
    runs = in_fresh_processes(_one, jobs)
    for r in runs:
        print(
            f"{r['dataset']} {r['arm']} seed {r['seed']}: served {100 * r['served']['hr@10']:.2f} "
            f"(w {r['weight']:g}), model alone {100 * r['model_alone']['hr@10']:.2f}"
        )
    from fedrecgel.baselines import popularity

    refs = {d: {"popularity": popularity(load(d, data_dir)).rounds[0].test} for d in chosen}
    from fedrecgel.prior import CHOICE

    settings = {"seeds": seeds, "prior_choice": CHOICE}
    write_result(out, {"settings": settings, "runs": runs, "references": refs}, t0)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)


def section() -> list[str]:
    """docs/RESULTS.md's section on the prior (nothing before the benchmark has run)."""
    d: dict[str, Any] | None = load_result("popularity_prior.json")
    if d is None:
        return []
    lines = [
        "## What `fedrec train` serves at the defaults: the model and the popularity prior "
        "(`bench/popularity_prior.py`)",
        "",
        "Test HR@10 (%), mean ± std over seeds "
        f"{d['settings']['seeds']}, at the round chosen on the model's own validation HR@10. "
        "*model*: the model's logits alone; *served*: logit + w * log(1 + item count), w "
        "chosen on validation at that evaluation (among 0 to 8; a weight only when it moves "
        "clearly more validation users into the served top 10 than out, by a sign test, "
        "the one that moves the most), so both "
        "figures come from the same training run. *weights*: the w served, one per seed. "
        "Federated: the default preset; central: the same NCF trained in one place at the "
        "step size and epochs `bench/central.py` chose on validation. The accuracy table "
        "below predates the prior: its rows are the model alone." + prior_choice_note(d),
        "",
        "| data set | popularity | federated, model | federated, served | weights | "
        "central, model | central, served | weights |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by = runs_by(d["runs"], "dataset", "arm")
    for name, ref in d["references"].items():
        cells = [name, f"{100 * ref['popularity']['hr@10']:.2f}"]
        for arm in ARMS:
            runs = by.get((name, arm), [])
            if not runs:
                cells += ["-", "-", "-"]
                continue
            cells += [
                mean_std([r["model_alone"]["hr@10"] for r in runs]),
                mean_std([r["served"]["hr@10"] for r in runs]),
                ", ".join(f"{r['weight']:g}" for r in runs),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
