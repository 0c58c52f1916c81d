"""What item-item structure beyond popularity survives user-level DP at all: the spectrum of each
data set's item co-occurrence against the noise one private release of it must carry.

    nice -n 5 .venv/bin/python -m bench.dp_spectrum [--datasets filmtrust/paper,...]
        [--epsilons 3,8] [--seeds 0,1,2] [--out bench/results/dp_spectrum.json]

A measurement of the data, independent of the model. Each user's distinct training items form a
0/1 row scaled to unit L2 norm; their co-occurrence G = sum over users of x x^T changes by at
most 1 in Frobenius norm when one user is added or removed. One Gaussian release of G (noise
std z on every entry of its upper triangle, z calibrated by the project's RDP accountant for
each of ``--epsilons`` at delta = 1/users, the WHOLE budget on this one release) is the most a private
mechanism that reads the second moment once can see. Random-matrix theory says what it sees:
a direction of G with eigenvalue lambda stands out of the noise's spectrum only when lambda is
above z*sqrt(I) (the BBP transition, I the number of items), and then the release's eigenvector
overlaps the true one by 1 - (z*sqrt(I)/lambda)^2 (squared cosine). The first direction is the
popularity direction; the ones after it are what personalised ranking is made of.

Since lambda grows in proportion to the users (the same kind of users, more of them) while the
threshold does not, ``users needed`` is the number of users at which a direction would reach a
squared overlap of 1/2.

To check the reading against ranking quality, each data set is also ranked by
``fedrec train --method cooccurrence`` (:mod:`fedrecgel.cooccurrence`: a user's candidates
scored by x_u G_k, G_k the rank-k part of G, k chosen on validation HR@10; the user's own
history stays on the client), from the exact G and from the release (``--seeds`` noise draws),
beside the popularity ranking and DP popularity at the same epsilon (``--dp-max-items`` items a
user). Test HR@10 at the validation-selected rank.

This bounds one family of mechanisms (one release of the second moment), not every mechanism;
the federated model's own signal against its noise is measured by ``bench.dp_signal``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_cli import (
    FloatList,
    Floats,
    IntList,
    Ints,
    OutFile,
    default_data_dir,
    fail,
    subset,
    write_result,
)
from bench.dp_signal import SYNTHETIC, _split

OUT = Path(__file__).resolve().parent / "results" / "dp_spectrum.json"
DATASETS = ("filmtrust/paper", "lastfm-2k/clean", "amazon-video/paper", SYNTHETIC)
TOP = 16  # eigenvalues kept in the results


def users_needed(n: int, lam: float, threshold: float, overlap: float = 0.5) -> float:
    """Users at which a direction of eigenvalue ``lam`` at ``n`` users reaches squared overlap
    ``overlap``: lambda grows with the users, the threshold does not."""
    return math.inf if lam <= 0 else n * threshold / (lam * math.sqrt(1.0 - overlap))


def measure(
    name: str, data_dir: Path | None, epsilons: list[float], seeds: list[int], max_items: int
) -> list[dict[str, Any]]:
    """The spectrum and the rankings of one data set, a record per epsilon."""
    from fedrecgel.accountant import calibrate_release
    from fedrecgel.baselines import popularity
    from fedrecgel.cooccurrence import cooccurrence
    from fedrecgel.dp_popularity import dp_popularity, plan_release
    from fedrecgel.item_spectrum import co_occurrence, history, top_eigen

    split = _split(name, data_dir)
    n, items = split.n_users, split.n_items
    delta = 1.0 / n
    lam, _ = top_eigen(co_occurrence(history(split)), TOP)

    def ranking(res: Any) -> dict[str, Any]:
        rec = res.rounds[0]
        return {
            "rank": res.config["rank"],
            "val_hr@10": rec.val["hr@10"],
            "test_hr@10": rec.test["hr@10"],
        }

    exact = ranking(cooccurrence(split))
    pop = popularity(split).rounds[0].test["hr@10"]
    out = []
    for epsilon in epsilons:
        z = calibrate_release(epsilon, delta)
        threshold = z * math.sqrt(items)
        overlaps = [max(0.0, 1.0 - (threshold / float(v)) ** 2) for v in lam[:TOP]]
        private = [ranking(cooccurrence(split, noise=z, seed=s)) for s in seeds]
        release = plan_release(n, max_items=max_items, target_epsilon=epsilon)
        dp_pop = [dp_popularity(split, release, s).rounds[0].test["hr@10"] for s in seeds]
        rec = {
            "dataset": name,
            "users": n,
            "items": items,
            "epsilon": epsilon,
            "delta": delta,
            "noise_multiplier": z,
            "threshold": threshold,
            "eigenvalues": [float(v) for v in lam[:TOP]],
            "squared_overlap": overlaps,
            "directions_visible": int(sum(o > 0 for o in overlaps)),
            "users_needed_second": users_needed(n, float(lam[1]), threshold),
            "users_needed_fifth": users_needed(n, float(lam[4]), threshold),
            "exact": exact,
            "private": private,
            "popularity_test_hr@10": pop,
            "dp_popularity_test_hr@10": dp_pop,
            "dp_max_items": max_items,
        }
        print(
            f"{name} epsilon {epsilon:g}: z {z:.3f}, threshold {threshold:.1f}, eigenvalues "
            f"{', '.join(f'{v:.1f}' for v in lam[:5])}; visible {rec['directions_visible']}; "
            f"private ranking test HR@10 {np.mean([p['test_hr@10'] for p in private]):.4f} "
            f"(exact {exact['test_hr@10']:.4f}), DP popularity {np.mean(dp_pop):.4f}",
            flush=True,
        )
        out.append(rec)
    return out


def main(
    datasets: str = ",".join(DATASETS),
    data_dir: Path | None = default_data_dir(),
    epsilons: FloatList = Floats([3.0, 8.0]),
    seeds: IntList = Ints([0, 1, 2]),
    dp_max_items: int = 10,
    out: OutFile = OUT,
) -> None:
    chosen = subset(datasets, DATASETS, "--datasets")
    if not all(0 < e < math.inf for e in epsilons):
        raise fail(f"--epsilons takes numbers > 0, got {epsilons}")
    t0 = time.perf_counter()
    runs = [r for d in chosen for r in measure(d, data_dir, epsilons, seeds, dp_max_items)]
    settings = {"epsilons": epsilons, "seeds": seeds, "dp_max_items": dp_max_items}
    write_result(out, {"settings": settings, "runs": runs}, t0)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
