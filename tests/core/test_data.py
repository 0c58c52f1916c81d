"""Tests of fedrecgel.data: the real datasets, raw loaders and their errors."""

from __future__ import annotations

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
    load_csv,
    load_raw,
    load_split,
    stats,
)
from fedrecgel.data.raw import _madrid_midnight_ms
from tests.core.datasets import (
    EXPECTED,
    SHARED,
    needs_shared,
    reference_split,
    write,
)


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
def test_lastfm_distinct_training_pairs_and_clean_protocol() -> None:
    """Lastfm-2K trains on distinct pairs (about 70k, not 184k rows); the clean protocol never
    holds out an item that is also a training item, which the paper protocol does for most
    users."""
    train, _, _ = reference_split("lastfm-2k")
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
    write(tmp_path / "filmtrust" / "ratings.txt", "".join(f"1 {i} 2\n" for i in range(1, 106)))
    raw = load_raw("filmtrust")
    assert len(raw) == 105


# ----------------------------------------------------------------------------- loaders


def test_filmtrust_timestamps(tmp_path: Path) -> None:
    rows = [(1, 5), (2, 7), (1, 3), (1, 9), (2, 1), (3, 3)]
    write(tmp_path / "filmtrust" / "ratings.txt", "".join(f"{u} {i} 3.5\n" for u, i in rows))
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
    write(
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
    write(tmp_path / "amazon-video" / "ratings.dat", text)
    raw = load_raw("amazon-video", tmp_path)
    assert raw.user_labels.tolist()[:2] == ["drop", "ub"]
    split = apply_protocol(raw, n_test_negatives=0)
    assert split.user_labels.tolist() == ["ub", "ua"]  # first appearance, not alphabetical
    assert split.item_labels.tolist() == ["Z", "A", "B", "C", "D", "E"]
    assert split.test_items.tolist() == [0, 5]  # ub's latest is Z (t=5), ua's is E (t=9)
    assert split.user_train(0).tolist() == [1, 2, 3, 4]


def test_load_csv_row_order_and_header(tmp_path: Path) -> None:
    p = write(tmp_path / "x.csv", "user,item\n" + "".join(f"u{k % 2},i{k}\n" for k in range(12)))
    raw = load_csv(p, header=True)
    assert raw.name == "x"
    np.testing.assert_array_equal(raw.timestamps, np.arange(12))
    split = apply_protocol(raw, n_test_negatives=2)
    assert split.item_labels[split.test_items].tolist() == ["i10", "i11"]
    p2 = write(tmp_path / "y.tsv", "3\t4\t10\n3\t5\t20\n3\t6\t5\n")
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
    p = write(tmp_path / "h.csv", first + rows)
    raw = load_csv(p)
    assert len(raw) == 12
    assert raw.user_labels.dtype == np.int64 and raw.item_labels.dtype == np.int64
    assert raw.item_labels.tolist() == list(range(12))
    # forcing it either way still works
    assert len(load_csv(p, header=header)) == 12
    # string ids with a header of names: detected by the names
    q = write(tmp_path / "s.csv", "user,item\n" + "".join(f"u{k % 2},i{k}\n" for k in range(6)))
    assert load_csv(q).item_labels.tolist() == [f"i{k}" for k in range(6)]


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


# a raw file of a dataset (its path under the data directory), its text, and the refusal
LASTFM = "lastfm-2k/user_taggedartists.dat"
BAD_RAW_FILES: dict[str, tuple[str, str, str]] = {
    "empty": ("filmtrust/ratings.txt", "", r"ratings\.txt: file is empty"),
    "too_many_fields": (
        "filmtrust/ratings.txt",
        "1 2 3\n\n1 3 3\n1 4 3 9\n",
        r"ratings\.txt, line 4: expected 3 fields, saw 4",
    ),
    "too_few_fields": (
        "amazon-video/ratings.dat",
        "a,b,5.0,1\n\na,c,5.0\na,d,4.0,3\n",
        r"ratings\.dat, line 3: expected 4 fields, saw 3",
    ),
    "item_id_not_an_integer": (
        "filmtrust/ratings.txt",
        "1 2 3\n1 x 3\n",
        r"ratings\.txt, line 2: item id must be an integer",
    ),
    "rating_not_numeric": (
        "filmtrust/ratings.txt",
        "1 2 3\n1 3 3\n1 4 good\n",
        r"ratings\.txt, line 3: rating must be numeric",
    ),
    "timestamp_not_an_integer": (
        "amazon-video/ratings.dat",
        "a,b,5.0,1\na,c,5.0,yesterday\n",
        r"ratings\.dat, line 2: timestamp must be an integer",
    ),
    "lastfm_invalid_date": (
        LASTFM,
        _lastfm_text(["2 52 13 1 4 2009", "2 53 13 31 2 2009"]),
        r"user_taggedartists\.dat, line 3: invalid date",
    ),
    "lastfm_tag_id_not_an_integer": (
        LASTFM,
        _lastfm_text(["2 52 13 1 4 2009", "2 53 x 1 2 2009"]),
        r"user_taggedartists\.dat, line 3: tagID must be",
    ),
    "lastfm_no_header": (
        LASTFM,
        "2\t52\t13\t1\t4\t2009\n",
        r"user_taggedartists\.dat, line 1: expected the header",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_RAW_FILES))
def test_bad_raw_file_is_refused(tmp_path: Path, case: str) -> None:
    path, text, refusal = BAD_RAW_FILES[case]
    write(tmp_path / path, text)
    with pytest.raises(DataError, match=refusal):
        load_raw(path.split("/")[0], tmp_path)


def test_empty_csv_file(tmp_path: Path) -> None:
    write(tmp_path / "blank.csv", "\n\n")
    with pytest.raises(DataError, match=r"blank\.csv: file is empty"):
        load_csv(tmp_path / "blank.csv")


def test_first_row_too_wide(tmp_path: Path) -> None:
    p = write(tmp_path / "w.csv", "1,2,3,4\n1,2,3,4\n")
    with pytest.raises(DataError, match=r"w\.csv, line 1: expected 2 or 3 fields, saw 4"):
        load_csv(p)


def test_empty_field_in_a_row_of_allowed_width(tmp_path: Path) -> None:
    p = write(tmp_path / "e.csv", "u,i,t\n1,2,3\nfoo,bar,\n4,5,6\n")
    with pytest.raises(DataError, match=r"e\.csv, line 3: field 3 of 3 is empty"):
        load_csv(p, header=True)


def test_non_numeric_csv_timestamp(tmp_path: Path) -> None:
    p = write(tmp_path / "h.csv", "user,item,time\nu,i,1\nu,j,1.5\n")
    with pytest.raises(DataError, match=r"h\.csv, line 3: timestamp must be an integer"):
        load_csv(p, header=True)


def test_empty_result(tmp_path: Path) -> None:
    p = write(tmp_path / "few.csv", "1,2\n1,3\n2,2\n")
    with pytest.raises(DataError, match="few: no user has at least 5 interactions"):
        apply_protocol(load_csv(p))


def test_interactions_length_mismatch() -> None:
    with pytest.raises(DataError, match="differ in length"):
        Interactions("bad", np.zeros(3), np.zeros(2), np.zeros(3, dtype=np.int64))
