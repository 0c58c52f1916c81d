"""Tests of the data protocol: leave-one-out, ties, duplicates, negatives, statistics."""

from __future__ import annotations

import numpy as np
import pytest

from fedrecgel.data import (
    DataError,
    stats,
)
from tests.core.datasets import (
    check_negatives,
    split_from_rows,
    user_items,
)

# ----------------------------------------------------------------------------- protocol


def test_leave_one_out_latest_and_ties() -> None:
    rows = [
        # user 10: latest t=9 on items 7 and 3 (tie) -> item 7 (first in the raw file)
        (10, 7, 9),
        (10, 3, 9),
        (10, 5, 1),
        (10, 8, 2),
        (10, 1, 8),
        # user 20: unique latest item 4; second latest: items 6 and 2 tie at 5 -> 6
        (20, 6, 5),
        (20, 4, 7),
        (20, 2, 5),
        (20, 9, 0),
        (20, 1, 1),
        # user 30: four rows only, filtered out
        (30, 1, 100),
        (30, 2, 100),
        (30, 3, 100),
        (30, 4, 100),
    ]
    split, _ = split_from_rows(rows, n_test_negatives=0)
    assert split.user_labels.tolist() == [10, 20]
    labels = split.item_labels
    # item indices in order of first appearance: 7 3 5 8 1 6 4 2 9
    assert labels.tolist() == [7, 3, 5, 8, 1, 6, 4, 2, 9]
    assert labels[split.test_items].tolist() == [7, 4]
    assert labels[split.user_train(0)].tolist() == [3, 5, 8, 1]
    v, _ = split_from_rows(rows, n_test_negatives=0, validation=True)
    assert v.val_items is not None
    assert labels[v.test_items].tolist() == [7, 4]
    assert labels[v.val_items].tolist() == [3, 6]
    assert labels[v.user_train(1)].tolist() == [1, 2, 9]
    assert v.train_indptr.tolist() == [0, 3, 6]


def test_duplicate_rows_merged_in_training_and_clean_protocol() -> None:
    rows = [(1, 2, 1), (1, 2, 5), (1, 3, 2), (1, 4, 3), (1, 2, 0), (1, 6, 4)]
    split, _ = split_from_rows(rows, n_test_negatives=0)
    # paper protocol: the latest row of item 2 is held out, its earlier rows train (once)
    assert split.item_labels[split.test_items].tolist() == [2]
    assert split.item_labels[split.user_train(0)].tolist() == [2, 3, 4, 6]
    assert split.n_interactions == 5
    # clean: one row per pair (latest time) first, so the held-out item is not a training item
    clean, _ = split_from_rows(rows, n_test_negatives=0, min_interactions=2, protocol="clean")
    assert clean.item_labels[clean.test_items].tolist() == [2]
    assert clean.item_labels[clean.user_train(0)].tolist() == [3, 4, 6]
    with pytest.raises(DataError, match="no user has at least 5"):
        split_from_rows(rows, n_test_negatives=0, protocol="clean")


def _brute_force_loo(rows: list[tuple[int, int, int]], validation: bool) -> list[list[int]]:
    first_seen: dict[int, int] = {}
    by_user: dict[int, list[tuple[int, int, int]]] = {}
    for pos, (u, i, t) in enumerate(rows):
        first_seen.setdefault(u, pos)
        by_user.setdefault(u, []).append((i, pos, t))
    out = []
    item_rank = {i: k for k, i in enumerate(dict.fromkeys(i for _, i, _ in rows))}
    for u in sorted(by_user, key=first_seen.__getitem__):
        # (item's first appearance, file position): the protocol's stable (user, item) order
        rs = sorted(by_user[u], key=lambda r: (item_rank[r[0]], r[1]))
        picks = []
        for _ in range(2 if validation else 1):
            best = max(range(len(rs)), key=lambda k: (rs[k][2], -k))
            picks.append(rs.pop(best)[0])
        out.append(picks)
    return out


