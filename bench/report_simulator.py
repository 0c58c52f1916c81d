"""RESULTS sections of the simulator's roofline, memory and scaling benchmarks.

Used by ``bench/report.py``; every figure comes from a JSON under bench/results/.
"""

from __future__ import annotations

from typing import Any

from bench.report_common import as_module, load_result


def roofline() -> list[str]:
    """The achieved fraction of the matmul rate and the speed-up over the per-client loop."""
    rf = load_result("roofline.json")
    if rf is None:
        return []
    ft = rf["filmtrust"]
    lines = [
        "## Simulator against the arithmetic floor (`bench/roofline.py`)",
        "",
        f"FilmTrust, default settings: {ft['clients_per_round']} clients a round, "
        f"{ft['samples_per_round_mean']:.0f} samples, {ft['rounds']} rounds; "
        f"{rf['machine']['threads']} torch threads{_load_note(rf)}. Analytic work of a round (2 FLOP per "
        f"multiply-add, the actual samples, no padding): *full* = forward and backward of "
        f"every pass {ft['gflop_per_round_full_mean']:.2f} GFLOP; *needed* = only the "
        f"gradients each pass's result depends on, pass 1's first-layer item half reused "
        f"{ft['gflop_per_round_needed_mean']:.2f} GFLOP. The matmul rate is torch's float32 "
        f"1024x1024 product with the same threads, probed between the rounds of the same run "
        f"(median {ft['matmul_gflops_median']:.1f} GFLOP/s). A round is client samples, the "
        "three passes, aggregation and the server step (no evaluation).",
        "",
        "| client path | s / round (median) | GFLOP/s (full) | fraction of matmul (full) "
        "| fraction (needed) | best round, fraction (full) | x per-client loop (same rounds) |",
        "|---|---|---|---|---|---|---|",
    ]
    native = ft.get("native_kernels", False)
    names = {
        "aggregate": "aggregate, native kernels (simulator default)"
        if native
        else "aggregate inside the backward (simulator default)",
        "aggregate_torch_ops": "aggregate, torch ops (`FEDREC_NATIVE=0`)",
        "per_client": "per-client uploads (worker path; bit-identity tests)",
    }
    for key, label in names.items():
        if key not in ft:
            continue
        p = ft[key]
        lines.append(
            f"| {label} | {p['s_per_round_median']:.3f} | {p['gflops_full_median']:.1f} | "
            f"{p['fraction_of_matmul_full']:.2f} | {p['fraction_of_matmul_needed']:.2f} | "
            f"{p.get('fraction_of_matmul_full_best', float('nan')):.2f} | "
            f"{p.get('speedup_vs_loop', float('nan')):.1f}x |"
        )
    if "per_client_loop_s_per_round_median" in ft:
        lines.append(
            f"| per-client loop (`fedrecgel/reference.py`) | "
            f"{ft['per_client_loop_s_per_round_median']:.3f} | | | | | 1.0x |"
        )
    ratio = ft["aggregate"].get("torch_ops_over_native_per_round_median")
    if native and ratio:
        lines += [
            "",
            "The aggregate path's client step runs on the native kernels "
            "(`fedrecgel/native/sam_kernels.cpp`: the three passes one client at a time, its "
            "activations kept in the core's cache, the elementwise work as loops over them, "
            "only the products calling the BLAS). The same rounds on torch ops, interleaved: "
            f"a round on torch ops takes {ratio:.2f}x the native one (median of the per-round "
            "ratios).",
        ]
    lines += [
        "",
        f"Targets: >= {ft['targets']['fraction_of_matmul']:.0%} of the matmul rate, >= "
        f"{ft['targets']['speedup_vs_loop']:.0f}x the per-client loop. Reproduce: "
        f"`{as_module(rf.get('command', 'OMP_NUM_THREADS=1 .venv/bin/python -m bench.roofline --threads 1'))}`"
        " (a shared 2-core machine: only the same-run ratios carry over; *best round*: the "
        "fastest round's rate over the fastest matmul probe of the run, the least disturbed "
        "pair).",
    ]
    lines += _floor_lines(ft)
    lines += _other_machine(ft)
    pr = ft.get("aggregate_round_profile")
    if pr:
        others = ", ".join(f"`{o['op']}` {o['share']:.0%}" for o in pr["top_other_ops"][:5])
        lines += [
            "",
            f"Where the round's own time goes (one more aggregate round under torch's profiler, "
            f"which slows it; read the shares): the matrix products "
            f"{pr['matmul_share']:.0%} of the round, at "
            f"{pr['matmul_gflops_inside_round']:.1f} GFLOP/s inside it "
            f"({pr['matmul_rate_inside_round_over_probe']:.2f} of the probed 1024x1024 rate); "
            f"every other op {pr['other_torch_ops_share']:.0%} (elementwise work, "
            f"gathers, index adds and the native kernel's own loops: {others}); outside the ops "
            f"{pr['outside_torch_ops_share']:.0%}: Python and numpy (drawing the clients' "
            f"samples alone: {pr['client_sampling_s_unprofiled']:.3f} s of the "
            f"{pr['wall_s']:.2f} s round).",
        ]
    return lines


