"""What the RESULTS sections (``bench/report*.py``) share: where the benchmarks' results are,
how one is read, and how two interleaved sides of an HTTP comparison are read and listed."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

RES = Path(__file__).resolve().parents[1] / "bench" / "results"
#: how a result recorded the program that wrote it (``python bench/NAME.py``, before bench/
#: became a package)
_SCRIPT_RUN = re.compile(r"\b(python\S*) bench/(\w+)\.py\b")


def as_module(command: str) -> str:
    """A command a result recorded, as it is run now: ``python bench/NAME.py ...`` (how the
    older results wrote it) becomes ``python -m bench.NAME ...``."""
    return _SCRIPT_RUN.sub(r"\1 -m bench.\2", command)


def load_result(path: Path | str) -> Any:
    """A benchmark's JSON (a path, or a file name under bench/results/); None when that
    benchmark has not been run."""
    p = path if isinstance(path, Path) else RES / path
    return json.loads(p.read_text()) if p.exists() else None


def result_pair(name_before: str, name_after: str) -> tuple[Any, Any, int, float] | None:
    """Two interleaved sides' results, their rounds and the ratio target (None unless both
    were run)."""
    before, after = load_result(name_before), load_result(name_after)
    if before is None or after is None:
        return None
    return before, after, after["config"]["rounds"], after.get("ratio_target", 1.5)


def runs_by(runs: list[dict[str, Any]], *keys: str) -> dict[Any, list[dict[str, Any]]]:
    """``runs`` grouped by their values of ``keys`` (a tuple of them, or the one value for one
    key), in the order first met."""
    by: dict[Any, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]], []).append(r)
    return by


def meets(summary: dict[str, Any], target: float) -> str:
    """Whether a side's median HTTP/simulator ratio "meets" ``target`` or "does not meet" it."""
    return "meets" if summary["ratio_median"] <= target else "does not meet"


def ratios_text(summary: dict[str, Any]) -> str:
    """A run summary's ratios, as listed."""
    return ", ".join(f"{r:.2f}" for r in summary["ratios"])


def load_range(*results: dict[str, Any]) -> str:
    """The range of the 1-minute load after the repetitions of ``results``."""
    loads = [r["load_avg_1m"] for d in results for r in d["repetitions"]]
    return f"{min(loads):.1f}-{max(loads):.1f}"


def prior_choice_note(d: dict[str, Any]) -> str:
    """A sentence for a result whose served figures an earlier rule chose (the prior's weight
    on the sampled validation HR@10), none for one the current rule chose."""
    from fedrecgel.prior import CHOICE

    if d["settings"].get("prior_choice") == CHOICE:
        return ""
    return (
        " Measured when the prior's weight was chosen on the sampled validation HR@10, before "
        "it was chosen at the served cut-off (`fedrecgel.prior.guard_k`): its served figures "
        "are that rule's."
    )


def mean_std(xs: list[float]) -> str:
    """Fractions as a percentage, mean ± sample std ("-" for none; one seed says so)."""
    if not xs:
        return "-"
    m = 100 * statistics.fmean(xs)
    if len(xs) == 1:
        return f"{m:.2f} (one seed)"
    return f"{m:.2f} ± {100 * statistics.stdev(xs):.2f}"
