"""RESULTS sections of the recommendation API and evaluation benchmarks.

Used by ``bench/report.py``; every figure comes from a JSON under bench/results/.
"""

from __future__ import annotations

from typing import Any

from bench.report_common import RES, as_module, load_result


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
    rec = load_result(RES / "recommend_load.json") or {}
    ev = load_result(RES / "evaluation.json") or {}
    ev2 = load_result(RES / "evaluation_threads2.json")
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
                        f"`{as_module(ev2['command'])}`"
                        f"{'' if 'previous_median_s' in ev2 else ', the evaluation before chunks'}"
                        "), s (median)",
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
        "Produced by `python -m bench.recommend_load` and `python -m bench.evaluation` on models",
        "trained with the simulator (`python -m bench.trained_models`). Rates and times come from",
        "a shared, loaded 2-core machine: only the ratios within one run compare.",
        "",
        "| measure | target | measured |",
        "|---|---|---|",
    ]
    lines += [f"| {m} | {t} | {v} |" for m, t, v in rows]
    lines += _p99_limit(big, rec.get("machine", {}).get("cpus"))
    commands = [d["command"] for d in (small, big, ev) if d.get("command")]
    if commands:
        lines += ["", "Reproduce: " + "; ".join(f"`{as_module(c)}`" for c in commands) + "."]
    return lines


def _p99_limit(big: dict[str, Any], cpus: int | None) -> list[str]:
    """Why p99 < 100 ms with 50 callers at 1e6 items cannot be met here (Little's law)."""
    noop, conc = big.get("noop_50", {}), big.get("concurrent_50", {})
    r = big.get("recall", {})
    ms = r.get("two_stage_ms_per_request")
    if not (noop.get("p99_ms") and conc.get("p99_ms") and ms and cpus):
        return []
    n = conc.get("callers", 50)
    rate = cpus * 1000.0 / ms  # requests a second if every core did nothing else
    need_ms = cpus * 100.0 / n  # CPU per request that 50 callers within 100 ms allow
    return [
        "",
        f"Why p99 < 100 ms with {n} callers at 1e6 items is out of reach on this machine: in a "
        f"closed loop of {n} callers the mean latency is {n} / throughput (Little's law), and "
        f"the throughput is at most {cpus} cores / CPU time per request. One two-stage request "
        f"({r.get('candidate_stage')}, {r.get('candidates')} candidates, recall above) costs "
        f"{ms} ms of one core in process (exact ranking: {r.get('exact_ms_per_request')} ms, "
        f"same run), so the server cannot exceed {rate:.1f} requests a second and the mean "
        f"latency cannot fall below {n / rate * 1000:.0f} ms, whatever the scheduling. Under "
        f"100 ms the {n} callers would need at most {need_ms:.0f} ms of CPU per request, "
        f"{ms / need_ms:.0f} times less than the candidate stage that reaches the recall "
        "target (it reads the first-layer and GMF item tables once per request). Serving "
        "concurrent requests from one scan would share the reading of the tables, not the "
        "per-user work (an add, a ReLU and a product over every item's first-layer row); the "
        "cheaper IVF candidates lose the recall (the table below). Measured: "
        f"{conc.get('req_per_s')} requests a second and p99 {conc['p99_ms']:.0f} ms (p50 "
        f"{conc.get('p50_ms', 0):.0f} ms); the no-op endpoint with the same callers and bodies "
        f"answered {noop.get('req_per_s')} a second with p99 {noop['p99_ms']:.0f} ms in the "
        "same run, the machine's load included.",
    ]


