"""`fedrec train` refuses an option that would change nothing with the method or the other
options (README: every option takes effect), naming it, and records the settings a run used.
Only what the user typed is refused: a preset's settings apply where they act."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest
import torch
from typer.testing import CliRunner

from fedrecgel import cli, train_runs
from fedrecgel.clitools import option_flag
from fedrecgel.config import DEFAULTS, OptimizerName, RunParams
from fedrecgel.server_strategy import strategy_of
from fedrecgel.strategy import FedAvgGradients
from tests.core.test_shipped_presets import _Capture, _csv

runner = CliRunner()


def _train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """``fedrec train`` on a small CSV with the simulator captured (nothing trains; a federated
    run evaluates nothing, a reference point takes no --eval-every); the result and the
    output folder."""
    monkeypatch.setattr(train_runs, "Simulator", _Capture)
    _Capture.configs.clear()
    out = tmp_path / "o"
    (out / "results.json").unlink(missing_ok=True)  # an earlier call's
    base = ["train", "--dataset", str(_csv(tmp_path)), "--quiet"]
    if not set(args) & set(cli.BASELINE_METHODS):
        base += ["--eval-every", "0"]
    return runner.invoke(cli.app, [*base, *args, "--out", str(out), "--overwrite"]), out


def _refused(r: Any, out: Path, flag: str) -> None:
    said = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert said.startswith("error:") and flag in said and "would change nothing" in said, said
    assert "Traceback" not in said and not _Capture.configs
    assert not (out / "results.json").exists()


#: a value of each setting other than its default (the option given, not its value, counts)
OTHER: dict[str, str] = {
    "rho_sh": str(DEFAULTS.rho_sh * 2),
    "rho_ns": str(DEFAULTS.rho_ns * 2),
    "layers": str(DEFAULTS.layers + 1),
    "factor": str(DEFAULTS.factor // 2),
    "rounds": str(DEFAULTS.rounds + 1),
    "fraction": str(DEFAULTS.fraction / 2),
    "server_lr": str(DEFAULTS.server_lr * 2),
    "server_weight_decay": str(DEFAULTS.server_weight_decay + 1),
    "dp_clip": str(DEFAULTS.dp_clip / 2),
    "dp_clip_quantile": "0.5",
    "dp_mode": "distributed" if DEFAULTS.dp_mode == "central" else "central",
    "dp_delta": "1e-6",
    "dp_prior_share": "0.5",
    "dp_item_share": "0.3",
    "dp_prior_items": str(DEFAULTS.dp_prior_items + 1),
    "secagg_neighbours": str(DEFAULTS.secagg_neighbours + 1),
    "secagg_dropout": str(DEFAULTS.secagg_dropout / 2),
    "secagg_range": str(DEFAULTS.secagg_range * 2),
    "secagg_scale_bits": str(DEFAULTS.secagg_scale_bits - 1),
    "trim_fraction": str(DEFAULTS.trim_fraction / 2),
}


def _given(name: str) -> list[str]:
    return [option_flag(name), OTHER[name]]


@pytest.mark.parametrize(
    ("method", "name"),
    [
        ("fedncf", "rho_sh"),
        ("fedncf", "rho_ns"),
        ("fedmf", "rho_sh"),
        ("fedmf", "layers"),
        ("fedmf", "server_weight_decay"),
        ("fedrecgel-no-shared-sam", "rho_sh"),
        ("fedrecgel-no-private-sam", "rho_ns"),
    ],
)
def test_a_setting_the_method_overrides_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, name: str
) -> None:
    """fedncf ran with rho 0 while results.json said --rho-sh 0.5; fedmf has no MLP tower."""
    r, out = _train(tmp_path, monkeypatch, "--method", method, *_given(name))
    _refused(r, out, option_flag(name))


def test_results_record_the_radii_the_method_ran_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preset's radii are no refusal, but fedncf runs, and records, both 0; an ablation keeps
    (and may be given) the radius it does not switch off."""
    r, out = _train(tmp_path, monkeypatch, "--method", "fedncf", "--preset", "tuned-amazon-video")
    assert r.exit_code == 0, r.output
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert (run["config"]["rho_sh"], run["config"]["rho_ns"]) == (0.0, 0.0)
    r, out = _train(tmp_path, monkeypatch, "--method", "fedrecgel-no-shared-sam", *_given("rho_ns"))
    assert r.exit_code == 0, r.output
    (cfg,) = _Capture.configs
    assert (cfg.rho_sh, cfg.rho_ns) == (0.0, float(OTHER["rho_ns"]))


