"""RESULTS reading of the HTTP run against the simulator once both use the native client step
(``fedrecgel/native``): the shipped configuration beside the same code on torch ops.

Used by ``bench/report_http.py``; every figure comes from a JSON under bench/results/.
"""

from __future__ import annotations

import statistics
from typing import Any

from report_common import load_result

NATIVE = "http_vs_simulator_native.json"
NATIVE_OFF = "http_vs_simulator_native_before.json"
TAG_NATIVE = "native client step (simulator and workers)"
TAG_NATIVE_OFF = "the same code on torch ops (FEDREC_NATIVE=0)"


def stage(s: dict[str, Any], key: str, part: str = "worker_phase") -> float:
    """Seconds a round of one worker phase (or, with part="aggregator_stage", one aggregator
    stage) in a run summary's median repetition."""
    return float(s["breakdown_of_median_run"][f"{part}_seconds_per_round"].get(key, 0.0))


def _cpu(data: dict[str, Any], who: str) -> float:
    """The median over repetitions of the services' CPU seconds (aggregator or workers)."""
    vals = [r["cpu"][f"{who}_seconds"] for r in data["repetitions"] if "cpu" in r]
    return statistics.median(vals) if vals else float("nan")


def native_reading() -> list[str]:
    """The ratio with the native step against the same code on torch ops, interleaved."""
    on, off = load_result(NATIVE), load_result(NATIVE_OFF)
    if on is None or off is None:
        return []
    a, b = on["modes"]["partial"], off["modes"]["partial"]
    target = on.get("ratio_target", 1.5)
    met = "meets" if a["ratio_median"] <= target else "does not meet"
    rounds = on["config"]["rounds"]
    ha, hb = a["http_wall_seconds"], b["http_wall_seconds"]
    sa, sb = a["simulator_wall_seconds"], b["simulator_wall_seconds"]
    loads = [r["load_avg_1m"] for d in (on, off) for r in d["repetitions"]]
    agg = "aggregator_stage"
    return [
        "",
        f"With the native client step (*{TAG_NATIVE}*; {len(ha)} repetitions interleaved "
        f"with {len(hb)} of *{TAG_NATIVE_OFF}*, 1-minute load {min(loads):.1f}-"
        f"{max(loads):.1f} after the runs): the simulator's {rounds} rounds take "
        f"{statistics.median(sa):.2f} s against {statistics.median(sb):.2f} s on torch ops "
        f"(medians), the run over HTTP {statistics.median(ha):.2f} s against "
        f"{statistics.median(hb):.2f} s, so the median ratio is {a['ratio_median']:.2f} "
        f"({', '.join(f'{r:.2f}' for r in a['ratios'])}) against {b['ratio_median']:.2f} "
        f"({', '.join(f'{r:.2f}' for r in b['ratios'])}): it {met} the {target}x target. "
        "The workers' partial sums go through the same kernels (a worker's compute of its "
        f"half of the cohort {stage(a, 'compute'):.3f} s a round against "
        f"{stage(b, 'compute'):.3f} s), but what a round over HTTP adds to it does not "
        "shrink with it: the aggregator's request handling, checks, commits and close "
        f"({_cpu(on, 'aggregator'):.2f} s of aggregator CPU a run against "
        f"{_cpu(off, 'aggregator'):.2f} s; its close {stage(a, 'close', agg):.3f} s a "
        f"round), a worker's scoring of its users ({stage(a, 'evaluate'):.3f} s), its "
        f"report, poll, download and state commit, with three processes on 2 cores. A "
        "faster simulator therefore raises the ratio: the same code meets the target on "
        "torch ops and misses it with the native step, while the run over HTTP takes about "
        "as long either way.",
    ]
