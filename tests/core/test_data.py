"""Tests of fedrecgel.data: loaders, protocol, negatives, NCF interchange, errors."""

from __future__ import annotations

import os
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from fedrecgel.data import (
    DATASETS,
    DataError,
    Interactions,
    Split,
    apply_protocol,
    default_data_dir,
    hold_out_validation,
    load_csv,
    load_raw,
    load_split,
    read_ncf,
    read_split_dir,
    stats,
    write_ncf,
)
from fedrecgel.data.raw import _madrid_midnight_ms


def _shared_datasets() -> Path:
    env = os.environ.get("FEDREC_SHARED_DATASETS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "datasets"


SHARED = _shared_datasets()
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} not present")

EXPECTED = {
    "filmtrust": (1227, 2059, 34889),
    "amazon-video": (8072, 11830, 63836),
    "lastfm-2k": (1600, 12454, 185650),
}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _split_from_rows(rows: list[tuple[int, int, int]], **kw: object) -> tuple[Split, Interactions]:
    raw = Interactions(
        "t",
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.int64),
        np.array([r[2] for r in rows], dtype=np.int64),
    )
    return apply_protocol(raw, **kw), raw  # type: ignore[arg-type]


def _user_items(raw: Interactions, split: Split) -> list[set[int]]:
    """All (re-indexed) items of each user, from the raw rows (numeric ids only)."""
    upos = {int(x): k for k, x in enumerate(split.user_labels)}
    ipos = {int(x): k for k, x in enumerate(split.item_labels)}
    out: list[set[int]] = [set() for _ in range(split.n_users)]
    for u, i in zip(raw.user_labels.tolist(), raw.item_labels.tolist(), strict=True):
        if u in upos:
            out[upos[u]].add(ipos[i])
    return out


def _check_negatives(split: Split, negatives: np.ndarray, items_of: list[set[int]]) -> None:
    assert negatives.dtype == np.int32
    for u in range(split.n_users):
        row = negatives[u].tolist()
        assert len(set(row)) == len(row)
        assert not set(row) & items_of[u]
        assert all(0 <= x < split.n_items for x in row)


# ----------------------------------------------------------------------------- real data


