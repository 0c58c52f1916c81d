"""RESULTS sections of the recommendation API and evaluation benchmarks.

Used by ``bench/report.py``; every figure comes from a JSON under bench/results/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RES = Path(__file__).resolve().parents[1] / "bench" / "results"


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _recall_row(items: str, target: str, load: dict[str, Any]) -> tuple[str, str, object]:
    """The recall row of one catalogue size of ``recommend_load.json``."""
    r = load.get("recall", {})
    return (
        f"recall@10 vs exact, {items} items, mean / p5",
        target,
        f"{r.get('recall_at_10_mean')} / {r.get('recall_at_10_p5')} ({r.get('users')} users)",
    )


def serving() -> list[str]:
    """Targets of two-stage recommendations and of evaluation against what was measured."""
    rec = _load(RES / "recommend_load.json") or {}
    ev = _load(RES / "evaluation.json") or {}
    ev2 = _load(RES / "evaluation_threads2.json")
    if not rec and not ev:
        return []
    rows: list[tuple[str, str, object]] = []
    small, big = rec.get("items_12k_50_callers", {}), rec.get("items_1m", {})
    if small:
        rows += [
            _recall_row("12k", ">= 0.99", small),
            (
                "rate vs no-op, 50 callers, 12k, two-stage",
                ">= 0.5",
                small.get("ratio_to_noop_two_stage"),
            ),
            ("rate vs no-op, 50 callers, 12k, exact option", "-", small.get("ratio_to_noop_exact")),
        ]
    if big:
        rows += [
            _recall_row("1e6", ">= 0.95", big),
            ("p99 ms, 50 callers, 1e6 items", "< 100", big.get("concurrent_50", {}).get("p99_ms")),
            (
                "p99 ms, 50 callers, no-op endpoint (same run, same bodies)",
                "-",
                big.get("noop_50", {}).get("p99_ms"),
            ),
            ("p99 ms, 1 caller, 1e6 items", "-", big.get("single_caller", {}).get("p99_ms")),
            (
                "server RSS MB (peak), 1e6 items",
                "< 2048",
                f"{big.get('server_memory', {}).get('rss_mb')} "
                f"({big.get('server_memory', {}).get('peak_rss_mb')})",
            ),
        ]
    if ev:
        rows += [
            (
                "evaluation of all Amazon-Video users, s (median)",
                "< 0.5 quiet",
                f"{ev.get('fast_median_s')} (previous evaluation: {ev.get('previous_median_s', '-')}"
                f", Scorer.score: {ev.get('reference_median_s')}, same run, "
                f"load {[round(x, 1) for x in ev.get('load_avg_1m', [])]})",
            ),
            ("evaluation speed-up, same run", "-", ev.get("speedup_same_run")),
            (
                "evaluation: matmul floor, s (FLOP of the tower / same-run matmul rate)",
                "-",
                f"{ev.get('matmul_floor_seconds')} ({ev.get('gflop_matmul_work')} GFLOP at "
                f"{ev.get('matmul_gflops_same_run_median')} GFLOP/s, "
                f"{ev.get('torch_threads')} threads); measured / floor: "
                f"{ev.get('fast_over_matmul_floor')}",
            ),
            (
                "evaluation: ranks / logits identical to Scorer.score",
                "yes",
                f"{ev.get('ranks_identical_to_reference', '-')} / "
                f"{ev.get('logits_identical_to_reference', '-')}",
            ),
            *(
                [
                    (
                        "evaluation with 2 torch threads (another run, "
                        f"`{ev2['command']}`), s (median)",
                        "-",
                        f"{ev2['fast_median_s']} (before: {ev2['reference_median_s']}; matmul "
                        f"floor {ev2['matmul_floor_seconds']}; load {ev2['load_avg_1m'][0]:.1f})",
                    )
                ]
                if ev2
                else []
            ),
            (
                "evaluation: max metric difference to Scorer.score (per user)",
                "0",
                ev.get("max_abs_metric_difference"),
            ),
        ]
    lines = [
        "## Serving and evaluation targets (`recommend_load.json`, `evaluation.json`)",
        "",
        "Produced by `bench/recommend_load.py` and `bench/evaluation.py` on models trained with",
        "the simulator (`bench/trained_models.py`). Rates and times come from a shared, loaded",
        "2-core machine: only the ratios within one run compare.",
        "",
        "| measure | target | measured |",
        "|---|---|---|",
    ]
    lines += [f"| {m} | {t} | {v} |" for m, t, v in rows]
    commands = [d["command"] for d in (small, big, ev) if d.get("command")]
    if commands:
        lines += ["", "Reproduce: " + "; ".join(f"`{c}`" for c in commands) + "."]
    return lines


def serving_before_after() -> list[str]:
    """Serving and evaluation figures before this revision's changes and after."""
    b, a = _load(RES / "recommend_load_before.json"), _load(RES / "recommend_load.json")
    eb, ea = _load(RES / "evaluation_before.json"), _load(RES / "evaluation.json")
    if not (b and a):
        return []
    bm, am = b.get("items_1m", {}), a.get("items_1m", {})

    def rec(m: dict[str, Any]) -> str:
        r = m.get("recall", {})
        return (
            f"{r.get('recall_at_10_mean')} / {r.get('recall_at_10_p5')} ({r.get('users')} "
            f"users; {r.get('candidates')} candidates, nprobe {r.get('nprobe', 48)})"
        )

    rows = [
        ("recall@10 vs exact at 1e6 items, mean / p5", rec(bm), rec(am)),
        (
            "p99 ms, 50 callers, 1e6 items (no-op p99 in the same run)",
            f"{bm.get('concurrent_50', {}).get('p99_ms')} (-)",
            f"{am.get('concurrent_50', {}).get('p99_ms')} ({am.get('noop_50', {}).get('p99_ms')})",
        ),
        (
            "p99 ms, 1 caller, 1e6 items",
            bm.get("single_caller", {}).get("p99_ms"),
            am.get("single_caller", {}).get("p99_ms"),
        ),
        (
            "server RSS MB after load (peak), 1e6 items",
            f"{bm.get('server_memory', {}).get('rss_mb')} "
            f"({bm.get('server_memory', {}).get('peak_rss_mb')})",
            f"{am.get('server_memory', {}).get('rss_mb')} "
            f"({am.get('server_memory', {}).get('peak_rss_mb')})",
        ),
        (
            "load average at the start of the run",
            round(bm.get("load_avg_1m_at_start", b["machine"]["load_avg_1m_at_start"]), 1),
            round(a["machine"]["load_avg_1m_at_start"], 1),
        ),
    ]
    if eb and ea:
        rows.append(
            (
                "evaluation of all Amazon-Video users, s (median; threads; load)",
                f"{eb['fast_median_s']} ({eb['torch_threads']}; {eb['load_avg_1m'][0]:.0f})",
                f"{ea['fast_median_s']} ({ea['torch_threads']}; {ea['load_avg_1m'][0]:.0f})",
            )
        )
    lines = [
        "## Serving and evaluation before / after",
        "",
        "*before*: the previous runs of the same benchmarks (`bench/results/*_before.json`); "
        "*after*: this revision (two-stage at 1e6 items: 256 IVF lists probed and at least "
        "3,000 candidates re-ranked, was 48 and 300). Different runs on a shared machine at "
        "different loads: compare the recall and the same-run ratios, not the times.",
        "",
        "| figure | before | after |",
        "|---|---|---|",
    ]
    return lines + [f"| {m} | {x} | {y} |" for m, x, y in rows]


