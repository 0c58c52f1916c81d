"""``torch.compile(dynamic=True)`` of the torch client step against the native kernels, one run.

    .venv/bin/python -m bench.compile_dynamic [--rounds 6] [--warmup 2]

Three simulators on the same default FilmTrust run (the aggregate path, fraction 0.1, no
evaluation) take the same rounds, interleaved round by round: the client step on the C++
kernels of :mod:`fedrecgel.native` (the simulator's default where they are built), on torch
ops (:func:`fedrecgel.sam.layout_step`, eager), and on torch ops with ``layout_step`` compiled
once by ``torch.compile(dynamic=True)`` (inductor, CPU: every group of every round has its own
sample and client counts, so the shapes are symbolic rather than compiled again per group).
The layout is built outside the compiled function (numpy). Dynamo may compile a frame again
for new sizes (the frames after a graph break specialise them): ``--recompile-limit`` (default
64, torch's is 8) keeps it compiling instead of falling back to eager. The first ``--warmup`` rounds
(compiling included) are timed apart; the medians are over the rounds after them. Also
recorded: dynamo's graph count, graph breaks and recompiles, and how far each torch path's
parameters end from the native path's after the same rounds. Writes
bench/results/compile_dynamic.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import torch

from bench.bench_cli import OutFile, opt, positive
from fedrecgel import sam
from fedrecgel.cohort import select_cohort
from fedrecgel.data import load_split
from fedrecgel.native import ops as native
from fedrecgel.simulate import Simulator, TrainConfig

OUT = Path(__file__).resolve().parents[1] / "bench" / "results" / "compile_dynamic.json"
PATHS = ("native", "eager", "compiled")


def _timed(sim: Simulator, r: int, use: Callable[[], Any]) -> float:
    """One training round of ``sim`` (no evaluation) inside the context ``use()``, seconds."""
    cohort = select_cohort(sim.users, sim.config.fraction, sim.config.seed, r)
    with use():
        t0 = time.perf_counter()
        sim._train(r, cohort)
        return time.perf_counter() - t0


@contextlib.contextmanager
def _compiled(step: Callable[..., Any]) -> Iterator[None]:
    """Within this block the torch client step runs ``step`` (``layout_step`` compiled) and
    not the native kernels."""
    eager = sam.layout_step
    with native.off():
        sam.layout_step = step
        try:
            yield
        finally:
            sam.layout_step = eager


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def bench(rounds: int, warmup: int, recompile_limit: int) -> dict[str, Any]:
    """Interleaved rounds of the three client steps; times, dynamo's counters, differences."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    # past this many compiles of one frame dynamo runs it eagerly (torch's default: 8)
    torch._dynamo.config.recompile_limit = recompile_limit

    split = load_split("filmtrust")
    cfg = TrainConfig(eval_every=0)
    sims = {p: Simulator(split, cfg) for p in PATHS}
    step = torch.compile(sam.layout_step, dynamic=True)
    contexts: dict[str, Callable[[], Any]] = {
        "native": contextlib.nullcontext,
        "eager": native.off,
        "compiled": lambda: _compiled(step),
    }
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    torch.set_grad_enabled(False)
    for r in range(1, warmup + rounds + 1):
        for p in PATHS:
            times[p].append(_timed(sims[p], r, contexts[p]))
    timed = {p: ts[warmup:] for p, ts in times.items()}
    med = {p: statistics.median(ts) for p, ts in timed.items()}
    return {
        "command": ".venv/bin/python -m bench.compile_dynamic",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "native_kernels": native.kernels() is not None,
        "rounds": rounds,
        "warmup_rounds": warmup,
        "clients_per_round": round(split.n_users * cfg.fraction),
        "s_per_round": times,
        "warmup_s": {p: sum(ts[:warmup]) for p, ts in times.items()},
        **{f"{p}_s_per_round_median": m for p, m in med.items()},
        # the same rounds side by side: each round's ratio, then their median
        "eager_over_native_median": statistics.median(
            e / n for e, n in zip(timed["eager"], timed["native"], strict=True)
        ),
        "compiled_over_native_median": statistics.median(
            c / n for c, n in zip(timed["compiled"], timed["native"], strict=True)
        ),
        "eager_over_compiled_median": statistics.median(
            e / c for e, c in zip(timed["eager"], timed["compiled"], strict=True)
        ),
        "dynamo": {
            "frames_compiled": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "graph_break_reasons": sorted(counters["graph_break"])[:10],
            "frames": {k: int(v) for k, v in counters["frames"].items()},
            "recompile_limit": recompile_limit,
        },
        "max_abs_difference_from_native": {
            p: _max_difference(sims[p].shared, sims["native"].shared) for p in ("eager", "compiled")
        },
    }


def main(
    rounds: Annotated[int, opt("timed rounds after the warm-up", parser=positive)] = 6,
    warmup: Annotated[int, opt("rounds timed apart (compiling)", parser=positive)] = 2,
    recompile_limit: Annotated[int, opt("dynamo's, per frame", parser=positive)] = 64,
    out: OutFile = OUT,
) -> None:
    """Run the rounds and write the JSON."""
    res = bench(rounds, warmup, recompile_limit)
    res["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    out.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "s_per_round"}, indent=1))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
