"""The simulator's rounds with glibc's default malloc thresholds against the raised ones
(:mod:`fedrecgel.allocator`).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.allocator [--pairs 4] [--rounds 10]

A round frees and allocates again the same tens of MB; glibc serves blocks above its mmap
threshold (128 KiB, raised automatically up to 32 MiB) with fresh mappings and returns the
top of its heap once more than twice that is free there, so some of it comes back as new
pages, each first write a page fault. Each side runs in its own child process (malloc's
thresholds are per process and cannot be put back to glibc's automatic ones): *default* as
glibc sets them (the client step's :func:`fedrecgel.allocator.keep_freed_memory` skipped),
*kept* as shipped (glibc only). A child runs default FilmTrust
rounds (aggregate path, no evaluation) after two warm-up rounds and reports, per round, its
thread CPU seconds and page faults, and its peak RSS. The two sides alternate, the order
inside each pair flipping; on a machine with two or more cores the two children of a pair run
at the same time, each pinned to its own core (swapped from pair to pair), so that both see
the same moments of a shared machine. The figure that counts is the median of the per-pair
ratios. Writes bench/results/allocator.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Annotated, Any

from bench.bench_cli import OutFile, Positive, child_command, one_of, opt

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "allocator.json"
SIDES = ("default", "kept")


def child(side: str, rounds: int) -> dict[str, Any]:
    """Run ``rounds`` timed rounds in this process (``side``: default or kept)."""
    import resource
    import time

    import numpy as np
    import torch

    from fedrecgel import sam
    from fedrecgel.cohort import select_cohort
    from fedrecgel.data import load_split
    from fedrecgel.simulate import Simulator, TrainConfig

    torch.set_num_threads(1)
    if side == "default":
        sam.keep_freed_memory = lambda: False  # type: ignore[attr-defined, assignment]  # replaces sam's imported lru_cache function
    sim = Simulator(load_split("filmtrust"), TrainConfig(eval_every=0))
    cfg = sim.config
    cpu, faults, wall = [], [], []
    for r in range(1, rounds + 3):
        cohort = select_cohort(sim.users, cfg.fraction, cfg.seed, r)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0, w0 = time.thread_time(), time.perf_counter()
        sim._train(r, cohort)
        if r > 2:
            cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - w0)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return {
        "side": side,
        "cpu_s_per_round": cpu,
        "wall_s_per_round": wall,
        "faults_per_round": faults,
        "cpu_s_median": float(np.median(cpu)),
        "faults_median": float(np.median(faults)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _start_child(side: str, rounds: int, core: int | None) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [*child_command(__file__), "--child", side, "--rounds", str(rounds)]
    if core is not None:
        cmd += ["--core", str(core)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"a benchmark child failed (exit {proc.returncode})")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _pair(order: tuple[str, str], rounds: int, together: bool) -> dict[str, dict[str, Any]]:
    """One run of each side: at the same time on cores 0 and 1, or one after the other."""
    if together:
        procs = {side: _start_child(side, rounds, core) for core, side in enumerate(order)}
        return {side: _result(p) for side, p in procs.items()}
    return {side: _result(_start_child(side, rounds, None)) for side in order}


def main(
    pairs: Positive = 4,
    rounds: Positive = 10,
    as_child: Annotated[str | None, one_of(SIDES, "--child")] = None,
    core: Annotated[int | None, opt(hidden=True)] = None,
    sequential: Annotated[bool, opt("one child at a time")] = False,
    out: OutFile = OUT,
) -> None:
    """Alternate the two sides and write the JSON."""
    if as_child:
        if core is not None:
            os.sched_setaffinity(0, {core})
        print(json.dumps(child(as_child, rounds)))
        return
    together = not sequential and len(os.sched_getaffinity(0)) >= 2
    runs: dict[str, list[dict[str, Any]]] = {"default": [], "kept": []}
    for i in range(pairs):
        order = ("default", "kept") if i % 2 == 0 else ("kept", "default")
        pair = _pair(order, rounds, together)
        for side in order:
            runs[side].append(pair[side])
            r = pair[side]
            print(f"pair {i} {side}: {r['cpu_s_median']:.3f} s CPU/round, "
                  f"{r['faults_median']:.0f} faults/round, peak {r['peak_rss_mb']:.0f} MB")  # fmt: skip
    med = statistics.median
    ratios = [
        k["cpu_s_median"] / d["cpu_s_median"]
        for d, k in zip(runs["default"], runs["kept"], strict=True)
    ]
    result = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.allocator "
        f"--pairs {pairs} --rounds {rounds}" + (" --sequential" if sequential else ""),
        "load_avg": os.getloadavg(),
        "children_together": together,
        "pairs": pairs,
        "rounds": rounds,
        "runs": runs,
        "summary": {
            side: {
                "cpu_s_per_round_median": med(r["cpu_s_median"] for r in rs),
                "faults_per_round_median": med(r["faults_median"] for r in rs),
                "peak_rss_mb_max": max(r["peak_rss_mb"] for r in rs),
            }
            for side, rs in runs.items()
        },
        "kept_over_default_cpu_ratios": ratios,
        "kept_over_default_cpu_ratio_median": med(ratios),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(result["summary"], indent=2),
        "ratio",
        result["kept_over_default_cpu_ratio_median"],
    )


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
