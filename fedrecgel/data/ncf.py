"""NCF interchange: the ``<name>.train.csv`` / ``<name>.test.negative`` layout of the NCF code."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from fedrecgel.config import MAX_ITEMS
from fedrecgel.data.raw import id_column, int_column, read_fields
from fedrecgel.data.types import DataError, Split


def _write_negative_file(path: Path, items: np.ndarray, negatives: np.ndarray) -> None:
    n_users = len(items)
    heads = np.char.add(
        np.char.add(np.char.add("(", np.arange(n_users).astype(str)), ","),
        np.char.add(np.asarray(items).astype(str), ")"),
    )
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for u in range(n_users):
            if negatives.shape[1]:
                fh.write(heads[u] + "\t" + "\t".join(map(str, negatives[u].tolist())) + "\n")
            else:
                fh.write(heads[u] + "\n")


def write_ncf(split: Split, out_dir: Path) -> None:
    """Write ``<name>.train.csv`` (``user,item``) and ``<name>.test.negative`` in NCF layout.

    With validation, ``<name>.val.negative`` is written too (same format); the original ids go to
    ``<name>.users.txt`` / ``<name>.items.txt`` (one per line, index order) so that ``read_ncf``
    restores the split exactly.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train = pd.DataFrame({"user": split.train_user_of_rows(), "item": split.train_items})
    train.to_csv(
        out_dir / f"{split.name}.train.csv", header=False, index=False, lineterminator="\n"
    )
    _write_negative_file(
        out_dir / f"{split.name}.test.negative", split.test_items, split.test_negatives
    )
    val_path = out_dir / f"{split.name}.val.negative"
    if split.val_items is not None and split.val_negatives is not None:
        _write_negative_file(val_path, split.val_items, split.val_negatives)
    else:  # an earlier export's: read back, it would hold out items this split trains on
        val_path.unlink(missing_ok=True)
    for suffix, labels in (("users", split.user_labels), ("items", split.item_labels)):
        with (out_dir / f"{split.name}.{suffix}.txt").open(
            "w", encoding="utf-8", newline="\n"
        ) as fh:
            fh.writelines(f"{x}\n" for x in np.asarray(labels).tolist())


_HEAD = re.compile(r"^\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)$")


