"""Tuning: validation only, resumable, presets learned across datasets."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from fedrecgel import presets
from fedrecgel.data import Split
from fedrecgel.simulate import TrainConfig
from fedrecgel.synthetic import synthetic_split
from fedrecgel.tune import (
    FACTORS,
    SPACE,
    TuneSpec,
    best_settings,
    finished,
    open_study,
    study_choices,
    tune,
    validation_only,
)


def _split() -> Split:
    return synthetic_split(
        60, 80, interactions_per_user=8, seed=1, n_test_negatives=20, validation=True
    )


def _spec(tmp_path: Path, n_trials: int) -> TuneSpec:
    base = TrainConfig(factor=4, layers=1, fraction=0.5)
    return TuneSpec(tmp_path / "study.db", "t", base, n_trials=n_trials, round_choices=(2, 3))


def test_tuning_never_touches_the_test_candidates(tmp_path: Path) -> None:
    split = _split()
    # test candidates that cannot even be scored: any use of them would fail
    broken = replace(split, test_negatives=np.full_like(split.test_negatives, split.n_items + 7))
    study = tune(broken, _spec(tmp_path, 2))
    assert finished(study) == 2
    assert 0.0 <= study.best_value <= 1.0
    tuned = validation_only(split)
    assert split.val_items is not None
    assert tuned.val_items is None and np.array_equal(tuned.test_items, split.val_items)
    with pytest.raises(ValueError, match="validation"):
        validation_only(synthetic_split(30, 40, seed=1, n_test_negatives=5))


def test_an_interrupted_study_resumes(tmp_path: Path) -> None:
    split = _split()
    spec = _spec(tmp_path, 2)
    tune(split, spec)
    # an interruption in the middle of a trial leaves it RUNNING in the stored study
    interrupted = open_study(spec).ask()
    interrupted.suggest_float("server_lr", *SPACE["server_lr"], log=True)
    del interrupted
    more = replace(spec, n_trials=3)
    study = tune(split, more)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states.count(TrialState.FAIL) == 1 and finished(study) == 3
    assert TrialState.RUNNING not in states
    # running it again does nothing more: the budget is reached
    assert len(tune(split, more).get_trials()) == len(states)
    assert set(best_settings(study)) >= {"server_lr", "client_lr", "rounds", "rho_sh"}


def test_presets_paper_tuned_and_learned_default(tmp_path: Path) -> None:
    path = tmp_path / "presets.json"
    assert presets.resolve("paper", "x", path) == {}
    with pytest.raises(presets.PresetError, match="no tuned preset"):
        presets.resolve("tuned", "x", path)
    presets.save(  # a preset saved under the optimizer's older name is read by its name now
        "tuned-a",
        {"server_lr": 0.01, "rounds": 100, "server_optimizer": "adam"},
        {"value": 0.5},
        path,
    )
    presets.save(
        "tuned-b",
        {"server_lr": 0.0001, "rounds": 300, "optimizer": "adam"},
        {"value": 0.6},
        path,
    )
    assert presets.resolve("tuned", "a", path)["server_lr"] == 0.01
    learned = presets.resolve("tuned", "new-data", path)
    assert learned["server_lr"] == pytest.approx(0.001)
    assert learned["rounds"] == 100 and learned["optimizer"] == "adam"
    assert json.loads(path.read_text())["tuned-b"]["study"] == {"value": 0.6}
    with pytest.raises(presets.PresetError, match="unknown preset"):
        presets.resolve("nope", "a", path)
    # with a default (chosen across datasets) in the file, a dataset without a preset gets it
    data = json.loads(path.read_text())
    data["default"] = {"settings": {"server_lr": 0.02, "rounds": 300}}
    path.write_text(json.dumps(data))
    assert presets.resolve("tuned", "new-data", path) == {"server_lr": 0.02, "rounds": 300}
    assert presets.resolve("tuned", "a", path)["server_lr"] == 0.01
    with pytest.raises(presets.PresetError, match="tuned-<dataset>"):
        presets.save("mine", {}, {}, path)


def test_a_joining_process_leaves_running_trials_alone(tmp_path: Path) -> None:
    spec = _spec(tmp_path, 1)
    running = open_study(spec).ask()  # another process's trial, in progress
    study = open_study(replace(spec, join=True))
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [TrialState.RUNNING]
    # and draws other settings than the first process would
    first_process = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    mine = study.ask()
    assert mine.suggest_float("x", 0, 1) != first_process.ask().suggest_float("x", 0, 1)
    study.tell(mine, state=TrialState.FAIL)
    # a process that does not join takes it for an interrupted trial and queues it again
    study = open_study(spec)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states[0] == TrialState.FAIL and TrialState.RUNNING not in states
    assert states[-1] == TrialState.WAITING
    del running


def test_a_new_study_starts_from_the_given_settings(tmp_path: Path) -> None:
    first: dict[str, Any] = {"server_lr": 0.01, "client_lr": 0.1, "rho_sh": 0.01}
    first |= {"rho_ns": 0.2, "rounds": 2, "optimizer": "adam"}
    study = tune(_split(), replace(_spec(tmp_path, 2), first=(first,)))
    # the choices the first settings leave open are the base config's (the paper's)
    assert study.trials[0].params == {
        **first,
        "local_steps": 0,
        "server_decay": "constant",
        "server_weight_decay": 0.0,
        "n_negatives": 4,
        "factor": 4,  # the base's own embedding size, though not one of FACTORS
        "client_weight_decay": 0.0,
    }
    assert 4 not in FACTORS and study_choices(_spec(tmp_path, 1).base)["factor"][-1] == 4
    with pytest.raises(ValueError, match="unknown settings"):
        tune(_split(), replace(_spec(tmp_path, 2), first=({"lr": 1.0},)))
