"""Accuracy under full-catalogue ranking: the held-out item against every item its user has
not interacted with (fedrecgel/full_ranking.py), instead of against 99 sampled negatives.

    nice -n 5 .venv/bin/python -m bench.full_ranking [--seeds 0,1,2]
        [--datasets amazon-video/paper,...] [--arms federated,central]
        [--out bench/results/full_ranking.json]

Each run trains as bench/popularity_prior.py's does (federated: the default preset; central:
the step size and epochs bench/central.py chose) and keeps the model of the round `fedrec
train` serves: the one with the best sampled validation HR@10 of the model's own ranking. That
model is then ranked over the whole catalogue: alone, with the popularity prior at the weight
that round's sampled evaluation chose (what is served), and with the weight the full ranking's
own validation items choose (among the same weights). References on the same split: item
popularity, and the item co-occurrence ranking (fedrecgel/cooccurrence.py) at the rank the
full ranking's validation items choose.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.accuracy_diagnosis import load
from bench.bench_cli import (
    IntList,
    Ints,
    OutFile,
    default_data_dir,
    in_fresh_processes,
    subset,
    write_result,
)
from bench.popularity_prior import arm_jobs, train_arm
from bench.report_common import load_result, mean_std, prior_choice_note, runs_by

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "full_ranking.json"
DATASETS = ("amazon-video/paper", "filmtrust/paper", "lastfm-2k/clean")
ARMS = ("federated", "central")


def _one(job: dict[str, Any]) -> dict[str, Any]:
    """One training run in a worker process, its served model ranked over the catalogue."""
    from fedrecgel.full_ranking import ServedModel

    split = load(job["dataset"], job["data_dir"])
    kept = ServedModel()
    t0 = time.perf_counter()
    res = train_arm(job, split, kept)
    trained = time.perf_counter() - t0
    selected = res.selected()
    assert selected is not None and selected["round"] == kept.round
    t1 = time.perf_counter()
    full = kept.ranked(split)
    return {
        **{k: v for k, v in job.items() if k != "data_dir"},
        "round": full.pop("round"),
        "weight": full.pop("weight"),
        "sampled": {
            "served": {k: selected[k] for k in ("hr@10", "ndcg@10")},
            "model": {k: selected.get(f"model.{k}", selected[k]) for k in ("hr@10", "ndcg@10")},
        },
        "full": full,
        "seconds": {"training": trained, "full_ranking": time.perf_counter() - t1},
    }


def references(key: str, data_dir: Path | None) -> dict[str, Any]:
    """Popularity and the item co-occurrence ranking (rank chosen on the full ranking's
    validation items) over the whole catalogue."""

    from fedrecgel.baselines import item_popularity, popularity
    from fedrecgel.cooccurrence import RANKS, catalogue_scorer
    from fedrecgel.full_ranking import fixed_scores, full_metrics, kept_figures
    from fedrecgel.item_spectrum import co_occurrence, history, top_eigen

    split = load(key, data_dir)
    pop = full_metrics(split, fixed_scores(item_popularity(split)))["model"]
    x = history(split)
    tried = [r for r in RANKS if r < split.n_items]
    lam, vec = top_eigen(co_occurrence(x), max(tried))
    by_rank = {r: full_metrics(split, catalogue_scorer(x, lam, vec, r))["model"] for r in tried}
    rank = max(by_rank, key=lambda r: by_rank[r]["val/hr@10"])
    sampled = popularity(split).rounds[0].test
    return {
        "popularity": kept_figures(pop),
        "popularity_sampled": {k: sampled[k] for k in ("hr@10", "ndcg@10")},
        "cooccurrence": {"rank": rank, **kept_figures(by_rank[rank])},
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
            f"{r['dataset']} {r['arm']} seed {r['seed']} round {r['round']}: full HR@10 model "
            f"{100 * r['full']['model']['hr@10']:.2f}, served {100 * r['full']['served']['hr@10']:.2f}"
            f" (sampled {100 * r['sampled']['served']['hr@10']:.2f})"
        )
    refs = {d: references(d, data_dir) for d in chosen}
    from fedrecgel.prior import CHOICE

    settings = {"seeds": seeds, "prior_choice": CHOICE}
    write_result(out, {"settings": settings, "runs": runs, "references": refs}, t0)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)


def _cells(runs: list[dict[str, Any]], metric: str) -> list[str]:
    if not runs:
        return ["-"] * 4
    return [
        mean_std([r["full"]["model"][metric] for r in runs]),
        mean_std([r["full"]["served"][metric] for r in runs]),
        mean_std([r["full"]["served_full_weight"][metric] for r in runs]),
        ", ".join(f"{r['full']['full_weight']:g}" for r in runs),
    ]


def section() -> list[str]:
    """docs/RESULTS.md's section on the full ranking (nothing before the benchmark has run)."""
    d: dict[str, Any] | None = load_result("full_ranking.json")
    if d is None:
        return []
    lines = [
        "## Accuracy over the whole catalogue (`bench/full_ranking.py`)",
        "",
        "Every table above ranks the held-out item among 99 sampled negatives, the paper's "
        "protocol. Sampled metrics can order models otherwise than the full ranking they "
        "estimate (Krichene and Rendle, KDD 2020), and a sampled negative is most often an "
        "item few users hold, which flatters popularity. Here each user's test item is ranked "
        "against every item the user has not interacted with (its validation item aside), "
        "ties against it. Each run keeps the model `fedrec train` serves (the round of best "
        "sampled validation HR@10) and ranks it alone (*model*), with the popularity prior at "
        "the weight that round's sampled evaluation chose (*served*), and at the weight the "
        "full ranking's validation items choose (*w full*, weights listed per seed). Federated: "
        "the default preset; central: the same NCF trained in one place (`bench/central.py`'s "
        "step size and epochs); co-occurrence: x_u G_k, k chosen on the full ranking's "
        f"validation items. Mean ± std over seeds {d['settings']['seeds']}, %."
        + prior_choice_note(d),
        "",
    ]
    by = runs_by(d["runs"], "dataset", "arm")
    for metric in ("hr@10", "ndcg@10"):
        name = metric.replace("hr", "HR").replace("ndcg", "NDCG")
        lines += [
            f"Full-ranking test {name}:",
            "",
            "| data set | popularity | co-occurrence (k) | federated, model | federated, served "
            "| federated, w full | weights | central, model | central, served | central, w full "
            "| weights |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for key, ref in d["references"].items():
            co = ref["cooccurrence"]
            cells = [
                key,
                f"{100 * ref['popularity'][metric]:.2f}",
                f"{100 * co[metric]:.2f} ({co['rank']})",
            ]
            for arm in ARMS:
                cells += _cells(by.get((key, arm), []), metric)
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    sampled = []
    for key, ref in d["references"].items():
        arms = [
            f"{arm} {mean_std([r['sampled']['served']['hr@10'] for r in runs])}"
            for arm in ARMS
            if (runs := by.get((key, arm)))
        ]
        pop = 100 * ref["popularity_sampled"]["hr@10"]
        sampled.append(f"{key}: {', '.join(arms)}, popularity {pop:.2f}")
    lines.append(
        "The same runs' served figures on the sampled candidates (test HR@10): "
        + "; ".join(sampled)
        + "."
    )
    return [*lines, "", *_reading(d, by)]


def _mean(runs: list[dict[str, Any]], *path: str) -> float:
    values: list[float] = []
    for r in runs:
        v: Any = r
        for step in path:
            v = v[step]
        values.append(100 * float(v))
    return sum(values) / len(values)


def _reading(d: dict[str, Any], by: dict[Any, list[dict[str, Any]]]) -> list[str]:
    """What the full ranking says, in words whose figures come from the results."""
    relations, served, lowered, co = [], [], [], []
    for key, ref in d["references"].items():
        runs = by.get((key, "federated"))
        if not runs:
            continue
        pop = 100 * ref["popularity"]["hr@10"]
        model = _mean(runs, "full", "model", "hr@10")
        word = "above" if model > pop + 0.5 else "below" if model < pop - 0.5 else "level with"
        relations.append(f"{word} it on {key} ({model:.2f} against {pop:.2f})")
        at_sampled = _mean(runs, "full", "served", "hr@10")
        served.append(f"{at_sampled:.2f} against {model:.2f} on {key}")
        if at_sampled < model - 0.5:
            lowered.append(f"{key} ({at_sampled:.2f} against the model's {model:.2f})")
        best = max(model, _mean(runs, "full", "served_full_weight", "hr@10"))
        co.append(f"{100 * ref['cooccurrence']['hr@10']:.2f} against {best:.2f} on {key}")
    if not relations:
        return []
    text = (
        "Reading: over the whole catalogue the federated model at the defaults ranks against "
        "popularity " + "; ".join(relations) + "."
    )
    text += (
        " Served (the prior at the weight its sampled evaluation chose) against the model "
        "alone: " + "; ".join(served) + "."
    )
    if lowered:
        text += (
            " The prior's weight chosen on the sampled candidates lowers the full ranking on "
            + "; ".join(lowered)
            + ": a sampled negative is most often an item few users hold, so the sampled "
            "figures reward a push towards popular items that the whole catalogue, where the "
            "held-out item competes with the popular items, does not; chosen on the full "
            "ranking's own validation items the weights are those of the *w full* columns."
        )
    text += (
        " The item co-occurrence ranking (a linear item-item model, one federated round of "
        "sums) against the best federated NCF ranking (model or w full) over the whole "
        "catalogue: " + "; ".join(co) + "."
    )
    return [text]
