"""What the RESULTS sections (``bench/report*.py``) share: where the benchmarks' results are,
and how one is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RES = Path(__file__).resolve().parents[1] / "bench" / "results"


def load_result(path: Path | str) -> Any:
    """A benchmark's JSON (a path, or a file name under bench/results/); None when that
    benchmark has not been run."""
    p = path if isinstance(path, Path) else RES / path
    return json.loads(p.read_text()) if p.exists() else None