def _other_machine(ft: dict[str, Any]) -> list[str]:
    """The same benchmark of the previous revision on another machine of the same size
    (``roofline_other_machine.json``): how the fraction moves with the CPU's matmul rate."""
    om = load_result("roofline_other_machine.json")
    if om is None:
        return []
    o, a = om["filmtrust"], ft
    oa, na = o["aggregate"], a.get("aggregate_torch_ops") or a["aggregate"]
    ofl, nfl = o.get("floor", {}), a.get("floor", {})
    return [
        "",
        "The same benchmark of an earlier revision (torch ops only) on another machine of this size "
        f"(`roofline_other_machine.json`): 1024x1024 rate {o['matmul_gflops_median']:.0f} "
        f"GFLOP/s there, {a['matmul_gflops_median']:.0f} GFLOP/s here (a CPU with AVX-512 and "
        f"AMX); products at the round's shapes {ofl.get('products_s_median', float('nan')):.3f}"
        f" s there, {nfl.get('products_s_median', float('nan')):.3f} s here; the round "
        f"{oa['s_per_round_median']:.3f} s there, {na['s_per_round_median']:.3f} s here "
        "(on torch ops); "
        f"fraction of the matmul rate {oa['fraction_of_matmul_full']:.2f} there, "
        f"{na['fraction_of_matmul_full']:.2f} here; copy bandwidth "
        f"{o['bandwidth_gbs_median']:.1f} and {a['bandwidth_gbs_median']:.1f} GB/s. The "
        "faster products did not make that revision's round faster: its time was the "
        "elementwise passes, gathers and index adds (bound by memory, which is no faster "
        "here) and the Python around them, so on torch ops the fraction of the matmul rate "
        "falls as the matmul rate rises.",
    ]


def _load_note(rf: dict[str, Any]) -> str:
    """The machine's load average around the run, when recorded."""
    la = rf["machine"].get("loadavg_1min")
    return f" (1-minute load average {la[0]:.1f} before, {la[1]:.1f} after, 2 cores)" if la else ""