def shortlist_recall() -> list[str]:
    """The candidate stage at 1e6 items taken apart (bench/shortlist_recall.py)."""
    d = _load(RES / "shortlist_recall.json")
    if d is None:
        return []
    m = d["model"]
    lines = [
        "## Two-stage recall at 1,000,000 items, taken apart (`bench/shortlist_recall.py`)",
        "",
        f"Model: synthetic, {m['items']:,} items, {m['rounds']} training rounds (test HR@10 "
        f"{m['test_hr@10']:.3f}); {m['items_moved_from_init']:,} items received a gradient "
        f"in training (most only as a sampled negative), "
        f"{m['items'] - m['items_moved_from_init']:,} keep their random initial vectors: the "
        f"item side stays near its random start and has no low-rank structure, the proxy "
        f"keeps {m['proxy_directions_kept']} of {m['of_directions']} principal directions (a "
        f"trained Amazon-Video model: about 30). Recall@10 against exact ranking over "
        f"{d['users']} users (mean / 5th percentile). *flat*: the proxy's exact top-n over "
        f"every item (what the proxy loses); *IVF*: the served index ({m['index']}), with its "
        f"search time per query (loaded machine). Served now: nprobe "
        f"{d['served']['nprobe']}, {d['served']['candidates']:,} candidates. Reproduce: "
        f"`{d['command']}`.",
        "",
        "| candidates | flat | " + " | ".join(f"IVF nprobe {p}" for p in (48, 128, 256)) + " |",
        "|---|---|---|---|---|",
    ]
    for n in ("300", "1000", "3000", "10000"):
        f = d["flat"].get(n)
        row = [f"{f['mean']} / {f['p5']}" if f else "-"]
        for p in (48, 128, 256):
            v = d["ivf"].get(f"nprobe{p}_{n}")
            row.append(f"{v['mean']} / {v['p5']} ({v['search_ms']} ms)" if v else "-")
        lines.append(f"| {int(n):,} | " + " | ".join(row) + " |")
    flat = d["flat"].get("10000")
    if flat:
        lines += [
            "",
            "Both stages lose: the proxy (a linear fit of the tower over item features) "
            f"reaches {flat['mean']} / {flat['p5']} only with 10,000 candidates from an exact "
            "scan of every item, and the IVF lists lose more on top (the served nprobe "
            "reads a quarter of the catalogue). The 0.95 target at 1e6 items is not met on "
            "this model; meeting it would take an exact proxy scan with about 10,000 "
            "candidates (a 1e6 x dim scan per request) or a model whose item side has "
            "structure (longer training).",
        ]
    return lines