def _read_negative_file(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    users: list[int] = []
    items: list[int] = []
    negs: list[list[int]] = []
    width: int | None = None
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            m = _HEAD.match(parts[0].strip())
            if not m:
                raise DataError(
                    f"{path}, line {lineno}: expected '(user,item)' first, got {parts[0]!r}"
                )
            try:
                row = [int(p) for p in parts[1:]]
            except ValueError:
                raise DataError(
                    f"{path}, line {lineno}: negative item ids must be integers"
                ) from None
            if width is None:
                width = len(row)
            elif len(row) != width:
                raise DataError(
                    f"{path}, line {lineno}: expected {width} negatives, saw {len(row)}"
                )
            users.append(int(m.group(1)))
            items.append(int(m.group(2)))
            negs.append(row)
    if not users:
        raise DataError(f"{path}: file is empty (no data rows)")
    u = np.asarray(users, dtype=np.int64)
    if not np.array_equal(u, np.arange(len(u))):
        raise DataError(f"{path}: expected one line per user, users 0..n-1 in order")
    try:
        negatives = np.asarray(negs, dtype=np.int32).reshape(len(u), width or 0)
    except OverflowError:
        raise DataError(f"{path}: a negative item id is past 2^31 - 1") from None
    return u, np.asarray(items, dtype=np.int64), negatives


def _read_labels(path: Path, n: int) -> np.ndarray:
    if not path.is_file():
        return np.arange(n, dtype=np.int64)
    with path.open("r", encoding="utf-8") as fh:
        values = [line.rstrip("\r\n") for line in fh]
    if len(values) != n:
        raise DataError(f"{path}: expected {n} labels, found {len(values)}")
    return id_column(pd.Series(values, dtype=object))


#: the layout of the original FedRecGEL notebook's split files
REFERENCE_TRAIN, REFERENCE_TEST = "train_interactions.csv", "test_neg_interactions"


def read_split_dir(path: Path, name: str | None = None) -> Split:
    """Read a ready split from a directory in either interchange layout.

    * ``<name>.train.csv`` + ``<name>.test.negative`` (+ ``<name>.val.negative``): what
      ``write_ncf`` writes and NCF-family code reads; ``name`` may be omitted when the directory
      holds one such split;
    * ``train_interactions.csv`` + ``test_neg_interactions``: the original notebook's files.
    """
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{path}: not a directory")
    if name is None and (path / REFERENCE_TEST).is_file():
        return _read_layout(
            path / REFERENCE_TRAIN, path / REFERENCE_TEST, None, path, path.name or "split"
        )
    if name is None:
        found = sorted(p.name[: -len(".test.negative")] for p in path.glob("*.test.negative"))
        if len(found) != 1:
            raise DataError(
                f"{path}: expected one <name>.test.negative (or {REFERENCE_TEST}), found "
                f"{len(found)}{': ' + ', '.join(found) if found else ''}"
            )
        name = found[0]
    return read_ncf(path, name)


def read_ncf(out_dir: Path, name: str) -> Split:
    """Read a split written in NCF layout (``<name>.train.csv`` and ``<name>.test.negative``)."""
    out_dir = Path(out_dir)
    return _read_layout(
        out_dir / f"{name}.train.csv",
        out_dir / f"{name}.test.negative",
        out_dir / f"{name}.val.negative",
        out_dir,
        name,
    )


def _read_layout(
    train_path: Path, test_path: Path, val_path: Path | None, out_dir: Path, name: str
) -> Split:
    """A split from its train pairs, test (and validation) negative files and label files.

    Repeated training pairs are merged: clients train on their distinct items."""
    _, test_items, test_neg = _read_negative_file(test_path)
    n_users = len(test_items)
    val_items: np.ndarray | None = None
    val_neg: np.ndarray | None = None
    if val_path is not None and val_path.is_file():
        _, val_items, val_neg = _read_negative_file(val_path)
        if len(val_items) != n_users:
            raise DataError(f"{val_path}: {len(val_items)} users, the test file has {n_users}")
    df, lines = read_fields(train_path, ",", 2, header=False)
    tu = int_column(df[0], train_path, lines, "user id")
    ti = int_column(df[1], train_path, lines, "item id")
    bad = (tu < 0) | (tu >= n_users)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{train_path}, line {lines[row]}: user {tu[row]} is not in the test file "
            f"(users 0..{n_users - 1})"
        )
    order = np.lexsort((ti, tu))
    tu, ti = tu[order], ti[order]
    first = np.ones(len(tu), dtype=bool)
    first[1:] = (tu[1:] != tu[:-1]) | (ti[1:] != ti[:-1])
    tu, ti = tu[first], ti[first]
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(tu, minlength=n_users), out=indptr[1:])
    user_labels = _read_labels(out_dir / f"{name}.users.txt", n_users)
    items_path = out_dir / f"{name}.items.txt"
    if items_path.is_file():
        with items_path.open("r", encoding="utf-8") as fh:
            n_items = sum(1 for _ in fh)
    else:
        parts = [ti, test_items, test_neg.reshape(-1)]
        if val_items is not None and val_neg is not None:
            parts += [val_items, val_neg.reshape(-1)]
        n_items = int(max(int(p.max()) for p in parts if len(p))) + 1
        if n_items > MAX_ITEMS:  # the catalogue is built from 0 to the largest id
            raise DataError(
                f"{out_dir}: item id {n_items - 1} is past the largest catalogue a run takes "
                f"(ids 0..{MAX_ITEMS - 1}); an NCF split numbers its items from 0 (or give "
                f"their ids in {items_path.name})"
            )
    item_labels = _read_labels(items_path, n_items)
    for what, arr in (("train", ti), ("test", test_items), ("negative", test_neg)):
        if arr.size and (arr.min() < 0 or arr.max() >= n_items):
            raise DataError(f"{out_dir / name}: {what} item ids outside 0..{n_items - 1}")
    return Split(
        name=name,
        n_users=n_users,
        n_items=n_items,
        train_indptr=indptr,
        train_items=ti,
        test_items=test_items,
        test_negatives=test_neg,
        val_items=val_items,
        val_negatives=val_neg,
        user_labels=user_labels,
        item_labels=item_labels,
    )
