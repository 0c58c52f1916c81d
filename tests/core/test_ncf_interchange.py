"""Tests of the NCF interchange and of ready splits from other codebases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedrecgel.data import (
    DataError,
    Interactions,
    apply_protocol,
    hold_out_validation,
    load_split,
    read_ncf,
    read_split_dir,
    write_ncf,
)
from tests.core.datasets import (
    SHARED,
    needs_shared,
    reference_split,
    split_from_rows,
    write,
)

# ----------------------------------------------------------------------------- NCF


@pytest.mark.parametrize("validation", [False, True])
def test_ncf_round_trip(tmp_path: Path, validation: bool) -> None:
    split = load_split("filmtrust", validation=validation)
    write_ncf(split, tmp_path)
    back = read_ncf(tmp_path, "filmtrust")
    assert back == split
    first = (tmp_path / "filmtrust.test.negative").read_text().splitlines()[0].split("\t")
    assert first[0] == f"({0},{split.test_items[0]})" and len(first) == 100
    train_first = (tmp_path / "filmtrust.train.csv").read_text().splitlines()[0]
    assert train_first == f"0,{split.train_items[0]}"


def test_an_export_without_validation_over_one_with_it_reads_back_as_itself(
    tmp_path: Path,
) -> None:
    """The earlier export's val.negative stayed, and reading the folder back gave a split
    whose validation items were training items of the new one."""
    write_ncf(load_split("filmtrust", validation=True), tmp_path)
    plain = load_split("filmtrust", validation=False)
    write_ncf(plain, tmp_path)
    assert not (tmp_path / "filmtrust.val.negative").exists()
    assert read_ncf(tmp_path, "filmtrust") == plain


def test_ncf_round_trip_string_labels_and_plain_layout(tmp_path: Path) -> None:
    raw = Interactions(
        "s",
        np.array(["b"] * 6 + ["a"] * 5, dtype=object),
        np.array(list("pqrstu") + list("pqrsx"), dtype=object),
        np.arange(11, dtype=np.int64),
    )
    split = apply_protocol(raw, n_test_negatives=1)
    write_ncf(split, tmp_path)
    assert read_ncf(tmp_path, "s") == split
    for f in ("s.users.txt", "s.items.txt"):
        (tmp_path / f).unlink()
    plain = read_ncf(tmp_path, "s")  # only the two NCF files: indices as labels
    np.testing.assert_array_equal(plain.user_labels, np.arange(2))
    assert plain.n_items == split.n_items
    np.testing.assert_array_equal(plain.train_items, split.train_items)
    np.testing.assert_array_equal(plain.test_negatives, split.test_negatives)


def test_read_ncf_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"x\.test\.negative"):
        read_ncf(tmp_path, "x")
    write(tmp_path / "x.test.negative", "(0,1)\t2\t3\n(1,2)\t3\n")
    with pytest.raises(DataError, match=r"x\.test\.negative, line 2"):
        read_ncf(tmp_path, "x")
    write(tmp_path / "x.test.negative", "(0,1)\t2\t3\n0,2\t3\t4\n")
    with pytest.raises(DataError, match=r"line 2: expected '\(user,item\)'"):
        read_ncf(tmp_path, "x")


@pytest.mark.parametrize(
    ("train", "test", "message"),
    [
        ("0,999999999999\n", "(0,1)\t2\n", "item id 999999999999 is past the largest catalogue"),
        ("0,3\n", "(0,99999999999)\t2\n", "item id 99999999999 is past the largest catalogue"),
        ("0,3\n", "(0,1)\t99999999999\n", "a negative item id is past 2"),
    ],
)
def test_huge_item_ids_are_refused_before_a_catalogue_is_built(
    tmp_path: Path, train: str, test: str, message: str
) -> None:
    """Without items.txt the catalogue runs from 0 to the largest id: an id of 1e12 asked
    for a 7 TiB array (and one of 1e9 for 8 GB that would be built)."""
    write(tmp_path / "x.train.csv", train)
    write(tmp_path / "x.test.negative", test)
    with pytest.raises(DataError, match=message):
        read_ncf(tmp_path, "x")


# ----------------------------------------------------------------------------- ready splits


@needs_shared
def test_read_split_dir_reads_the_originals_files() -> None:
    ref = SHARED / "filmtrust" / "reference-split"
    split = read_split_dir(ref)
    train, test_items, negatives = reference_split("filmtrust")
    assert split.n_users == 1227 and split.n_items == 2059
    np.testing.assert_array_equal(split.test_items, test_items)
    pairs = split.train_user_of_rows() * split.n_items + split.train_items
    np.testing.assert_array_equal(pairs, np.unique(train[:, 0] * 2059 + train[:, 1]))
    np.testing.assert_array_equal(split.test_negatives, negatives)
    # the same split as our protocol builds, negatives included
    ours = load_split("filmtrust", SHARED)
    np.testing.assert_array_equal(ours.test_negatives, split.test_negatives)
    np.testing.assert_array_equal(ours.train_items, split.train_items)
    np.testing.assert_array_equal(ours.train_indptr, split.train_indptr)


def test_read_split_dir_ncf_layout_and_validation(tmp_path: Path) -> None:
    split, _ = split_from_rows(
        [(u, (u * 7 + k) % 40, k) for u in range(30) for k in range(8)], n_test_negatives=9
    )
    write_ncf(split, tmp_path / "ncf")
    back = read_split_dir(tmp_path / "ncf")
    assert back == split
    v = hold_out_validation(back, seed=1)
    assert v.val_items is not None and v.val_negatives is not None
    np.testing.assert_array_equal(v.test_items, split.test_items)
    np.testing.assert_array_equal(v.test_negatives, split.test_negatives)
    for u in range(v.n_users):
        before = set(split.user_train(u).tolist())
        after = set(v.user_train(u).tolist())
        assert before - after == {int(v.val_items[u])} and after < before
        negs = set(v.val_negatives[u].tolist())
        assert len(negs) == 9 and not negs & (before | {int(split.test_items[u])})
    assert hold_out_validation(back, seed=1) == v
    with pytest.raises(DataError, match="already has a validation"):
        hold_out_validation(v)
    with pytest.raises(DataError, match="not a directory"):
        read_split_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="found 0"):
        read_split_dir(tmp_path / "empty")