@pytest.mark.parametrize(
    ("method", "args", "name"),
    [
        ("popularity", [], "server_lr"),
        ("popularity", [], "rho_sh"),
        ("popularity", [], "dp_delta"),  # without DP, popularity takes nothing
        ("random", [], "factor"),
        ("random", [], "rounds"),
        ("central", [], "server_lr"),
        ("central", [], "fraction"),  # central trains every user each epoch
        ("cooccurrence", ["--target-epsilon", "3"], "fraction"),
        ("cooccurrence", [], "rho_ns"),
    ],
)
def test_a_setting_a_reference_point_does_not_use_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, args: list[str], name: str
) -> None:
    r, out = _train(tmp_path, monkeypatch, "--method", method, *args, *_given(name))
    _refused(r, out, option_flag(name))


def test_a_reference_point_takes_the_settings_it_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """central's model size, epochs and negatives; private popularity's budget and delta;
    popularity and random take no preset (central does: its model size and epochs)."""
    small = ["--factor", "4", "--layers", "1", "--rounds", "1", "--n-negatives", "2"]
    r, out = _train(tmp_path, monkeypatch, "--method", "central", *small)
    assert r.exit_code == 0, r.output
    assert json.loads((out / "results.json").read_text())["runs"][0]["config"]["epochs"] == 1
    budget = ["--target-epsilon", "3", *_given("dp_delta")]
    r, out = _train(tmp_path, monkeypatch, "--method", "popularity", *budget)
    assert r.exit_code == 0, r.output
    for method in ("popularity", "random"):
        r, out = _train(tmp_path, monkeypatch, "--method", method, "--preset", "paper")
        _refused(r, out, "--preset")


@pytest.mark.parametrize("name", [n for n in train_runs.DP_ONLY if n != "dp_clip_quantile"])
def test_a_dp_setting_without_dp_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    r, out = _train(tmp_path, monkeypatch, *_given(name))
    _refused(r, out, option_flag(name))


