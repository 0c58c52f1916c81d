"""Which clients take part in a round: the same draw in the simulator and the aggregator."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from fedrecgel.config import DEFAULTS, Sampling


def cohort_size(n_candidates: int, fraction: float) -> int:
    """m = int(fraction * n), at least 1."""
    return max(1, int(fraction * n_candidates))


def client_groups(ids: np.ndarray, groups: int, seed: int) -> np.ndarray:
    """The group (0..``groups``-1) of each client id: a keyed hash (splitmix64 of the id and
    the seed), so a client's group depends on its id and the run's seed alone, not on which
    other clients are registered."""
    mix = (int(seed) * 0x9E3779B97F4A7C15 + 0xC0C0) % 2**64
    z = np.asarray(ids, dtype=np.int64).astype(np.uint64) ^ np.uint64(mix)
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(groups)).astype(np.int64)


def select_cohort(
    candidates: np.ndarray,
    fraction: float,
    seed: int,
    round_id: int,
    attempt: int = 0,
    sampling: Sampling = DEFAULTS.sampling,
    groups: int | None = None,
) -> np.ndarray:
    """The round's clients from ``candidates``, sorted.

    ``fixed``: :func:`cohort_size` of them uniformly without replacement; ``poisson``: each one
    independently with probability ``fraction`` (the cohort may be of any size, even empty).
    ``candidates`` is taken in sorted order, so the draw depends only on the set of ids, the
    seed, the round and the attempt (a retried round draws a new cohort).

    ``groups``: the same draw over the groups 0..groups-1 (:func:`client_groups`) instead of
    the clients, and the cohort is every candidate of the groups drawn.
    """
    ids = np.sort(np.asarray(candidates, dtype=np.int64))
    if groups is not None:
        drawn = select_cohort(np.arange(groups), fraction, seed, round_id, attempt, sampling)
        return ids[np.isin(client_groups(ids, groups, seed), drawn)]
    if sampling == "poisson":
        rng = np.random.default_rng([int(seed), int(round_id), int(attempt), 0x9C])
        return ids[rng.random(len(ids)) < fraction]
    perm = np.random.default_rng([int(seed), int(round_id), int(attempt), 0xC0]).permutation(
        len(ids)
    )
    return np.sort(ids[perm[: cohort_size(len(ids), fraction)]])


def largest_group_cohort(
    candidates: np.ndarray, fraction: float, seed: int, sampling: Sampling, groups: int
) -> int:
    """The most clients a cohort of whole groups (``select_cohort(..., groups=groups)``) of
    ``candidates`` can hold: the largest groups drawn (all of them under Poisson sampling)."""
    if sampling == "poisson":
        return len(candidates)
    sizes = group_sizes(np.asarray(candidates), groups, seed)
    return int(np.sort(sizes)[::-1][: cohort_size(groups, fraction)].sum())


def group_sizes(ids: np.ndarray, groups: int, seed: int) -> np.ndarray:
    """How many of clients ``ids`` fall in each group (:func:`client_groups`): (groups,)."""
    return np.bincount(client_groups(ids, groups, seed), minlength=groups)


def broken_groups(
    cohort: Sequence[int], present: Collection[int], groups: int, seed: int
) -> list[int]:
    """The groups (:func:`client_groups`) of which ``cohort`` holds some members in ``present``
    and some not: a secure round of whole groups unmasks no sum over part of a group."""
    ids = np.asarray(list(cohort), dtype=np.int64)
    g = client_groups(ids, groups, seed)
    here = np.isin(ids, np.fromiter(present, dtype=np.int64, count=len(present)))
    return sorted(set(g[here].tolist()) & set(g[~here].tolist()))


def groups_summary(ids: np.ndarray, groups: int, seed: int) -> str:
    """What cohorts of whole groups hide among clients ``ids``: the groups' sizes, and a
    warning naming how many clients are alone in theirs (a round's union names such a client's
    items as its own)."""
    sizes = group_sizes(ids, groups, seed)
    held = sizes[sizes > 0]
    if len(held) == 0:
        return "cohorts of whole groups: no clients yet"
    line = (
        f"cohorts of whole groups: {len(held)} groups of {int(held.min())} to {int(held.max())} "
        f"clients (mean {len(ids) / len(held):.1f})"
    )
    alone = int((held == 1).sum())
    if alone:
        line += (
            f"; warning: {alone} clients are alone in their group, and the rounds' unions can "
            "name their items (fewer groups make larger ones)"
        )
    return line
