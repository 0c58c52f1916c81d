"""The simulator's round against the arithmetic floor of this machine, measured in one run.

    .venv/bin/python -m bench.roofline [--rounds 5] [--loop-rounds 2] [--threads N]

For a default FilmTrust round (fraction 0.1) it counts the floating-point work analytically
(:func:`round_flops`: the multiply-adds of the three SAM passes for the actual samples, no
padding), times the round (client samples, the three passes, aggregation, server step; no
evaluation) in its client paths (the aggregate path the simulator uses by default, on the
native kernels of :mod:`fedrecgel.native` when they are built and again on torch ops, and the
per-client uploads a worker builds), and in the same run, interleaved with the rounds,
torch's dense float32 matmul rate with the same thread count, and the plain per-client loop
(:mod:`fedrecgel.reference`) on the same cohorts. Each round's attainable floor is measured
alongside (:mod:`roofline_floor`): its matrix products replayed alone at their actual shapes,
plus the bytes it must move outside them at the bandwidth of a large copy. The machine is
shared: every figure that matters is a ratio of two things measured side by side. Writes
bench/results/roofline.json.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch

from bench.bench_cli import OutFile, Positive, opt
from bench.roofline_floor import bandwidth, floor_bytes, product_floor
from fedrecgel.cohort import select_cohort
from fedrecgel.data import load_split
from fedrecgel.model import ModelConfig
from fedrecgel.native import ops as native
from fedrecgel.reference import reference_client_step
from fedrecgel.sam import PrivateState
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.uploads import Update

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "roofline.json"


def round_flops(
    cfg: ModelConfig, sizes: np.ndarray, rho_sh: float, rho_ns: float
) -> dict[str, float]:
    """Floating-point operations of one round's client step (2 per multiply-add).

    Per sample, a forward pass costs the tower as the model computes it: the item half of the
    first layer (E -> H), the hidden layers, the predict layer over concat(GMF, MLP) and the
    GMF product; the user half of the first layer is once per client. A backward pass costs
    twice its forward (input and weight gradients).

    * ``full``: forward and backward of each pass that runs (pass 1 always, pass 2 when
      rho_sh > 0, pass 3 when rho_ns > 0), every layer, every gradient;
    * ``needed``: only what each pass's result depends on: pass 2 computes no private
      gradients, pass 3 no weight gradients and no item gradients and reuses pass 1's item
      half of the first layer.
    """
    n = float(np.sum(sizes))
    c = float(len(sizes))
    f = cfg.factor
    if cfg.kind == "mf":
        per_fwd, user_fwd, first_item, hidden = 2.0 * f, 0.0, 0.0, 0.0
    else:
        e = cfg.mlp_dim
        sizes_t = cfg.tower_sizes()
        h0 = sizes_t[0][1]
        first_item = 2.0 * e * h0
        hidden = sum(2.0 * i * o for i, o in sizes_t[1:])
        per_fwd = first_item + hidden + 2.0 * 2 * f + f
        user_fwd = 2.0 * e * h0
    fwd = n * per_fwd + c * user_fwd
    passes = 1 + (rho_sh > 0) + (rho_ns > 0)
    full = passes * 3 * fwd
    needed = 3 * fwd  # pass 1: everything
    if rho_sh > 0:  # pass 2: all shared gradients, the user half's input gradient skipped
        needed += 3 * fwd - c * user_fwd
    if rho_ns > 0:  # pass 3: forward without the item half, input gradients without it
        fwd3 = fwd - n * first_item
        needed += fwd3 + (fwd3 - c * user_fwd) + c * user_fwd
    return {"full": full, "needed": needed, "samples": n, "clients": c}


def matmul_rate(size: int = 1024, repeats: int = 5) -> float:
    """torch's dense float32 matmul rate (FLOP/s, best of ``repeats``) with the current threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best


_MATMUL_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::addmm_",
    "aten::bmm",
    "aten::baddbmm",
    "aten::addmv",
    "aten::addmv_",
)


def profile_round(sim: Simulator, r: int, cohort: np.ndarray) -> dict[str, Any]:
    """Where one round's time goes (torch's profiler, FLOPs of the matrix products counted).

    Splits the round's wall time into the matrix products (and the rate they reach: the
    profiler's FLOP count of those ops over their own time), every other torch op (elementwise,
    gathers, index adds: memory-bound), and what runs outside torch's ops (client sampling in
    numpy, Python). Profiling adds overhead, so read the shares, not the seconds.
    """
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    samples = sim.samples_for(cohort, r)
    sampling = time.perf_counter() - t0
    del samples
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        t0 = time.perf_counter()
        sim._train(r, cohort)
        wall = time.perf_counter() - t0
    mm_s, mm_flops, other_s = 0.0, 0.0, 0.0
    top: list[tuple[str, float]] = []
    for ev in prof.key_averages():
        self_s = ev.self_cpu_time_total / 1e6
        if ev.key in _MATMUL_OPS:
            mm_s += self_s
            mm_flops += float(ev.flops or 0)
        else:
            other_s += self_s
            top.append((ev.key, self_s))
    top.sort(key=lambda x: -x[1])
    return {
        "wall_s": wall,
        "matmul_s": mm_s,
        "matmul_share": mm_s / wall,
        "matmul_gflops_inside_round": mm_flops / max(mm_s, 1e-12) / 1e9,
        "other_torch_ops_s": other_s,
        "other_torch_ops_share": other_s / wall,
        "outside_torch_ops_share": max(0.0, 1.0 - (mm_s + other_s) / wall),
        "client_sampling_s_unprofiled": sampling,
        "top_other_ops": [{"op": k, "s": v, "share": v / wall} for k, v in top[:8]],
    }