def test_the_clip_quantile_without_dp_is_refused_but_not_from_the_private_preset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The private preset sets dp_clip_quantile; named without DP it is no refusal (a preset
    applies where it acts), typed it is."""
    r, out = _train(tmp_path, monkeypatch, *_given("dp_clip_quantile"))
    _refused(r, out, "--dp-clip-quantile")
    r, out = _train(tmp_path, monkeypatch, "--preset", "private")
    assert r.exit_code == 0, r.output
    r, out = _train(tmp_path, monkeypatch, "--target-epsilon", "3", *_given("dp_clip"))
    assert r.exit_code == 0, r.output
    assert _Capture.configs[0].dp_clip == float(OTHER["dp_clip"])


@pytest.mark.parametrize("name", ["dp_prior_share", "dp_item_share", "dp_prior_items"])
def test_a_share_of_the_target_without_a_target_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """--dp-noise alone makes a DP run, but these spend a share of --target-epsilon."""
    r, out = _train(tmp_path, monkeypatch, "--dp-noise", "1", *_given(name))
    _refused(r, out, option_flag(name))


@pytest.mark.parametrize("name", [*train_runs.SECAGG_ONLY, "trim_fraction"])
def test_a_secure_aggregation_or_trimming_setting_without_it_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    r, out = _train(tmp_path, monkeypatch, *_given(name))
    _refused(r, out, option_flag(name))
    on = ["--secure-aggregation", "dense"] if name != "trim_fraction" else []
    on = on or ["--server-mean", "trimmed"]
    r, out = _train(tmp_path, monkeypatch, *on, *_given(name))
    assert r.exit_code == 0, r.output
    assert str(getattr(_Capture.configs[0], name)) == OTHER[name]


def _server_steps(params: RunParams) -> torch.Tensor:
    """A parameter after three server steps of the optimizer ``params`` builds."""
    strategy = strategy_of(params)
    assert isinstance(strategy, FedAvgGradients)
    weights = {"w": torch.zeros(3)}
    for k in range(3):
        grad = {"w": torch.tensor([1.0, -2.0, 0.5]) * (k + 1)}
        strategy.optimizer.step(weights, grad)
    return weights["w"]


@pytest.mark.parametrize("name", sorted(train_runs.OPTIMIZER_SETTINGS))
@pytest.mark.parametrize("optimizer", get_args(OptimizerName))
def test_the_optimizer_settings_act_with_the_optimizers_said_and_no_other(
    optimizer: str, name: str
) -> None:
    """OPTIMIZER_SETTINGS against the server step itself (fedrecgel.strategy): a setting
    changes the step with each optimizer it names, and with no other."""
    base = RunParams(optimizer=optimizer)  # type: ignore[arg-type]
    changed = base.model_copy(update={name: 0.5})
    acts = not torch.equal(_server_steps(base), _server_steps(changed))
    assert acts == (optimizer in train_runs.OPTIMIZER_SETTINGS[name])


@pytest.mark.parametrize(
    ("args", "optimizer", "source"),
    [
        (["--server-momentum", "0.5"], "adam", "from preset default"),
        (["--optimizer", "fedadam", "--server-momentum", "0.5"], "fedadam", "from --optimizer"),
        (["--preset", "paper", "--server-momentum", "0.5"], DEFAULTS.optimizer, "the default"),
        (["--optimizer", "sgd", "--server-beta1", "0.5"], "sgd", "from --optimizer"),
        (["--preset", "private", "--server-beta2", "0.9"], "sgd", "from preset private"),
        (["--optimizer", "fedadagrad", "--server-beta2", "0.9"], "fedadagrad", "from --optimizer"),
    ],
)
def test_a_setting_of_another_server_optimizer_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], optimizer: str, source: str
) -> None:
    """--server-momentum with the default preset's adam was run, and recorded, as if it acted;
    the refusal names the option, the optimizer in effect and where it came from."""
    r, out = _train(tmp_path, monkeypatch, *args)
    flag = next(a for a in args if a.startswith("--server-"))
    _refused(r, out, flag)
    said = " ".join(r.output.split())
    assert f"this run's is {optimizer} ({source})" in said, said


@pytest.mark.parametrize(
    ("args", "name", "value"),
    [
        (["--optimizer", "sgd", "--server-momentum", "0.5"], "server_momentum", 0.5),
        (["--preset", "private", "--server-momentum", "0.5"], "server_momentum", 0.5),
        (["--optimizer", "fedadagrad", "--server-beta1", "0.5"], "server_beta1", 0.5),
        (["--server-beta2", "0.9"], "server_beta2", 0.9),
        # the private preset's momentum with adam typed: a preset's setting is no refusal
        (["--preset", "private", "--optimizer", "adam"], "optimizer", "adam"),
    ],
)
def test_a_setting_of_the_server_optimizer_in_effect_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], name: str, value: object
) -> None:
    r, _ = _train(tmp_path, monkeypatch, *args)
    assert r.exit_code == 0, r.output
    assert getattr(_Capture.configs[0], name) == value


def test_a_preset_setting_the_optimizer_typed_ignores_is_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The private preset's momentum, with --optimizer adam typed: the run takes adam and the
    default momentum, so its config records no momentum adam never applied."""
    from fedrecgel.presets import stored

    assert stored()["private"]["settings"]["server_momentum"] != DEFAULTS.server_momentum
    r, _ = _train(tmp_path, monkeypatch, "--preset", "private", "--optimizer", "adam")
    assert r.exit_code == 0, r.output
    config = _Capture.configs[0]
    assert config.optimizer == "adam" and config.server_momentum == DEFAULTS.server_momentum
    r, _ = _train(tmp_path, monkeypatch, "--preset", "private")
    assert _Capture.configs[0].server_momentum == stored()["private"]["settings"]["server_momentum"]
