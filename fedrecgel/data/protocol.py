"""The data protocol: user filter, re-indexing, leave-one-out split and test negatives.

The paper's protocol, as the original notebook builds it (the steps below; README.md "Data"
says where each dataset's raw file comes from). For FilmTrust, Amazon-Video and Lastfm-2K the tests check that user and item
indices, test items, distinct training pairs and the 99 test negatives of every user equal the
original's split (``shared/datasets/*/reference-split``).

1. every raw row is a positive interaction;
2. users and items are numbered in order of first appearance in the raw file (integer ids too);
   users with fewer than ``min_interactions`` rows are dropped (items are not filtered, but an
   item seen only in dropped users' rows disappears); both are re-indexed to ``0..n-1`` in sorted
   order of those first-appearance numbers, then rows are sorted by ``(user, item)`` (stable,
   duplicates kept). Lastfm-2K is numbered after the user filter (``NUMBERED_AFTER_USER_FILTER``:
   the original's Lastfm file was built already filtered);
3. leave-one-out: each user's latest row by timestamp is the test item, ties going to the row that
   comes first in ``(user, item)`` order (the item that appeared first in the raw file); with
   ``validation=True`` the latest of the remaining rows (same tie rule) becomes the validation
   item; everything else is training data. Clients train on their *distinct* training items (the
   original builds positives from a 0/1 user x item matrix), so repeated rows of one pair are
   merged in ``Split.train_items``;
4. per user ``n_test_negatives`` test negatives drawn without replacement from the items the user
   never interacted with (in any row), exactly as the original draws them: Python's ``random``
   seeded with ``seed``, in two passes over the users (``reference_negatives``). Validation
   negatives are a separate draw with ``numpy.random.default_rng(seed)`` (vectorised rejection
   sampling, ``sample_negatives``), so the test negatives do not depend on ``validation``.
   Splits built directly with ``build_split`` (synthetic data) use the numpy sampler for both.

``protocol="clean"`` first merges repeated user-item pairs into one row with their latest
timestamp, so a held-out item is never also a training item (on Lastfm-2K the paper protocol
holds out an earlier-tagged artist for most users).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from fedrecgel.data.raw import load_raw
from fedrecgel.data.types import DataError, Interactions, Split
from fedrecgel.rows import repeated_in_row

Protocol = Literal["paper", "clean"]
PROTOCOLS: tuple[str, ...] = ("paper", "clean")

#: datasets whose file the original built with the user filter already applied (Lastfm-2K):
#: their items are numbered by first appearance among the kept users' rows only, so an item
#: first seen in a dropped user's row does not move ahead of the others
NUMBERED_AFTER_USER_FILTER = frozenset({"lastfm-2k"})
#: users per block in the negative sampler (fixed, so results depend only on the seed)
_NEG_BLOCK = 1 << 13
#: rejection rounds before falling back to exact per-user sampling of the leftovers
_NEG_MAX_ROUNDS = 64


def _first_appearance(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``0..n-1`` in order of first appearance, and the label of each code."""
    codes, uniques = pd.factorize(np.asarray(labels), use_na_sentinel=False)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniques)


def _check_holdouts(min_interactions: int, validation: bool) -> None:
    need = 3 if validation else 2
    if min_interactions < need:
        held = "a test and a validation item" if validation else "a test item"
        raise DataError(
            f"min_interactions={min_interactions} is too small: holding out {held} needs at "
            f"least {need} interactions per user (one must stay in training)"
        )