def _time_round(sim: Simulator, r: int, cohort: np.ndarray) -> float:
    """One training round of ``sim`` on ``cohort`` (no evaluation), seconds."""
    t0 = time.perf_counter()
    sim._train(r, cohort)
    return time.perf_counter() - t0


def _time_loop(
    sim: Simulator,
    shared: dict[str, torch.Tensor],
    states: dict[int, PrivateState],
    r: int,
    cohort: np.ndarray,
) -> float:
    """The plain per-client loop on the same cohort and samples (its own model copy)."""
    strategy = sim.config.strategy()
    t0 = time.perf_counter()
    samples = sim.samples_for(cohort, r)
    ups: list[Update] = []
    with torch.enable_grad():
        _loop(sim, shared, states, cohort, samples, ups)
    strategy.round(shared, ups)
    return time.perf_counter() - t0


def _loop(
    sim: Simulator,
    shared: dict[str, torch.Tensor],
    states: dict[int, PrivateState],
    cohort: np.ndarray,
    samples: list[tuple[np.ndarray, np.ndarray]],
    ups: list[Update],
) -> None:
    for u, (items, labels) in zip(cohort, samples, strict=True):
        st = states.get(int(u)) or PrivateState.fresh(sim.model_cfg, sim.config.seed, np.array([u]))
        up, states[int(u)] = reference_client_step(
            sim.model_cfg, shared, int(u), st, items, labels, sim.hp
        )
        ups.append(up)


def bench(rounds: int, loop_rounds: int, fraction: float) -> dict[str, Any]:
    """Interleaved rounds of both client paths, matmul probes and the per-client loop."""
    split = load_split("filmtrust")
    cfg = TrainConfig(eval_every=0, fraction=fraction)
    fast = Simulator(split, cfg)
    torch_ops = Simulator(split, cfg)  # the same aggregate path on torch ops, no native kernels
    exact = Simulator(split, cfg.replace(per_client_uploads=True))
    loop_shared = {k: v.clone() for k, v in fast.shared.items()}
    loop_states: dict[int, PrivateState] = {}
    times: dict[str, list[float]] = {
        "aggregate": [],
        "aggregate_torch_ops": [],
        "per_client": [],
        "loop": [],
        "rate": [],
    }
    flops: list[dict[str, float]] = []
    floors: list[dict[str, Any]] = []
    bws: list[float] = []
    torch.set_grad_enabled(False)
    for r in range(1, rounds + 1):
        cohort = select_cohort(fast.users, cfg.fraction, cfg.seed, r)
        samples = fast.samples_for(cohort, r)
        sizes = np.array([len(s[0]) for s in samples])
        flops.append(round_flops(fast.model_cfg, sizes, *cfg.effective_rho()))
        floors.append(_floor(fast, samples, sizes))
        bws.append(bandwidth())
        times["rate"].append(matmul_rate())
        times["aggregate"].append(_time_round(fast, r, cohort))
        with native.off():
            times["aggregate_torch_ops"].append(_time_round(torch_ops, r, cohort))
        times["rate"].append(matmul_rate())
        times["per_client"].append(_time_round(exact, r, cohort))
        if r <= loop_rounds:
            times["rate"].append(matmul_rate())
            times["loop"].append(_time_loop(fast, loop_shared, loop_states, r, cohort))
    rate = statistics.median(times["rate"])
    bw = statistics.median(bws)
    r = rounds + 1
    breakdown = profile_round(fast, r, select_cohort(fast.users, cfg.fraction, cfg.seed, r))
    breakdown["matmul_rate_inside_round_over_probe"] = (
        breakdown["matmul_gflops_inside_round"] * 1e9 / rate
    )
    out: dict[str, Any] = {
        "native_kernels": native.kernels() is not None,
        "aggregate_round_profile": breakdown,
        "rounds": rounds,
        "clients_per_round": int(flops[0]["clients"]),
        "samples_per_round_mean": float(np.mean([f["samples"] for f in flops])),
        "gflop_per_round_full_mean": float(np.mean([f["full"] for f in flops])) / 1e9,
        "gflop_per_round_needed_mean": float(np.mean([f["needed"] for f in flops])) / 1e9,
        "matmul_gflops_median": rate / 1e9,
        "matmul_gflops": [x / 1e9 for x in times["rate"]],
        "bandwidth_gbs_median": bw / 1e9,
        "bandwidth_gbs": [x / 1e9 for x in bws],
    }
    out["floor"] = _floor_summary(floors, times["aggregate"], flops, bw, rate)
    for path in ("aggregate", "aggregate_torch_ops", "per_client"):
        ts = times[path]
        full = [f["full"] / t for f, t in zip(flops, ts, strict=True)]
        needed = [f["needed"] / t for f, t in zip(flops, ts, strict=True)]
        out[path] = {
            "s_per_round": ts,
            "s_per_round_median": statistics.median(ts),
            "gflops_full_median": statistics.median(full) / 1e9,
            "gflops_needed_median": statistics.median(needed) / 1e9,
            "fraction_of_matmul_full": statistics.median(full) / rate,
            "fraction_of_matmul_needed": statistics.median(needed) / rate,
            # the least disturbed round against the fastest probe (a shared machine)
            "fraction_of_matmul_full_best": max(full) / max(times["rate"]),
        }
    # the same rounds on the native kernels and on torch ops, side by side
    out["aggregate"]["torch_ops_over_native_per_round_median"] = statistics.median(
        t / n for t, n in zip(times["aggregate_torch_ops"], times["aggregate"], strict=True)
    )
    if times["loop"]:
        loop = statistics.median(times["loop"])
        out["per_client_loop_s_per_round"] = times["loop"]
        out["per_client_loop_s_per_round_median"] = loop
        # ratios over the rounds both ran, side by side
        k = len(times["loop"])
        for path in ("aggregate", "aggregate_torch_ops", "per_client"):
            out[path]["speedup_vs_loop"] = loop / statistics.median(times[path][:k])
    out["targets"] = {"fraction_of_matmul": 0.5, "speedup_vs_loop": 5.0}
    return out