def _reference_split(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The original's split of ``name``: its training (user, item) rows and test items."""
    ref = SHARED / name / "reference-split"
    train = np.loadtxt(ref / "train_interactions.csv", delimiter=",", dtype=np.int64)
    tests = []
    with (ref / "test_neg_interactions").open() as fh:
        for line in fh:
            user, item = line.split("\t", 1)[0].strip("()").split(",")
            tests.append((int(user), int(item)))
    heads = np.asarray(tests, dtype=np.int64)
    np.testing.assert_array_equal(heads[:, 0], np.arange(len(heads)))
    return train, heads[:, 1]


@needs_shared
@pytest.mark.parametrize("name", DATASETS)
def test_real_counts(name: str) -> None:
    split = load_split(name, SHARED)
    users, items, rows = EXPECTED[name]
    assert (split.n_users, split.n_items) == (users, items)
    assert split.test_negatives.shape == (users, 99)
    assert split.train_indptr[-1] == split.n_train
    # clients train on their distinct items: no (user, item) pair repeats in training
    pairs = split.train_user_of_rows() * split.n_items + split.train_items
    assert len(np.unique(pairs)) == split.n_train < rows - users + 1
    st = stats(split)
    assert (st["users"], st["items"], st["interactions"]) == (users, items, split.n_interactions)
    v = load_split(name, SHARED, validation=True)
    np.testing.assert_array_equal(v.test_items, split.test_items)
    np.testing.assert_array_equal(v.test_negatives, split.test_negatives)
    assert v.n_train < split.n_train
    assert v.val_negatives is not None and v.val_negatives.shape == (users, 99)


@needs_shared
@pytest.mark.parametrize("name", ["filmtrust", "amazon-video"])
def test_split_equals_the_originals(name: str) -> None:
    """Same user and item indices, the same test item per user and the same distinct training
    pairs as the original's split (first-appearance numbering and its tie rule)."""
    split = load_split(name, SHARED)
    train, test_items = _reference_split(name)
    np.testing.assert_array_equal(split.test_items, test_items)
    ref_pairs = np.unique(train[:, 0] * split.n_items + train[:, 1])
    ours = split.train_user_of_rows() * split.n_items + split.train_items
    np.testing.assert_array_equal(np.sort(ours), ref_pairs)


@needs_shared
def test_lastfm_distinct_training_pairs_and_clean_protocol() -> None:
    """Lastfm-2K trains on distinct pairs (about 70k, not 184k rows); the clean protocol never
    holds out an item that is also a training item, which the paper protocol does for most
    users."""
    train, _ = _reference_split("lastfm-2k")
    split = load_split("lastfm-2k", SHARED)
    assert len(train) == 184_050
    assert abs(split.n_train - len(np.unique(train[:, 0] * split.n_items + train[:, 1]))) <= 1

    def leaked(s: Split) -> int:
        return sum(int(s.test_items[u]) in set(s.user_train(u).tolist()) for u in range(s.n_users))

    assert leaked(split) > 900
    clean = load_split("lastfm-2k", SHARED, protocol="clean")
    assert leaked(clean) == 0
    assert clean.n_users <= split.n_users


@needs_shared
def test_real_lastfm_timestamps_and_duplicates() -> None:
    raw = load_raw("lastfm-2k", SHARED)
    assert len(raw) == 186479
    assert raw.timestamps[0] == 1238536800000  # "2 52 13 1 4 2009"
    assert -428720400000 in set(raw.timestamps.tolist())  # "43 1395 39 1 6 1956"
    split = apply_protocol(raw)
    assert stats(split)["distinct_pairs"] == 70508  # duplicates kept as rows


@needs_shared
def test_packaged_filmtrust_is_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDREC_DATA_DIR", raising=False)
    assert default_data_dir() is None
    packaged = load_split("filmtrust")
    assert packaged == load_split("filmtrust", SHARED)


def test_packaged_filmtrust_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDREC_DATA_DIR", raising=False)
    split = load_split("filmtrust")
    assert (split.n_users, split.n_items) == EXPECTED["filmtrust"][:2]
    assert split.user_labels.dtype == np.int64
    # indices follow the order of first appearance in the whole raw file (before the user
    # filter), restricted to the users kept and the items they touched
    raw = load_raw("filmtrust")
    kept = np.isin(raw.user_labels, split.user_labels)
    assert split.user_labels.tolist() == list(dict.fromkeys(raw.user_labels[kept].tolist()))
    touched = set(raw.item_labels[kept].tolist())
    order = [i for i in dict.fromkeys(raw.item_labels.tolist()) if i in touched]
    assert split.item_labels.tolist() == order


def test_default_data_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FEDREC_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path
    _write(tmp_path / "filmtrust" / "ratings.txt", "".join(f"1 {i} 2\n" for i in range(1, 106)))
    raw = load_raw("filmtrust")
    assert len(raw) == 105


# ----------------------------------------------------------------------------- loaders


def test_filmtrust_timestamps(tmp_path: Path) -> None:
    rows = [(1, 5), (2, 7), (1, 3), (1, 9), (2, 1), (3, 3)]
    _write(tmp_path / "filmtrust" / "ratings.txt", "".join(f"{u} {i} 3.5\n" for u, i in rows))
    raw = load_raw("filmtrust", tmp_path)
    base = np.random.default_rng(42).integers(0, 10**9, size=len(rows))
    k = np.array([0, 0, 1, 2, 1, 0])
    np.testing.assert_array_equal(raw.timestamps, base * 10**6 + k)
    np.testing.assert_array_equal(raw.user_labels, [1, 2, 1, 1, 2, 3])
    np.testing.assert_array_equal(raw.item_labels, [5, 7, 3, 9, 1, 3])


def _lastfm_text(rows: list[str]) -> str:
    head = "userID\tartistID\ttagID\tday\tmonth\tyear\n"
    return head + "".join(r.replace(" ", "\t") + "\n" for r in rows)


def test_lastfm_timestamp_examples(tmp_path: Path) -> None:
    _write(
        tmp_path / "lastfm-2k" / "user_taggedartists.dat",
        _lastfm_text(["2 52 13 1 4 2009", "43 1395 39 1 6 1956", "2 52 15 1 4 2009"]),
    )
    raw = load_raw("lastfm-2k", tmp_path)
    np.testing.assert_array_equal(raw.timestamps, [1238536800000, -428720400000, 1238536800000])
    np.testing.assert_array_equal(raw.item_labels, [52, 1395, 52])  # duplicate pair kept


def test_madrid_midnight_matches_zoneinfo() -> None:
    days = [date(1940, 1, 1) + timedelta(days=k) for k in range(0, 26000, 1)]
    y = np.array([d.year for d in days])
    m = np.array([d.month for d in days])
    dd = np.array([d.day for d in days])
    got = _madrid_midnight_ms(y, m, dd, Path("x"), np.arange(len(days)))
    tz = ZoneInfo("Europe/Madrid")
    want = [round(datetime(d.year, d.month, d.day, tzinfo=tz).timestamp() * 1000) for d in days]
    np.testing.assert_array_equal(got, want)


def test_amazon_factorisation(tmp_path: Path) -> None:
    # item "Z" first appears with user "drop" (filtered out), so it still precedes "A"
    rows = [("drop", "Z", 1)]
    rows += [("ub", it, t) for it, t in zip("ZABCD", [5, 4, 3, 2, 1], strict=True)]
    rows += [("ua", it, t) for it, t in zip("ABCDE", [1, 2, 3, 4, 9], strict=True)]
    text = "".join(f"{u},{i},5.0,{t}\r\n" for u, i, t in rows)
    _write(tmp_path / "amazon-video" / "ratings.dat", text)
    raw = load_raw("amazon-video", tmp_path)
    assert raw.user_labels.tolist()[:2] == ["drop", "ub"]
    split = apply_protocol(raw, n_test_negatives=0)
    assert split.user_labels.tolist() == ["ub", "ua"]  # first appearance, not alphabetical
    assert split.item_labels.tolist() == ["Z", "A", "B", "C", "D", "E"]
    assert split.test_items.tolist() == [0, 5]  # ub's latest is Z (t=5), ua's is E (t=9)
    assert split.user_train(0).tolist() == [1, 2, 3, 4]


def test_load_csv_row_order_and_header(tmp_path: Path) -> None:
    p = _write(tmp_path / "x.csv", "user,item\n" + "".join(f"u{k % 2},i{k}\n" for k in range(12)))
    raw = load_csv(p, header=True)
    assert raw.name == "x"
    np.testing.assert_array_equal(raw.timestamps, np.arange(12))
    split = apply_protocol(raw, n_test_negatives=2)
    assert split.item_labels[split.test_items].tolist() == ["i10", "i11"]
    p2 = _write(tmp_path / "y.tsv", "3\t4\t10\n3\t5\t20\n3\t6\t5\n")
    raw2 = load_csv(p2, sep="\t", name="why")
    assert raw2.name == "why" and raw2.user_labels.dtype == np.int64
    assert apply_protocol(raw2, min_interactions=2, n_test_negatives=0).test_items.tolist() == [1]


@pytest.mark.parametrize(
    ("first", "header"),
    [
        ("user,item,timestamp\n", True),
        ("userId,movieId\n", True),
        ("user_id,item_id,time\n", True),
        ("u,i,when\n", True),  # timestamp field not an integer, the next row's is
        ("uid,iid\n", True),
        ("", False),
    ],
)
def test_load_csv_detects_a_header_row(tmp_path: Path, first: str, header: bool) -> None:
    n_fields = first.count(",") + 1 if first else 3
    rows = "".join(f"{k % 2},{k}{',' + str(k) if n_fields == 3 else ''}\n" for k in range(12))
    p = _write(tmp_path / "h.csv", first + rows)
    raw = load_csv(p)
    assert len(raw) == 12
    assert raw.user_labels.dtype == np.int64 and raw.item_labels.dtype == np.int64
    assert raw.item_labels.tolist() == list(range(12))
    # forcing it either way still works
    assert len(load_csv(p, header=header)) == 12
    # string ids with a header of names: detected by the names
    q = _write(tmp_path / "s.csv", "user,item\n" + "".join(f"u{k % 2},i{k}\n" for k in range(6)))
    assert load_csv(q).item_labels.tolist() == [f"i{k}" for k in range(6)]


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
    split, _ = _split_from_rows(rows, n_test_negatives=0)
    assert split.user_labels.tolist() == [10, 20]
    labels = split.item_labels
    # item indices in order of first appearance: 7 3 5 8 1 6 4 2 9
    assert labels.tolist() == [7, 3, 5, 8, 1, 6, 4, 2, 9]
    assert labels[split.test_items].tolist() == [7, 4]
    assert labels[split.user_train(0)].tolist() == [3, 5, 8, 1]
    v, _ = _split_from_rows(rows, n_test_negatives=0, validation=True)
    assert v.val_items is not None
    assert labels[v.test_items].tolist() == [7, 4]
    assert labels[v.val_items].tolist() == [3, 6]
    assert labels[v.user_train(1)].tolist() == [1, 2, 9]
    assert v.train_indptr.tolist() == [0, 3, 6]


def test_duplicate_rows_merged_in_training_and_clean_protocol() -> None:
    rows = [(1, 2, 1), (1, 2, 5), (1, 3, 2), (1, 4, 3), (1, 2, 0), (1, 6, 4)]
    split, _ = _split_from_rows(rows, n_test_negatives=0)
    # paper protocol: the latest row of item 2 is held out, its earlier rows train (once)
    assert split.item_labels[split.test_items].tolist() == [2]
    assert split.item_labels[split.user_train(0)].tolist() == [2, 3, 4, 6]
    assert split.n_interactions == 5
    # clean: one row per pair (latest time) first, so the held-out item is not a training item
    clean, _ = _split_from_rows(rows, n_test_negatives=0, min_interactions=2, protocol="clean")
    assert clean.item_labels[clean.test_items].tolist() == [2]
    assert clean.item_labels[clean.user_train(0)].tolist() == [3, 4, 6]
    with pytest.raises(DataError, match="no user has at least 5"):
        _split_from_rows(rows, n_test_negatives=0, protocol="clean")


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
    split, _ = _split_from_rows(rows, n_test_negatives=0, validation=validation)
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
    split, raw = _split_from_rows(rows, n_test_negatives=40, validation=True, seed=7)
    items_of = _user_items(raw, split)
    _check_negatives(split, split.test_negatives, items_of)
    assert split.val_negatives is not None
    _check_negatives(split, split.val_negatives, items_of)
    assert not np.array_equal(split.test_negatives, split.val_negatives)
    again, _ = _split_from_rows(rows, n_test_negatives=40, validation=True, seed=7)
    assert again == split
    other, _ = _split_from_rows(rows, n_test_negatives=40, validation=True, seed=8)
    assert not np.array_equal(other.test_negatives, split.test_negatives)
    plain, _ = _split_from_rows(rows, n_test_negatives=40, validation=False, seed=7)
    np.testing.assert_array_equal(plain.test_negatives, split.test_negatives)


def test_negatives_when_almost_no_free_items() -> None:
    # user 0 interacted with 95 of 100 items: exactly 5 candidates remain
    rows = [(0, i, i) for i in range(95)] + [(1, i, i) for i in range(90, 100)]
    split, raw = _split_from_rows(rows, n_test_negatives=5)
    assert sorted(split.test_negatives[0].tolist()) == [95, 96, 97, 98, 99]
    _check_negatives(split, split.test_negatives, _user_items(raw, split))
    with pytest.raises(DataError, match="user 0 interacted with 95 of 100 items"):
        _split_from_rows(rows, n_test_negatives=6)


def test_negatives_uniform() -> None:
    rows = [(0, i, i) for i in range(5)] + [(u, i, i) for u in range(1, 4000) for i in range(5)]
    rows += [(4000, i, i) for i in range(5, 15)] + [(4001, i, i) for i in range(15, 25)]
    split, _ = _split_from_rows(rows, n_test_negatives=10, seed=1)
    counts = np.bincount(split.test_negatives[:4000].ravel(), minlength=split.n_items)
    free = counts[5:]
    assert counts[:5].sum() == 0
    assert free.min() > 0.8 * free.mean() and free.max() < 1.2 * free.mean()


def test_min_interactions_too_small() -> None:
    rows = [(0, i, i) for i in range(6)]
    with pytest.raises(DataError, match="min_interactions=1"):
        _split_from_rows(rows, min_interactions=1)
    with pytest.raises(DataError, match="min_interactions=2"):
        _split_from_rows(rows, min_interactions=2, validation=True, n_test_negatives=0)
    split, _ = _split_from_rows(rows, min_interactions=3, validation=True, n_test_negatives=0)
    assert split.n_train == 4


def test_stats_values() -> None:
    rows = [(0, i, i) for i in range(5)] + [(1, i, i) for i in range(2, 9)] + [(1, 2, 0)]
    split, _ = _split_from_rows(rows, n_test_negatives=0)
    st = stats(split)
    # the repeated (1, 2) row trains once: 12 interactions, 10 of them training pairs
    assert st["users"] == 2 and st["items"] == 9 and st["interactions"] == 12
    assert st["train"] == 10 and st["distinct_pairs"] == 12
    assert st["interactions_per_user_max"] == 7 and st["interactions_per_user_median"] == 6
    assert st["sparsity"] == pytest.approx(1 - 12 / 18)
    assert st["users_per_item_max"] == 2 and st["interactions_per_item_max"] == 2


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
    _write(tmp_path / "x.test.negative", "(0,1)\t2\t3\n(1,2)\t3\n")
    with pytest.raises(DataError, match=r"x\.test\.negative, line 2"):
        read_ncf(tmp_path, "x")
    _write(tmp_path / "x.test.negative", "(0,1)\t2\t3\n0,2\t3\t4\n")
    with pytest.raises(DataError, match=r"line 2: expected '\(user,item\)'"):
        read_ncf(tmp_path, "x")


# ----------------------------------------------------------------------------- errors


def test_unknown_dataset() -> None:
    with pytest.raises(DataError, match=r"unknown dataset 'movielens'.*filmtrust"):
        load_raw("movielens")


def test_missing_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FEDREC_DATA_DIR", raising=False)
    with pytest.raises(DataError, match=r"FEDREC_DATA_DIR.*amazon-video/ratings\.dat"):
        load_raw("amazon-video")
    with pytest.raises(DataError, match=r"lastfm-2k/user_taggedartists\.dat: file not found"):
        load_raw("lastfm-2k", tmp_path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.csv: file not found"):
        load_csv(tmp_path / "nope.csv")


def test_empty_file(tmp_path: Path) -> None:
    _write(tmp_path / "filmtrust" / "ratings.txt", "")
    with pytest.raises(DataError, match=r"ratings\.txt: file is empty"):
        load_raw("filmtrust", tmp_path)
    _write(tmp_path / "blank.csv", "\n\n")
    with pytest.raises(DataError, match=r"blank\.csv: file is empty"):
        load_csv(tmp_path / "blank.csv")


def test_too_many_fields(tmp_path: Path) -> None:
    _write(tmp_path / "filmtrust" / "ratings.txt", "1 2 3\n\n1 3 3\n1 4 3 9\n")
    with pytest.raises(DataError, match=r"ratings\.txt, line 4: expected 3 fields, saw 4"):
        load_raw("filmtrust", tmp_path)


def test_too_few_fields(tmp_path: Path) -> None:
    _write(tmp_path / "amazon-video" / "ratings.dat", "a,b,5.0,1\n\na,c,5.0\na,d,4.0,3\n")
    with pytest.raises(DataError, match=r"ratings\.dat, line 3: expected 4 fields, saw 3"):
        load_raw("amazon-video", tmp_path)


def test_first_row_too_wide(tmp_path: Path) -> None:
    p = _write(tmp_path / "w.csv", "1,2,3,4\n1,2,3,4\n")
    with pytest.raises(DataError, match=r"w\.csv, line 1: expected 2 or 3 fields, saw 4"):
        load_csv(p)


def test_non_numeric(tmp_path: Path) -> None:
    _write(tmp_path / "filmtrust" / "ratings.txt", "1 2 3\n1 x 3\n")
    with pytest.raises(DataError, match=r"ratings\.txt, line 2: item id must be an integer"):
        load_raw("filmtrust", tmp_path)
    _write(tmp_path / "filmtrust" / "ratings.txt", "1 2 3\n1 3 3\n1 4 good\n")
    with pytest.raises(DataError, match=r"ratings\.txt, line 3: rating must be numeric"):
        load_raw("filmtrust", tmp_path)
    _write(tmp_path / "amazon-video" / "ratings.dat", "a,b,5.0,1\na,c,5.0,yesterday\n")
    with pytest.raises(DataError, match=r"ratings\.dat, line 2: timestamp must be an integer"):
        load_raw("amazon-video", tmp_path)
    p = _write(tmp_path / "h.csv", "user,item,time\nu,i,1\nu,j,1.5\n")
    with pytest.raises(DataError, match=r"h\.csv, line 3: timestamp must be an integer"):
        load_csv(p, header=True)


def test_lastfm_bad_rows(tmp_path: Path) -> None:
    f = tmp_path / "lastfm-2k" / "user_taggedartists.dat"
    _write(f, _lastfm_text(["2 52 13 1 4 2009", "2 53 13 31 2 2009"]))
    with pytest.raises(DataError, match=r"user_taggedartists\.dat, line 3: invalid date"):
        load_raw("lastfm-2k", tmp_path)
    _write(f, _lastfm_text(["2 52 13 1 4 2009", "2 53 x 1 2 2009"]))
    with pytest.raises(DataError, match=r"user_taggedartists\.dat, line 3: tagID must be"):
        load_raw("lastfm-2k", tmp_path)
    _write(f, "2\t52\t13\t1\t4\t2009\n")
    with pytest.raises(DataError, match=r"user_taggedartists\.dat, line 1: expected the header"):
        load_raw("lastfm-2k", tmp_path)


def test_empty_result(tmp_path: Path) -> None:
    p = _write(tmp_path / "few.csv", "1,2\n1,3\n2,2\n")
    with pytest.raises(DataError, match="few: no user has at least 5 interactions"):
        apply_protocol(load_csv(p))


def test_interactions_length_mismatch() -> None:
    with pytest.raises(DataError, match="differ in length"):
        Interactions("bad", np.zeros(3), np.zeros(2), np.zeros(3, dtype=np.int64))


# ----------------------------------------------------------------------------- ready splits


@needs_shared
def test_read_split_dir_reads_the_originals_files() -> None:
    ref = SHARED / "filmtrust" / "reference-split"
    split = read_split_dir(ref)
    train, test_items = _reference_split("filmtrust")
    assert split.n_users == 1227 and split.n_items == 2059
    np.testing.assert_array_equal(split.test_items, test_items)
    pairs = split.train_user_of_rows() * split.n_items + split.train_items
    np.testing.assert_array_equal(pairs, np.unique(train[:, 0] * 2059 + train[:, 1]))
    with (ref / "test_neg_interactions").open() as fh:
        first = [int(x) for x in fh.readline().rstrip("\n").split("\t")[1:]]
    assert split.test_negatives[0].tolist() == first
    # the same split as our protocol builds, but for the negatives
    ours = load_split("filmtrust", SHARED)
    np.testing.assert_array_equal(ours.train_items, split.train_items)
    np.testing.assert_array_equal(ours.train_indptr, split.train_indptr)


def test_read_split_dir_ncf_layout_and_validation(tmp_path: Path) -> None:
    split, _ = _split_from_rows(
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
