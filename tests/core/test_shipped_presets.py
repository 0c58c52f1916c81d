"""The presets shipped in fedrecgel/presets.json reach `fedrec train` as stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from fedrecgel import cli, presets, train_runs
from fedrecgel.simulate import RunResult, TrainConfig

runner = CliRunner()


class _Capture:
    """Stands in for the simulator: records the config ``fedrec train`` built, trains nothing."""

    configs: ClassVar[list[TrainConfig]] = []
    privacy: Any = None  # the simulator's DP plan; these presets run without DP

    def __init__(self, split: Any, config: TrainConfig) -> None:
        self.config = config
        self.total_rounds = config.rounds
        _Capture.configs.append(config)

    def run(self, on_round: Any = None) -> RunResult:
        return RunResult(self.config.model_dump(), "d", [], 0.0)


def _csv(tmp_path: Path) -> Path:
    rows = [f"{u},{(u * 7 + k * 5) % 150},{k}" for u in range(30) for k in range(6)]
    path = tmp_path / "d.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("name", ["tuned-amazon-video"])
def test_fedrec_train_preset_resolves_to_the_shipped_settings(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = presets.stored(presets.PRESETS_FILE)
    assert name in shipped, f"{name} is not shipped in {presets.PRESETS_FILE}"
    settings = shipped[name]["settings"]
    assert set(settings) >= {"server_lr", "client_lr", "rounds", "optimizer"}
    monkeypatch.setattr(train_runs, "Simulator", _Capture)
    _Capture.configs.clear()
    args = ["train", "--dataset", str(_csv(tmp_path)), "--preset", name, "--quiet"]
    r = runner.invoke(cli.app, [*args, "--eval-every", "0", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    (cfg,) = _Capture.configs
    for key, value in settings.items():
        assert getattr(cfg, key) == value, key
    # what is not in the preset keeps the paper's value; the command line still wins
    assert cfg.fraction == TrainConfig().fraction
    _Capture.configs.clear()
    r = runner.invoke(
        cli.app, [*args, "--eval-every", "0", "--rounds", "3", "--out", str(tmp_path / "o2")]
    )
    assert r.exit_code == 0, r.output
    assert _Capture.configs[0].rounds == 3
    assert _Capture.configs[0].server_lr == settings["server_lr"]


def test_paper_preset_takes_the_authors_radii() -> None:
    assert presets.resolve("paper", "amazon-video") == {"rho_sh": 0.01, "rho_ns": 0.2}
    assert presets.resolve("paper", "some-csv") == {}


def _train_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> TrainConfig:
    monkeypatch.setattr(train_runs, "Simulator", _Capture)
    _Capture.configs.clear()
    args = ["train", "--dataset", str(_csv(tmp_path)), "--quiet", "--eval-every", "0"]
    r = runner.invoke(cli.app, [*args, *extra, "--out", str(tmp_path / "o"), "--overwrite"])
    assert r.exit_code == 0, r.output
    (cfg,) = _Capture.configs
    return cfg


def test_train_without_a_preset_runs_the_default_preset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = presets.stored(presets.PRESETS_FILE)["default"]["settings"]
    assert settings, "the default preset sets something"
    cfg = _train_config(tmp_path, monkeypatch)
    for key, value in settings.items():
        assert getattr(cfg, key) == value, key
    # an option on the command line still wins over the default preset
    assert _train_config(tmp_path, monkeypatch, "--local-steps", "0").local_steps == 0


def test_paper_preset_is_the_faithful_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--preset paper`` is the reference code's behaviour, field for field (on a CSV the
    radii are the defaults'): no local steps, server Adam 0.001, client 0.1, 100 rounds."""
    cfg = _train_config(tmp_path, monkeypatch, "--preset", "paper")
    assert cfg.replace(eval_every=1) == TrainConfig()
    assert (cfg.local_steps, cfg.server_lr, cfg.client_lr, cfg.rounds) == (0, 0.001, 0.1, 100)


def test_a_private_run_without_a_preset_runs_the_private_preset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under DP the default preset's server Adam ranks at chance: a DP run with no preset
    takes the private one (server SGD, adaptive clipping); a clip norm on the command line is
    the run's, fixed; a preset named is still the one taken."""
    settings = presets.stored(presets.PRESETS_FILE)["private"]["settings"]
    assert settings["optimizer"] == "sgd" and settings["dp_clip_quantile"] == 0.5
    cfg = _train_config(tmp_path, monkeypatch, "--target-epsilon", "3")
    for key, value in settings.items():
        assert getattr(cfg, key) == value, key
    fixed = _train_config(tmp_path, monkeypatch, "--target-epsilon", "3", "--dp-clip", "0.4")
    assert (fixed.dp_clip, fixed.dp_clip_quantile, fixed.optimizer) == (0.4, None, "sgd")
    named = _train_config(tmp_path, monkeypatch, "--dp-noise", "1", "--preset", "default")
    assert (named.optimizer, named.dp_clip_quantile) == ("adam", None)
    assert _train_config(tmp_path, monkeypatch).optimizer == "adam"  # no DP: the default
