"""``bench/report.py`` answers ``--help`` and unknown options without writing docs/RESULTS.md
(it took no arguments, so ``--help`` rewrote the file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "RESULTS.md"


def test_report_help_and_unknown_options_write_nothing() -> None:
    before = RESULTS.stat().st_mtime_ns
    for args, code, said in ((["--help"], 0, "usage:"), (["--rounds", "2"], 2, "unrecognized")):
        r = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "report.py"), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == code, (args, r.stdout, r.stderr)
        assert said in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stderr
    assert RESULTS.stat().st_mtime_ns == before
