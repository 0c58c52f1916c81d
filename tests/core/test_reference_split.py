"""The faithful split equals the original's, index for index, on every shared dataset.

``shared/datasets/<name>/reference-split`` holds the split the original notebook builds from the
raw file beside it. The project's paper protocol must give the same user and item indices, the
same test item per user, the same distinct training pairs and the same 99 test negatives per
user, in the same order.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedrecgel.data import DATASETS, load_split
from fedrecgel.data.protocol import reference_negatives

from .datasets import SHARED, needs_shared, reference_split


@needs_shared
@pytest.mark.parametrize("name", DATASETS)
def test_split_equals_the_originals(name: str) -> None:
    split = load_split(name, SHARED)
    train, test_items, negatives = reference_split(name)
    assert (split.n_users, len(test_items)) == (len(negatives), len(test_items))
    np.testing.assert_array_equal(split.test_items, test_items)
    ref_pairs = np.unique(train[:, 0] * split.n_items + train[:, 1])
    ours = split.train_user_of_rows() * split.n_items + split.train_items
    np.testing.assert_array_equal(np.sort(ours), ref_pairs)
    np.testing.assert_array_equal(split.test_negatives, negatives)


def test_reference_negatives_are_valid_and_depend_on_the_seed() -> None:
    """Distinct, never one of the user's items, reproducible, and another seed draws others."""
    rng = np.random.default_rng(0)
    n_users, n_items = 40, 300
    rows = [
        np.unique(rng.integers(0, n_items, size=int(rng.integers(2, 60)))) for _ in range(n_users)
    ]
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=indptr[1:])
    items = np.concatenate(rows)
    a = reference_negatives(indptr, items, n_items, 99, seed=42)
    assert a.shape == (n_users, 99) and a.dtype == np.int32
    for u in range(n_users):
        assert len(set(a[u].tolist())) == 99
        assert not set(a[u].tolist()) & set(rows[u].tolist())
    np.testing.assert_array_equal(a, reference_negatives(indptr, items, n_items, 99, seed=42))
    assert (a != reference_negatives(indptr, items, n_items, 99, seed=7)).any()


def test_reference_negatives_when_the_first_draw_covers_the_catalogue() -> None:
    """A user with almost every item: the first draw is capped at the catalogue, and the
    negatives are exactly the free items."""
    n_items = 120
    items = np.arange(20, dtype=np.int64)
    out = reference_negatives(np.array([0, 20]), items, n_items, 99, seed=1)
    assert set(out[0].tolist()) <= set(range(20, n_items))
    assert len(set(out[0].tolist())) == 99