@pytest.mark.parametrize("validation", [False, True])
def test_leave_one_out_matches_brute_force(validation: bool) -> None:
    rng = np.random.default_rng(3)
    rows = [
        (int(u), int(i), int(t))
        for u, i, t in zip(
            rng.integers(0, 40, 600), rng.integers(0, 30, 600), rng.integers(0, 4, 600), strict=True
        )
    ]
    split, _ = split_from_rows(rows, n_test_negatives=0, validation=validation)
    want = _brute_force_loo(rows, validation)
    lab = split.item_labels
    assert lab[split.test_items].tolist() == [w[0] for w in want]
    if validation:
        assert split.val_items is not None
        assert lab[split.val_items].tolist() == [w[1] for w in want]


def test_negatives_valid_and_reproducible() -> None:
    rng = np.random.default_rng(0)
    n = 3000
    rows = [
        (int(u), int(i), int(t))
        for u, i, t in zip(
            rng.integers(0, 200, n), rng.integers(0, 160, n), rng.integers(0, 50, n), strict=True
        )
    ]
    split, raw = split_from_rows(rows, n_test_negatives=40, validation=True, seed=7)
    items_of = user_items(raw, split)
    check_negatives(split, split.test_negatives, items_of)
    assert split.val_negatives is not None
    check_negatives(split, split.val_negatives, items_of)
    assert not np.array_equal(split.test_negatives, split.val_negatives)
    again, _ = split_from_rows(rows, n_test_negatives=40, validation=True, seed=7)
    assert again == split
    other, _ = split_from_rows(rows, n_test_negatives=40, validation=True, seed=8)
    assert not np.array_equal(other.test_negatives, split.test_negatives)
    plain, _ = split_from_rows(rows, n_test_negatives=40, validation=False, seed=7)
    np.testing.assert_array_equal(plain.test_negatives, split.test_negatives)


def test_negatives_when_almost_no_free_items() -> None:
    # user 0 interacted with 95 of 100 items: exactly 5 candidates remain
    rows = [(0, i, i) for i in range(95)] + [(1, i, i) for i in range(90, 100)]
    split, raw = split_from_rows(rows, n_test_negatives=5)
    assert sorted(split.test_negatives[0].tolist()) == [95, 96, 97, 98, 99]
    check_negatives(split, split.test_negatives, user_items(raw, split))
    with pytest.raises(DataError, match="user 0 interacted with 95 of 100 items"):
        split_from_rows(rows, n_test_negatives=6)


def test_negatives_uniform() -> None:
    rows = [(0, i, i) for i in range(5)] + [(u, i, i) for u in range(1, 4000) for i in range(5)]
    rows += [(4000, i, i) for i in range(5, 15)] + [(4001, i, i) for i in range(15, 25)]
    split, _ = split_from_rows(rows, n_test_negatives=10, seed=1)
    counts = np.bincount(split.test_negatives[:4000].ravel(), minlength=split.n_items)
    free = counts[5:]
    assert counts[:5].sum() == 0
    assert free.min() > 0.8 * free.mean() and free.max() < 1.2 * free.mean()


def test_min_interactions_too_small() -> None:
    rows = [(0, i, i) for i in range(6)]
    with pytest.raises(DataError, match="min_interactions=1"):
        split_from_rows(rows, min_interactions=1)
    with pytest.raises(DataError, match="min_interactions=2"):
        split_from_rows(rows, min_interactions=2, validation=True, n_test_negatives=0)
    split, _ = split_from_rows(rows, min_interactions=3, validation=True, n_test_negatives=0)
    assert split.n_train == 4


def test_stats_values() -> None:
    rows = [(0, i, i) for i in range(5)] + [(1, i, i) for i in range(2, 9)] + [(1, 2, 0)]
    split, _ = split_from_rows(rows, n_test_negatives=0)
    st = stats(split)
    # the repeated (1, 2) row trains once: 12 interactions, 10 of them training pairs
    assert st["users"] == 2 and st["items"] == 9 and st["interactions"] == 12
    assert st["train"] == 10 and st["distinct_pairs"] == 12
    assert st["interactions_per_user_max"] == 7 and st["interactions_per_user_median"] == 6
    assert st["sparsity"] == pytest.approx(1 - 12 / 18)
    assert st["users_per_item_max"] == 2 and st["interactions_per_item_max"] == 2
