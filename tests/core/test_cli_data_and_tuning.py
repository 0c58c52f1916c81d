"""`fedrec train` on protocols, ready splits, presets and reference points; `fedrec tune`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedrecgel.cli import app
from fedrecgel.data import load_split, write_ncf

runner = CliRunner()
SMALL = ["--factor", "4", "--layers", "1", "--quiet"]
ONE_ROUND = ["--rounds", "1", "--fraction", "0.05", *SMALL]


def _csv(tmp_path: Path) -> Path:
    """Users who repeat a pair: its latest row is the held-out one under the paper protocol."""
    rows = ["user,item,timestamp"]
    for u in range(40):
        items = [(u * 3 + k * 11) % 150 for k in range(7)]
        rows += [f"{u},{i},{t}" for t, i in enumerate(items)]
        rows.append(f"{u},{items[0]},99")  # the first item again, latest
    path = tmp_path / "d.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _said(output: str) -> str:
    """The console output with its line wrapping undone."""
    return " ".join(output.split())


def _results(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((out / "results.json").read_text())  # type: ignore[no-any-return]


def test_protocols_change_the_split(tmp_path: Path) -> None:
    csv = _csv(tmp_path)
    outs = {}
    for protocol in ("paper", "clean"):
        out = tmp_path / protocol
        r = runner.invoke(
            app,
            [
                "train",
                "--dataset",
                str(csv),
                "--protocol",
                protocol,
                "--method",
                "popularity",
                "--out",
                str(out),
                "--quiet",
            ],
        )
        assert r.exit_code == 0, r.output
        outs[protocol] = _results(out)
    assert outs["paper"]["protocol"] == "paper" and outs["clean"]["protocol"] == "clean"
    # the header row is not data, and clean merges the repeated pair before the leave-one-out
    assert outs["paper"]["data"]["users"] == 40
    assert outs["paper"]["data"]["train"] > outs["clean"]["data"]["train"]
    r = runner.invoke(app, ["train", "--dataset", str(csv), "--protocol", "nope"])
    assert r.exit_code == 2 and "--protocol" in r.output


def test_split_dir_trains_on_a_ready_split(tmp_path: Path) -> None:
    split = load_split("filmtrust")
    write_ncf(split, tmp_path / "ncf")
    out = tmp_path / "run"
    r = runner.invoke(
        app,
        [
            "train",
            "--split-dir",
            str(tmp_path / "ncf"),
            *ONE_ROUND,
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    res = _results(out)
    assert res["protocol"] == "split-dir" and res["data"]["users"] == split.n_users
    assert res["runs"][0]["selected_on_validation"] is not None  # a validation item was held out
    r = runner.invoke(app, ["train", "--split-dir", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "not a directory" in r.output and "Traceback" not in r.output


def test_reference_methods(tmp_path: Path) -> None:
    for method, extra in (
        ("popularity", []),
        ("random", ["--seeds", "0,1"]),
        ("central", ["--rounds", "1", *SMALL]),
    ):
        out = tmp_path / method
        r = runner.invoke(app, ["train", "--method", method, *extra, "--out", str(out)])
        assert r.exit_code == 0, r.output
        res = _results(out)
        assert res["method"] == method and res["summary"]["selected.hr@10.mean"] > 0
    pop = _results(tmp_path / "popularity")["summary"]["selected.hr@10.mean"]
    rnd = _results(tmp_path / "random")["summary"]["selected.hr@10.mean"]
    assert pop > rnd + 0.5  # FilmTrust: popularity about 0.91, chance about 0.1
    r = runner.invoke(app, ["train", "--method", "nope"])
    assert r.exit_code == 2 and "--method" in r.output


def test_results_without_a_plot_leave_no_earlier_runs_plot_beside_them(tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = runner.invoke(app, ["train", *ONE_ROUND, "--out", str(out)])
    assert r.exit_code == 0 and (out / "hr_ndcg.png").exists(), r.output
    r = runner.invoke(app, ["train", "--method", "popularity", "--out", str(out), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert _results(out)["method"] == "popularity"
    assert not (out / "hr_ndcg.png").exists()  # the fedrecgel run's curve is gone


def test_presets_and_tune_resume(tmp_path: Path) -> None:
    presets = tmp_path / "presets.json"
    base = ["--dataset", str(_csv(tmp_path)), *["--fraction", "0.5"]]
    tune = [
        "tune",
        *base,
        "--rounds",
        "2",
        "--storage",
        str(tmp_path / "s.db"),
        "--presets-file",
        str(presets),
        "--save-preset",
        "tuned-d",
    ]
    r = runner.invoke(app, [*tune, "--trials", "2"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, [*tune, "--trials", "3"])
    assert r.exit_code == 0 and "3 trials" in r.output, r.output
    saved = json.loads(presets.read_text())["tuned-d"]
    assert saved["study"]["trials"] == 3 and saved["settings"]["rounds"] == 2
    r = runner.invoke(app, ["tune", *base, "--method", "popularity"])
    assert r.exit_code == 2
    r = runner.invoke(app, ["train", "--preset", "nope", "--rounds", "1"])
    assert r.exit_code == 2 and "unknown preset" in r.output
    out = tmp_path / "paper"
    r = runner.invoke(
        app,
        [
            "train",
            "--preset",
            "paper",
            *ONE_ROUND,
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert _results(out)["preset"] == "paper"
    assert np.isclose(_results(out)["runs"][0]["config"]["server_lr"], 0.001)


def test_tune_refuses_bad_round_choices_and_storage_before_any_trial(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    storage = tmp_path / "study.db"
    for args, message in (
        (
            ["--rounds", "999999999", "--storage", str(storage)],
            "round choices must be in 1..100000",
        ),
        (["--rounds", "1", "--storage", str(blocker / "s.db")], f"--storage {blocker}: cannot"),
    ):
        r = runner.invoke(app, ["tune", "--trials", "1", "--eval-every", "1", *args])
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output and "Traceback" not in r.output, r.output
    assert not storage.exists()  # no study was opened, no failed trial recorded


def test_tune_refuses_a_bad_first_trial_storage_or_preset_name_before_any_trial(
    tmp_path: Path,
) -> None:
    """Each of these used to run trials first (and print optuna's traceback of a failed trial),
    or to end in a traceback of the database layer."""
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a study\n")
    storage = tmp_path / "study.db"
    ok = ["--storage", str(storage)]
    for args, message in (
        ([*ok, "--first", '{"server_lr": 1e300}'], "first trial: server_lr"),
        ([*ok, "--first", '{"rounds": 7}'], "first trial: rounds 7"),
        ([*ok, "--save-preset", "mine"], "tuned-<dataset>"),
        (["--storage", str(not_sqlite)], "is not an SQLite file"),
        (["--storage", str(tmp_path)], "is a folder"),
    ):
        r = runner.invoke(
            app, ["tune", "--trials", "1", "--rounds", "1", "--eval-every", "1", *args]
        )
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output and "Traceback" not in r.output, (args, r.output)
        assert "trial 0" not in r.output, r.output
    assert not storage.exists()
    assert not_sqlite.read_text() == "not a study\n"


def test_central_lr_out_of_bounds_or_without_method_central_is_refused(tmp_path: Path) -> None:
    """1e308 overflowed inside Adam (a traceback after loading the data); with another method
    the option was ignored without a word."""
    out = tmp_path / "o"
    for args, message in (
        (["--method", "central", "--central-lr", "1e308"], "lr must be in (0, 10]"),
        (["--method", "central", "--central-lr", "nan"], "lr must be in (0, 10]"),
        (["--method", "popularity", "--central-lr", "0.1"], "--central-lr is the step size"),
        (["--central-lr", "0.1"], "--central-lr is the step size"),
    ):
        # the settings central takes (--fraction would change nothing: it trains every user)
        r = runner.invoke(app, ["train", *args, "--rounds", "1", *SMALL, "--out", str(out)])
        assert r.exit_code == 2 and message in r.output, (args, r.output)
        assert not (out / "results.json").exists()


def test_an_earlier_runs_results_are_replaced_only_when_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fedrec train and fedrec data export wrote over what an --out folder held, unasked."""
    out = tmp_path / "mine"
    popularity = ["train", "--method", "popularity", "--quiet"]
    assert runner.invoke(app, [*popularity, "--out", str(out)]).exit_code == 0
    before = (out / "results.json").read_bytes()
    r = runner.invoke(app, ["train", "--method", "random", "--out", str(out)])
    assert r.exit_code == 2 and "already holds results.json" in _said(r.output), r.output
    assert "--overwrite" in r.output and (out / "results.json").read_bytes() == before
    r = runner.invoke(app, ["train", "--method", "random", "--out", str(out), "--overwrite"])
    assert r.exit_code == 0 and _results(out)["method"] == "random", r.output
    monkeypatch.chdir(tmp_path)  # the default folder holds the latest run: replaced
    for method in ("popularity", "random"):
        r = runner.invoke(app, ["train", "--method", method])
        assert r.exit_code == 0 and _results(tmp_path / "runs/latest")["method"] == method
    export = ["data", "export", "filmtrust", "--out", str(tmp_path / "split")]
    assert runner.invoke(app, export).exit_code == 0
    r = runner.invoke(app, export)
    assert r.exit_code == 2 and "filmtrust.train.csv" in r.output, r.output
    assert runner.invoke(app, [*export, "--overwrite"]).exit_code == 0