def _floor(
    sim: Simulator, samples: list[tuple[np.ndarray, np.ndarray]], sizes: np.ndarray
) -> dict[str, Any]:
    """The round's products replayed at their shapes and its unavoidable bytes."""
    pairs = sum(len(np.unique(s[0])) for s in samples)
    items = len(np.unique(np.concatenate([s[0] for s in samples])))
    prod = product_floor(sim.model_cfg, sizes, sim.hp.max_batch_samples)
    mem = floor_bytes(sim.model_cfg, int(sizes.sum()), pairs, items, len(sizes))
    return {"products": prod, "bytes": mem}


def _floor_summary(
    floors: list[dict[str, Any]],
    rounds_s: list[float],
    flops: list[dict[str, float]],
    bw: float,
    rate: float,
) -> dict[str, Any]:
    """Attainable time of each round (its products at their probed speed, plus its unavoidable
    bytes at the measured bandwidth), and what the round and that floor reach."""
    med = statistics.median
    floor_s = [f["products"]["s"] + f["bytes"]["total"] / bw for f in floors]
    prod = [f["products"] for f in floors]
    return {
        "products_s_median": med(p["s"] for p in prod),
        "products_gflop_mean": float(np.mean([p["gflop"] for p in prod])),
        "batched_products_gflops": med(p["batched_gflop"] / p["batched_s"] for p in prod),
        "batched_products_gflop_mean": float(np.mean([p["batched_gflop"] for p in prod])),
        "per_client_products_gflops": med(p["per_client_gflop"] / p["per_client_s"] for p in prod),
        "per_client_products_gflop_mean": float(np.mean([p["per_client_gflop"] for p in prod])),
        "bytes_mb_mean": float(np.mean([f["bytes"]["total"] for f in floors])) / 1e6,
        "bytes_mb_by_part": {
            k: float(np.mean([f["bytes"][k] for f in floors])) / 1e6
            for k in floors[0]["bytes"]
            if k != "total"
        },
        "bytes_s_median": med(f["bytes"]["total"] / bw for f in floors),
        "attainable_s_median": med(floor_s),
        "achieved_fraction_of_attainable": med(
            a / t for a, t in zip(floor_s, rounds_s, strict=True)
        ),
        "attainable_fraction_of_matmul_full": med(
            f["full"] / a / rate for f, a in zip(flops, floor_s, strict=True)
        ),
    }


def _without_out(argv: list[str]) -> list[str]:
    """The command-line arguments without ``--out PATH`` (the figures do not depend on it)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            out.append(a)
    return out


def main(
    rounds: Positive = 5,
    loop_rounds: int = 2,
    fraction: float = TrainConfig().fraction,
    threads: Annotated[int, opt("torch threads (default: torch's)")] = 0,
    out: OutFile = OUT,
) -> None:
    """Run the benchmark and write bench/results/roofline.json."""
    if threads:
        torch.set_num_threads(threads)
    load_start = os.getloadavg()[0]
    res: dict[str, Any] = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python "
        + " ".join(["-m bench.roofline", *_without_out(sys.argv[1:])]),
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "filmtrust": bench(rounds, loop_rounds, fraction),
    }
    # 1-minute load average before and after: above 1 the single thread shared its core
    res["machine"]["loadavg_1min"] = [load_start, os.getloadavg()[0]]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