def _floor_lines(ft: dict[str, Any]) -> list[str]:
    """The attainable floor of a round: its products at their shapes plus its unavoidable
    bytes at the measured bandwidth (``bench/roofline_floor.py``)."""
    fl = ft.get("floor")
    if fl is None:
        return []
    agg = ft["aggregate"]
    native = ft.get("native_kernels", False)
    native_label = ", native kernels" if native else ""
    half = ft["gflop_per_round_full_mean"] / (0.5 * ft["matmul_gflops_median"])
    tops = ft.get("aggregate_torch_ops")
    torch_row = (
        [
            f"| the round, aggregate path on torch ops | | {tops['s_per_round_median']:.3f} | "
            f"{tops['fraction_of_matmul_full']:.2f} of that rate; "
            f"{fl['attainable_s_median'] / tops['s_per_round_median']:.2f} of the floor "
            "(medians) |"
        ]
        if native and tops
        else []
    )
    native_reading = (
        "The native kernels keep each client's activations in the core's cache through its "
        "three passes, so the elementwise work that ran as separate passes over the whole "
        "group's activations on torch ops is now loops over data already in cache. What is "
        "left beyond the floor: the kernels run passes 1 and 3 per client too (at the "
        "per-client products' rate rather than the group's, for the sake of the cache), the "
        "call around each of some 2,700 small products a round, the item tables' index adds "
        "and the layout in torch and numpy, and drawing the clients' samples in numpy."
    )
    torch_reading = (
        "The round's time beyond the floor is the elementwise work done as separate passes "
        "over the (samples x width) activations (bias, ReLU and its mask, loss terms, gathers "
        "into per-sample rows, index adds), the Python around some 1,100 per-client products "
        "a round, and drawing the clients' samples in numpy."
    )
    parts = ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in fl["bytes_mb_by_part"].items())
    return [
        "",
        "The attainable floor, measured in the same run: every matrix product of the round's "
        "client step replayed alone at its actual shape on random tensors (the same groups of "
        "clients, each product the best of 3), and the bytes the round must move outside its "
        "products even with every bias, ReLU, mask and loss term fused into them, at the "
        f"bandwidth of a large float32 copy (median {ft['bandwidth_gbs_median']:.1f} GB/s, "
        "read + write, same thread count).",
        "",
        "| part of a round | work | seconds (median) | rate |",
        "|---|---|---|---|",
        f"| products over all of a group's samples (passes 1 and 3, pass 2's weight "
        f"gradients) | {fl['batched_products_gflop_mean']:.2f} GFLOP | | "
        f"{fl['batched_products_gflops']:.1f} GFLOP/s |",
        f"| products per client, ~{ft['samples_per_round_mean'] / ft['clients_per_round']:.0f}"
        f" rows each (pass 1's weight gradients, pass 2's forward and input gradients) | "
        f"{fl['per_client_products_gflop_mean']:.2f} GFLOP | | "
        f"{fl['per_client_products_gflops']:.1f} GFLOP/s |",
        f"| all products | {fl['products_gflop_mean']:.2f} GFLOP | "
        f"{fl['products_s_median']:.3f} | |",
        f"| unavoidable memory traffic ({parts} MB) | {fl['bytes_mb_mean']:.0f} MB | "
        f"{fl['bytes_s_median']:.3f} | {ft['bandwidth_gbs_median']:.1f} GB/s |",
        f"| **attainable round** | | **{fl['attainable_s_median']:.3f}** | "
        f"{fl['attainable_fraction_of_matmul_full']:.2f} of the 1024x1024 rate (full count) |",
        f"| the round, aggregate path{native_label} | | {agg['s_per_round_median']:.3f} | "
        f"{agg['fraction_of_matmul_full']:.2f} of that rate; "
        f"**{fl['achieved_fraction_of_attainable']:.2f} of the attainable floor** |",
        *torch_row,
        "",
        "Reading: alone and at their shapes, the products run at "
        f"{fl['batched_products_gflops']:.0f} GFLOP/s over a group's samples and "
        f"{fl['per_client_products_gflops']:.0f} GFLOP/s per client "
        f"({fl['per_client_products_gflop_mean'] / fl['products_gflop_mean']:.0%} of the "
        "products' FLOPs are per client: in pass 2 every client has its own perturbed score "
        "network), so a round doing nothing but its products and its unavoidable traffic "
        f"would reach {fl['attainable_fraction_of_matmul_full']:.2f} of the 1024x1024 rate "
        f"(counting the full {ft['gflop_per_round_full_mean']:.2f} GFLOP); half the rate is "
        f"a round of {half:.3f} s, {half / fl['attainable_s_median']:.2f}x the floor. "
        + (native_reading if native else torch_reading),
        *_compile_lines(),
        *_compile_dynamic_lines(),
        *_allocator_lines(),
    ]


