"""RESULTS reading of the HTTP run against the simulator after the aggregator's storage and the
workers' round ends were made lighter: 64 KB SQLite pages, version blobs in a table of their
own, storage passes at most once a second, one store transaction for a worker's round end,
and no poll or report from a worker whose upload left its round open while that round closes.

Used by ``bench/report_http.py``; every figure comes from a JSON under bench/results/.
"""

from __future__ import annotations

from bench.report_common import load_range, load_result, meets, ratios_text, result_pair
from bench.report_http_cpu import cpu_table, wall_medians

STORE = "http_vs_simulator_storage.json"
STORE_BEFORE = "http_vs_simulator_storage_before.json"
ROUND_CPU_PAGES = "aggregator_round_cpu_pages.json"
#: a later confirmation: the final code (cohort progress from memory too) against the same
#: "before", interleaved again
STORE_FINAL = "http_vs_simulator_storage_final.json"
STORE_FINAL_BEFORE = "http_vs_simulator_storage_final_before.json"
TAG_STORE = "64 KB pages, blobs apart, closes uncontended"
TAG_STORE_BEFORE = "before: the native step's session, measured again"
TAG_STORE_FINAL = "the same + cohort progress from memory (final code)"
TAG_STORE_FINAL_BEFORE = "before, measured a third time"


def _pages() -> str:
    """The in-process aggregator CPU a round, 64 KB pages against 4 KB, if measured."""
    data = load_result(ROUND_CPU_PAGES)
    if data is None:
        return ""
    med = data["cpu_seconds_per_round_median"]
    big, small = med["64K"], med["4K"]
    kinds = ", ".join(
        f"{k} {big[k] * 1e3:.1f} against {small[k] * 1e3:.1f}"
        for k in ("upload", "close", "storage", "report")
    )
    return (
        f" In process (`python -m bench.aggregator_round_cpu --compare page-size`, "
        f"{data['config']['repeats']} interleaved repetitions of {data['config']['rounds']} "
        f"rounds each, the code after this session's changes), 64 KB pages cost the "
        f"aggregator {big['total'] * 1e3:.1f} ms of CPU a round against "
        f"{small['total'] * 1e3:.1f} ms with SQLite's 4 KB (medians; by request, ms: {kinds})."
    )


def storage_reading() -> list[str]:
    """This session's changes against the code before them, interleaved."""
    pair = result_pair(STORE_BEFORE, STORE)
    if pair is None:
        return []
    before, after, _, target = pair
    a, b = after["modes"]["partial"], before["modes"]["partial"]
    under = sum(r <= target for r in a["ratios"])
    met = meets(a, target)
    text = (
        f"**Lighter storage and round ends** (*{TAG_STORE}* against *{TAG_STORE_BEFORE}*: "
        f"{len(a['ratios'])} interleaved pairs of repetitions, the order within a pair "
        f"alternating, 1-minute load {load_range(after, before)} after the runs). "
        "A profile of the aggregator in the run over HTTP showed SQLite's commits and the "
        "writes of blobs (a version's params and optimizer state, about 5 MB, the partial "
        "sums) as the largest items of its CPU, and the worker whose upload left its round "
        "open posting a poll and its evaluation report while the aggregator took the closing "
        "upload and closed the round (a close took 70-77 ms of wall time for about 33 ms of "
        "its own CPU). The changes: a new SQLite file gets 64 KB pages (a blob's overflow "
        "pages and WAL frames a sixteenth as many); a version's params and optimizer state "
        "are rows of their own (`version_blobs`, migration 0006: SQLite writes a whole row "
        "again on every update of it, so writing a version's metrics rewrote its 5 MB of "
        "blobs, about 9 MB of WAL, and so did freeing the previous version's optimizer "
        "state); the storage pass runs at most once a second instead of after every close; "
        "a worker commits a round's states, its kept evaluation sums and the cleared upload "
        "note in one store transaction (three before); and a worker whose upload left its "
        "round open waits for the version event before it polls again, and delivers its "
        "report once the round is over. "
        f"Median ratio {a['ratio_median']:.2f} ({ratios_text(a)}) against {b['ratio_median']:.2f} "
        f"({ratios_text(b)}); {wall_medians(a, b)}. The median ratio {met} the "
        f"{target}x target ({under} of {len(a['ratios'])} repetitions at or under it); the "
        "simulator alone moved between "
        f"{min(a['simulator_wall_seconds'] + b['simulator_wall_seconds']):.1f} and "
        f"{max(a['simulator_wall_seconds'] + b['simulator_wall_seconds']):.1f} s from one "
        "repetition to the next, which is most of the spread of the ratios." + _pages()
    )
    return ["", text, *cpu_table(before, after, TAG_STORE_BEFORE, TAG_STORE), *_final()]


def _final() -> list[str]:
    """The final code against the same code before, in a later set of interleaved pairs."""
    pair = result_pair(STORE_FINAL_BEFORE, STORE_FINAL)
    if pair is None:
        return []
    before, after, _, target = pair
    a, b = after["modes"]["partial"], before["modes"]["partial"]
    under = sum(r <= target for r in a["ratios"])
    return [
        "",
        f"The final code (*{TAG_STORE_FINAL}*: a worker's store also answers each round's "
        "cohort check from memory) against the same code before (*"
        f"{TAG_STORE_FINAL_BEFORE}*), {len(a['ratios'])} more interleaved pairs, 1-minute load "
        f"{load_range(after, before)}: median ratio {a['ratio_median']:.2f} ({ratios_text(a)}; "
        f"{under} of {len(a['ratios'])} at or under {target}) against "
        f"{b['ratio_median']:.2f} ({ratios_text(b)}); {wall_medians(a, b)}.",
        *cpu_table(before, after, TAG_STORE_FINAL_BEFORE, TAG_STORE_FINAL),
    ]
