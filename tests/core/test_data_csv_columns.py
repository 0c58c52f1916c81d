"""A CSV of one's own is read by its header's names (columns in any order, others such as a
rating ignored), with quoted fields and ISO 8601 times; before, columns were taken by position
(a rating became the timestamp, ``item,user`` swapped users and items, MovieLens's
``ratings.csv`` was refused, a quoted header was a bad timestamp)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedrecgel.data import DataError, apply_protocol, load_csv, load_raw
from fedrecgel.data.raw import packaged_filmtrust, raw_path
from tests.core.datasets import write

#: (user, item, time) rows; user 0's latest item is 12, user 1's is 20
ROWS = [(u, 10 * u + k, 100 * (k if u else 9 - k)) for u in (0, 1) for k in range(10)]


def _expected(path: Path) -> None:
    raw = load_csv(path)
    assert raw.user_labels.tolist() == [r[0] for r in ROWS]
    assert raw.item_labels.tolist() == [r[1] for r in ROWS]
    assert raw.timestamps.tolist() == [r[2] for r in ROWS]


@pytest.mark.parametrize(
    ("header", "row"),
    [
        ("item,user,timestamp", "{i},{u},{t}"),
        ("userId,movieId,rating,timestamp", "{u},{i},4.5,{t}"),
        ("rating,ts,asin,reviewerID", "5,{t},{i},{u}"),
        ('"user","item","timestamp"', '"{u}","{i}","{t}"'),
        ("\ufeffuser, item, time", "{u}, {i}, {t}"),
        ("reviewerID,asin,overall,unixReviewTime", "{u},{i},5.0,{t}"),
    ],
)
def test_columns_are_read_by_their_names(tmp_path: Path, header: str, row: str) -> None:
    text = header + "\n" + "".join(row.format(u=u, i=i, t=t) + "\n" for u, i, t in ROWS)
    _expected(write(tmp_path / "named.csv", text))


def test_a_header_of_string_ids_without_a_time_is_a_header(tmp_path: Path) -> None:
    text = "reviewerID,asin,overall\n" + "".join(f"A{u},B{i},5.0\n" for u, i, _ in ROWS)
    raw = load_csv(write(tmp_path / "a.csv", text))
    assert raw.user_labels[0] == "A0" and len(raw) == len(ROWS)


def test_a_rating_column_is_not_the_time(tmp_path: Path) -> None:
    text = "user,item,rating\n" + "".join(f"{u},{i},{5 - i % 5}\n" for u, i, _ in ROWS)
    raw = load_csv(write(tmp_path / "r.csv", text))
    np.testing.assert_array_equal(raw.timestamps, np.arange(len(ROWS)))  # row order
    split = apply_protocol(raw, n_test_negatives=2)
    assert split.item_labels[split.test_items].tolist() == [9, 19]  # each user's last row


def test_quoted_ids_and_iso_times(tmp_path: Path) -> None:
    text = 'user,item,date\nann,"The Film, Part 2",2024-03-01\nann,Other,2024-03-02T10:00:00Z\n'
    raw = load_csv(write(tmp_path / "q.csv", text))
    assert raw.item_labels.tolist() == ["The Film, Part 2", "Other"]
    assert raw.timestamps[1] - raw.timestamps[0] == (24 + 10) * 3600 * 10**9


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("user,item,uid\n1,2,3\n", "does not name one user column"),
        ("user,rating\n1,2\n", "does not name one user column"),
        ("user,item,time\n1,2,3\n1,3,2024-01-01\n", "line 2: timestamp must be an integer or"),
        ("user,item,time\n1,2,yesterday\n", "line 2: timestamp must be an integer or"),
    ],
)
def test_a_header_that_names_no_columns_is_refused(tmp_path: Path, text: str, refusal: str) -> None:
    with pytest.raises(DataError, match=refusal):
        load_csv(write(tmp_path / "bad.csv", text))


def test_a_too_small_catalogue_names_a_text_user(tmp_path: Path) -> None:
    """It raised AttributeError ('str' object has no attribute 'item') instead."""
    text = "".join(f"alice{u},film{(u + j) % 30}\n" for u in range(20) for j in range(6))
    with pytest.raises(DataError, match="user 'alice0' interacted with 6 of 25 items"):
        apply_protocol(load_csv(write(tmp_path / "s.csv", text)))


def test_filmtrust_ships_also_when_the_data_dir_holds_only_other_datasets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting FEDREC_DATA_DIR for Amazon-Video made the default dataset unloadable."""
    monkeypatch.setenv("FEDREC_DATA_DIR", str(tmp_path))
    assert raw_path("filmtrust") == packaged_filmtrust()
    assert len(load_raw("filmtrust")) == len(load_raw("filmtrust", packaged_filmtrust().parent))
    with pytest.raises(DataError, match="file not found for dataset 'amazon-video'"):
        raw_path("amazon-video")