def _latest_per_pair(
    users: np.ndarray, items: np.ndarray, ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row per (user, item) pair, with its latest timestamp, in first-appearance row order."""
    key = users * (int(items.max()) + 1) + items
    frame = pd.DataFrame({"key": key, "ts": ts, "row": np.arange(len(key))})
    agg = frame.groupby("key", sort=False).agg(ts=("ts", "max"), row=("row", "min"))
    rows = agg["row"].to_numpy()
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    return users[rows], items[rows], agg["ts"].to_numpy()[order]


def apply_protocol(
    raw: Interactions,
    min_interactions: int = 5,
    n_test_negatives: int = 99,
    validation: bool = False,
    seed: int = 42,
    protocol: Protocol = "paper",
) -> Split:
    """Filter users, re-index, leave-one-out (test and optional validation) and draw negatives."""
    _check_holdouts(min_interactions, validation)
    if n_test_negatives < 0:
        raise DataError(f"n_test_negatives must be >= 0, got {n_test_negatives}")
    if protocol not in PROTOCOLS:
        raise DataError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    if len(raw) == 0:
        raise DataError(f"{raw.name}: no interactions")
    u_codes, u_labels = _first_appearance(raw.user_labels)
    i_codes, i_labels = _first_appearance(raw.item_labels)
    ts = np.asarray(raw.timestamps, dtype=np.int64)
    if protocol == "clean":
        u_codes, i_codes, ts = _latest_per_pair(u_codes, i_codes, ts)

    counts = np.bincount(u_codes)
    keep = counts[u_codes] >= min_interactions
    if not keep.any():
        raise DataError(
            f"{raw.name}: no user has at least {min_interactions} interactions "
            f"({len(counts)} users, {len(u_codes)} rows): the split would be empty"
        )
    users_kept, users = np.unique(u_codes[keep], return_inverse=True)
    if raw.name in NUMBERED_AFTER_USER_FILTER:
        items, items_kept = _first_appearance(i_codes[keep])
    else:
        items_kept, items = np.unique(i_codes[keep], return_inverse=True)
        items = items.reshape(-1).astype(np.int64)
    return build_split(
        name=raw.name,
        users=users.reshape(-1).astype(np.int64),
        items=items,
        timestamps=ts[keep],
        n_users=len(users_kept),
        n_items=len(items_kept),
        user_labels=u_labels[users_kept],
        item_labels=i_labels[items_kept],
        n_test_negatives=n_test_negatives,
        validation=validation,
        rng=np.random.default_rng(seed),
        reference_seed=seed,
    )


def build_split(
    name: str,
    users: np.ndarray,
    items: np.ndarray,
    timestamps: np.ndarray,
    n_users: int,
    n_items: int,
    user_labels: np.ndarray,
    item_labels: np.ndarray,
    n_test_negatives: int,
    validation: bool,
    rng: np.random.Generator,
    presorted: bool = False,
    reference_seed: int | None = None,
) -> Split:
    """Leave-one-out and negatives on rows already re-indexed to ``0..n_users-1``/``0..n_items-1``.

    Every user in ``0..n_users-1`` must have at least 2 rows (3 with validation). With
    ``presorted=True`` the rows must already be sorted by ``(user, item)``. With
    ``reference_seed`` the test negatives are the original's draw (``reference_negatives``);
    without it they come from ``rng`` (``sample_negatives``). Validation negatives always come
    from ``rng``.
    """
    users = np.asarray(users, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    timestamps = np.asarray(timestamps, dtype=np.int64)
    if not presorted:
        order = np.lexsort((items, users))  # stable: equal (user, item) keep row order
        users, items, timestamps = users[order], items[order], timestamps[order]
        del order
    counts = np.bincount(users, minlength=n_users)
    need = 3 if validation else 2
    if len(counts) != n_users or counts.min(initial=need) < need:
        u = int(np.argmin(counts))
        raise DataError(
            f"{name}: user {np.asarray(user_labels)[u].item()!r} has {counts[u]} interactions, "
            f"fewer than the {need} needed for the held-out items"
        )
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])

    # leave-one-out, vectorised over users (rows are grouped by user, ties -> first row)
    held = np.zeros(len(users), dtype=bool)
    test_rows = _latest_rows(timestamps, indptr, held)
    held[test_rows] = True
    test_items = items[test_rows]
    val_items: np.ndarray | None = None
    if validation:
        val_rows = _latest_rows(timestamps, indptr, held)
        held[val_rows] = True
        val_items = items[val_rows]

    # training: the distinct items of each user's remaining rows (sorted: rows are (user, item))
    rest = ~held
    t_users, t_items = users[rest], items[rest]
    first = np.ones(len(t_items), dtype=bool)
    first[1:] = (t_items[1:] != t_items[:-1]) | (t_users[1:] != t_users[:-1])
    train_items = t_items[first]
    train_indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(t_users[first], minlength=n_users), out=train_indptr[1:])

    if reference_seed is None:
        test_neg = sample_negatives(
            indptr, items, n_items, n_test_negatives, rng, user_labels=user_labels, name=name
        )
    else:
        test_neg = reference_negatives(
            indptr, items, n_items, n_test_negatives, reference_seed, user_labels, name
        )
    val_neg: np.ndarray | None = None
    if validation:
        val_neg = sample_negatives(
            indptr, items, n_items, n_test_negatives, rng, user_labels=user_labels, name=name
        )
    return Split(
        name=name,
        n_users=int(n_users),
        n_items=int(n_items),
        train_indptr=train_indptr,
        train_items=train_items,
        test_items=test_items,
        test_negatives=test_neg,
        val_items=val_items,
        val_negatives=val_neg,
        user_labels=np.asarray(user_labels),
        item_labels=np.asarray(item_labels),
    )


def _latest_rows(timestamps: np.ndarray, indptr: np.ndarray, held: np.ndarray) -> np.ndarray:
    """Per user, the first row (in row order) with the latest timestamp among rows not held."""
    starts = indptr[:-1]
    counts = np.diff(indptr)
    alive = ~held
    t = np.where(alive, timestamps, np.iinfo(np.int64).min)
    latest = np.maximum.reduceat(t, starts)
    is_latest = alive & (t == np.repeat(latest, counts))
    idx = np.where(is_latest, np.arange(len(t), dtype=np.int64), len(t))
    return np.asarray(np.minimum.reduceat(idx, starts), dtype=np.int64)


def _in_sorted(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    if len(sorted_keys) == 0:
        return np.zeros(keys.shape, dtype=bool)
    idx = np.searchsorted(sorted_keys, keys)
    np.minimum(idx, len(sorted_keys) - 1, out=idx)
    return np.asarray(sorted_keys[idx] == keys)


def _check_free_items(
    indptr: np.ndarray,
    items: np.ndarray,
    n_items: int,
    n_neg: int,
    user_labels: np.ndarray | None,
    name: str,
) -> np.ndarray:
    """Raise unless every user leaves ``n_neg`` items to draw; returns the user of each row."""
    if n_items > np.iinfo(np.int32).max:
        raise DataError(f"{name}: {n_items} items do not fit the int32 negatives")
    n_users = len(indptr) - 1
    users = np.repeat(np.arange(n_users, dtype=np.int64), np.diff(indptr))
    # distinct items per user (items sorted within user, so a change marks a new item)
    new = np.ones(len(items), dtype=bool)
    new[1:] = (items[1:] != items[:-1]) | (users[1:] != users[:-1])
    distinct = np.bincount(users[new], minlength=n_users)
    free = n_items - distinct
    if free.min() < n_neg:
        u = int(np.argmin(free))
        label = u if user_labels is None else user_labels[u]
        label = label.item() if isinstance(label, np.generic) else label  # "7", not np.int64(7)
        raise DataError(
            f"{name}: user {label!r} interacted with {distinct[u]} of {n_items} items, leaving "
            f"{free[u]} candidates for {n_neg} negatives"
        )
    return users


def reference_negatives(
    indptr: np.ndarray,
    items: np.ndarray,
    n_items: int,
    n_neg: int,
    seed: int,
    user_labels: np.ndarray | None = None,
    name: str = "data",
) -> np.ndarray:
    """The original notebook's test negatives, draw for draw; int32 ``(n_users, n_neg)``.

    Python's ``random`` seeded with ``seed`` (the original: 42). ``pool`` is every item index
    (a set of ``0..n_items-1`` lists in increasing order) and ``x`` a user's items in any row.
    The original makes two passes over the users in increasing order: first, per user,
    ``set(random.sample(pool, n_neg + len(x))) - x``; then, per user again, ``random.sample``
    of ``n_neg`` from the list of that set (CPython's set order, which depends only on the
    inserted values and their order, so rebuilding the set from the first draw gives the same
    list). Checked against the original's candidates for every user of FilmTrust, Amazon-Video
    and Lastfm-2K (``tests/core/test_reference_split.py``). A Python loop: about 0.1 ms a user.
    """
    n_users = len(indptr) - 1
    out = np.empty((n_users, n_neg), dtype=np.int32)
    if n_neg == 0 or n_users == 0:
        return out
    _check_free_items(indptr, items, n_items, n_neg, user_labels, name)
    rnd = random.Random(seed)
    pool = list(range(n_items))
    user_items = [set(items[indptr[u] : indptr[u + 1]].tolist()) for u in range(n_users)]
    # first pass: keep each draw as a compact array, in draw order (the set is rebuilt from it)
    draws = [
        np.asarray(rnd.sample(pool, min(n_neg + len(x), n_items)), dtype=np.int32)
        for x in user_items
    ]
    for u, (draw, x) in enumerate(zip(draws, user_items, strict=True)):
        out[u] = rnd.sample(list(set(draw.tolist()) - x), n_neg)
    return out


def sample_negatives(
    indptr: np.ndarray,
    items: np.ndarray,
    n_items: int,
    n_neg: int,
    rng: np.random.Generator,
    user_labels: np.ndarray | None = None,
    name: str = "data",
) -> np.ndarray:
    """Per user, ``n_neg`` distinct items uniformly from those absent from the user's rows.

    ``items[indptr[u]:indptr[u+1]]`` are user u's items, sorted within the user (duplicates ok).
    Vectorised rejection sampling in fixed blocks of users; returns int32 ``(n_users, n_neg)``.
    """
    n_users = len(indptr) - 1
    out = np.empty((n_users, n_neg), dtype=np.int32)
    if n_neg == 0 or n_users == 0:
        return out
    users = _check_free_items(indptr, items, n_items, n_neg, user_labels, name)
    for u0 in range(0, n_users, _NEG_BLOCK):
        u1 = min(u0 + _NEG_BLOCK, n_users)
        r0, r1 = int(indptr[u0]), int(indptr[u1])
        pos = (users[r0:r1] - u0) * n_items + items[r0:r1]  # sorted: rows are (user, item)
        base = np.arange(u1 - u0, dtype=np.int64)[:, None] * n_items
        cand = rng.integers(0, n_items, size=(u1 - u0, n_neg), dtype=np.int64)
        rows = np.arange(u1 - u0)
        sub = cand
        for _ in range(_NEG_MAX_ROUNDS):
            bad = _in_sorted(pos, base[rows] + sub) | repeated_in_row(sub)
            if not bad.any():
                rows = rows[:0]
                break
            keep_rows = bad.any(axis=1)
            rows, sub, bad = rows[keep_rows], sub[keep_rows], bad[keep_rows]
            sub[bad] = rng.integers(0, n_items, size=int(bad.sum()), dtype=np.int64)
            cand[rows] = sub
        else:
            bad = _in_sorted(pos, base[rows] + sub) | repeated_in_row(sub)
            keep_rows = bad.any(axis=1)
            rows, sub, bad = rows[keep_rows], sub[keep_rows], bad[keep_rows]
        # exact fallback for the few rows rejection did not settle (users with few free items)
        for j, r in enumerate(rows):
            u = u0 + int(r)
            taken = np.union1d(items[indptr[u] : indptr[u + 1]], sub[j][~bad[j]])
            allowed = np.setdiff1d(np.arange(n_items, dtype=np.int64), taken, assume_unique=True)
            sub[j][bad[j]] = rng.choice(allowed, size=int(bad[j].sum()), replace=False)
            cand[r] = sub[j]
        out[u0:u1] = cand
    return out


def load_split(
    name: str,
    data_dir: Path | None = None,
    validation: bool = False,
    seed: int = 42,
    protocol: Protocol = "paper",
) -> Split:
    """``load_raw`` followed by ``apply_protocol`` with the default protocol settings."""
    return apply_protocol(
        load_raw(name, data_dir), validation=validation, seed=seed, protocol=protocol
    )


def hold_out_validation(split: Split, seed: int = 42) -> Split:
    """A validation item per user taken out of a ready split's training items.

    For splits read from another codebase's files, which carry no timestamps: each user's
    validation item is drawn uniformly (seeded) from their distinct training items, and its
    negatives are drawn like the test negatives (never an item of the user). Test items and test
    negatives are untouched. Every user needs at least 2 distinct training items.
    """
    if split.has_validation:
        raise DataError(f"{split.name}: the split already has a validation item")
    rng = np.random.default_rng(seed)
    counts = np.diff(split.train_indptr)
    if counts.min(initial=2) < 2:
        u = int(np.argmin(counts))
        raise DataError(
            f"{split.name}: user {u} has {counts[u]} training item(s); holding out a validation "
            "item needs at least 2"
        )
    pick = split.train_indptr[:-1] + (rng.random(split.n_users) * counts).astype(np.int64)
    keep = np.ones(split.n_train, dtype=bool)
    keep[pick] = False
    train_indptr = np.zeros_like(split.train_indptr)
    np.cumsum(counts - 1, out=train_indptr[1:])
    # every item of a user (train, validation, test), grouped by user and sorted, for the sampler
    users = np.concatenate([split.train_user_of_rows(), np.arange(split.n_users)])
    items = np.concatenate([split.train_items, split.test_items])
    order = np.lexsort((items, users))
    indptr = np.zeros(split.n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(users, minlength=split.n_users), out=indptr[1:])
    val_neg = sample_negatives(
        indptr,
        items[order],
        split.n_items,
        split.test_negatives.shape[1],
        rng,
        user_labels=split.user_labels,
        name=split.name,
    )
    return replace(
        split,
        train_indptr=train_indptr,
        train_items=split.train_items[keep],
        val_items=split.train_items[pick],
        val_negatives=val_neg,
    )
