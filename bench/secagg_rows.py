"""How many item rows a secure round would have to mask if masks covered only the rows its
cohort touches: the measurement behind the sparse secure aggregation's design.

    python -m bench.secagg_rows [--rounds 5] [--datasets filmtrust/paper,amazon-video/paper]

A client's upload touches the item rows of its round's samples: its positives and the sampled
negatives (4 per positive, uniform over the items it never interacted with, drawn by
:func:`fedrecgel.sampling.cohort_samples` as a training round draws them). Pairwise masks
cancel only on coordinates that every pair masks alike, so a mask over "the rows a round
touches" must cover the union of the cohort's rows (announced to the server, which then learns
each client's rows unless they are padded), and a fixed row budget with padding must cover at
least the largest client's rows. For each data set, over the first ``--rounds`` rounds' cohorts
of the default fraction (0.1) as the simulator draws them on seed 0 (the same cohorts and
each client's own random stream): rows per client, the largest client's rows, the union of
the round's rows, and the union of the positives alone, against the catalogue. Writes ``bench/results/secagg_rows.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.accuracy_diagnosis import load
from bench.bench_cli import default_data_dir, run
from fedrecgel.cohort import cohort_size, select_cohort
from fedrecgel.config import DEFAULTS
from fedrecgel.sam import client_rng
from fedrecgel.sampling import cohort_samples

OUT = Path(__file__).resolve().parents[1] / "bench" / "results" / "secagg_rows.json"


def measure(key: str, data_dir: Path | None, rounds: int, seed: int = 0) -> dict[str, Any]:
    """The row counts of ``rounds`` cohorts of data set ``key``."""
    split = load(key, data_dir)
    everyone = np.arange(split.n_users, dtype=np.int64)
    per_client: list[int] = []
    largest: list[int] = []
    union: list[int] = []
    positives: list[int] = []
    for r in range(1, rounds + 1):
        users = select_cohort(everyone, DEFAULTS.fraction, seed, r)
        pos = [split.user_train(int(u)) for u in users]
        streams = [client_rng(seed, r, int(u)) for u in users]
        samples = cohort_samples(pos, split.n_items, DEFAULTS.n_negatives, streams)
        rows = [np.unique(items) for items, _ in samples]
        per_client += [len(r) for r in rows]
        largest.append(max(len(r) for r in rows))
        union.append(len(np.unique(np.concatenate(rows))))
        positives.append(len(np.unique(np.concatenate(pos))))
    return {
        "dataset": key,
        "items": split.n_items,
        "users": split.n_users,
        "cohort": cohort_size(split.n_users, DEFAULTS.fraction),
        "rounds": rounds,
        "rows_per_client_mean": float(np.mean(per_client)),
        "rows_largest_client_mean": float(np.mean(largest)),
        "union_rows_mean": float(np.mean(union)),
        "union_share": float(np.mean(union)) / split.n_items,
        "positive_union_rows_mean": float(np.mean(positives)),
    }


def main(
    data_dir: Path | None = default_data_dir(),
    rounds: int = 5,
    datasets: str = "filmtrust/paper,amazon-video/paper,lastfm-2k/clean",
) -> None:
    results = [measure(k, data_dir, rounds) for k in datasets.split(",")]
    for r in results:
        print(
            f"{r['dataset']}: {r['items']} items, cohort {r['cohort']}: "
            f"{r['rows_per_client_mean']:.1f} rows per client (largest "
            f"{r['rows_largest_client_mean']:.0f}), union {r['union_rows_mean']:.0f} "
            f"({100 * r['union_share']:.1f}% of the items), positives' union "
            f"{r['positive_union_rows_mean']:.0f}"
        )
    command = f"python -m bench.secagg_rows --rounds {rounds}"
    OUT.write_text(json.dumps({"command": command, "datasets": results}, indent=1) + "\n")


if __name__ == "__main__":
    run(main)
