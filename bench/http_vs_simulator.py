"""The federated run over HTTP against the in-process simulator, same config, same machine.

Starts the aggregator and two client workers as local processes (SQLite, no Redis), through
the launcher's helpers (what ``fedrec up`` uses), runs 20 FilmTrust rounds over HTTP, then
runs :class:`fedrecgel.simulate.Simulator` for the same config in this process, and writes
``bench/results/http_vs_simulator.json``: both wall times, their ratio (target: HTTP <= 3x the
simulator), the per-round agreement of the global metrics and loss (max abs diff) and the
final model's max abs diff.

The HTTP wall time runs from ``POST /v1/runs`` until every round is closed and evaluated by
the workers (process start-up and registration are reported separately); the simulator's is
:attr:`RunResult.wall_seconds` (training and the per-round evaluation, as the workers do).

    python bench/http_vs_simulator.py [--rounds 20] [--out bench/results/http_vs_simulator.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import torch

from fedrecgel.data import load_split
from fedrecgel.simulate import RunResult, Simulator, TrainConfig
from fedrecgel.wire import decode_model
from services.launcher import worker_torch_threads

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/support/
from tests.support.loopback import redis_server
from tests.support.parity import aggregator_started, parity_options, start_workers

RESULTS = Path(__file__).resolve().parent / "results" / "http_vs_simulator.json"


def http_run(
    train: TrainConfig,
    dataset: str,
    workers: int,
    poll_max_s: float,
    workdir: Path,
    redis_url: str | None = None,
) -> dict[str, Any]:
    """The run over HTTP: timings, history and the final model's shared parameters."""
    split = load_split(dataset)
    opts = parity_options(
        train, dataset, workdir, workers=workers, redis_url=redis_url, worker_poll_max_s=poll_max_s
    )
    t0 = time.perf_counter()
    with aggregator_started(opts) as c:
        start_workers(c, split.n_users)
        t_ready = time.perf_counter()
        c.start_run(split.n_items)
        history = c.wait_complete(timeout_s=3600.0, poll_s=0.05)
        t_done = time.perf_counter()
        resp = httpx.get(f"{c.agg_url}/v1/models/latest", headers=c.operator_headers(), timeout=30)
        resp.raise_for_status()
        _, shared, version = decode_model(resp.content)
    return {
        "startup_seconds": t_ready - t0,
        "run_seconds": t_done - t_ready,
        "history": history,
        "shared": shared,
        "version": version,
    }


def agreement(http: dict[str, Any], sim: Simulator, result: RunResult) -> dict[str, Any]:
    """Max abs differences of metrics, losses and final parameters, per round and overall."""
    per_round: list[dict[str, Any]] = []
    metric_diffs: list[float] = []
    loss_diffs: list[float] = []
    for rec, row in zip(result.rounds, http["history"]["rounds"], strict=True):
        metrics = row.get("metrics") or {}
        diffs = {k: abs(float(metrics[k]) - v) for k, v in rec.test.items() if k in metrics}
        metric_diffs.append(max(diffs.values(), default=float("nan")))
        loss_diffs.append(abs(float(row["loss"]) - rec.loss))
        per_round.append(
            {
                "round": rec.round,
                "metrics_max_abs_diff": metric_diffs[-1],
                "worst_metric": max(diffs, key=lambda k: diffs[k]) if diffs else None,
                "loss_abs_diff": loss_diffs[-1],
            }
        )
    params = {k: float((http["shared"][k] - v).abs().max()) for k, v in sim.shared.items()}
    return {
        "metrics_max_abs_diff": max(metric_diffs),
        "loss_max_abs_diff": max(loss_diffs),
        "final_model_max_abs_diff": max(params.values()),
        "final_model_max_abs_diff_per_tensor": params,
        "per_round": per_round,
    }


def main() -> None:
    """Run both, print the headline figures, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="filmtrust")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--poll-max-s", type=float, default=0.5, help="workers' idle poll cap")
    parser.add_argument(
        "--no-redis", action="store_true", help="workers poll instead of following Redis events"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    train = TrainConfig(rounds=args.rounds, shards=args.workers)
    with (
        tempfile.TemporaryDirectory(prefix="fedrec-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        redis_url = None if args.no_redis else stack.enter_context(redis_server(Path(tmp))).url
        http = http_run(train, args.dataset, args.workers, args.poll_max_s, Path(tmp), redis_url)
    # timing: the simulator at its best, all of this machine's cores in one process
    result = Simulator(load_split(args.dataset), train).run()
    # agreement: the simulator with the torch threads each worker ran with (float rounding
    # depends on the kernels, which depend on the thread count)
    threads = torch.get_num_threads()
    worker_threads = worker_torch_threads(args.workers)
    torch.set_num_threads(worker_threads)
    sim = Simulator(load_split(args.dataset), replace(train, per_client_uploads=True))
    try:
        exact = sim.run()
    finally:
        torch.set_num_threads(threads)
    agree = agreement(http, sim, exact)
    ratio = http["run_seconds"] / result.wall_seconds
    out = {
        "dataset": args.dataset,
        "config": {
            "rounds": train.rounds,
            "fraction": train.fraction,
            "seed": train.seed,
            "rho_sh": train.rho_sh,
            "rho_ns": train.rho_ns,
            "workers": args.workers,
            "database": "sqlite",
            "redis": not args.no_redis,
            "worker_poll_max_s": args.poll_max_s,
            "worker_torch_threads": worker_threads,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_avg_1m_at_end": os.getloadavg()[0],
        },
        "http_wall_seconds": http["run_seconds"],
        "http_startup_seconds": http["startup_seconds"],
        "simulator_wall_seconds": result.wall_seconds,
        "overhead_ratio": ratio,
        "overhead_target": 3.0,
        "overhead_within_target": ratio <= 3.0,
        "final_model_version": http["version"],
        **agree,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"http {http['run_seconds']:.1f}s (+{http['startup_seconds']:.1f}s start-up), "
        f"simulator {result.wall_seconds:.1f}s, ratio {ratio:.2f}; "
        f"metrics max diff {agree['metrics_max_abs_diff']:.3g}, "
        f"final model max diff {agree['final_model_max_abs_diff']:.3g} -> {args.out}"
    )


if __name__ == "__main__":
    main()
