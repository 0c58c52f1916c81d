"""Which clients take part in a round: the same draw in the simulator and the aggregator."""

from __future__ import annotations

import numpy as np

from fedrecgel.config import DEFAULTS, Sampling


def cohort_size(n_candidates: int, fraction: float) -> int:
    """m = int(fraction * n), at least 1."""
    return max(1, int(fraction * n_candidates))


def select_cohort(
    candidates: np.ndarray,
    fraction: float,
    seed: int,
    round_id: int,
    attempt: int = 0,
    sampling: Sampling = DEFAULTS.sampling,
) -> np.ndarray:
    """The round's clients from ``candidates``, sorted.

    ``fixed``: :func:`cohort_size` of them uniformly without replacement; ``poisson``: each one
    independently with probability ``fraction`` (the cohort may be of any size, even empty).
    ``candidates`` is taken in sorted order, so the draw depends only on the set of ids, the
    seed, the round and the attempt (a retried round draws a new cohort).
    """
    ids = np.sort(np.asarray(candidates, dtype=np.int64))
    if sampling == "poisson":
        rng = np.random.default_rng([int(seed), int(round_id), int(attempt), 0x9C])
        return ids[rng.random(len(ids)) < fraction]
    perm = np.random.default_rng([int(seed), int(round_id), int(attempt), 0xC0]).permutation(
        len(ids)
    )
    return np.sort(ids[perm[: cohort_size(len(ids), fraction)]])
