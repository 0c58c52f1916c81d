"""What `fedrec train` says of a reference point's runs (their seeds, no rounds) and of the
preset it took; `fedrec tune --save-preset` keeps a study that did not beat popularity out of
the presets unless told."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fedrecgel import cli, presets, train_runs, tune_cli
from fedrecgel.baselines import popularity
from fedrecgel.clitools import load_data
from tests.core.test_shipped_presets import _Capture, _csv

runner = CliRunner()


def _said(output: str) -> str:
    """The console output with its line wrapping undone."""
    return " ".join(output.split())


def test_a_seeded_reference_point_records_and_prints_each_seed(tmp_path: Path) -> None:
    """`--method random --seeds 0,1,2` printed `seed -:` three times, with three figures, and
    recorded no seed; and `best test round 0` for a ranking that has no rounds."""
    out = tmp_path / "random"
    args = ["train", "--dataset", str(_csv(tmp_path)), "--method", "random", "--seeds", "3,5"]
    r = runner.invoke(cli.app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [run["config"]["seed"] for run in runs] == [3, 5]
    said = _said(r.output)
    assert "seed 3: " in said and "seed 5: " in said and "seed -" not in said, said
    assert "round" not in said.replace("no rounds", ""), said
    assert "one ranking, no rounds" in said and "mean of 2 rankings" in said


def test_an_unseeded_reference_point_says_so(tmp_path: Path) -> None:
    out = tmp_path / "popularity"
    args = ["train", "--dataset", str(_csv(tmp_path)), "--method", "popularity"]
    r = runner.invoke(cli.app, [*args, "--seeds", "0,1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert "seed" not in run["config"]
    said = _said(r.output)
    assert "popularity (no seed)" in said and "the same whatever --seeds" in said, said
    assert "round" not in said.replace("no rounds", ""), said


def _preset_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """What `fedrec train` on the CSV (named ``d``) says before training (nothing trains)."""
    monkeypatch.setattr(train_runs, "Simulator", _Capture)
    _Capture.configs.clear()
    train = ["train", "--dataset", str(_csv(tmp_path)), "--quiet", "--eval-every", "0"]
    r = runner.invoke(cli.app, [*train, *args, "--out", str(tmp_path / "o"), "--overwrite"])
    assert r.exit_code == 0, r.output
    return _said(r.output)


def test_preset_tuned_says_which_preset_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a saved tuned-d, `--preset tuned` ran the default preset without a word."""
    said = _preset_said(tmp_path, monkeypatch, "--preset", "tuned")
    assert "preset tuned: no tuned-d preset saved; using the default preset" in said, said
    default = presets.stored(presets.PRESETS_FILE)["default"]["settings"]
    assert all(getattr(_Capture.configs[0], k) == v for k, v in default.items())
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"tuned-d": {"settings": {"rounds": 2}, "study": {}}}))
    said = _preset_said(tmp_path, monkeypatch, "--preset", "tuned", "--presets-file", str(mine))
    assert "preset tuned: using tuned-d" in said and "warning" not in said, said


def test_a_preset_tuned_on_another_dataset_is_a_warning_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = _preset_said(tmp_path, monkeypatch, "--preset", "tuned-amazon-video")
    assert "warning: preset tuned-amazon-video was tuned on amazon-video, not d" in said, said
    assert _Capture.configs  # it ran
    assert "warning" not in _preset_said(tmp_path, monkeypatch, "--preset", "paper")


@functools.cache
def _popularity() -> float:
    """Popularity's validation HR@10 on FilmTrust's split (what fedrec tune compares with)."""
    return popularity(load_data("filmtrust", None, True)).rounds[0].val["hr@10"]


def _tune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, best: float, *args: str
) -> tuple[Any, Path]:
    """``fedrec tune --save-preset tuned-filmtrust`` with a study whose best validation HR@10
    is ``best`` (no training)."""

    class Study:
        best_value = best

    monkeypatch.setattr(tune_cli, "tune", lambda split, spec, progress: Study())
    monkeypatch.setattr(tune_cli, "best_settings", lambda study: {"rounds": 2})
    monkeypatch.setattr(tune_cli, "finished", lambda study: 2)
    target = tmp_path / "presets.json"
    tune = ["tune", "--storage", str(tmp_path / "s.db"), "--presets-file", str(target)]
    return runner.invoke(cli.app, [*tune, "--save-preset", "tuned-filmtrust", *args]), target


def test_a_study_that_does_not_beat_popularity_is_not_saved_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2-trial study at chance level was saved, and `--preset tuned` then took it silently."""
    pop = _popularity()
    r, target = _tune(tmp_path, monkeypatch, pop / 10)
    said = _said(r.output)
    assert r.exit_code == 2 and "error: the study's best validation HR@10" in said, said
    assert f"popularity's {pop:.4f}" in said and "--force" in said
    assert not target.exists()
    r, target = _tune(tmp_path, monkeypatch, pop / 10, "--force")
    assert r.exit_code == 0, r.output
    study = presets.stored(target)["tuned-filmtrust"]["study"]
    assert study["popularity_validation_hr@10"] == pop
    # a run that takes it is told
    monkeypatch.setattr(train_runs, "Simulator", _Capture)
    train = ["train", "--preset", "tuned", "--presets-file", str(target), "--quiet"]
    r = runner.invoke(cli.app, [*train, "--eval-every", "0", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "preset tuned: using tuned-filmtrust; warning: its study reached" in _said(r.output)


def test_a_study_above_popularity_is_saved_beside_its_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pop = _popularity()
    best = (1 + pop) / 2
    r, target = _tune(tmp_path, monkeypatch, best)
    assert r.exit_code == 0, r.output
    said = _said(r.output)
    assert f"best validation HR@10 {best:.4f}; popularity on the same validation items" in said
    assert presets.stored(target)["tuned-filmtrust"]["settings"] == {"rounds": 2}
    r = runner.invoke(cli.app, ["tune", "--force", "--storage", str(tmp_path / "t.db")])
    assert r.exit_code == 2 and "--force is a setting of --save-preset" in _said(r.output)
