"""RESULTS paragraphs on the aggregator's freed-page writes and evaluation lookups: the
interleaved HTTP runs before and after (``bench/http_vs_simulator.py``) and the aggregator's
own CPU a round by request kind (``bench/aggregator_round_cpu.py``).

Used by ``bench/report_http.py``; every figure comes from a JSON under bench/results/.
"""

from __future__ import annotations

from typing import Any

from bench.report_common import load_range, load_result, meets, ratios_text, result_pair
from bench.report_http_cpu import CPU_AFTER, TAG_AFTER, cpu_table, per_round_cpu, wall_medians

CHURN_BEFORE = "http_vs_simulator_churn_before.json"
CHURN_AFTER = "http_vs_simulator_churn.json"
TAG_CHURN_BEFORE = "before: freed pages zeroed, every report looked up"
TAG_CHURN_AFTER = "secure_delete=FAST, reports looked up on a conflict only"
ROUND_CPU = "aggregator_round_cpu.json"
META_BEFORE = "http_vs_simulator_meta_before.json"
META_AFTER = "http_vs_simulator_meta.json"
TAG_META_BEFORE = "before: worker meta read from its store"
TAG_META_AFTER = "worker meta in memory"
_KINDS = {
    "download": "two model downloads",
    "poll": "two polls",
    "upload": "the first partial-sum upload",
    "close": "the second, which closes the round",
    "storage": "the storage pass after the close",
    "report": "two evaluation reports of 650 clients",
    "history": "a history read",
    "total": "**the round**",
}


