"""Presets saved by ``fedrec tune`` go to a file of the user's (by default in their
configuration folder), never into the installed package, and ``fedrec train --preset`` reads
them besides the shipped ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedrecgel import cli, presets, train_runs, tune_cli
from fedrecgel.simulate import TrainConfig
from tests.core.test_shipped_presets import _Capture, _csv

runner = CliRunner()
SETTINGS = {"server_lr": 0.02, "client_lr": 0.3, "rounds": 2, "optimizer": "adam"}


@pytest.fixture
def quick_study(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fedrec tune`` with a study that finds ``SETTINGS`` at once (no training)."""

    class Study:
        best_value = 0.5

    monkeypatch.setattr(tune_cli, "tune", lambda split, spec, progress: Study())
    monkeypatch.setattr(tune_cli, "best_settings", lambda study: dict(SETTINGS))
    monkeypatch.setattr(tune_cli, "finished", lambda study: 1)


def _tune(tmp_path: Path, *args: str) -> str:
    base = ["tune", "--dataset", str(_csv(tmp_path)), "--storage", str(tmp_path / "s.db")]
    r = runner.invoke(cli.app, [*base, "--save-preset", "tuned-d", *args])
    assert r.exit_code == 0, r.output
    return r.output


def _trained_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> TrainConfig:
    monkeypatch.setattr(train_runs, "Simulator", _Capture)
    _Capture.configs.clear()
    train = ["train", "--dataset", str(_csv(tmp_path)), "--preset", "tuned-d", "--quiet"]
    r = runner.invoke(cli.app, [*train, *args, "--eval-every", "0", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    (cfg,) = _Capture.configs
    return cfg


def test_a_saved_preset_goes_to_the_users_folder_not_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_study: None
) -> None:
    shipped = presets.PRESETS_FILE.read_bytes()
    shipped_mtime = presets.PRESETS_FILE.stat().st_mtime_ns
    _tune(tmp_path)
    assert presets.PRESETS_FILE.read_bytes() == shipped
    assert presets.PRESETS_FILE.stat().st_mtime_ns == shipped_mtime
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "fedrecgel" / "presets.json"
    assert presets.user_presets_file() == user
    assert presets.stored(user)["tuned-d"]["settings"] == SETTINGS
    cfg = _trained_with(tmp_path, monkeypatch)
    assert cfg.server_lr == 0.02 and cfg.client_lr == 0.3
    # the shipped presets are still read
    assert {"tuned-amazon-video", "tuned-d"} <= set(presets.stored())


def test_a_preset_saved_in_a_named_file_is_read_from_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_study: None
) -> None:
    mine = tmp_path / "mine" / "presets.json"
    _tune(tmp_path, "--presets-file", str(mine))
    assert presets.stored(mine)["tuned-d"]["settings"] == SETTINGS
    assert not presets.user_presets_file().exists()
    cfg = _trained_with(tmp_path, monkeypatch, "--presets-file", str(mine))
    assert cfg.server_lr == 0.02


def test_saving_into_the_package_is_refused(tmp_path: Path, quick_study: None) -> None:
    shipped = presets.PRESETS_FILE.read_bytes()
    base = ["tune", "--dataset", str(_csv(tmp_path)), "--storage", str(tmp_path / "s.db")]
    r = runner.invoke(
        cli.app,
        [*base, "--save-preset", "tuned-d", "--presets-file", str(presets.PRESETS_FILE)],
    )
    assert r.exit_code != 0 and "inside the installed package" in r.output, r.output
    assert presets.PRESETS_FILE.read_bytes() == shipped
    with pytest.raises(presets.PresetError, match="inside the installed package"):
        presets.save("tuned-x", {}, {}, presets.PRESETS_FILE.parent / "other.json")


@pytest.mark.parametrize(
    "content", ["{oops", "[1, 2]", '{"tuned-x": 3}', '{"tuned-x": {"study": {}}}', "\udcff"]
)
def test_a_presets_file_that_cannot_be_read_is_named_not_a_traceback(
    tmp_path: Path, content: str
) -> None:
    user = presets.user_presets_file()
    user.parent.mkdir(parents=True)
    user.write_bytes(content.encode("utf-8", "surrogateescape"))
    train = ["train", "--dataset", str(_csv(tmp_path)), "--preset", "tuned", "--quiet"]
    r = runner.invoke(cli.app, [*train, "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and str(user) in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    with pytest.raises(presets.PresetError, match=str(user)):
        presets.save("tuned-d", {}, {}, user)  # nor is it overwritten
    assert user.read_bytes() == content.encode("utf-8", "surrogateescape")


@pytest.mark.parametrize(
    ("args", "content", "message"),
    [
        (["--preset", "tuned-d"], None, "no such file"),
        ([], '{"tuned-d": {"settings": {"rounds": 2}}}', "only with --preset"),
        (["--preset", "tuned-d"], '{"tuned-d": {"settings": {"serverlr": 2}}}', "serverlr"),
    ],
)
def test_a_presets_file_that_would_be_ignored_is_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    content: str | None,
    message: str,
) -> None:
    """A named presets file that is missing, given without --preset, or holding a setting
    no preset sets, stops the run instead of training silently with other settings."""
    monkeypatch.setattr(train_runs, "Simulator", _Capture)
    _Capture.configs.clear()
    mine = tmp_path / "mine.json"
    if content is not None:
        mine.write_text(content)
    train = ["train", "--dataset", str(_csv(tmp_path)), "--quiet", "--presets-file", str(mine)]
    r = runner.invoke(cli.app, [*train, *args, "--eval-every", "0", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and message in r.output, r.output
    assert not _Capture.configs and not (tmp_path / "o").exists()
