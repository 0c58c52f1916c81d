"""Why a federated run ranks like a popularity count: instruments measured along a run.

    nice -n 5 .venv/bin/python -m bench.accuracy_diagnosis [--datasets lastfm-2k/clean,...]
        [--rounds 200] [--every 10] [--data-dir ../shared/datasets]

For each dataset and each configuration (the paper's settings, the same with a 10x server step,
and the project's defaults),
every ``--every`` rounds on the tuning seed (100), validation items only:

* ``val_hr``: validation HR@10; ``val_hr_mean_user``: the same with every user's private
  embeddings replaced by the population's mean (a ranking that knows nothing of the user);
  when the two agree, the user embeddings add nothing to the ranking;
* ``item_share``: the share of the within-user variance of the candidates' logits that the
  mean user's logits explain (1: every user ranks the items alike);
* ``spearman_pop``: rank correlation of the mean user's logits with the items' training counts;
* ``move``: distance of the item tables and the first tower layer from their initial values,
  relative to the initial norm; ``max_step``: the largest change of an item-table entry in the
  round (the server optimizer's effective step);
* ``user_norm``, ``user_cos_mean``: mean norm of the private GMF embeddings and mean cosine to
  the population's mean embedding; ``user_steps``: mean private Adam steps taken per user;
* ``neg_share``: for 64 members of the round's cohort, the share of the squared norm of their
  item-row upload that falls on their sampled negatives (per-client uploads, computed on copies:
  the run's state is not touched).

Writes ``bench/results/diagnosis.json``; ``bench/report.py`` plots it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr

from bench.bench_cli import OutFile, Positive, default_data_dir
from fedrecgel.baselines import item_popularity
from fedrecgel.data import Split, load_split
from fedrecgel.metrics import KS, candidate_logits, means, metric_sums
from fedrecgel.model import Scorer
from fedrecgel.presets import resolve
from fedrecgel.sam import cohort_step
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.synthetic import synthetic_split

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "diagnosis.json"
SEED = 100
#: the synthetic set with taste groups (personal structure popularity cannot see)
SYNTHETIC_TASTES = {
    "n_users": 2000,
    "n_items": 1000,
    "interactions_per_user": 20.0,
    "skew": 1.0,
    "groups": 20,
    "affinity": 0.8,
}


#: a set no choice of the defaults saw (not in the grid): MovieLens-100K's shape (943 users,
#: 1,682 items, 106 interactions each) with taste groups; only the leave-out check trains on it
SYNTHETIC_HOLDOUT = {
    "n_users": 943,
    "n_items": 1682,
    "interactions_per_user": 106.0,
    "skew": 0.8,
    "groups": 12,
    "affinity": 0.6,
}


#: the synthetic sets by name: the generator's settings and seed
SYNTHETIC_SETS: dict[str, tuple[dict[str, Any], int]] = {
    # the accuracy table's synthetic set: popularity and no more
    "synthetic": (
        {"n_users": 2000, "n_items": 1000, "interactions_per_user": 20.0, "skew": 1.0},
        0,
    ),
    "synthetic-tastes": (SYNTHETIC_TASTES, 0),
    "synthetic-holdout": (SYNTHETIC_HOLDOUT, 7),
}


def load(key: str, data_dir: Path | None) -> Split:
    """A dataset key ``name/protocol`` (a synthetic set's protocol is optional) as a
    validation split named after the data set."""
    name, _, protocol = key.partition("/")
    if name in SYNTHETIC_SETS:
        settings, seed = SYNTHETIC_SETS[name]
        return replace(synthetic_split(**settings, seed=seed, validation=True), name=name)
    return load_split(name, data_dir, validation=True, protocol=protocol)  # type: ignore[arg-type]


def configs(rounds: int) -> dict[str, TrainConfig]:
    """The configurations compared, each ``rounds`` rounds on the default radii: the paper's
    settings, the paper's with a 10x server step, and the shipped defaults."""
    base = TrainConfig(seed=SEED, rounds=rounds, eval_every=0)
    return {
        "paper": base,
        "paper, server step 0.01": base.replace(server_lr=0.01),
        "default": base.replace(**{**resolve("default", ""), "rounds": rounds}),
    }


def _neg_share(sim: Simulator, split: Split, r: int) -> float:
    """Share of the squared item-row upload norm on sampled negatives, 64 cohort members."""
    from fedrecgel.cohort import select_cohort

    cohort = select_cohort(sim.users, sim.config.fraction, sim.config.seed, r)[:64]
    samples = sim.clients.samples(r, cohort, split.user_train)
    res = cohort_step(sim.model_cfg, sim.shared, cohort, sim.store.get(cohort), samples, sim.hp)
    neg = tot = 0.0
    for up, u in zip(res.uploads, cohort, strict=True):
        pos = np.unique(split.user_train(int(u)))
        for idx, rows in up.rows.values():
            sq = rows.square().sum(1).numpy()
            is_pos = np.isin(idx.numpy(), pos)
            neg += float(sq[~is_pos].sum())
            tot += float(sq.sum())
    return neg / tot if tot else 0.0


def instrument(split: Split, cfg: TrainConfig, every: int) -> list[dict[str, Any]]:
    """Run ``cfg`` on ``split`` and measure the instruments every ``every`` rounds."""
    sim = Simulator(split, cfg)
    init = {k: v.clone() for k, v in sim.shared.items()}
    pop = item_popularity(split)
    assert split.val_items is not None and split.val_negatives is not None
    cand = np.concatenate([split.val_items[:, None], split.val_negatives], 1).astype(np.int64)
    cand_t = torch.from_numpy(cand)
    users = sim.users
    out: list[dict[str, Any]] = []
    torch.set_grad_enabled(False)
    for r in range(1, cfg.rounds + 1):
        before = sim.shared["item_gmf"].clone()
        neg = _neg_share(sim, split, r) if (r % every == 0 or r == 1) else None
        rec = sim.step()
        if neg is None:
            continue
        scorer = Scorer(sim.model_cfg, sim.shared)
        priv = sim.store.params(users)
        mean_user = {k: v.mean(0, keepdim=True).expand_as(v).contiguous() for k, v in priv.items()}
        val = means(metric_sums(scorer, priv, split.val_items, split.val_negatives, KS))
        val_mean = means(metric_sums(scorer, mean_user, split.val_items, split.val_negatives, KS))
        logits = candidate_logits(scorer, priv, cand_t)
        logits_mean = candidate_logits(scorer, mean_user, cand_t)
        lc = logits - logits.mean(1, keepdim=True)
        lm = logits_mean - logits_mean.mean(1, keepdim=True)
        ug = priv["user_gmf"]
        steps = sim.store.data.step[: sim.store.size].to(torch.float64)
        out.append(
            {
                "round": r,
                "loss": rec.loss,
                "val_hr": val["hr@10"],
                "val_hr_mean_user": val_mean["hr@10"],
                "item_share": 1.0 - float((lc - lm).square().sum() / lc.square().sum()),
                "spearman_pop": float(spearmanr(lm.numpy().ravel(), pop[cand].ravel())[0]),
                "move": {
                    k: float((sim.shared[k] - init[k]).norm() / init[k].norm())
                    for k in ("item_gmf", "item_mlp", "tower.0.weight")
                    if k in init
                },
                "max_step": float((sim.shared["item_gmf"] - before).abs().max()),
                "user_norm": float(ug.norm(dim=1).mean()),
                "user_cos_mean": float(
                    torch.nn.functional.cosine_similarity(ug, ug.mean(0, keepdim=True)).mean()
                ),
                "user_steps": float(steps.sum() / len(users)),
                "neg_share": neg,
            }
        )
        print(json.dumps({"round": r, "val_hr": round(val["hr@10"], 4)}), flush=True)
    torch.set_grad_enabled(True)
    return out


def main(
    datasets: str = "lastfm-2k/clean,filmtrust/paper,synthetic-tastes",
    rounds: Positive = 200,
    every: Positive = 10,
    data_dir: Path | None = default_data_dir(),
    out: OutFile = OUT,
) -> None:
    """Measure and write the instruments (see the module docstring)."""
    measure(datasets, rounds, every, data_dir, out, configs(rounds), instrument)


def measure(
    datasets: str,
    rounds: int,
    every: int,
    data_dir: Path | None,
    out: Path,
    cfgs: dict[str, TrainConfig],
    instrument: Callable[[Split, TrainConfig, int], list[dict[str, Any]]],
) -> None:
    """Run every configuration on every dataset of ``datasets`` (validation items only),
    ``instrument`` measuring every ``every`` rounds of each run; written to ``out`` after each
    dataset (the datasets of an earlier file are kept)."""
    torch.set_num_threads(1)
    result: dict[str, Any] = {"seed": SEED, "rounds": rounds, "datasets": {}}
    if out.exists():
        result = json.loads(out.read_text())
    for key in datasets.split(","):
        split = load(key, data_dir)  # only validation items are ranked
        runs = {}
        for label, cfg in cfgs.items():
            print(f"{key} {label}", flush=True)
            runs[label] = {"config": cfg.model_dump(), "rounds": instrument(split, cfg, every)}
        result["datasets"][key] = runs
        out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
