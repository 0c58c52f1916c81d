"""What item-item structure beyond popularity survives user-level DP at all: the spectrum of each
data set's item co-occurrence against the noise one private release of it must carry.

    nice -n 5 .venv/bin/python -m bench.dp_spectrum [--datasets filmtrust/paper,...]
        [--epsilon 3] [--seeds 0,1,2] [--out bench/results/dp_spectrum.json]

A measurement of the data, independent of the model. Each user's distinct training items form a
0/1 row scaled to unit L2 norm; their co-occurrence G = sum over users of x x^T changes by at
most 1 in Frobenius norm when one user is added or removed. One Gaussian release of G (noise
std z on every entry of its upper triangle, z calibrated by the project's RDP accountant for
``--epsilon`` at delta = 1/users, the WHOLE budget on this one release) is the most a private
mechanism that reads the second moment once can see. Random-matrix theory says what it sees:
a direction of G with eigenvalue lambda stands out of the noise's spectrum only when lambda is
above z*sqrt(I) (the BBP transition, I the number of items), and then the release's eigenvector
overlaps the true one by 1 - (z*sqrt(I)/lambda)^2 (squared cosine). The first direction is the
popularity direction; the ones after it are what personalised ranking is made of.

Since lambda grows in proportion to the users (the same kind of users, more of them) while the
threshold does not, ``users needed`` is the number of users at which a direction would reach a
squared overlap of 1/2.

To check the reading against ranking quality, each data set is also ranked by the release: a
user's candidates scored by x_u G_k (G_k the rank-k part of the noisy release, k chosen on
validation HR@10; the user's own history stays on the client), over ``--seeds`` noise draws,
beside the same ranking from the exact G, the popularity ranking and DP popularity at the same
epsilon (``--dp-max-items`` items a user). Test HR@10 at the validation-selected rank.

This bounds one family of mechanisms (one release of the second moment), not every mechanism;
the federated model's own signal against its noise is measured by ``bench.dp_signal``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_cli import OutFile, default_data_dir, fail, validation_split, write_result
from fedrecgel.data import Split

OUT = Path(__file__).resolve().parent / "results" / "dp_spectrum.json"
SYNTHETIC = "synthetic-tastes-100k"
DATASETS = ("filmtrust/paper", "lastfm-2k/clean", "amazon-video/paper", SYNTHETIC)
RANKS = (1, 2, 4, 8, 16, 32, 64)
TOP = 16  # eigenvalues kept in the results


def _split(name: str, data_dir: Path | None) -> Split:
    if name == SYNTHETIC:
        from bench.dp_scale import _split as tastes

        return tastes(100_000)
    return validation_split(name, data_dir)


def _history(split: Split) -> Any:
    """The users' distinct training items as a sparse 0/1 matrix (users x items)."""
    from scipy.sparse import csr_matrix

    rows = np.repeat(np.arange(split.n_users), np.diff(split.train_indptr))
    x = csr_matrix(
        (np.ones(len(rows), np.float32), (rows, split.train_items)),
        shape=(split.n_users, split.n_items),
    )
    x.sum_duplicates()
    x.data[:] = 1.0
    return x


def co_occurrence(x: Any) -> np.ndarray:
    """G = sum of x_u x_u^T over the users' unit-norm rows: (items, items) float32."""
    from scipy.sparse import diags

    norms = np.sqrt(np.maximum(np.asarray(x.sum(axis=1)).ravel(), 1.0))
    xn = diags(1.0 / norms) @ x
    return np.asarray((xn.T @ xn).toarray(), dtype=np.float32)


def noisy_release(g: np.ndarray, z: float, seed: int) -> np.ndarray:
    """G plus symmetric Gaussian noise: std z on every entry off the diagonal, z*sqrt(2) on it
    (at least z on each released entry of the upper triangle)."""
    rng = np.random.default_rng([seed, 0x5BEC])
    n = rng.standard_normal(g.shape, dtype=np.float32)
    n += n.T
    n *= np.float32(z / math.sqrt(2.0))
    n += g
    return n


