"""`fedrec train --preset` computes what the accuracy table stores; `fedrec tune` resumes a study
whose process was killed in the middle of a trial."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from fedrecgel.cli import app
from fedrecgel.clitools import load_data
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.tune import suggest

runner = CliRunner()


def _csv(tmp_path: Path) -> Path:
    rows = ["user,item,timestamp"]
    rows += [f"{u},{(u * 7 + k * 5) % 120},{k}" for u in range(40) for k in range(7)]
    path = tmp_path / "d.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _said(output: str) -> str:
    """The console output with its line wrapping undone (it wraps at the terminal width)."""
    return " ".join(output.split())


@pytest.mark.parametrize("label", ["tuned-fedrecgel", "tuned-fedmf"])
def test_fedrec_train_preset_gives_the_accuracy_tables_run(label: str, tmp_path: Path) -> None:
    from bench import accuracy_table as table

    method, preset = table.FEDERATED[label]
    csv = _csv(tmp_path)
    out = tmp_path / "out"
    args = ["train", "--dataset", str(csv), "--method", method, "--preset", preset]
    args += ["--seeds", "1", "--validation", "--eval-every", "10", "--quiet", "--out", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    (cli_run,) = json.loads((out / "results.json").read_text())["runs"]

    split = load_data(str(csv), None, True)
    cfg = table.config_of(label, split, 10).replace(seed=1)
    table_run = table.record(Simulator(split, cfg).run(), 1)
    # results.json records the radii the method ran with (FedMF: none), the table its preset's
    used = dict(zip(("rho_sh", "rho_ns"), cfg.effective_rho(), strict=True))
    assert cli_run["config"] == {**table_run["config"], **used}
    assert cli_run["selected_on_validation"] == table_run["selected"]
    assert cli_run["best_test"] == table_run["best_test"]
    assert table_run["selected"] is not None and table_run["selected"]["hr@10"] > 0


def test_fedrec_tune_resumes_a_study_killed_mid_trial(tmp_path: Path) -> None:
    storage = tmp_path / "study.db"
    tune = ["tune", "--dataset", str(_csv(tmp_path)), "--fraction", "0.5", "--rounds", "2"]
    tune += ["--eval-every", "1", "--storage", str(storage), "--study", "s"]
    r = runner.invoke(app, [*tune, "--trials", "1"])
    assert r.exit_code == 0 and " 1 trials; best" in _said(r.output), r.output
    # a killed process leaves its trial RUNNING, with the settings it had drawn
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{storage}")
    killed = study.ask()
    drawn = suggest(killed, TrainConfig(), (2,))
    r = runner.invoke(app, [*tune, "--trials", "2"])
    assert r.exit_code == 0 and " 2 trials; best" in _said(r.output), r.output
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{storage}").get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    # the interrupted settings are run again, not lost
    assert trials[2].params == trials[1].params and trials[2].params["rounds"] == drawn.rounds
    assert trials[2].params["server_lr"] == drawn.server_lr
    # the budget is reached: running it once more adds nothing
    r = runner.invoke(app, [*tune, "--trials", "2"])
    assert r.exit_code == 0, r.output
    assert len(optuna.load_study(study_name="s", storage=f"sqlite:///{storage}").trials) == 3