def _walls_and_ratios(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The HTTP and simulator wall times and the ratios of two sides' partial-mode summaries,
    after (``a``) against before (``b``)."""
    return (
        f"{wall_medians(a, b)}. Median ratio {a['ratio_median']:.2f} ({ratios_text(a)}) "
        f"against {b['ratio_median']:.2f} ({ratios_text(b)})"
    )


def churn_reading() -> list[str]:
    """The interleaved HTTP runs before and after, with their CPU seconds."""
    pair = result_pair(CHURN_BEFORE, CHURN_AFTER)
    if pair is None:
        return []
    before, after, rounds, target = pair
    b, a = before["modes"]["partial"], after["modes"]["partial"]
    agg_b, agg_a = (per_round_cpu(d, "aggregator_seconds", rounds) for d in (before, after))
    wk_b, wk_a = (per_round_cpu(d, "workers_seconds", rounds) for d in (before, after))
    under = sum(r <= target for r in a["ratios"])
    sims = [x for s in (a, b) for x in s["simulator_wall_seconds"]]
    earlier = load_result(CPU_AFTER)
    then = (
        f" ({earlier['modes']['partial']['ratio_median']:.2f} in that session, "
        f"{b['ratio_median']:.2f} in this one)"
        if earlier is not None
        else ""
    )

    text = (
        f"**Freed pages and evaluation lookups** (*{TAG_CHURN_BEFORE}* and "
        f"*{TAG_CHURN_AFTER}*: {len(a['ratios'])} interleaved pairs of repetitions of "
        "partial-sum runs, the order within a pair alternating, 1-minute load "
        f"{load_range(before, after)} after the runs). Two changes to the aggregator "
        "between the two sides. Python's SQLite is built with `secure_delete` on, so the "
        "storage pass after each close zeroed every page of the blobs it freed (the round's "
        "two update bodies, the previous version's optimizer state, pruned versions' "
        "params: megabytes a round) and wrote them through the WAL again; the aggregator "
        "now sets it to FAST (freed pages are reused or compacted away unzeroed, as "
        "PostgreSQL leaves dead rows to VACUUM; docs/API.md says so). And an evaluation "
        "report's clients are looked up only when the unique constraint refuses one of "
        "them (a repeat or an overlap), not before every insert. "
        f"Aggregator CPU {agg_a:.3f} s a round against {agg_b:.3f} s "
        f"({(agg_a / agg_b - 1) * 100:+.0f}%), the two workers' {wk_a:.3f} against "
        f"{wk_b:.3f} s; {_walls_and_ratios(a, b)}: the code "
        f"after {meets(a, target)} the {target}x target ({under} of {len(a['ratios'])} "
        f"repetitions at or under it), the code before {meets(b, target)} it in these runs. The "
        f"code before is the one measured as *{TAG_AFTER}* above{then}: the same code gives "
        "a different ratio in another session, as the simulator's speed moves with the "
        "machine's state (in this session's repetitions it took "
        f"{min(sims):.1f}-{max(sims):.1f} s for the same run), so only the sides of one "
        "session compare."
    )
    table = cpu_table(before, after, TAG_CHURN_BEFORE, TAG_CHURN_AFTER)
    return ["", text, *table, *round_cpu()]


def round_cpu() -> list[str]:
    """The aggregator's own CPU a round by request kind, both ``secure_delete`` settings."""
    data = load_result(ROUND_CPU)
    if data is None:
        return []
    med = data["cpu_seconds_per_round_median"]
    cfg = data["config"]
    fast, on = med["FAST"], med["ON"]
    rows = [f"| {label} | {fast[k] * 1e3:.1f} | {on[k] * 1e3:.1f} |" for k, label in _KINDS.items()]
    return [
        "",
        f"The aggregator's own CPU a round (`bench/aggregator_round_cpu.py`: an in-process "
        f"aggregator with {cfg['population']:,} clients under two credentials, driven through "
        "a round's requests as two workers make them, called on the service with no HTTP; "
        "partial sums of random values over "
        f"{cfg['rows_per_partial']:,} item rows; {cfg['rounds']} rounds after "
        f"{cfg['warmup']}, {cfg['repeats']} repetitions per setting, interleaved, medians; "
        "milliseconds of CPU a round), with `secure_delete` as the aggregator sets it and as "
        "Python's SQLite is built:",
        "",
        "| request | FAST | ON |",
        "|---|---|---|",
        *rows,
        "",
        f"Zeroing the freed pages cost the storage pass {on['storage'] * 1e3:.1f} ms a round "
        f"against {fast['storage'] * 1e3:.1f} (medians); the round's total moves "
        "with the machine's speed from one repetition to the next as much as that (totals "
        f"with FAST {_totals(data, 'FAST')}, with ON {_totals(data, 'ON')} ms).",
    ]


def _totals(data: dict[str, Any], setting: str) -> str:
    """The per-repetition totals of one setting, in milliseconds."""
    return ", ".join(f"{r['total'] * 1e3:.0f}" for r in data["runs"][setting])


def meta_reading() -> list[str]:
    """The interleaved HTTP runs before and after the workers kept their meta in memory."""
    pair = result_pair(META_BEFORE, META_AFTER)
    if pair is None:
        return []
    before, after, rounds, target = pair
    b, a = before["modes"]["partial"], after["modes"]["partial"]
    wk_b, wk_a = (per_round_cpu(d, "workers_seconds", rounds) for d in (before, after))
    agg_b, agg_a = (per_round_cpu(d, "aggregator_seconds", rounds) for d in (before, after))
    spread = [
        r["cpu"]["workers_seconds"] / rounds for d in (before, after) for r in d["repetitions"]
    ]
    text = (
        f"**Worker meta in memory** (*{TAG_META_BEFORE}* and *{TAG_META_AFTER}*: "
        f"{len(a['ratios'])} interleaved pairs, the order within a pair alternating; the "
        "side before is the code after the runs above plus the evaluation coverage drop, "
        "which both sides have). A worker read a few meta values from its store on every "
        "poll (its run, model key, evaluated version, the reports kept for delivery), each a "
        "SQLAlchemy transaction of its own; the store that mirrors the states now keeps the "
        "small meta table in memory too, written through after each commit. The workers' "
        f"CPU {wk_a:.3f} s a round against {wk_b:.3f} s "
        f"({(wk_a / wk_b - 1) * 100:+.0f}%; single runs range over "
        f"{min(spread):.3f}-{max(spread):.3f} s, so the change, about 10 meta reads of about "
        "a millisecond each per worker and round, is below what these runs resolve), the "
        f"aggregator's {agg_a:.3f} against "
        f"{agg_b:.3f} s; {_walls_and_ratios(a, b)}: the final "
        f"code {meets(a, target)} the {target}x target in these runs."
    )
    return ["", text, *cpu_table(before, after, TAG_META_BEFORE, TAG_META_AFTER)]
