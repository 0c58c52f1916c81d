"""Ranking with embeddings fitted to the model (``rank_fit_steps``) where users take part in few
rounds: the synthetic taste groups at 100,000 users, cohorts of 1%.

    nice -n 5 .venv/bin/python -m bench.rank_fit [--users 100000] [--rounds 100]
        [--fraction 0.01] [--steps 20] [--lr 0.05] [--seeds 0,1,2] [--dp-seeds 0]
        [--epsilon 3] [--eval-every 100] [--defaults DATASETS] [--jobs 2]
        [--out bench/results/rank_fit.json]

The split and the settings are ``bench/dp_scale.py``'s: the accuracy tables' synthetic-tastes set
at ``--users`` users with a validation item per user, ``--rounds`` rounds of Poisson cohorts of
``--fraction`` of the users (each user takes part in about rounds x fraction of them, one here).
A user's private embeddings move only in its rounds, so at the end most users rank with
embeddings fitted to an early model, or never fitted at all. Arms, each the test HR@10 / NDCG@10
at the validation-selected evaluated round (mean and std over the seeds):

* ``stored``: the shipped default preset, every user ranked with its stored embeddings (the
  run as it was);
* ``fitted``: the same run (the same training: the fit changes no stored state and no upload),
  each user whose embeddings took fewer than ``--steps`` private steps fitting a copy of them to
  the evaluated model (``--steps`` Adam steps of ``--lr`` on its own training items and fresh
  negatives) before ranking;
* the same two under client-level DP at ``--epsilon`` (``bench/dp_scale.py``'s DP settings;
  ``--dp-seeds``);
* reference points on the same split: popularity, DP popularity at ``--epsilon`` (K = 2, as
  ``bench/dp_scale.py`` chose it on its tuning seed) and the item co-occurrence ranking
  (``fedrec train --method cooccurrence``, exact, rank chosen on validation).

``--defaults DATASETS``: the shipped default preset on each shipped data set (seed 0; cohorts of
10%, 300 rounds), one training run evaluated every 10 rounds with and without the fit (the fit
changes no stored state, so it is one run): the figures at the round chosen on the model's own
validation HR@10, as ``fedrec train`` reports them (popularity prior included), and the share of
users fitted there. Users who took part in many rounds are not fitted, because fitting
well-trained embeddings again to a user's few training items overfits them: the final model is
ranked with every user fitted too (forced, whatever its steps; validation and test HR@10 of the
model alone), to show it.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import numpy as np

from bench.bench_cli import (
    IntList,
    OutFile,
    Positive,
    default_data_dir,
    int_list,
    opt,
    positive,
    run,
    validation_split,
)
from bench.dp_scale import (
    DP_CLIP,
    DP_MOMENTUM,
    DP_POPULARITY_K,
    DP_SERVER_LR,
    TASTES,
    _config,
    _curve,
    _figures,
    _split,
    _write,
)
from bench.report_common import load_result, prior_choice_note
from fedrecgel.baselines import popularity
from fedrecgel.config import DEFAULTS
from fedrecgel.cooccurrence import cooccurrence
from fedrecgel.dp_popularity import dp_popularity, plan_release
from fedrecgel.prior import CHOICE

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "rank_fit.json"


def _one(job: tuple[SimpleNamespace, int, float | None, int]) -> dict[str, Any]:
    """One run (in a worker process): the validation-selected figures and the curve."""
    import torch

    from fedrecgel.simulate import Simulator

    torch.set_num_threads(1)
    args, seed, epsilon, steps = job
    cfg = _config(args, seed, epsilon, args.dp_server_lr).replace(
        rank_fit_steps=steps, rank_fit_lr=args.lr, popularity_prior=False
    )
    t0 = time.perf_counter()
    res = Simulator(_split(args.users), cfg).run()
    sel = res.selected()
    assert sel is not None  # the split has validation items
    return {
        "seed": seed,
        "epsilon": epsilon,
        "rank_fit_steps": steps,
        "epsilon_spent": res.epsilon_spent(),
        "selected": {k: sel[k] for k in ("round", "hr@10", "ndcg@10")},
        "curve": _curve(res),
        "seconds": time.perf_counter() - t0,
    }


def _defaults(job: tuple[SimpleNamespace, str]) -> dict[str, Any]:
    """The default preset on a shipped data set (seed 0), one training run evaluated every 10
    rounds both ways (the fit changes no stored state, so the runs are one): the figures at the
    round chosen on the model's own validation HR@10, with and without the fit, and the share of
    users it fitted there. At the end, the final model ranked with every user fitted (forced,
    whatever its steps)."""
    import torch

    from fedrecgel.presets import run_settings
    from fedrecgel.rank_fit import RankFit, needs_fit, ranking_params
    from fedrecgel.simulate import RoundRecord, RunResult, Simulator, TrainConfig

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    args, key = job
    split = validation_split(key, args.data_dir)
    cfg = TrainConfig(**run_settings("default", key.split("/")[0]), seed=0, eval_every=0)
    sim = Simulator(split, cfg)
    users = np.arange(split.n_users)
    fit = RankFit(steps=args.steps, lr=args.lr)
    records: dict[str, list[RoundRecord]] = {"stored": [], "fitted": []}
    fitted_share: dict[int, float] = {}
    for r in range(1, cfg.rounds + 1):
        rec = sim.step()
        if r % 10 and r != cfg.rounds:
            continue
        for arm, steps in (("stored", 0), ("fitted", args.steps)):
            sim.config = cfg.replace(rank_fit_steps=steps, rank_fit_lr=args.lr)
            test, val = sim.evaluate()
            row = RoundRecord(r, rec.n_clients, rec.loss, 0.0)
            row.take_evaluation(test, val, n_val=split.n_users)
            records[arm].append(row)
        sim.config = cfg
        fitted_share[r] = len(needs_fit(sim.store.get(users), fit)) / split.n_users
    out: dict[str, Any] = {"dataset": key, "rounds": cfg.rounds, "fraction": cfg.fraction}
    for arm, rows in records.items():
        sel = RunResult(cfg.model_dump(), key, rows, 0.0).selected() or {}
        out[arm] = {
            k: sel.get(k) for k in ("round", "hr@10", "ndcg@10", "prior_weight", "model.hr@10")
        }
        out[arm]["fitted_share"] = fitted_share[int(sel["round"])]
    # the final model, every user fitted
    state = sim.store.get(users)
    state.step.zero_()
    forced = ranking_params(
        sim.model_cfg, sim.shared, state, users, split.user_train, sim.hp, fit, 0, cfg.rounds
    )
    out["final"] = {
        "stored": _hr(sim, split, sim.store.params(users)),
        "every user fitted": _hr(sim, split, forced),
    }
    return out


def _hr(sim: Any, split: Any, params: Any) -> dict[str, float]:
    """Validation and test HR@10 of the simulator's model ranked with ``params`` (no prior)."""
    from fedrecgel.metrics import KS, means, metric_sums
    from fedrecgel.model import Scorer

    scorer = Scorer(sim.model_cfg, sim.shared)
    sets = {
        "val": (split.val_items, split.val_negatives),
        "test": (split.test_items, split.test_negatives),
    }
    return {
        part: means(metric_sums(scorer, params, items, negs, KS))["hr@10"]
        for part, (items, negs) in sets.items()
    }


