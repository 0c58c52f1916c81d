"""Shared helpers of the data tests: where the shared datasets are, small splits from rows."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fedrecgel.data import Interactions, Split, apply_protocol


def shared_datasets() -> Path:
    env = os.environ.get("FEDREC_SHARED_DATASETS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "datasets"


SHARED = shared_datasets()
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} not present")

EXPECTED = {
    "filmtrust": (1227, 2059, 34889),
    "amazon-video": (8072, 11830, 63836),
    "lastfm-2k": (1600, 12454, 185650),
}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def split_from_rows(rows: list[tuple[int, int, int]], **kw: object) -> tuple[Split, Interactions]:
    raw = Interactions(
        "t",
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.int64),
        np.array([r[2] for r in rows], dtype=np.int64),
    )
    return apply_protocol(raw, **kw), raw  # type: ignore[arg-type]


def user_items(raw: Interactions, split: Split) -> list[set[int]]:
    """All (re-indexed) items of each user, from the raw rows (numeric ids only)."""
    upos = {int(x): k for k, x in enumerate(split.user_labels)}
    ipos = {int(x): k for k, x in enumerate(split.item_labels)}
    out: list[set[int]] = [set() for _ in range(split.n_users)]
    for u, i in zip(raw.user_labels.tolist(), raw.item_labels.tolist(), strict=True):
        if u in upos:
            out[upos[u]].add(ipos[i])
    return out


def check_negatives(split: Split, negatives: np.ndarray, items_of: list[set[int]]) -> None:
    assert negatives.dtype == np.int32
    for u in range(split.n_users):
        row = negatives[u].tolist()
        assert len(set(row)) == len(row)
        assert not set(row) & items_of[u]
        assert all(0 <= x < split.n_items for x in row)


def reference_split(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The original's split of ``name``: training (user, item) rows, test items, test negatives."""
    ref = SHARED / name / "reference-split"
    train = np.loadtxt(ref / "train_interactions.csv", delimiter=",", dtype=np.int64)
    heads, negatives = [], []
    with (ref / "test_neg_interactions").open() as fh:
        for line in fh:
            head, *negs = line.rstrip("\n").split("\t")
            user, item = head.strip("()").split(",")
            heads.append((int(user), int(item)))
            negatives.append([int(x) for x in negs])
    pairs = np.asarray(heads, dtype=np.int64)
    np.testing.assert_array_equal(pairs[:, 0], np.arange(len(pairs)))
    return train, pairs[:, 1], np.asarray(negatives, dtype=np.int64)
