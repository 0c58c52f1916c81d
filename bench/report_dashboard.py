"""RESULTS section of the dashboard page benchmark (``bench/dashboard_redraw.py``).

Used by ``bench/report.py``; every figure comes from a JSON under bench/results/.
"""

from __future__ import annotations

from bench.report_common import load_result


def section() -> list[str]:
    """The page's script before and now over a long history, measured in one run."""
    data = load_result("dashboard_redraw.json")
    if data is None:
        return []
    b, a = data["before"], data["after"]
    n = f"{data['rounds']:,}"
    lines = [
        f"## The dashboard page over {n} rounds (`bench/results/dashboard_redraw.json`)",
        "",
        "Produced by `python -m bench.dashboard_redraw`: the page in the system's headless Chromium, the",
        "dashboard over a fake aggregator's paged history; the page's script before",
        f"(`{data['before_rev']}`: every round redrawn on each change) and now (only new or changed",
        "rounds touched; the newest 50 versions in the table, at most 2,000 chart points),",
        f"alternately in one run: {data['repeats']} page loads and "
        f"{data['repeats'] * data['updates']} one-round updates each.",
        "Times from the state answer's arrival to the first frame after the page showed it",
        f"(medians; the machine's {data['machine']['cpus']} cores were shared with other jobs).",
        "",
        "| script | table rows | chart points | page load (ms) | one-round update (ms) | update, max (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in (("before", b), ("now", a)):
        lines.append(
            f"| {name} | {r['table_rows']:,} | {r['chart_points']:,} | {r['load_ms_median']:.0f} "
            f"| {r['update_ms_median']:.1f} | {r['update_ms_max']:.1f} |"
        )
    lines += [
        "",
        f"A one-round update is {data['update_speedup']:.0f}x faster, the page load "
        f"{data['load_speedup']:.1f}x.",
    ]
    return lines