def evaluation_before_after() -> list[str]:
    """The evaluation of all Amazon-Video users: the previous code against the current one."""
    ev, eb = _load(RES / "evaluation.json"), _load(RES / "evaluation_before.json")
    if not ev or "previous_median_s" not in ev:
        return []
    prof = ev.get("fast_profile", {})
    rows = [
        (
            "wall s, median (min)",
            f"{ev['previous_median_s']} ({min(ev['previous_seconds'])})",
            f"{ev['fast_median_s']} ({ev['fast_min_s']})",
        ),
        (
            "CPU s of the thread, median (min)",
            f"{ev['previous_cpu_median_s']} ({min(ev['previous_cpu_seconds'])})",
            f"{ev['fast_cpu_median_s']} ({min(ev['fast_cpu_seconds'])})",
        ),
        (
            "same-run speed-up (wall / CPU)",
            "",
            f"{ev['speedup_over_previous_same_run']} / {ev['speedup_over_previous_cpu_same_run']}",
        ),
        (
            "max metric difference to Scorer.score's ranks (per user)",
            ev["max_abs_metric_difference_previous"],
            ev["max_abs_metric_difference"],
        ),
    ]
    if eb:
        rows.append(
            (
                "an earlier run of the previous code on a quieter machine, s (median; load)",
                f"{eb['fast_median_s']} ({eb['load_avg_1m'][0]:.1f})",
                "",
            )
        )
    floor, gflop, rate = (
        ev["matmul_floor_seconds"],
        ev["gflop_matmul_work"],
        ev["matmul_gflops_same_run_median"],
    )
    lines = [
        "## Evaluation before / after (`bench/evaluation.py`)",
        "",
        f"All {ev['users']:,} Amazon-Video users x {ev['candidates_per_user']} candidates, "
        f"{ev['torch_threads']} torch thread(s), load average {ev['load_avg_1m'][0]:.1f} at the "
        "start of the run. *before*: the previous evaluation (batches of 512 users, new "
        "(512, 100, H) tensors per step), timed in the same run, interleaved; *after*: "
        f"chunks of {ev['chunk_pairs']} (user, candidate) pairs through buffers allocated "
        "once. Both give the per-user ranks of Scorer.score exactly (after: logits bit for bit "
        f"too, ranks identical: {ev['ranks_identical_to_reference']}).",
        "",
        "| figure | before | after |",
        "|---|---|---|",
        *[f"| {m} | {x} | {y} |" for m, x, y in rows],
        "",
        f"Arithmetic floor: the score network after its first layer's item half (precomputed "
        f"per item) costs {gflop} GFLOP for these pairs (2 per multiply-add: the hidden layers "
        f"and the predict layer); at the same run's dense matmul rate ({rate} GFLOP/s, 1024^3) "
        f"that is {floor} s, so the evaluation runs at {ev['fast_fraction_of_matmul_rate']} of "
        f"that rate. Profile of one evaluation (shares of its wall time): matrix products "
        f"{prof.get('matmul_share')} (at {prof.get('matmul_gflops_inside')} GFLOP/s inside), "
        f"gathers of the item rows {prof.get('gather_share')}, other torch ops (the GMF "
        f"product, the first layer's sum, ReLUs, ranks) {prof.get('other_torch_ops_share')}, "
        f"outside torch ops (Python, dispatch) {prof.get('outside_torch_ops_share')}.",
    ]
    return lines