def main(
    users: Positive = 100_000,
    rounds: Positive = DEFAULTS.rounds,
    fraction: float = 0.01,
    steps: Positive = 20,
    lr: float = 0.05,
    seeds: IntList = int_list("0,1,2"),
    dp_seeds: IntList = int_list("0"),
    epsilon: float = 3.0,
    eval_every: Positive = 100,
    dp_clip: float = DP_CLIP,
    dp_server_lr: float = DP_SERVER_LR,
    dp_momentum: float = DP_MOMENTUM,
    defaults: Annotated[str, opt("shipped data sets to run the default preset on ('': none)")] = (
        "filmtrust,lastfm-2k/clean,amazon-video"
    ),
    data_dir: Path | None = default_data_dir(),
    n_jobs: Annotated[int, opt(None, "--jobs", parser=positive)] = 2,
    out: OutFile = OUT,
) -> None:
    args = SimpleNamespace(**locals())
    t0 = time.perf_counter()
    split = _split(users)
    arms = [(None, s, seeds) for s in (0, steps)] + [(epsilon, s, dp_seeds) for s in (0, steps)]
    jobs = [(args, seed, e, s) for e, s, group in arms for seed in group]
    datasets = [d for d in defaults.split(",") if d]
    with ProcessPoolExecutor(max_workers=n_jobs) as pool:
        shipped = pool.map(_defaults, [(args, d) for d in datasets])
        done = list(pool.map(_one, jobs))
        at_defaults = list(shipped)
    rows: dict[str, Any] = {}
    for e, s, _ in arms:
        runs = [r for r in done if r["epsilon"] == e and r["rank_fit_steps"] == s]
        name = ("no DP" if e is None else f"DP, epsilon {e:g}") + (", fitted" if s else ", stored")
        rows[name] = {"figures": _figures(runs), "runs": runs}
    pop = popularity(split).selected() or {}
    release = plan_release(split.n_users, DP_POPULARITY_K, target_epsilon=epsilon)
    dp_pop = [dp_popularity(split, release, s).selected() or {} for s in dp_seeds]
    co = cooccurrence(split)
    co_sel = co.selected() or {}
    result = {
        "dataset": {"name": "synthetic-tastes", "users": split.n_users, **TASTES},
        "settings": {
            **{k: v for k, v in vars(args).items() if k not in ("out", "n_jobs", "data_dir")},
            "prior_choice": CHOICE,
        },
        "references": {
            "popularity": {"hr@10": pop.get("hr@10"), "ndcg@10": pop.get("ndcg@10")},
            f"DP popularity, epsilon {epsilon:g}": {
                "k": DP_POPULARITY_K,
                "hr@10": float(np.mean([r["hr@10"] for r in dp_pop])),
                "ndcg@10": float(np.mean([r["ndcg@10"] for r in dp_pop])),
            },
            "co-occurrence": {
                "rank": co.config.get("rank"),
                "hr@10": co_sel.get("hr@10"),
                "ndcg@10": co_sel.get("ndcg@10"),
            },
        },
        "rows": rows,
        "defaults": at_defaults,
    }
    _write(args.out, result, t0)
    print(f"-> {args.out}")


