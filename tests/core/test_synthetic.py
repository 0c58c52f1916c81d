"""Tests of fedrecgel.synthetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedrecgel.data import DataError, Split, read_ncf, stats, write_ncf
from fedrecgel.synthetic import synthetic_split


def _rows(split: Split) -> tuple[np.ndarray, np.ndarray]:
    """All (user, item) rows of a split: train, test and validation."""
    users = [split.train_user_of_rows(), np.arange(split.n_users)]
    items = [split.train_items, split.test_items]
    if split.val_items is not None:
        users.append(np.arange(split.n_users))
        items.append(split.val_items)
    return np.concatenate(users), np.concatenate(items)


def test_shapes_and_validity() -> None:
    s = synthetic_split(500, 300, interactions_per_user=14, seed=1, validation=True)
    assert s.name == "synthetic" and (s.n_users, s.n_items) == (500, 300)
    assert s.train_indptr.shape == (501,) and s.train_indptr.dtype == np.int64
    assert s.test_items.shape == (500,) and s.test_negatives.shape == (500, 99)
    assert s.val_items is not None and s.val_negatives is not None
    assert s.val_negatives.shape == (500, 99) and s.test_negatives.dtype == np.int32
    users, items = _rows(s)
    per_user = np.bincount(users, minlength=500)
    assert per_user.min() >= 5
    assert abs(per_user.mean() - 14) < 1.0
    keys = users * s.n_items + items
    assert len(np.unique(keys)) == len(keys)  # distinct items per user
    for u in range(s.n_users):
        train = s.user_train(u)
        assert np.all(np.diff(train) > 0)
        mine = set(train.tolist()) | {int(s.test_items[u]), int(s.val_items[u])}
        for negs in (s.test_negatives[u], s.val_negatives[u]):
            assert len(set(negs.tolist())) == 99 and not mine & set(negs.tolist())
    np.testing.assert_array_equal(s.user_labels, np.arange(500))
    assert stats(s)["interactions"] == s.n_interactions == len(keys)


def test_deterministic() -> None:
    a = synthetic_split(300, 200, seed=5)
    assert a == synthetic_split(300, 200, seed=5)
    b = synthetic_split(300, 200, seed=6)
    assert not np.array_equal(a.train_items, b.train_items)


def test_skew_concentrates_popularity() -> None:
    def top_share(skew: float) -> float:
        s = synthetic_split(3000, 1000, skew=skew, seed=2, n_test_negatives=10)
        _, items = _rows(s)
        counts = np.sort(np.bincount(items, minlength=s.n_items))[::-1]
        return float(counts[:10].sum() / counts.sum())

    uniform, zipf1, zipf2 = top_share(0.0), top_share(1.0), top_share(2.0)
    assert uniform < 0.02  # 10 of 1000 items: about 1 % of the rows
    assert zipf1 > 3 * uniform
    assert zipf2 > zipf1


def test_popular_items_are_permuted() -> None:
    s = synthetic_split(2000, 500, skew=1.5, seed=3, n_test_negatives=5)
    _, items = _rows(s)
    top = np.argsort(np.bincount(items, minlength=500))[::-1][:5]
    assert sorted(top.tolist()) != [0, 1, 2, 3, 4]


def test_heavy_skew_many_interactions() -> None:
    # strong skew and users taking a large share of the catalogue: rejection plus exact fallback
    s = synthetic_split(200, 60, interactions_per_user=40, skew=3.0, seed=4, n_test_negatives=5)
    users, items = _rows(s)
    keys = users * s.n_items + items
    assert len(np.unique(keys)) == len(keys)
    assert np.bincount(users).max() <= 55


def test_count_cap_and_errors() -> None:
    s = synthetic_split(50, 30, interactions_per_user=100, seed=0, n_test_negatives=10)
    users, _ = _rows(s)
    assert np.bincount(users).max() == 20
    with pytest.raises(DataError, match="cannot give each user"):
        synthetic_split(10, 50, n_test_negatives=99)
    with pytest.raises(DataError, match="min_interactions=2"):
        synthetic_split(10, 500, min_interactions=2, validation=True)
    with pytest.raises(DataError, match="skew"):
        synthetic_split(10, 500, skew=-1)


def test_ncf_round_trip(tmp_path: Path) -> None:
    s = synthetic_split(100, 400, seed=9, validation=True)
    write_ncf(s, tmp_path)
    assert read_ncf(tmp_path, "synthetic") == s


def test_200k_users_completes() -> None:
    s = synthetic_split(200_000, 50_000, seed=0)
    assert s.n_users == 200_000 and s.test_negatives.shape == (200_000, 99)
    assert s.n_interactions == s.n_train + 200_000