def top_eigen(m: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest eigenvalues of symmetric ``m`` (descending) and their eigenvectors."""
    from scipy.sparse.linalg import eigsh

    k = min(k, m.shape[0] - 1)
    lam, vec = eigsh(m, k=k, which="LA")
    order = np.argsort(-lam)
    return lam[order], vec[:, order]


def _rank_hr(split: Split, x: Any, lam: np.ndarray, vec: np.ndarray) -> dict[str, Any]:
    """HR@10 (validation, test) of scoring by x_u G_k for each k of RANKS; k chosen on
    validation."""
    import torch

    from fedrecgel.baselines import _candidate_metrics

    users = np.arange(split.n_users)
    proj = np.asarray(x @ vec) * lam  # (users, K): x_u V Lambda
    by_rank = {}
    for k in (r for r in RANKS if r <= len(lam)):

        def scores(u: np.ndarray, cand: np.ndarray, k: int = k) -> Any:
            return torch.from_numpy(np.einsum("uk,uck->uc", proj[u, :k], vec[cand, :k]))

        assert split.val_items is not None and split.val_negatives is not None
        val = _candidate_metrics(scores, users, split.val_items, split.val_negatives)["hr@10"]
        test = _candidate_metrics(scores, users, split.test_items, split.test_negatives)["hr@10"]
        by_rank[k] = (val, test)
    best = max(by_rank, key=lambda k: by_rank[k][0])
    return {"rank": best, "val_hr@10": by_rank[best][0], "test_hr@10": by_rank[best][1]}


def users_needed(n: int, lam: float, threshold: float, overlap: float = 0.5) -> float:
    """Users at which a direction of eigenvalue ``lam`` at ``n`` users reaches squared overlap
    ``overlap``: lambda grows with the users, the threshold does not."""
    return math.inf if lam <= 0 else n * threshold / (lam * math.sqrt(1.0 - overlap))


def measure(
    name: str, data_dir: Path | None, epsilon: float, seeds: list[int], max_items: int
) -> dict[str, Any]:
    """The spectrum and the rankings of one data set."""
    from fedrecgel.accountant import calibrate_release
    from fedrecgel.baselines import popularity
    from fedrecgel.dp_popularity import dp_popularity, plan_release

    split = _split(name, data_dir)
    n, items = split.n_users, split.n_items
    x = _history(split)
    g = co_occurrence(x)
    delta = 1.0 / n
    z = calibrate_release(epsilon, delta)
    threshold = z * math.sqrt(items)
    lam, vec = top_eigen(g, max(RANKS))
    overlaps = [max(0.0, 1.0 - (threshold / float(v)) ** 2) for v in lam[:TOP]]
    exact = _rank_hr(split, x, lam, vec)
    private = []
    noise_top = []
    for s in seeds:
        plam, pvec = top_eigen(noisy_release(g, z, s), max(RANKS))
        private.append(_rank_hr(split, x, plam, pvec))
        noise_top.append(float(plam[0]))
    release = plan_release(n, max_items=max_items, target_epsilon=epsilon)
    dp_pop = [dp_popularity(split, release, s).rounds[0].test["hr@10"] for s in seeds]
    out = {
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
        "release_top_eigenvalue": noise_top,
        "popularity_test_hr@10": popularity(split).rounds[0].test["hr@10"],
        "dp_popularity_test_hr@10": dp_pop,
        "dp_max_items": max_items,
    }
    print(
        f"{name}: z {z:.3f}, threshold {threshold:.1f}, eigenvalues "
        f"{', '.join(f'{v:.1f}' for v in lam[:5])}; visible {out['directions_visible']}; "
        f"private ranking test HR@10 {np.mean([p['test_hr@10'] for p in private]):.4f} "
        f"(exact {exact['test_hr@10']:.4f}), DP popularity {np.mean(dp_pop):.4f}",
        flush=True,
    )
    return out


def main(
    datasets: str = ",".join(DATASETS),
    data_dir: Path | None = default_data_dir(),
    epsilon: float = 3.0,
    seeds: str = "0,1,2",
    dp_max_items: int = 10,
    out: OutFile = OUT,
) -> None:
    chosen = [d.strip() for d in datasets.split(",") if d.strip()]
    if not chosen or any(d not in DATASETS for d in chosen):
        raise fail(f"--datasets takes a comma-separated subset of {', '.join(DATASETS)}")
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise fail(f"--seeds takes comma-separated integers, got {seeds!r}") from None
    if not seed_list:
        raise fail("--seeds names no seed")
    if not 0 < epsilon < math.inf:
        raise fail(f"--epsilon must be a number > 0, got {epsilon}")
    t0 = time.perf_counter()
    runs = [measure(d, data_dir, epsilon, seed_list, dp_max_items) for d in chosen]
    settings = {"epsilon": epsilon, "seeds": seed_list, "dp_max_items": dp_max_items}
    write_result(out, {"settings": settings, "runs": runs}, t0)


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
