"""The users' item co-occurrence and its spectrum: what the co-occurrence ranking
(:mod:`fedrecgel.cooccurrence`) scores with, and the item tables a DP run can start from.

Each user's distinct training items form a 0/1 row x_u scaled to unit L2 norm; their
co-occurrence is G = sum over users of x_u x_u^T (items x items). G moves by at most 1 in
Frobenius norm when one user is added or removed (``||x x^T|| = ||x||^2 = 1``), so G plus
symmetric Gaussian noise of standard deviation z on every entry of its upper triangle (sqrt(2)*z
on the diagonal) is one Gaussian release of noise multiplier z (:func:`noisy_release`).

Spectral item tables (``dp_item_share``, :func:`spectral_tables`): a DP run may spend part of
its budget on one such release and start its item tables from the release's top eigenvectors,
each direction weighted by sqrt(theta), theta the strength of the true direction behind the
released eigenvalue (:func:`spike_strength`): eigenvalues within the noise's spectral edge
2*z*sqrt(items) get weight 0 (below the BBP transition a released direction says nothing about
the true one). The tables are then scaled to a standard deviation
of :data:`SPECTRAL_STD` and kept fixed for the run (not trained, not uploaded, no noise on them):
what the rounds release is the score network only, and each user fits its private embeddings
to these items.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.sparse import csr_matrix, diags
from scipy.sparse.linalg import eigsh
from torch import Tensor

from fedrecgel.data import Split
from fedrecgel.model import ITEM_TABLES

#: the largest catalogue whose dense co-occurrence (float32) is built: 1.6 GB at 20,000 items
MAX_ITEMS = 20_000
#: the key of the co-occurrence ranking's noise (fedrecgel.cooccurrence)
RANKING_KEY = 0x5BEC
#: the key of the noise of a DP run's spectral item tables
TABLES_KEY = 0x5BED
#: the standard deviation the spectral item tables are scaled to (a probe on the 100,000-user
#: synthetic set's tuning seed: docs/RESULTS.md, "Spectral item tables")
SPECTRAL_STD = 0.1


def history(split: Split) -> csr_matrix:
    """The users' distinct training items as a sparse 0/1 matrix (users x items)."""
    rows = split.train_user_of_rows()
    x = csr_matrix(
        (np.ones(len(rows), np.float32), (rows, split.train_items)),
        shape=(split.n_users, split.n_items),
    )
    x.sum_duplicates()
    x.data[:] = 1.0
    return x


def co_occurrence(x: csr_matrix) -> np.ndarray:
    """G = sum of x_u x_u^T over the users' unit-norm rows: (items, items) float32."""
    norms = np.sqrt(np.maximum(np.asarray(x.sum(axis=1)).ravel(), 1.0))
    xn = diags(1.0 / norms) @ x
    return np.asarray((xn.T @ xn).toarray(), dtype=np.float32)


def noisy_release(g: np.ndarray, noise: float, seed: int, key: int = RANKING_KEY) -> np.ndarray:
    """``g`` plus symmetric Gaussian noise: std ``noise`` off the diagonal, sqrt(2) times it on
    the diagonal (at least ``noise`` on every released entry of the upper triangle), drawn from
    the stream keyed by (``seed``, ``key``)."""
    rng = np.random.default_rng([int(seed), int(key)])
    n = rng.standard_normal(g.shape, dtype=np.float32)
    n += n.T
    n *= np.float32(noise / math.sqrt(2.0))
    n += g
    return n


def top_eigen(m: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest eigenvalues of symmetric ``m`` (descending) and their eigenvectors
    (at most one fewer than its size)."""
    k = min(k, m.shape[0] - 1)
    lam, vec = eigsh(m, k=k, which="LA", v0=np.ones(m.shape[0]))
    order = np.argsort(-lam)
    return lam[order], vec[:, order]


def spike_strength(lam: np.ndarray, noise: float, n: int) -> np.ndarray:
    """The eigenvalues theta of the directions behind the observed eigenvalues ``lam`` of a
    release with noise std ``noise`` on each of ``n`` x ``n`` entries: a direction of strength
    theta > noise*sqrt(n) shows as lambda = theta + noise^2*n/theta, above the noise's own
    spectral edge 2*noise*sqrt(n); an eigenvalue at or below the edge is noise (theta 0)."""
    edge = 2.0 * noise * math.sqrt(n)
    lam = np.asarray(lam, dtype=np.float64)
    root = np.sqrt(np.clip(lam * lam - edge * edge, 0.0, None))
    return np.where(lam > edge, (lam + root) / 2.0, 0.0)


def spectral_tables(
    split: Split, noise: float, seed: int, shapes: dict[str, tuple[int, ...]]
) -> dict[str, Tensor]:
    """The item tables of ``shapes`` from one release of ``split``'s co-occurrence at noise
    multiplier ``noise`` (seeded by ``seed``): table t's column j is the j-th eigenvector
    weighted by sqrt(:func:`spike_strength` of lambda_j), all tables scaled together to a
    standard deviation of :data:`SPECTRAL_STD`. Raises ValueError above :data:`MAX_ITEMS`."""
    if split.n_items > MAX_ITEMS:
        raise ValueError(
            f"spectral item tables need the dense items x items co-occurrence: "
            f"{split.n_items:,} items is more than the {MAX_ITEMS:,} it takes"
        )
    names = [n for n in ITEM_TABLES if n in shapes]
    dims = max(shapes[n][1] for n in names)
    g = noisy_release(co_occurrence(history(split)), noise, seed, TABLES_KEY)
    lam, vec = top_eigen(g, dims)
    del g
    weights = np.sqrt(spike_strength(lam, noise, split.n_items))
    full = np.zeros((split.n_items, dims), dtype=np.float64)
    full[:, : len(lam)] = vec * weights
    std = full.std()
    if std > 0:
        full *= SPECTRAL_STD / std
    return {n: torch.from_numpy(full[:, : shapes[n][1]].astype(np.float32)) for n in names}
