"""The `fedrec` command line: a short training run, its outputs, and clear errors."""

import json
from pathlib import Path

from typer.testing import CliRunner

from fedrecgel.cli import app

runner = CliRunner()


def test_train_writes_results_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = runner.invoke(
        app,
        [
            "train",
            "--rounds",
            "2",
            "--seeds",
            "0,1",
            "--fraction",
            "0.05",
            "--factor",
            "8",
            "--layers",
            "2",
            "--out",
            str(out),
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["dataset"] == "filmtrust" and len(res["runs"]) == 2
    run = res["runs"][0]
    assert run["config"]["factor"] == 8 and run["config"]["fraction"] == 0.05
    assert [r["round"] for r in run["rounds"]] == [1, 2]
    assert run["best_test"]["hr@10"] > 0 and run["selected_on_validation"] is not None
    assert "best_test.hr@10.mean" in res["summary"] and "selected.hr@10.std" in res["summary"]
    png = (out / "hr_ndcg.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_on_a_csv_file(tmp_path: Path) -> None:
    rows = [f"{u},{u * 7 + k},{k}" for u in range(30) for k in range(8)]
    csv = tmp_path / "mine.csv"
    csv.write_text("\n".join(rows) + "\n")
    r = runner.invoke(
        app,
        [
            "train",
            "--dataset",
            str(csv),
            "--rounds",
            "1",
            "--factor",
            "4",
            "--layers",
            "1",
            "--n-negatives",
            "2",
            "--out",
            str(tmp_path / "o"),
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output


def test_unknown_dataset_is_a_clear_error() -> None:
    r = runner.invoke(app, ["train", "--dataset", "nope", "--rounds", "1"])
    assert r.exit_code == 2
    assert "unknown dataset 'nope'" in r.output and "Traceback" not in r.output


def test_bad_options_are_clear_errors(tmp_path: Path) -> None:
    for args, message in (
        (["--fraction", "0"], "fraction"),
        (["--method", "fedavg"], "method must be one of"),
        (["--seeds", "a,b"], "--seeds"),
        (["--server-optimizer", "rmsprop"], "--optimizer: Input should be 'adam'"),
        (["--layers", "9"], "--layers: Input should be less than or equal to 8"),
        (["--seeds", "0,-1"], "--seed: Input should be greater than or equal to 0"),
        (["--clip", "0"], "--clip: Input should be greater than 0"),
        # a rule across settings is said in its own words, not as an option named --config
        (
            ["--secure-aggregation", "sparse"],
            "error: secure_aggregation=sparse needs negative_pool",
        ),
    ):
        r = runner.invoke(app, ["train", "--rounds", "1", "--out", str(tmp_path), *args])
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output and "Traceback" not in r.output
        assert "--config" not in r.output and "Value error" not in r.output


def test_missing_data_dir_names_where_to_get_data(tmp_path: Path) -> None:
    r = runner.invoke(app, ["data", "stats", "amazon-video", "--data-dir", str(tmp_path)])
    assert r.exit_code == 2
    assert "amazon-video" in r.output and "Traceback" not in r.output


def test_data_stats_prints_the_protocol_counts() -> None:
    r = runner.invoke(app, ["data", "stats", "filmtrust", "--json", "--no-validation"])
    assert r.exit_code == 0
    st = json.loads(r.output)
    # 34,889 raw rows of the users kept; two repeat a (user, item) pair and train once
    assert (st["users"], st["items"], st["interactions"]) == (1227, 2059, 34887)
    assert st["train"] == 33660 and st["test"] == 1227


def test_data_stats_counts_the_split_train_reports(tmp_path: Path) -> None:
    """`data stats` split without a validation item while `fedrec train` holds one out: on a CSV
    with repeated pairs the two reported different interaction counts (1,010 against 1,012)."""
    rows = [f"u{u},i{(u * 7 + k * 5) % 150},{k}" for u in range(40) for k in range(8)]
    rows += [f"u{u},i{(u * 7) % 150},{9}" for u in range(0, 40, 3)]  # a repeat, held out
    csv = tmp_path / "d.csv"
    csv.write_text("user,item,timestamp\n" + "\n".join(rows) + "\n")
    r = runner.invoke(app, ["data", "stats", str(csv), "--json"])
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output)
    args = ["train", "--dataset", str(csv), "--method", "popularity", "--out", str(tmp_path / "o")]
    assert runner.invoke(app, args).exit_code == 0
    trained = json.loads((tmp_path / "o" / "results.json").read_text())["data"]
    assert shown == trained
    clean = runner.invoke(app, ["data", "stats", str(csv), "--json", "--protocol", "clean"])
    assert json.loads(clean.output)["interactions"] < shown["interactions"]


def test_data_export_writes_the_ncf_layout(tmp_path: Path) -> None:
    r = runner.invoke(app, ["data", "export", "filmtrust", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    lines = (tmp_path / "filmtrust.test.negative").read_text().splitlines()
    assert len(lines) == 1227 and len(lines[0].split("\t")) == 100


def _dp_train(tmp_path: Path, *extra: str) -> str:
    rows = [f"{u},{(u * 7 + k * 5) % 150},{k}" for u in range(40) for k in range(6)]
    csv = tmp_path / "d.csv"
    csv.write_text("\n".join(rows) + "\n")
    args = ["train", "--dataset", str(csv), "--rounds", "2", "--fraction", "0.5"]
    args += ["--factor", "4", "--layers", "1", "--dp-noise", "1.0", "--quiet"]
    r = runner.invoke(app, [*args, *extra, "--out", str(tmp_path / "o"), "--overwrite"])
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())


def test_a_dp_run_with_server_adam_is_told_what_the_noise_does(tmp_path: Path) -> None:
    out = _dp_train(tmp_path, "--optimizer", "adam")
    assert "differential privacy (central)" in out
    assert "note: server adam" in out and "the private preset" in out
    out = _dp_train(tmp_path, "--optimizer", "sgd", "--server-lr", "3")
    assert "differential privacy (central)" in out and "note: server" not in out
    # no preset named: the private one (server SGD, the clip norm adapting)
    out = _dp_train(tmp_path)
    assert "preset private" in out and "note: server" not in out
    assert "clip 0.1 adapting to quantile 0.5" in out


def test_an_output_folder_that_cannot_be_made_fails_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for args in (["train", "--rounds", "1"], ["data", "export", "filmtrust"]):
        for out in (blocker, blocker / "below"):
            r = runner.invoke(app, [*args, "--out", str(out)])
            assert r.exit_code == 2, (args, out, r.output)
            assert f"--out {out}: cannot create the folder" in r.output, r.output
            assert "Traceback" not in r.output and "seed 0:" not in r.output  # nothing trained


def test_a_model_too_large_to_build_is_refused_before_allocating(tmp_path: Path) -> None:
    # each bound alone is fine; together they would be a 34e9-parameter tower (137 GB)
    r = runner.invoke(
        app, ["train", "--rounds", "1", "--factor", "1024", "--layers", "8", "--out", str(tmp_path)]
    )
    assert r.exit_code == 2, r.output
    assert "shared parameters; at most 50,000,000" in r.output and "Traceback" not in r.output


def test_a_seed_named_twice_is_refused(tmp_path: Path) -> None:
    r = runner.invoke(app, ["train", "--rounds", "1", "--seeds", "0,1,0", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--seeds names a seed twice" in r.output, r.output
