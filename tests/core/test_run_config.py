"""One run configuration: every setting of :class:`fedrecgel.config.RunParams` reaches every
surface (the HTTP contract, ``fedrec train``, ``fedrec up``, the launcher's ``POST /v1/runs``
body, the simulator), out-of-bound values are refused everywhere, and each default is written
once in the code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import services.up
from fedrecgel import presets
from fedrecgel.cli import CLI_EVAL_EVERY
from fedrecgel.clitools import bounds
from fedrecgel.config import DEFAULTS, RunParams
from fedrecgel.run_config import RunConfig
from fedrecgel.sam import SAMConfig
from fedrecgel.simulate import TrainConfig
from services import contract
from services.aggregator.app import create_app
from services.aggregator.settings import Settings
from services.cli import app
from services.launcher import UpOptions, run_config

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
FIELDS = list(RunParams.model_fields)
# fields ``fedrec train`` takes otherwise: --method picks the model kind, --seeds several
# seeds, --dataset also takes a CSV path; deadline and quorum only exist for rounds over HTTP
TRAIN_OWN = {"kind", "seed", "dataset", "deadline_s", "quorum"}
# fields the simulator does not use: they only matter for rounds over HTTP
HTTP_ONLY = {"deadline_s", "quorum", "dataset"}


def other_value(name: str) -> Any:
    """A valid value of field ``name`` that is not its default."""
    field = RunParams.model_fields[name]
    ann, default = field.annotation, field.default
    value: Any
    if ann is bool:
        value = not default
    elif get_origin(ann) is Literal:
        value = next(v for v in get_args(ann) if v != default)
    elif ann is str:
        value = "other"
    elif default is None and int in get_args(ann):  # an optional count
        value = 64
    elif default is None:
        upper = bounds(name).get("lt", bounds(name).get("le", 2.0))
        value = 1.5 if upper > 1.5 else upper / 2
    elif ann is int:
        value = default + 1
    else:
        value = default / 2 if default else 0.5
    RunParams(**{name: value})  # in bounds
    assert value != default
    return value


def options(command: str) -> dict[str, str]:
    """Flag -> parameter name of the run settings of a ``fedrec`` command."""
    click_cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {
        flag: str(p.name)
        for p in click_cmd.params
        if getattr(p, "rich_help_panel", None) == "Run settings"
        for flag in p.opts
    }


def test_the_contract_is_the_core_config() -> None:
    assert contract.RunConfig is RunConfig
    assert issubclass(contract.AnnouncedRunConfig, RunConfig)
    assert set(RunConfig.model_fields) == {*FIELDS, "n_items"}


#: what a setting acts with (`fedrec up` refuses it without: it would change nothing)
ACTS_WITH: dict[str, list[str]] = {
    "server_momentum": ["--optimizer", "sgd"],
    "trim_fraction": ["--server-mean", "trimmed"],
    **{
        name: ["--secure-aggregation", "dense"]
        for name in ("secagg_neighbours", "secagg_dropout", "secagg_range", "secagg_scale_bits")
    },
    **{
        name: ["--dp-noise", "1"] for name in ("dp_clip", "dp_clip_quantile", "dp_mode", "dp_delta")
    },
    **{
        name: ["--target-epsilon", "3"]
        for name in ("dp_prior_share", "dp_item_share", "dp_prior_items")
    },
    # the private preset's prior share and an item share must leave the rounds some budget
    "dp_item_share": ["--target-epsilon", "3", "--dp-prior-share", "0.25"],
}


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_reaches_up_and_the_launchers_run_body(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = other_value(name)
    flag = "--" + name.replace("_", "-")
    assert options("up")[flag] == name
    assert set(options("up").values()) == set(FIELDS)
    seen: list[UpOptions] = []
    monkeypatch.setattr(services.up, "up", lambda opts: seen.append(opts))
    # a switch is given as its flag or its --no- twin, any other setting with its value
    args = (
        [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
    )
    r = runner.invoke(app, ["up", *args, *ACTS_WITH.get(name, [])])
    assert r.exit_code == 0, r.output
    (opts,) = seen
    assert getattr(opts.run, name) == value
    body = run_config(opts, n_items=77)
    assert body[name] == value and body["n_items"] == 77
    assert RunConfig.model_validate(body) == RunConfig(n_items=77, **opts.run.model_dump())


def test_train_has_every_field_but_its_own() -> None:
    got = set(options("train").values())
    assert got == set(FIELDS) - TRAIN_OWN
    assert options("train")["--server-optimizer"] == "optimizer"  # the older flag still works


@pytest.mark.parametrize("name", sorted(set(FIELDS) - HTTP_ONLY - {"kind"}))
def test_every_field_reaches_the_simulator_and_back(name: str) -> None:
    params = RunParams(**{name: other_value(name)})
    train = TrainConfig.from_params(params)
    assert train.run_params(**{k: getattr(params, k) for k in HTTP_ONLY}) == params


def test_the_model_kind_maps_to_the_method() -> None:
    train = TrainConfig.from_params(RunParams(kind="mf"))
    assert train.method == "fedmf" and train.run_params().kind == "mf"


def test_defaults_come_from_the_one_config() -> None:
    train, sam = TrainConfig(), SAMConfig()
    p = train.run_params()
    assert p == DEFAULTS
    for name in ("rho_sh", "rho_ns", "client_lr", "n_negatives", "chunk_size"):
        assert getattr(sam, name) == getattr(DEFAULTS, name)
    assert UpOptions().run == DEFAULTS


BAD = [
    ("layers", 9),
    ("layers", 0),
    ("factor", 4096),
    ("n_items", 0),
    ("rounds", 0),
    ("rounds", 10**9),
    ("seed", -1),
    ("fraction", 0.0),
    ("fraction", 1.5),
    ("quorum", 1.01),
    ("deadline_s", 0),
    ("rho_sh", -0.1),
    ("n_negatives", 10**6),
    ("optimizer", "rmsprop"),
]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_out_of_bound_settings_are_refused_over_http(tmp_path: Path, name: str, value: Any) -> None:
    settings = Settings(
        environment="test",
        database_url=f"sqlite:///{tmp_path / 'a.db'}",
        operator_token="operator-token-for-the-config-test",
        deadline_poll_s=3600.0,
    )
    good = {"n_items": 50, "rounds": 2}
    with TestClient(create_app(settings)) as client:
        headers = {"Authorization": "Bearer operator-token-for-the-config-test"}
        r = client.post("/v1/runs", json={**good, name: value}, headers=headers)
        assert r.status_code == 422, r.text
        assert name in r.text


@pytest.mark.parametrize(
    ("command", "name", "value"),
    [("up", n, v) for n, v in BAD if n != "n_items"]
    + [("train", n, v) for n, v in BAD if n not in TRAIN_OWN | {"n_items"}],
)
def test_out_of_bound_settings_are_clear_cli_errors(command: str, name: str, value: Any) -> None:
    flag = "--" + name.replace("_", "-")
    args = [command, flag, str(value)] + ([] if name == "rounds" else ["--rounds", "1"])
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert flag in r.output and "Traceback" not in r.output, r.output


# ----------------------------------------------------------------------------- defaults once

SOURCES = [
    *ROOT.glob("fedrecgel/**/*.py"),
    *ROOT.glob("services/**/*.py"),
    *ROOT.glob("bench/*.py"),
]


# ``seed: int = 0`` is everywhere a seed is, for unrelated things (synthetic data, sampling)
@pytest.mark.parametrize(
    "name", [n for n in FIELDS if RunParams.model_fields[n].default is not None and n != "seed"]
)
def test_no_default_is_declared_again(name: str) -> None:
    """Outside fedrecgel/config.py, no code declares a setting with its default value by hand
    (a field or parameter ``<name>: T = <default>``): it is read from the one config."""
    default = RunParams.model_fields[name].default
    lit = re.escape(default if isinstance(default, str) else repr(default))
    value = f"['\"]{lit}['\"]" if isinstance(default, str) else rf"{lit}(?![\d._])"
    pattern = re.compile(rf"\b{name}\b\s*:[^=\n]*=\s*(Field\(\s*default\s*=\s*)?{value}")
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in SOURCES
        if path != ROOT / "fedrecgel" / "config.py"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_the_rho_default_is_written_once_per_radius() -> None:
    """The literal ``0.02``, the SAM radii's default, is in fedrecgel/config.py (once for each
    radius) and nowhere else in the project's code (but the paper's table of tuned radii per
    dataset, which the reproduction benchmark runs)."""
    hits = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in SOURCES
        if path != ROOT / "bench" / "reproduce.py"
        for line in path.read_text().splitlines()
        if re.search(r"(?<![\d.])0\.02(?!\d)", line)
    ]
    assert len(hits) == 2 and all(h.startswith("fedrecgel/config.py") for h in hits), hits


@pytest.mark.parametrize(("name", "value"), [("server_lr", "nan"), ("rho_sh", "inf")])
def test_nan_and_infinity_are_named_as_such(tmp_path: Path, name: str, value: str) -> None:
    # 'Input should be less than or equal to 10' told a user who typed nan nothing useful
    r = runner.invoke(app, ["train", "--" + name.replace("_", "-"), value, "--rounds", "1"])
    assert r.exit_code == 2 and "Input should be a finite number" in r.output, r.output
    with pytest.raises(ValueError, match="finite number"):
        RunParams.model_validate({name: float(value)})


def test_up_runs_the_default_preset_with_its_own_evaluations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`fedrec up` trains the preset's settings, its rounds included, and evaluates every
    CLI_EVAL_EVERY rounds unless told otherwise."""
    seen: list[UpOptions] = []
    monkeypatch.setattr(services.up, "up", lambda opts: seen.append(opts))
    default = presets.run_settings("default", "filmtrust")
    assert default["server_lr"] != RunParams().server_lr  # else this test shows nothing
    assert default["rounds"] != RunParams().rounds
    for args in ([], ["--preset", "paper"], ["--server-lr", "0.5"], ["--eval-every", "1"]):
        r = runner.invoke(app, ["up", *args])
        assert r.exit_code == 0, r.output
    plain, paper, given, every = (opts.run for opts in seen)
    assert plain == RunParams(**{**default, "eval_every": CLI_EVAL_EVERY})
    assert "preset default: " in runner.invoke(app, ["up"]).output
    # FilmTrust's paper settings: the defaults (the paper's 100 rounds)
    assert paper == RunParams(eval_every=CLI_EVAL_EVERY)
    assert given == RunParams(**{**default, "eval_every": CLI_EVAL_EVERY, "server_lr": 0.5})
    assert every == RunParams(**default)
    r = runner.invoke(app, ["up", "--preset", "nonesuch"])
    assert r.exit_code == 2 and "unknown preset 'nonesuch'" in r.output, r.output
