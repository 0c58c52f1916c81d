"""The run retention's section of docs/RESULTS.md (``bench/run_retention.py``)."""

from __future__ import annotations

from bench.report_common import load_result

#: the runs at which the sizes are shown
MARKS = (1, 2, 5, 10, 11, 15, 20)


def section() -> list[str]:
    """The database's size after each of many runs, with and without run retention."""
    data = load_result("run_retention.json")
    if data is None:
        return []
    sizes = data["bytes"]
    n = data["runs"]
    marks = [r for r in MARKS if r <= n]
    lines = [
        "## Storage across runs (`bench/run_retention.py`)",
        "",
        f"The aggregator's SQLite database (file, WAL and shared memory, after the storage pass "
        f"and the compaction) after each of {n} runs started one after the other, as "
        f"{n} `docker compose up`/`down` cycles of the demo leave a kept volume: each run "
        f"{data['rounds_per_run']} rounds of random per-client updates of "
        f"{data['clients']} clients on a {data['model']['n_items']:,}-item NCF "
        f"(factor {data['model']['factor']}, {data['model']['layers']} layers), then stopped. "
        f"*retention*: the default `KEEP_RUNS` ({data['keep_runs']}: older runs keep their rows "
        f"but no version's params); *no retention*: every run kept. Same process, interleaved "
        f"run by run.",
        "",
        "| after run | " + " | ".join(str(r) for r in marks) + " | growth after run "
        f"{min(data['keep_runs'], n)} |",
        "|---|" + "---|" * (len(marks) + 1),
    ]
    for name, series in sizes.items():
        cells = " | ".join(f"{series[r - 1] / 1e6:.1f}" for r in marks)
        growth = 100 * data["growth_after_keep_runs"][name]
        lines.append(f"| {name}, MB | {cells} | {growth:+.1f}% |")
    lines.append("")
    return lines