def section() -> list[str]:
    """docs/RESULTS.md's section on the fit (nothing before the benchmark has run)."""
    d: dict[str, Any] | None = load_result("rank_fit.json")
    if d is None:
        return []
    st, ds = d["settings"], d["dataset"]
    lines = [
        "## Users who took part in few rounds: ranking with embeddings fitted to the model "
        "(`bench/rank_fit.py`)",
        "",
        f"The synthetic taste groups at {ds['users']:,} users and {ds['n_items']:,} items, "
        f"{st['rounds']} rounds of Poisson cohorts of {st['fraction']:g} of the users (each "
        f"user in about {st['rounds'] * st['fraction']:g} of them), the shipped default "
        "preset's training; test HR@10 / NDCG@10 (%) at the validation-selected evaluated "
        f"round (every {st['eval_every']}), mean ± std over the seeds listed. *stored*: each "
        "user ranks with its stored embeddings; *fitted*: the same training, each user whose "
        f"embeddings took fewer than {st['steps']} private steps first fits a copy of them "
        f"to the evaluated model ({st['steps']} Adam steps of {st['lr']:g} on its own "
        "training items, nothing stored or uploaded: `rank_fit_steps`). DP: "
        f"`bench/dp_scale.py`'s settings at epsilon {st['epsilon']:g}.{prior_choice_note(d)}",
        "",
        "| run | seeds | test HR@10 | test NDCG@10 | selected round(s) |",
        "|---|---|---|---|---|",
    ]
    for name, row in d["rows"].items():
        f, runs = row["figures"], row["runs"]
        rounds = ", ".join(str(r["selected"]["round"]) for r in runs)
        seeds = ", ".join(str(x) for x in f["seeds"])
        lines.append(
            f"| {name} | {seeds} | {100 * f['hr@10.mean']:.2f} ± {100 * f['hr@10.std']:.2f} | "
            f"{100 * f['ndcg@10.mean']:.2f} ± {100 * f['ndcg@10.std']:.2f} | {rounds} |"
        )
    for name, ref in d["references"].items():
        extra = f" (rank {ref['rank']})" if ref.get("rank") else ""
        extra += f" (k {ref['k']})" if ref.get("k") else ""
        lines.append(
            f"| {name}{extra} | | {100 * ref['hr@10']:.2f} | {100 * ref['ndcg@10']:.2f} | |"
        )
    rows, refs = d["rows"], d["references"]
    if "no DP, stored" in rows and "no DP, fitted" in rows:
        a, b = (rows[k]["figures"]["hr@10.mean"] for k in ("no DP, stored", "no DP, fitted"))
        pop, co = refs["popularity"]["hr@10"], refs["co-occurrence"]["hr@10"]
        lines += [
            "",
            f"Reading: ranked with their stored embeddings, the users rank at {100 * a:.2f}, "
            f"{100 * (a - pop):.2f} points above popularity; the same model ranked with the "
            f"fitted copies reaches {100 * b:.2f}, {100 * (co - b):.2f} below the exact item "
            "co-occurrence ranking. The model had learned the tastes; the users' embeddings, "
            "moved in one round each, could not express them. Under DP the fit changes "
            "nothing: there the noise leaves the item tables popularity and little more "
            "(`bench/dp_signal.py`), so a user fitted to them has no taste to find.",
        ]
    if d.get("defaults"):
        lines += [
            "",
            "At the defaults on the shipped data sets (seed 0, the default preset: cohorts of "
            "10%, 300 rounds; one training run evaluated every 10 rounds both ways): served test "
            "HR@10 (%) at the round chosen on the model's own validation HR@10, with the share "
            "of users the fit reached there; and the final model ranked with every user fitted "
            "(forced; the model alone, validation / test HR@10), which is why users with many "
            "rounds are left as they are.",
            "",
            "| data set | round (stored, fitted) | stored | fitted | users fitted there | "
            "final, stored (val / test) | final, every user fitted (val / test) |",
            "|---|---|---|---|---|---|---|",
        ]
        for x in d["defaults"]:
            a, b, fin = x["stored"], x["fitted"], x["final"]
            lines.append(
                f"| {x['dataset']} | {a['round']}, {b['round']} | {100 * a['hr@10']:.2f} | "
                f"{100 * b['hr@10']:.2f} | {100 * b['fitted_share']:.1f}% | "
                f"{100 * fin['stored']['val']:.2f} / {100 * fin['stored']['test']:.2f} | "
                f"{100 * fin['every user fitted']['val']:.2f} / "
                f"{100 * fin['every user fitted']['test']:.2f} |"
            )
        lines += [
            "",
            "The accuracy table's default-preset cells below ran before the fit joined the "
            "preset and were not run again; at the rounds chosen here the fit reaches no user "
            "(seed 0 on these three data sets, the table above).",
        ]
    return lines


if __name__ == "__main__":
    run(main)