def _allocator_lines() -> list[str]:
    """The client step's raised malloc thresholds against glibc's defaults
    (``bench/allocator.py``)."""
    al = load_result("allocator.json")
    if al is None:
        return []
    d, k = al["summary"]["default"], al["summary"]["kept"]
    faults = [r["faults_median"] for r in al["runs"]["default"]]
    ratios = al["kept_over_default_cpu_ratios"]
    faster = sum(r < 1.0 for r in ratios)
    how = "at the same time on the two cores" if al.get("children_together") else "in turn"
    return [
        "",
        "Page faults (`bench/allocator.py`, each side in its own process, "
        f"{al['pairs']} pairs of {al['rounds']} default rounds run {how}). A round frees and "
        "allocates again the same tens of MB, and with glibc's default thresholds part of it "
        "comes back as fresh pages: "
        f"{d['faults_per_round_median']:,.0f} page faults a round (median; from "
        f"{min(faults):,.0f} to {max(faults):,.0f} across processes, as the heap happens to be "
        "laid out). The client step now raises malloc's mmap and trim thresholds once per "
        f"process (`fedrecgel/allocator.py`): {k['faults_per_round_median']:,.0f} faults a "
        f"round, peak RSS {k['peak_rss_mb_max']:.0f} MB against {d['peak_rss_mb_max']:.0f} MB, "
        f"thread CPU a round {k['cpu_s_per_round_median']:.3f} s against "
        f"{d['cpu_s_per_round_median']:.3f} s; per-pair ratio median "
        f"{al['kept_over_default_cpu_ratio_median']:.2f}, faster in {faster} of "
        f"{len(ratios)} pairs (ratios from {min(ratios):.2f} to {max(ratios):.2f}: a small "
        "gain against this machine's noise; 1-minute load average "
        f"{al['load_avg'][0]:.1f} at the end, other jobs running). Reproduce: "
        f"`{as_module(al['command'])}`.",
    ]


def _compile_lines() -> list[str]:
    """What ``torch.compile`` gave on pass 3 (``bench/roofline_compile.py``)."""
    tc = load_result("roofline_compile.json")
    if tc is None:
        return []
    return [
        "",
        f"`torch.compile` (inductor, CPU) on pass 3 of one group ({tc['samples']:,} samples, "
        f"{tc['clients']} clients; the batched pass, written as one function and compiled for "
        f"that fixed shape): {tc['compiled_ms_best']:.1f} ms against "
        f"{tc['eager_ms_best']:.1f} ms for the eager pass (best of the interleaved repeats; "
        f"medians {tc['compiled_ms_median']:.1f} and {tc['eager_ms_median']:.1f}), for "
        f"{tc['compile_s']:.0f} s of compiling (inductor's on-disk cache may have been warm). "
        "A round has two or three such groups and every group of every round has its own "
        "sample count, so a fixed-shape compile is paid again each time: the few "
        "milliseconds a round do not pay for it, and the compiled path is not used. "
        f"Reproduce: `{as_module(tc['command'])}`.",
    ]


#: the issue's rule: the C++ kernels stay only while they are at least this much faster
NATIVE_KEEP_RATIO = 1.3


def _compile_dynamic_lines() -> list[str]:
    """``torch.compile(dynamic=True)`` of the torch client step against the native kernels
    (``bench/compile_dynamic.py``)."""
    cd = load_result("compile_dynamic.json")
    if cd is None:
        return []
    ratio = cd["compiled_over_native_median"]
    dyn = cd["dynamo"]
    diff = cd["max_abs_difference_from_native"]
    if not cd["native_kernels"]:
        verdict = "the native kernels were not built in that run: no verdict"
    elif ratio >= NATIVE_KEEP_RATIO:
        verdict = (
            f"the C++ kernels are {ratio:.2f}x faster than the compiled torch step, at least "
            f"the {NATIVE_KEEP_RATIO}x that keeps them"
        )
    else:
        verdict = (
            f"the C++ kernels are only {ratio:.2f}x faster than the compiled torch step, under "
            f"the {NATIVE_KEEP_RATIO}x that would keep them: the measurement says remove them"
        )
    return [
        "",
        f"`torch.compile(dynamic=True)` (inductor, CPU) of the whole torch client step "
        f"(`fedrecgel.sam.layout_step`: the three SAM passes of a group on a ready layout, "
        f"handed to the compiler once, with symbolic shapes) against the C++ kernels, on the same "
        f"default FilmTrust rounds ({cd['clients_per_round']} clients a round, aggregate path), "
        f"interleaved round by round, {cd['threads']} threads: median "
        f"{cd['native_s_per_round_median']:.3f} s a round on the C++ kernels, "
        f"{cd['compiled_s_per_round_median']:.3f} s compiled, "
        f"{cd['eager_s_per_round_median']:.3f} s eager (over {cd['rounds']} rounds after "
        f"{cd['warmup_rounds']} of warm-up, which took {cd['warmup_s']['compiled']:.0f} s "
        f"compiled with the compiling, {cd['warmup_s']['native']:.1f} s native). Per round, "
        f"compiled over native {ratio:.2f}x, eager over native "
        f"{cd['eager_over_native_median']:.2f}x, eager over compiled "
        f"{cd['eager_over_compiled_median']:.2f}x (medians of the per-round ratios). Dynamo: "
        f"{dyn['frames_compiled']} graphs, {dyn['graph_breaks']} graph breaks (values read "
        f"back from tensors as Python numbers), at most {dyn['recompile_limit']} compiles a "
        f"frame (a frame past it runs eagerly). After the same rounds the parameters differ from "
        f"the native run's by at most {diff['compiled']:.1e} (compiled) and "
        f"{diff['eager']:.1e} (eager). So {verdict}. Reproduce: `{as_module(cd['command'])}`.",
    ]


