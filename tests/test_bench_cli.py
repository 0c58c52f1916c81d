"""The benchmark programs' command lines (each run as ``python -m bench.NAME``): ``python -m
bench.report`` answers ``--help`` and unknown options without writing docs/RESULTS.md (it took
no arguments, so ``--help`` rewrote the file), and bad input to any program is one line and a
non-zero exit, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "RESULTS.md"


def _bench(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"bench.{program}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )


def test_report_help_and_unknown_options_write_nothing() -> None:
    before = RESULTS.stat().st_mtime_ns
    for args, code, said in ((["--help"], 0, "Usage:"), (["--rounds", "2"], 2, "No such option")):
        r = subprocess.run(
            [sys.executable, "-m", "bench.report", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert r.returncode == code, (args, r.stdout, r.stderr)
        assert said in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stderr
    assert RESULTS.stat().st_mtime_ns == before


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["speed", "--rounds", "0", "--skip-scale"], "'--rounds': must be at least 1, got 0"),
        (["aggregator_storage", "--rounds", "-1"], "'--rounds': must be at least 1, got -1"),
        (["http_vs_simulator", "--dataset", "nope"], "error: unknown dataset 'nope'"),
        (["export_study", "{tmp}/none.db"], "none.db: no such file"),
        (["memory", "--out", "{tmp}"], "is a folder (name the result file)"),
        (["roofline", "--out", "{tmp}/a-file/r.json"], "cannot create the folder"),
        (["aggregator_replicas", "--replicas", "1"], "the larger set-up needs at least 2"),
        (["ray_scaling", "--nodes", "0,x"], "--nodes: positive integers, comma-separated"),
        (["server_step", "speed", "--items", "0"], "'--items': integers >= 1, comma-separated"),
        (["server_step", "accuracy", "--datasets", "filmtrust"], "<dataset>/<protocol>"),
        (["dp_spectrum", "--epsilons", "3,x"], "not comma-separated numbers"),
        (["dp_spectrum", "--epsilons", "3,-1"], "--epsilons takes numbers > 0"),
        (["dp_spectrum", "--datasets", "nope"], "--datasets takes a comma-separated subset"),
        (["full_ranking", "--datasets", "nope"], "--datasets takes a comma-separated subset"),
        (["dp_defaults", "--epsilon", "0"], "--epsilon must be a number > 0, got 0"),
        (["demo_settings", "--arms", "worker-5"], "--arms: unknown ['worker-5']"),
    ],
)
def test_bad_input_to_a_benchmark_is_one_line_not_a_traceback(
    args: list[str], said: str, tmp_path: Path
) -> None:
    """Each ended in a traceback (a median of no rounds, a ConfigError, a DataError, an
    IndexError after creating an empty database where the study file was not); a result file
    that cannot be written failed after the whole benchmark had run."""
    (tmp_path / "a-file").write_text("in the way")
    r = _bench(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "none.db").exists()


def test_every_benchmark_program_runs_its_main_through_the_bad_input_guard() -> None:
    for path in sorted((ROOT / "bench").glob("*.py")):
        text = path.read_text()
        if '__name__ == "__main__"' in text:
            assert "run(main)" in text, path.name
            # the guard's import rebinds a module-level ``run``: aggregator_storage.py's own
            # run() became the guard, and every run of it failed with a TypeError
            assert "\ndef run(" not in text, f"{path.name} defines run(), which the guard shadows"
