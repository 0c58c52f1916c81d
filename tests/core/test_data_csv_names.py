"""A CSV of the data directory is a dataset by its name, for every command and service that
takes a dataset's name: ``<dir>/<name>.csv`` (``.tsv``, ``.txt``) or ``<dir>/<name>/<name>.csv``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from fedrecgel.cli import app
from fedrecgel.clitools import by_name
from fedrecgel.data import DataError, csv_dataset, load_csv, load_split
from tests.core.datasets import write

ROWS = [f"u{u},m{(u * 7 + k * 13) % 150},{k}" for u in range(40) for k in range(8)]
TEXT = "user,item,timestamp\n" + "\n".join(ROWS) + "\n"


def test_a_csv_is_found_by_its_name_flat_nested_or_with_its_suffix(tmp_path: Path) -> None:
    flat = write(tmp_path / "shop.csv", TEXT)
    nested = write(tmp_path / "books" / "books.csv", TEXT)
    tabs = write(tmp_path / "music.tsv", TEXT.replace(",", "\t"))
    assert csv_dataset("shop", tmp_path) == flat
    assert csv_dataset("shop.csv", tmp_path) == flat
    assert csv_dataset("books", tmp_path) == nested
    assert csv_dataset("music", tmp_path) == tabs
    assert csv_dataset("other", tmp_path) is None
    upper = write(tmp_path / "SHOP2.CSV", TEXT)
    assert csv_dataset("SHOP2.CSV", tmp_path) == upper
    # a name is a file name of the folder, never a path out of it, nor a known dataset
    write(tmp_path / "inner" / "x.csv", TEXT)
    assert csv_dataset("inner/x", tmp_path) is None
    assert csv_dataset("../shop", tmp_path / "inner") is None
    assert csv_dataset(".hidden", tmp_path) is None
    write(tmp_path / "filmtrust.csv", TEXT)
    assert csv_dataset("filmtrust", tmp_path) is None


def test_a_named_csv_loads_as_the_same_file_by_its_path(tmp_path: Path) -> None:
    path = write(tmp_path / "shop.csv", TEXT)
    write(tmp_path / "music.tsv", TEXT.replace(",", "\t"))
    by_path = load_split("shop", tmp_path)
    assert by_path.name == "shop" and by_path.n_users == 40
    raw = load_csv(path)
    assert sorted(by_path.item_labels.tolist()) == sorted(set(raw.item_labels.tolist()))
    tsv = load_split("music", tmp_path)
    assert np.array_equal(tsv.train_items, by_path.train_items)
    assert np.array_equal(tsv.item_labels, by_path.item_labels)


def test_an_unknown_name_says_where_its_csv_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(DataError, match=f"no shop.csv in the data directory {tmp_path}"):
        load_split("shop", tmp_path)
    monkeypatch.delenv("FEDREC_DATA_DIR", raising=False)
    with pytest.raises(DataError, match="FEDREC_DATA_DIR is unset"):
        load_split("shop")


def test_train_takes_a_csv_of_the_data_directory_by_name(tmp_path: Path) -> None:
    write(tmp_path / "d" / "shop.csv", TEXT)
    out = tmp_path / "o"
    args = ["train", "--dataset", "shop", "--data-dir", str(tmp_path / "d"), "--out", str(out)]
    r = CliRunner().invoke(app, [*args, "--method", "popularity", "--quiet"])
    assert r.exit_code == 0, r.output
    assert '"dataset": "shop"' in (out / "results.json").read_text()


def test_services_take_a_csv_path_as_its_file_name_in_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "d" / "shop.csv", TEXT)
    assert by_name(str(path), None) == ("shop.csv", path.parent.resolve())
    assert by_name(str(path), path.parent) == ("shop.csv", path.parent.resolve())
    assert by_name("filmtrust", None) == ("filmtrust", None)
    assert by_name("shop", tmp_path / "d") == ("shop", tmp_path / "d")  # a name stays a name
    with pytest.raises(typer.Exit):
        by_name(str(path), tmp_path)
    assert f"--data-dir {tmp_path} would not hold it" in capsys.readouterr().err
    write(tmp_path / "d" / "my shop.csv", TEXT)
    with pytest.raises(typer.Exit):
        by_name(str(tmp_path / "d" / "my shop.csv"), None)
    assert "letters, digits" in capsys.readouterr().err
