"""The aggregator soak's section of docs/RESULTS.md (``bench/aggregator_soak.py``)."""

from __future__ import annotations

from typing import Any

from bench.report_common import RES, load_result

#: the rounds at which the RSS series is shown
MARKS = (1, 10, 50, 100, 200, 400, 600, 800, 1000)


def _series(data: dict[str, Any]) -> str:
    rss = data["rss_mb"]
    marks = [r for r in MARKS if r <= len(rss)]
    if len(rss) not in marks:
        marks.append(len(rss))
    head = "| round | " + " | ".join(str(r) for r in marks) + " |"
    rule = "|---|" + "---|" * len(marks)
    row = "| RSS MB | " + " | ".join(f"{rss[r - 1]:.0f}" for r in marks) + " |"
    return "\n".join([head, rule, row])


def _line(name: str, data: dict[str, Any]) -> str:
    env = ", ".join(f"`{k}={v}`" for k, v in data["aggregator_env"].items()) or "as shipped"
    verdict = "flat" if data["flat"] else "**grows**"
    return (
        f"| {name} | {env} | {data['rounds']} | {data['rss_at_warmup_mb']:.0f} | "
        f"{data['rss_peak_after_warmup_mb']:.0f} | {data['rss_end_mb']:.0f} | "
        f"{100 * data['growth_after_warmup']:+.1f}% | {verdict} | {data['wall_s']:.0f} |"
    )


def section() -> list[str]:
    """RSS of the aggregator process over a long run of short rounds (and the runs it is
    compared with, ``aggregator_soak_*.json``)."""
    data = load_result("aggregator_soak.json")
    if data is None:
        return []
    # other settings of the same soak (``--env``, ``--out aggregator_soak_<name>.json``)
    others = [
        (p.stem.removeprefix("aggregator_soak_"), load_result(p))
        for p in sorted(RES.glob("aggregator_soak_*.json"))
    ]
    lines = [
        "## Aggregator soak (`bench/aggregator_soak.py`)",
        "",
        f"One aggregator process (SQLite, default settings), {data['population']} registered "
        f"clients and {data['n_items']} items (FilmTrust's sizes), {data['rounds']} rounds of "
        f"about {data['cohort_mean']:.0f} clients each, driven over HTTP as workers do (poll, "
        "download, per-client uploads, an evaluation report of every client per version); "
        "the resident set size after each round. Target: after "
        f"{data['warmup']} rounds of warm-up the RSS stays within "
        f"{100 * data['flat_within']:.0f}% of its value then.",
        "",
        "| run | aggregator environment | rounds | RSS at warm-up MB | peak after MB | "
        "end MB | growth | verdict | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
        _line("now", data),
    ]
    lines += [_line(name, d) for name, d in others]
    lines += ["", "RSS along the run (now):", "", _series(data)]
    return lines
