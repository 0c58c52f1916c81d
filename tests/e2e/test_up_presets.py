"""`fedrec up` picks its run settings as `fedrec train` does: the default preset, or under DP
the private one, with its clip norm fixed (the aggregator does not adapt it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import services.up
from fedrecgel.config import DEFAULTS
from fedrecgel.presets import FIXED_PRIVATE_CLIP, stored
from services.cli import app


def _run_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str) -> Any:
    """The run config `fedrec up ARGS` would start the services with (nothing is started)."""
    seen: list[Any] = []
    monkeypatch.setattr(services.up, "up", seen.append)
    r = CliRunner().invoke(app, ["up", "--workdir", str(tmp_path / "w"), *args])
    assert r.exit_code == 0, r.output
    (opts,) = seen
    return opts.run


def test_a_private_run_over_http_takes_the_private_preset_with_a_fixed_clip_norm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    private = stored()["private"]["settings"]
    run = _run_config(monkeypatch, tmp_path, "--target-epsilon", "3")
    assert (run.optimizer, run.server_lr, run.sampling) == (
        private["optimizer"],
        private["server_lr"],
        private["sampling"],
    )
    assert run.dp_clip == FIXED_PRIVATE_CLIP and run.dp_clip_quantile is None
    assert run.rounds == private["rounds"]  # the rounds the noise was chosen for
    named = _run_config(monkeypatch, tmp_path, "--dp-noise", "1", "--dp-clip", "0.7")
    assert named.dp_clip == 0.7 and named.dp_clip_quantile is None
    plain = _run_config(monkeypatch, tmp_path)
    assert plain.optimizer == stored()["default"]["settings"]["optimizer"]
    assert plain.dp_noise is None and plain.target_epsilon is None


def test_up_refuses_a_setting_that_would_change_nothing_as_train_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(services.up, "up", lambda opts: pytest.fail("started"))
    for args, refusal in (
        (["--server-momentum", "0.5"], "--server-momentum is a setting of the server optimizer"),
        (["--dp-clip", "0.5"], "--dp-clip is a setting of a differentially private run"),
        (["--secagg-neighbours", "4"], "--secagg-neighbours is a setting of --secure-aggregation"),
    ):
        r = CliRunner().invoke(app, ["up", "--workdir", str(tmp_path / "w"), *args])
        assert r.exit_code == 2, r.output
        assert refusal in r.output and "it would change nothing" in r.output, r.output
    # the private preset's server optimizer takes a momentum
    run = _run_config(monkeypatch, tmp_path, "--target-epsilon", "3", "--server-momentum", "0.5")
    assert run.server_momentum == 0.5
    # a preset's momentum that the optimizer typed ignores is not passed on
    adam = _run_config(monkeypatch, tmp_path, "--target-epsilon", "3", "--optimizer", "adam")
    assert adam.optimizer == "adam" and adam.server_momentum == DEFAULTS.server_momentum
