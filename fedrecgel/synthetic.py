"""Synthetic interaction data with controllable size and popularity skew (QB-article stand-in).

Generation, all vectorised and deterministic for a seed:

* **Interactions per user**:
  ``min_interactions + Poisson(interactions_per_user - min_interactions)`` (just
  ``min_interactions`` when the mean is not above it), capped at ``n_items - n_test_negatives``
  so every user keeps enough candidate negatives. The mean is therefore
  ``interactions_per_user`` up to that cap; the held-out items are part of the count.
* **Items**: popularity is Zipf-like over ranks, ``p(rank r) ~ (r + 1) ** -skew`` (``skew = 0`` is
  uniform), and ranks are mapped to item ids through a random permutation, so popular items are
  spread over the id range. Items are distinct within a user: duplicates are re-drawn from the
  same distribution (rejection, only the offending entries), which is sampling without
  replacement; the rare users rejection does not settle are drawn exactly.
* **Tastes** (``groups`` > 0): each user belongs to one of ``groups`` taste groups (drawn
  uniformly), and each group has its own random permutation of the popularity ranks. Each of
  a user's interactions takes its item, with probability ``affinity``, from its group's
  permutation instead of the global one: items popular within a group are then rare in the
  others, so a model that learns who likes what beats the global popularity ranking, as on
  real data. ``groups = 0`` (the default) gives every user the same popularity and no
  structure beyond it (and the same draws as before the option existed).
* **Timestamps** are random, so the held-out items are random rows; then the same leave-one-out
  and negative sampling as the real datasets (``fedrecgel.data.build_split``).

Nothing of size users x items is ever built: 1,000,000 users x 100,000 items takes seconds.
"""

from __future__ import annotations

import numpy as np

from fedrecgel.data import DataError, Split, build_split

__all__ = ["synthetic_split"]

_MAX_ROUNDS = 200


def _segment_rows(indptr: np.ndarray, users: np.ndarray) -> np.ndarray:
    """Row indices of the given users' segments, concatenated in the users' order."""
    starts = indptr[users]
    lens = indptr[users + 1] - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.zeros(len(users), dtype=np.int64)
    np.cumsum(lens[:-1], out=offsets[1:])
    return np.repeat(starts - offsets, lens) + np.arange(total, dtype=np.int64)


def _dup_positions(sorted_keys: np.ndarray) -> np.ndarray:
    """Positions (in the sorted array) of entries equal to their predecessor."""
    return np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1]) + 1


def synthetic_split(
    n_users: int,
    n_items: int,
    interactions_per_user: float = 14.0,
    skew: float = 1.0,
    seed: int = 0,
    n_test_negatives: int = 99,
    validation: bool = False,
    min_interactions: int = 5,
    groups: int = 0,
    affinity: float = 0.0,
) -> Split:
    """A random leave-one-out split with Zipf-like item popularity (see the module docstring)."""
    need = 3 if validation else 2
    if min_interactions < need:
        raise DataError(
            f"min_interactions={min_interactions} is too small: the held-out items need at least "
            f"{need} interactions per user"
        )
    if n_users < 1 or n_items < 1:
        raise DataError(f"need at least one user and one item, got {n_users} x {n_items}")
    if skew < 0:
        raise DataError(f"skew must be >= 0, got {skew}")
    if groups < 0 or not 0.0 <= affinity <= 1.0:
        raise DataError(f"need groups >= 0 and 0 <= affinity <= 1, got {groups}, {affinity}")
    if n_test_negatives < 0:
        raise DataError(f"n_test_negatives must be >= 0, got {n_test_negatives}")
    cap = n_items - n_test_negatives
    if cap < min_interactions:
        raise DataError(
            f"{n_items} items cannot give each user {min_interactions} interactions and "
            f"{n_test_negatives} negatives"
        )
    rng = np.random.default_rng(seed)

    extra = max(float(interactions_per_user) - min_interactions, 0.0)
    counts = min_interactions + rng.poisson(extra, size=n_users).astype(np.int64)
    np.minimum(counts, cap, out=counts)
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    total = int(indptr[-1])

    # popularity over ranks, ranks -> item ids via a random permutation
    weights = np.arange(1, n_items + 1, dtype=np.float64) ** -float(skew)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    perm = rng.permutation(n_items).astype(np.int64)

    group_perms = np.zeros((0, n_items), dtype=np.int64)
    group_of = np.zeros(0, dtype=np.int64)
    if groups > 0:
        group_of = rng.integers(0, groups, size=n_users)
        group_perms = np.stack([rng.permutation(n_items) for _ in range(groups)])

    def draw(who: np.ndarray) -> np.ndarray:
        """One item for each entry of ``who`` (user ids)."""
        ranks = np.searchsorted(cdf, rng.random(len(who)), side="right")
        np.minimum(ranks, n_items - 1, out=ranks)
        out = np.asarray(perm[ranks])
        if groups > 0:
            mine = np.flatnonzero(rng.random(len(who)) < affinity)
            out[mine] = group_perms[group_of[who[mine]], ranks[mine]]
        return out

    users = np.repeat(np.arange(n_users, dtype=np.int64), counts)
    keys = users * n_items + draw(users)
    del users
    keys.sort()
    # duplicates: re-draw them, then re-sort only the affected users' segments
    dup = _dup_positions(keys)
    for _ in range(_MAX_ROUNDS):
        if len(dup) == 0:
            break
        dup_users = keys[dup] // n_items
        keys[dup] = dup_users * n_items + draw(dup_users)
        rows = _segment_rows(indptr, np.unique(dup_users))
        seg = np.sort(keys[rows])
        keys[rows] = seg
        dup = rows[_dup_positions(seg)]
    if len(dup):
        # exact draw without replacement for the users rejection did not settle
        base = weights / weights.sum()
        p = np.empty(n_items, dtype=np.float64)
        p[perm] = base
        for u in np.unique(keys[dup] // n_items).tolist():
            r0, r1 = int(indptr[u]), int(indptr[u + 1])
            if groups > 0:  # the mixture the user's items are drawn from
                p = np.zeros(n_items, dtype=np.float64)
                p[perm] += (1.0 - affinity) * base
                p[group_perms[group_of[u]]] += affinity * base
            chosen = rng.choice(n_items, size=r1 - r0, replace=False, p=p)
            keys[r0:r1] = np.sort(chosen) + u * n_items

    users = keys // n_items
    items = keys - users * n_items
    del keys
    timestamps = rng.integers(0, 1 << 40, size=total, dtype=np.int64)
    return build_split(
        name="synthetic",
        users=users,
        items=items,
        timestamps=timestamps,
        n_users=n_users,
        n_items=n_items,
        user_labels=np.arange(n_users, dtype=np.int64),
        item_labels=np.arange(n_items, dtype=np.int64),
        n_test_negatives=n_test_negatives,
        validation=validation,
        rng=rng,
        presorted=True,
    )
