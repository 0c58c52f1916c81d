"""RESULTS section of the demo's settings (``bench/demo_settings.py``).

Used by ``bench/report.py``; every figure comes from a JSON under bench/results/.
"""

from __future__ import annotations

from typing import Any

from bench.report_common import load_result

#: how each arm's settings read in the table
UPLOADS = {"client": "one per client", "worker": "one partial sum per worker"}


def _evaluated(every: int) -> str:
    return "every round" if every == 1 else f"every {every}th and the last"


def _pct(r: dict[str, Any], key: str) -> str:
    return f"{100 * r[key]['hr@10']:.2f}" if key in r else "-"


def section() -> list[str]:
    """Time and figures of ``fedrec up`` under the demo's settings and the defaults."""
    data = load_result("demo_settings.json")
    if data is None:
        return []
    runs = data["runs"]
    lines = [
        "## The demo's settings: what they cost and give (`bench/demo_settings.py`)",
        "",
        f"Produced by `{data['command']}`: `fedrec up` on FilmTrust with the default preset "
        f"({runs[0]['rounds']} rounds, seed 0), two workers, SQLite, no Redis, dashboard or "
        "recommendation API, the arms one after the other on this machine. *Wall*: the whole "
        "command, start-up and registration included; *compute*, *evaluate*: a worker's seconds "
        "in those phases over its training rounds (mean of the two workers; the scoring of the "
        "last version, after the last round, is in no round's timings); HR@10 (%): the last round's "
        "test figure, and the test figure at the round chosen on validation, as `fedrec up` "
        "prints them. `scripts/demo.sh` runs the last row's settings.",
        "",
        "| uploads | evaluated | wall (s) | compute (s) | evaluate (s) | final HR@10 "
        "| selected round | selected HR@10 | popularity HR@10 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["eval_every"], r["upload_grouping"])):
        w = r["worker_seconds"]
        sel = r.get("selected", {})
        lines.append(
            f"| {UPLOADS[r['upload_grouping']]} | {_evaluated(r['eval_every'])} "
            f"| {r['wall_seconds']:.0f} | {w['compute']:.0f} | {w['evaluate']:.0f} "
            f"| {_pct(r, 'final')} | {sel.get('round', '-')} | {_pct(r, 'selected')} "
            f"| {_pct(r, 'popularity')} |"
        )
    arm = {r["arm"]: r for r in runs}
    if "client-1" in arm and "worker-10" in arm:
        d, s = arm["client-1"], arm["worker-10"]
        lines += [
            "",
            f"Reading: the demo's settings take {s['wall_seconds']:.0f} s where `fedrec up`'s "
            f"defaults take {d['wall_seconds']:.0f} s ({d['wall_seconds'] / s['wall_seconds']:.1f}x"
            f" as long), ending at test HR@10 {_pct(s, 'final')} against {_pct(d, 'final')}, "
            f"popularity {_pct(s, 'popularity')}.",
        ]
    return lines