def serving_before_after() -> list[str]:
    """Serving and evaluation figures before this revision's changes and after."""
    b, a = load_result(RES / "recommend_load_before.json"), load_result(RES / "recommend_load.json")
    eb, ea = load_result(RES / "evaluation_before.json"), load_result(RES / "evaluation.json")
    if not (b and a):
        return []
    bm, am = b.get("items_1m", {}), a.get("items_1m", {})

    def rec(m: dict[str, Any]) -> str:
        r = m.get("recall", {})
        stage = r.get("candidate_stage", "ivf")
        how = f"IVF nprobe {r.get('nprobe', 48)}" if stage == "ivf" else f"{stage}"
        return (
            f"{r.get('recall_at_10_mean')} / {r.get('recall_at_10_p5')} ({r.get('users')} "
            f"users; {r.get('candidates')} candidates, {how})"
        )

    rows = [
        ("recall@10 vs exact at 1e6 items, mean / p5", rec(bm), rec(am)),
        (
            "two-stage ms per request in process, 1e6 items (exact in the same run)",
            f"{bm.get('recall', {}).get('two_stage_ms_per_request')} "
            f"({bm.get('recall', {}).get('exact_ms_per_request')})",
            f"{am.get('recall', {}).get('two_stage_ms_per_request')} "
            f"({am.get('recall', {}).get('exact_ms_per_request')})",
        ),
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
        "*after*: this revision (two-stage at 1e6 items: candidates from a per-request scan "
        "of the item tables with a proxy exact in the first tower layer, 10,000 re-ranked; "
        "was an IVF index over the `[b, |b|]` proxy, 256 lists probed, 3,000 re-ranked; the "
        "item MLP table becomes its first-layer half in place while loading, and the scan "
        "needs no index memory). Different runs on a shared machine at different loads: "
        "compare the recall, the memory and the same-run ratios, not the times.",
        "",
        "| figure | before | after |",
        "|---|---|---|",
    ]
    return lines + [f"| {m} | {x} | {y} |" for m, x, y in rows]


def shortlist_recall() -> list[str]:
    """The candidate stage at 1e6 items taken apart (bench/shortlist_recall.py)."""
    d = load_result(RES / "shortlist_recall.json")
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
        f"item side stays near its random start and has no low-rank structure, the `[b, |b|]` "
        f"proxy keeps {m['proxy_directions_kept']} of {m['of_directions']} principal "
        f"directions (a trained Amazon-Video model: about 30). Recall@10 against exact ranking "
        f"over {d['users']} users (mean / 5th percentile). *flat*: the exact top-n of the "
        "`[b, |b|]` proxy over every item (what that proxy loses); *IVF*: that proxy in an IVF "
        "index (IndexIVFScalarQuantizer), with its search time per query; *scan*: the top-n of "
        "the per-request scan of the item tables, whose proxy is exact in the first tower layer "
        "and linear in the deeper ones (`ScanShortlist`). Load average "
        f"{d.get('load_avg_1m_at_start')} at the start: times compare within the run only. "
        f"Reproduce: `{as_module(d['command'])}`.",
        "",
        "| candidates | flat | "
        + " | ".join(f"IVF nprobe {p}" for p in (48, 128, 256))
        + " | scan |",
        "|---|---|---|---|---|---|",
    ]
    for n in ("300", "1000", "3000", "10000", "30000"):
        f = d["flat"].get(n)
        row = [f"{f['mean']} / {f['p5']}" if f else "-"]
        for p in (48, 128, 256):
            v = d["ivf"].get(f"nprobe{p}_{n}")
            row.append(f"{v['mean']} / {v['p5']} ({v['search_ms']} ms)" if v else "-")
        sc = d.get("scan", {}).get(n)
        row.append(f"{sc['mean']} / {sc['p5']}" if sc else "-")
        lines.append(f"| {int(n):,} | " + " | ".join(row) + " |")
    req, served = d.get("request_ms_one_thread"), d.get("served", {})
    scan10 = d.get("scan", {}).get("10000")
    flat = d["flat"].get("10000")
    if req and scan10 and flat:
        ivf, sc, parts = req["ivf"], req["scan"], req["scan_parts"]
        lines += [
            "",
            "Whole two-stage request (candidates and exact re-rank, k = 10, one thread, 10 "
            "users, two passes in the same run): IVF nprobe "
            f"{ivf['nprobe']} with {ivf['candidates']:,} candidates "
            f"{' / '.join(str(x) for x in ivf['ms'])} ms; scan with {sc['candidates']:,} "
            f"candidates {' / '.join(str(x) for x in sc['ms'])} ms (fit "
            f"{parts['fit_ms']} ms, fit and scan {parts['fit_and_scan_ms']} ms, top-n "
            f"{parts['top_n_ms']} ms, re-rank {parts['rerank_ms']} ms).",
            "",
            "The IVF lists cannot reach the target: they only lose on top of their proxy, which "
            f"reaches {flat['mean']} / {flat['p5']} with 10,000 candidates even when every item "
            "is scanned, and scanning every list reads four times the vectors of the served "
            "nprobe (256 of about 1,000 lists). The "
            f"scan reaches {scan10['mean']} / {scan10['p5']} with 10,000 candidates at a cost "
            "of the same order as IVF at nprobe 256: it reads the first-layer and GMF tables "
            "once per request (about 0.6 GB at 1e6 items, add, ReLU and a matrix-vector "
            "product), memory the exact re-rank holds anyway, so the server needs no index "
            f"memory. Served: `{served.get('index')}`, which is the scan at 1e6 items "
            f"({served.get('scan_candidates'):,} candidates, {served.get('fit_samples')} fit "
            "samples); a faiss flat index up to 200,000 items; IVF by setting "
            "(`FEDREC_REC_ANN_INDEX`).",
        ]
    return lines


