"""Item co-occurrence ranking, a linear reference point (in the manner of PureSVD), and its
user-level differentially private variant.

Each user's distinct training items form a 0/1 row x_u scaled to unit L2 norm; their
co-occurrence is G = sum over users of x_u x_u^T (items x items). A user's candidates are
scored by x_u G_k, G_k the part of G on its k largest eigenvalues: items that co-occur, in the
main directions of the data, with the user's own items. In a federation each client adds its own
x_u x_u^T to a (secure) sum and ranks on its own device: the server sees G, never a history.

Private variant (``noise`` z): G moves by at most 1 in Frobenius norm when one user is added
or removed (``||x x^T|| = ||x||^2 = 1``), so G plus Gaussian noise of standard deviation z on
every entry of its upper triangle (symmetric; sqrt(2)*z on the diagonal) is one Gaussian
release of noise multiplier z, accounted by the project's RDP accountant like the DP popularity
counts (:func:`fedrecgel.dp_popularity.plan_release`). Ranking with the released matrix and the
user's own history spends nothing more. The noise here is keyed by the run seed so that runs
repeat: a simulation, as the simulator's noise is.

The rank k is chosen on validation HR@10 among :data:`RANKS` (a release's up to
:data:`PRIVATE_MAX_RANK`) when the split has validation items, else :data:`DEFAULT_RANK`.
G is dense: catalogues above :data:`MAX_ITEMS` are refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from scipy.sparse import csr_matrix
from torch import Tensor

from fedrecgel.baselines import _fixed_ranking
from fedrecgel.data import Split
from fedrecgel.item_spectrum import (
    MAX_ITEMS,
    co_occurrence,
    history,
    noisy_release,
    top_eigen,
)
from fedrecgel.simulate import RunResult

#: the ranks tried on validation, and the one taken without validation items
RANKS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_RANK = 16
#: the largest rank tried on a private release: past the few directions above its noise a rank
#: adds noise, and 256 eigenpairs of a dense noisy matrix take minutes
PRIVATE_MAX_RANK = 64


def _projection(x: csr_matrix, lam: np.ndarray, vec: np.ndarray, rank: int) -> np.ndarray:
    """(users, k): x_u V Lambda, each user's history in the top ``rank`` directions of G."""
    proj: np.ndarray = np.asarray(x @ vec[:, :rank]) * lam[:rank]
    return proj


def scorer(
    x: csr_matrix, lam: np.ndarray, vec: np.ndarray, rank: int
) -> Callable[[np.ndarray, np.ndarray], Tensor]:
    """scores(users, candidates) -> (U, C): x_u G_k at the candidates, G_k of rank ``rank``."""
    proj = _projection(x, lam, vec, rank)

    def scores(users: np.ndarray, cand: np.ndarray) -> Tensor:
        return torch.from_numpy(np.einsum("uk,uck->uc", proj[users], vec[cand, :rank]))

    return scores


def catalogue_scorer(
    x: csr_matrix, lam: np.ndarray, vec: np.ndarray, rank: int
) -> Callable[[np.ndarray], Tensor]:
    """scores(users) -> (U, n_items): x_u G_k for every item (a full ranking's scores)."""
    proj, basis = _projection(x, lam, vec, rank), vec[:, :rank].T

    def scores(users: np.ndarray) -> Tensor:
        return torch.from_numpy(proj[users] @ basis)

    return scores


def cooccurrence(
    split: Split, rank: int | None = None, noise: float | None = None, seed: int = 0
) -> RunResult:
    """Rank every user's candidates by x_u G_k: G exact, or (``noise`` z) one Gaussian release
    of it seeded by ``seed``; ``rank`` k fixed, or chosen on validation HR@10 (see the module
    docstring). Raises ValueError for a catalogue above :data:`MAX_ITEMS` or a bad rank."""
    if split.n_items > MAX_ITEMS:
        raise ValueError(
            f"--method cooccurrence builds a dense items x items matrix: {split.n_items:,} "
            f"items is more than the {MAX_ITEMS:,} it takes"
        )
    if rank is not None and not 1 <= rank < split.n_items:
        raise ValueError(f"the rank must be in [1, {split.n_items - 1}], got {rank}")
    t0 = time.perf_counter()
    x = history(split)
    g = co_occurrence(x)
    if noise is not None:
        g = noisy_release(g, noise, seed)
    if rank is not None:
        tried = [rank]
    elif not split.has_validation:
        tried = [min(DEFAULT_RANK, split.n_items - 1)]
    else:
        most = split.n_items if noise is None else PRIVATE_MAX_RANK + 1
        tried = [r for r in RANKS if r < min(split.n_items, most)]
    lam, vec = top_eigen(g, max(tried))  # every rank tried is below the catalogue's size
    del g
    runs = [(r, _fixed_ranking(split, scorer(x, lam, vec, r), "cooccurrence")) for r in tried]
    chosen, res = max(runs, key=lambda run: run[1].rounds[0].val.get("hr@10", 0.0))
    res.config.update(rank=chosen, seed=seed, ranks_tried=tried)
    res.rounds[0].seconds = res.wall_seconds = time.perf_counter() - t0
    return res
