"""RESULTS reading of the HTTP run against the simulator once both use the native client step
(``fedrecgel/native``): the shipped configuration beside the same code on torch ops.

Used by ``bench/report_http.py``; every figure comes from a JSON under bench/results/.
"""

from __future__ import annotations

from typing import Any

from bench.report_common import load_range, meets, ratios_text, result_pair
from bench.report_http_cpu import median_of, run_cpu

NATIVE = "http_vs_simulator_native.json"
NATIVE_OFF = "http_vs_simulator_native_before.json"
TAG_NATIVE = "native client step (simulator and workers)"
TAG_NATIVE_OFF = "the same code on torch ops (FEDREC_NATIVE=0)"


def stage(s: dict[str, Any], key: str, part: str = "worker_phase") -> float:
    """Seconds a round of one worker phase (or, with part="aggregator_stage", one aggregator
    stage) in a run summary's median repetition."""
    return float(s["breakdown_of_median_run"][f"{part}_seconds_per_round"].get(key, 0.0))


def native_reading() -> list[str]:
    """The ratio with the native step against the same code on torch ops, interleaved."""
    pair = result_pair(NATIVE_OFF, NATIVE)
    if pair is None:
        return []
    off, on, rounds, target = pair
    a, b = on["modes"]["partial"], off["modes"]["partial"]
    met = meets(a, target)
    ha, hb = a["http_wall_seconds"], b["http_wall_seconds"]
    sa, sb = a["simulator_wall_seconds"], b["simulator_wall_seconds"]
    agg = "aggregator_stage"
    return [
        "",
        f"With the native client step (*{TAG_NATIVE}*; {len(ha)} repetitions interleaved "
        f"with {len(hb)} of *{TAG_NATIVE_OFF}*, 1-minute load {load_range(on, off)} "
        f"after the runs): the simulator's {rounds} rounds take "
        f"{median_of(sa):.2f} s against {median_of(sb):.2f} s on torch ops "
        f"(medians), the run over HTTP {median_of(ha):.2f} s against "
        f"{median_of(hb):.2f} s, so the median ratio is {a['ratio_median']:.2f} "
        f"({ratios_text(a)}) against {b['ratio_median']:.2f} ({ratios_text(b)}): it {met} the {target}x target. "
        "The workers' partial sums go through the same kernels (a worker's compute of its "
        f"half of the cohort {stage(a, 'compute'):.3f} s a round against "
        f"{stage(b, 'compute'):.3f} s), but what a round over HTTP adds to it does not "
        "shrink with it: the aggregator's request handling, checks, commits and close "
        f"({run_cpu(on, 'aggregator_seconds'):.2f} s of aggregator CPU a run against "
        f"{run_cpu(off, 'aggregator_seconds'):.2f} s; its close {stage(a, 'close', agg):.3f} s a "
        f"round), a worker's scoring of its users ({stage(a, 'evaluate'):.3f} s), its "
        f"report, poll, download and state commit, with three processes on 2 cores. A "
        "faster simulator therefore raises the ratio: the same code meets the target on "
        "torch ops and misses it with the native step, while the run over HTTP takes about "
        "as long either way.",
    ]