def evaluation_before_after() -> list[str]:
    """The evaluation of all Amazon-Video users: the previous code against the current one."""
    ev, eb = load_result(RES / "evaluation.json"), load_result(RES / "evaluation_before.json")
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
        f"chunks of {ev['chunk_pairs']} (user, candidate) pairs, item rows gathered as "
        "one-row embedding bags (FBGEMM), the layers' outputs in buffers allocated once. "
        "Both give the per-user ranks of Scorer.score exactly (ranks identical: "
        f"{ev['ranks_identical_to_reference']}; after: the same logits too, "
        f"{ev['logits_identical_to_reference']}).",
        "",
        "| figure | before | after |",
        "|---|---|---|",
        *[f"| {m} | {x} | {y} |" for m, x, y in rows],
        "",
        f"Arithmetic floor: the score network after its first layer's item half (precomputed "
        f"per item) costs {gflop} GFLOP for these pairs (2 per multiply-add: the hidden layers "
        f"and the predict layer); at the same run's dense matmul rate ({rate} GFLOP/s, 1024^3) "
        f"that is {floor} s, so the evaluation runs at {ev['fast_fraction_of_matmul_rate']} of "
        f"that rate. Profile of one evaluation (one run under the profiler, which adds "
        "overhead, at the load of the moment; shares of its wall time): matrix products "
        f"{prof.get('matmul_share')} (at {prof.get('matmul_gflops_inside')} GFLOP/s inside), "
        f"gathers of the item rows {prof.get('gather_share')}, other torch ops (the GMF "
        f"product, the first layer's sum, ReLUs, ranks) {prof.get('other_torch_ops_share')}, "
        f"outside torch ops (Python, dispatch) {prof.get('outside_torch_ops_share')}.",
        "",
        f"Target: < {ev['target_seconds_quiet_machine']} s on a quiet machine: "
        f"{'met' if ev['fast_median_s'] < ev['target_seconds_quiet_machine'] else 'not met'} "
        f"by this run's median ({ev['fast_median_s']} s; best {ev['fast_min_s']} s), at load "
        f"{ev['load_avg_1m'][0]:.1f}, where the wall time is "
        f"{ev['fast_median_s'] / ev['fast_cpu_median_s']:.2f}x the thread's CPU time (1 when "
        "the process never waits for a core; the other processes' use of the shared caches "
        "is in both). What is left above the matmul floor is memory-bound: gathering 160 "
        "floats per (user, candidate) pair from the item tables (a random row of a 7.5 MB "
        "table each, beyond the core's 1 MB L2), the GMF product, the first layer's sum, the "
        "ReLUs and the bias copies of the products, each a pass over a chunk's activations; "
        "no rearrangement with torch ops that keeps the numbers removes those passes (fusing "
        "them needs a custom kernel).",
    ]
    return lines