def memory() -> list[str]:
    """Peak RSS per case, each in its own process."""
    mem = load_result("memory.json")
    if not mem:
        return []
    before = load_result("memory_before.json") or {}
    lines = [
        "## Simulator memory (`bench/memory.py`)",
        "",
        "Peak RSS (`ru_maxrss`) of a child process per case, data included. *before*: the same "
        "case run by the batched client step this replaced (padded groups, autograd), where "
        "measured. Reproduce: `OMP_NUM_THREADS=1 .venv/bin/python -m bench.memory --only "
        "filmtrust-all --rounds 100` and `... --only synthetic-1e6x1e5 --scale-rounds 2`.",
        "",
        "| case | clients / round | rounds | peak RSS | after loading data | s / round "
        "(median) | before | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, m in mem.items():
        if "error" in m:
            lines.append(f"| {case} | failed: {' '.join(m['error'])[:120]} | | | | | | |")
            continue
        secs = sorted(m["seconds_per_round"])
        b = before.get(case, {})
        target = m.get("target_peak_mb")
        old = f"{b['peak_rss_mb']:.0f} MB" if "peak_rss_mb" in b else "-"
        lines.append(
            f"| {case} | {m['clients_per_round']:,} | {m['rounds']} | {m['peak_rss_mb']:.0f} MB | "
            f"{m['peak_rss_mb_after_data']:.0f} MB | {secs[len(secs) // 2]:.2f} | "
            f"{old} | "
            f"{f'<= {target} MB' if target else '-'} |"
        )
    return lines


def scaling() -> list[str]:
    """Seconds per round against clients and against items."""
    sc = load_result("scaling.json")
    if not sc:
        return []
    lines = [
        "## Simulator scaling (`bench/scaling.py`)",
        "",
        "Synthetic data, default model and client path, one child process per point, the "
        "clients' private state created before the timed round. Plots: "
        "`docs/scaling_clients.png`, `docs/scaling_items.png`. Reproduce: "
        f"`OMP_NUM_THREADS=1 .venv/bin/{as_module(sc.get('command', 'python -m bench.scaling'))}` "
        "(a point over `--point-timeout` is reported as capped and the larger points of its "
        "sweep are skipped).",
        "",
        "| sweep | users | items | clients | samples | s / round | server step s | us / sample |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sweep in ("clients", "items"):
        for p in sc.get(sweep, []):
            if "error" in p:
                what = "" if "capped_s" in p else "failed: "
                lines.append(
                    f"| {sweep} | {p['users']:,} | {p['items']:,} | {p['clients']:,} | "
                    f"{what}{p['error'][:100]} | | | |"
                )
                continue
            lines.append(
                f"| {sweep} | {p['users']:,} | {p['items']:,} | {p['clients']:,} | "
                f"{p['samples']:,} | {p['seconds_per_round']:.3f} | "
                f"{p['server_step_seconds']:.3f} | "
                f"{1e6 * p['seconds_per_round'] / max(p['samples'], 1):.1f} |"
            )
    items = [p for p in sc.get("items", []) if "error" not in p]
    if len(items) >= 2:
        a, b = items[0], items[-1]
        client_a = a["seconds_per_round"] - a["server_step_seconds"]
        client_b = b["seconds_per_round"] - b["server_step_seconds"]
        lines += [
            "",
            f"Where it stops being linear: at a fixed cohort the clients' part of a round "
            f"({client_a:.1f} s at {a['items']:,} items, {client_b:.1f} s at {b['items']:,}) "
            "does not grow with the catalogue (a client touches only its own samples' rows), "
            f"but the server step does: {a['server_step_seconds']:.3f} s at {a['items']:,} "
            f"items, {b['server_step_seconds']:.1f} s at {b['items']:,} "
            f"({b['server_step_seconds'] / b['seconds_per_round']:.0%} of the round): the "
            "server's optimizer updates every row of the item tables each round (dense Adam "
            "moments), linear in the catalogue.",
        ]
    cl = [p for p in sc.get("clients", []) if "error" not in p]
    if len(cl) >= 2:
        a, b = cl[0], cl[-1]

        def per(p: dict[str, Any]) -> float:
            return float(1e6 * p["seconds_per_round"] / max(p["samples"], 1))

        lines += [
            "",
            f"Against clients per round the cost grows with the samples and no faster: "
            f"{per(a):.0f} us a sample at {a['clients']:,} clients, {per(b):.0f} at "
            f"{b['clients']:,} (fixed costs of a round and of each group of clients spread "
            "over more samples). The machine is shared: a point is only as steady as its load.",
        ]
    return lines


def before_after() -> list[str]:
    """The simulator's figures before and after the hand-written passes."""
    old = load_result("simulator_before.json")
    rf = load_result("roofline.json")
    sp = load_result("speed.json")
    if old is None or rf is None:
        return []
    ft = rf["filmtrust"]
    o = old["filmtrust"]
    lines = [
        "## Simulator before / after",
        "",
        "*before*: `bench/results/simulator_before.json`, the last run of `bench/speed.py` with "
        "the padded autograd client step; *after*: this revision. Each speed-up is a same-run "
        "ratio against the unchanged per-client loop.",
        "",
        "| figure | before | after |",
        "|---|---|---|",
        f"| FilmTrust round, x per-client loop (same run) | {o['speedup']:.1f}x | "
        f"{ft['aggregate'].get('speedup_vs_loop', float('nan')):.1f}x (aggregate path), "
        f"{ft['per_client'].get('speedup_vs_loop', float('nan')):.1f}x (per-client uploads) |",
    ]
    prev = load_result("roofline_before.json")
    if prev is not None:  # the hand-written passes before the elementwise and Python work
        pa, na = prev["filmtrust"]["aggregate"], ft["aggregate"]
        lines += [
            "| aggregate round before the fused ReLU masks, single-pass norms and perturbations "
            "(`roofline_before.json`) vs now: fraction of the same-run 1024x1024 matmul rate "
            f"({prev['filmtrust']['matmul_gflops_median']:.0f} GFLOP/s then, "
            f"{ft['matmul_gflops_median']:.0f} now: not the same machine) | "
            f"{pa['fraction_of_matmul_full']:.2f} | {na['fraction_of_matmul_full']:.2f} |",
            "| same, x per-client loop (same run) | "
            f"{pa.get('speedup_vs_loop', float('nan')):.1f}x | "
            f"{na.get('speedup_vs_loop', float('nan')):.1f}x |",
        ]
    if sp is not None:
        agree = sp["filmtrust"].get("upload_agreement_round_1")
        if agree:
            lines.append(
                "| uploads vs per-client loop, round 1, max over clients of "
                "`||a-b|| / ||b||` (whole upload) | - | "
                f"{agree['max_rel_to_upload_norm']:.1e} |"
            )
            old_m = agree["old_metric_max_abs_over_max_abs"]
            lines.append(
                "| the earlier metric (`max|a-b| / max|b|` per tensor), worst case | "
                f"{o['max_rel_upload_difference_round_1']:.1e} | {old_m['value']:.1e} "
                f"({old_m['tensor']}, a tensor {old_m['tensor_norm_over_upload_norm']:.1e} of "
                "its upload's norm) |"
            )
    mem, mem_old = load_result("memory.json") or {}, load_result("memory_before.json") or {}
    for case in ("filmtrust-all", "synthetic-1e6x1e5"):
        a, b = mem.get(case, {}), mem_old.get(case, {})
        if "peak_rss_mb" in a:
            before = f"{b['peak_rss_mb']:.0f} MB" if "peak_rss_mb" in b else "-"
            lines.append(f"| peak RSS, {case} | {before} | {a['peak_rss_mb']:.0f} MB |")
    return lines
