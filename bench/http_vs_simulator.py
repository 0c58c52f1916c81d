"""The federated run over HTTP against the in-process simulator, same config, same machine.

Starts the aggregator and two client workers as local processes (SQLite, Redis version
events), through the launcher's helpers (what ``fedrec up`` uses), runs 20 FilmTrust rounds
over HTTP, then times :class:`fedrecgel.simulate.Simulator` on the same config in this
process, and repeats the pair ``--repeats`` times, interleaved (the machine is shared: the
figure is the median of the per-repetition ratios, each from one repetition). The simulator is
timed with torch's default threads and with one thread, and the faster counts (its best on
this machine at that moment).

Modes (``--modes``): ``exact``, the workers' default, computes each upload one client at a
time (the bytes do not depend on the group: bit for bit the simulator's even when a worker
recomputes part of a round after a crash); ``grouped`` starts the workers with
``--grouped-uploads`` (a worker's cohort members computed together); ``partial`` runs with
``upload_grouping=worker`` (each worker uploads one partial sum of its cohort members per
round, summed inside the batched backward; the simulator it is timed and checked against
runs with the same grouping).

Each HTTP run also records where a round's wall time goes: the workers' phase timings (their
``round timings`` log lines, :mod:`services.client_sim.timings`), the aggregator's stage
histograms from ``/metrics`` and its close times, and from these the event latency (a
round's close to the poll answer a worker starts the next round from). Agreement with the
simulator (per-round metrics and loss, final model) is checked once per mode against the
simulator computing per-client uploads the way the workers did.

    python -m bench.http_vs_simulator [--rounds 20] [--repeats 3] [--modes exact,grouped,partial]
        [--out bench/results/http_vs_simulator.json]
    python -m bench.http_vs_simulator --merge a.json b.json ... --out merged.json
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import torch
import typer

from bench.bench_cli import OutFile, Positive, fail, opt
from bench.cpu_accounting import CpuWatch, machine_busy_seconds
from fedrecgel.config import DEFAULTS
from fedrecgel.data import load_split, raw_path
from fedrecgel.simulate import RunResult, Simulator, TrainConfig
from fedrecgel.wire import decode_model
from harness.loopback import redis_server
from harness.parity import aggregator_started, parity_options, start_workers
from services.client_sim.timings import PHASES
from services.launcher import worker_torch_threads

RESULTS = Path(__file__).resolve().parent / "results" / "http_vs_simulator.json"
MODES = ("exact", "grouped", "partial")
#: a worker's phases (services/client_sim/timings.py), waiting ones last, and the aggregator's
#: stages, in order
WORKER_PHASES = (*(p for p in PHASES if p not in ("poll", "wait")), "poll", "wait")
AGG_STAGES = ("validate", "commit", "aggregate", "encode_model", "publish")
_CLOSED = re.compile(r"^(\S+ \S+) INFO \S+: round (\d+) closed: ")
_FINISHED = re.compile(
    r"^(\S+ \S+) INFO \S+: (?:round \d+ closed: |version \d+ evaluated over )", re.MULTILINE
)
_TIMINGS = re.compile(r"round timings (\{.*\})\s*$")
_METRIC = re.compile(r'^(fedrec_agg_\w+?)_(sum|count)(?:\{stage="(\w+)"\})? (\S+)$')


def http_run(
    train: TrainConfig,
    dataset: str,
    workers: int,
    poll_max_s: float,
    workdir: Path,
    redis_url: str | None = None,
    grouped: bool = False,
    watch_s: float = 0.5,
) -> dict[str, Any]:
    """The run over HTTP: timings, their breakdown, history and the final shared params.

    The run is timed from just before it starts to the aggregator's own record (its log) of
    the last round's close or of the last version's metrics, whichever came later; the
    history is polled only every ``watch_s`` to see that it is complete (each poll reads
    every closed round: polling fast would load the aggregator it measures)."""
    split = load_split(dataset)
    opts = parity_options(
        train,
        dataset,
        workdir,
        workers=workers,
        redis_url=redis_url,
        worker_poll_max_s=poll_max_s,
        worker_log_level="INFO",
        aggregator_log_level="info",
        extra_env={"FEDREC_WORKER_GROUPED_UPLOADS": "1" if grouped else "0"},
    )
    t0 = time.perf_counter()
    with aggregator_started(opts) as c:
        start_workers(c, split.n_users)
        # read all along: a worker may exit (and be reaped) before the run is seen complete
        watch = CpuWatch({p.name: p.popen.pid for p in c.procs})
        cpu0 = watch.seconds()
        busy0 = machine_busy_seconds()
        t_ready, started = time.perf_counter(), time.time()
        c.start_run(split.n_items)
        history = c.wait_complete(timeout_s=3600.0, poll_s=watch_s)
        t_done = time.perf_counter()
        cpu = {n: s - cpu0[n] for n, s in watch.stop().items()}
        busy = machine_busy_seconds() - busy0
        resp = httpx.get(f"{c.agg_url}/v1/models/latest", headers=c.operator_headers(), timeout=30)
        resp.raise_for_status()
        _, shared, version = decode_model(resp.content)
        metrics = httpx.get(f"{c.agg_url}/metrics", timeout=30).text
    logs = {p.stem: p.read_text() for p in workdir.glob("*.log")}
    run_seconds = run_end(logs.get("aggregator", "")) - started
    return {
        "startup_seconds": t_ready - t0,
        "run_seconds": run_seconds,
        "run_seconds_seen_by_polls": t_done - t_ready,
        "history": history,
        "shared": shared,
        "version": version,
        "breakdown": breakdown(logs, metrics, train.rounds, run_seconds),
        # CPU seconds from the run's start until this script saw it complete (up to
        # ``watch_s`` after its end): each service process, and the whole machine (every
        # process on it, this script's polls and other jobs included)
        "cpu_seconds": cpu,
        "machine_busy_seconds": busy,
        "cpu_window_seconds": t_done - t_ready,
    }


def _epoch(stamp: str) -> float:
    """A log line's ``asctime`` (local time, milliseconds after a comma) as epoch seconds."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def run_end(aggregator_log: str) -> float:
    """Epoch seconds of the aggregator's last round close or version evaluation (its log)."""
    stamps = [_epoch(m.group(1)) for m in _FINISHED.finditer(aggregator_log)]
    if not stamps:
        raise RuntimeError("the aggregator's log records no closed round")
    return max(stamps)


def breakdown(
    logs: dict[str, str], metrics: str, rounds: int, run_seconds: float
) -> dict[str, Any]:
    """Seconds per round of each worker phase (mean over workers), of each aggregator stage,
    and of the event latency, from the services' logs and the aggregator's /metrics."""
    closed: dict[int, float] = {}
    for line in logs.get("aggregator", "").splitlines():
        if m := _CLOSED.match(line):
            closed[int(m.group(2))] = _epoch(m.group(1))
    per_worker: list[dict[int, dict[str, float]]] = []
    for name in sorted(k for k in logs if k.startswith("worker-")):
        rows = {}
        for line in logs[name].splitlines():
            if m := _TIMINGS.search(line):
                row = json.loads(m.group(1))
                rows[int(row["round"])] = row
        per_worker.append(rows)
    phases = {
        p: sum(sum(r.get(p, 0.0) for r in w.values()) for w in per_worker)
        / (rounds * max(1, len(per_worker)))
        for p in WORKER_PHASES
    }
    cpu = {
        p: sum(sum(r.get(f"cpu_{p}", 0.0) for r in w.values()) for w in per_worker)
        / (rounds * max(1, len(per_worker)))
        for p in WORKER_PHASES
    }
    latency = [
        row["seen"] - closed[r - 1] for w in per_worker for r, row in w.items() if r - 1 in closed
    ]
    sums: dict[str, float] = {}
    for line in metrics.splitlines():
        if (m := _METRIC.match(line)) and m.group(2) == "sum":
            key = m.group(3) or m.group(1).removeprefix("fedrec_agg_")
            sums[key] = float(m.group(4))
    stages = {s: sums.get(s, 0.0) / rounds for s in AGG_STAGES}
    stages["close"] = sums.get("round_close_seconds", 0.0) / rounds
    return {
        "round_seconds": run_seconds / rounds,
        "worker_phase_seconds_per_round": phases,
        # CPU seconds of the thread that ran each phase (mean over the workers, per round)
        "worker_phase_cpu_seconds_per_round": cpu,
        "aggregator_stage_seconds_per_round": stages,
        "event_latency_seconds_median": statistics.median(latency) if latency else None,
        "event_latency_seconds_max": max(latency) if latency else None,
        "rounds_timed": [len(w) for w in per_worker],
    }


def agreement(http: dict[str, Any], sim: Simulator, result: RunResult) -> dict[str, Any]:
    """Max abs differences of metrics, losses and final parameters over the rounds."""
    metric_diffs: list[float] = []
    loss_diffs: list[float] = []
    for rec, row in zip(result.rounds, http["history"]["rounds"], strict=True):
        metrics = row.get("metrics") or {}
        diffs = [abs(float(metrics[k]) - v) for k, v in rec.test.items() if k in metrics]
        metric_diffs.append(max(diffs, default=float("nan")))
        loss_diffs.append(abs(float(row["loss"]) - rec.loss))
    params = {k: float((http["shared"][k] - v).abs().max()) for k, v in sim.shared.items()}
    return {
        "metrics_max_abs_diff": max(metric_diffs),
        "loss_max_abs_diff": max(loss_diffs),
        "final_model_max_abs_diff": max(params.values()),
        "final_model_max_abs_diff_per_tensor": params,
    }


def simulator_seconds(dataset: str, train: TrainConfig, threads: int) -> tuple[float, float]:
    """Wall seconds of the simulator's run (training and per-round evaluation), and the CPU
    seconds this process spent meanwhile (all its threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        sim = Simulator(load_split(dataset), train)
        cpu0 = time.process_time()
        wall = sim.run().wall_seconds
        return wall, time.process_time() - cpu0
    finally:
        torch.set_num_threads(before)


def exact_reference(dataset: str, train: TrainConfig, workers: int) -> tuple[Simulator, RunResult]:
    """The simulator computing per-client uploads as the workers do, with their threads
    (float rounding depends on the kernels, which depend on the thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(worker_torch_threads(workers))
    try:
        sim = Simulator(load_split(dataset), train.replace(per_client_uploads=True))
        return sim, sim.run()
    finally:
        torch.set_num_threads(before)


def summary(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The median ratio of a mode's repetitions and the breakdown of its median run."""
    ratios = [r["ratio"] for r in reps]
    mid = sorted(reps, key=lambda r: r["ratio"])[len(reps) // 2]
    agree: dict[str, Any] = next((r["agreement"] for r in reps if "agreement" in r), {})
    return {
        "final_model_max_abs_diff": agree.get("final_model_max_abs_diff"),
        "metrics_max_abs_diff": agree.get("metrics_max_abs_diff"),
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "http_wall_seconds": [r["http_wall_seconds"] for r in reps],
        "simulator_wall_seconds": [r["simulator_wall_seconds"] for r in reps],
        "breakdown_of_median_run": mid["breakdown"],
    }


def merge(paths: list[Path], out: Path, label: str) -> None:
    """One result of several runs of this script (say, repetitions interleaved with those of
    another commit, one per run): their repetitions, numbered again, and each mode's summary
    over all of them; the first run's config, with every run's start load."""
    runs = [json.loads(p.read_text()) for p in paths]
    merged = dict(runs[0], label=label or runs[0].get("label", ""), modes={}, repetitions=[])
    merged["config"] = dict(
        runs[0]["config"],
        repeats=sum(len(r["repetitions"]) for r in runs),
        load_avg_1m_at_start=min(r["config"]["load_avg_1m_at_start"] for r in runs),
        load_avg_1m_at_starts=[r["config"]["load_avg_1m_at_start"] for r in runs],
        merged_from=[p.name for p in paths],
    )
    for r in runs:
        for row in r["repetitions"]:
            merged["repetitions"].append(dict(row, repetition=len(merged["repetitions"])))
    for mode in dict.fromkeys(row["mode"] for row in merged["repetitions"]):
        merged["modes"][mode] = summary([r for r in merged["repetitions"] if r["mode"] == mode])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2) + "\n")
    for mode, s in merged["modes"].items():
        print(f"{mode}: median ratio {s['ratio_median']:.2f} over {len(s['ratios'])} -> {out}")


def main(
    dataset: str = DEFAULTS.dataset,
    rounds: Positive = 20,
    workers: int = 2,
    repeats: Positive = 3,
    modes: Annotated[str, opt("comma-separated: " + ",".join(MODES))] = ",".join(MODES),
    poll_max_s: Annotated[float, opt("workers' idle poll cap")] = 0.5,
    watch_s: Annotated[
        float,
        opt(
            "how often this script polls the history for the run's end (the time itself "
            "comes from the aggregator's log)"
        ),
    ] = 0.5,
    threads_text: Annotated[
        str,
        opt(
            "torch threads to time the simulator with, comma-separated (default: torch's "
            "default and 1; on a loaded machine more threads than free cores only slow it)",
            "--sim-threads",
        ),
    ] = "",
    check_agreement: Annotated[
        bool, opt("check the runs' agreement (or skip it)", "--agreement/--no-agreement")
    ] = True,
    label: Annotated[str, opt("a note kept in the JSON (e.g. 'before')")] = "",
    out: OutFile = RESULTS,
    merging: Annotated[
        bool, opt("run nothing: merge the JSON results of earlier runs given after it", "--merge")
    ] = False,
    files: Annotated[list[Path] | None, typer.Argument(metavar="[JSON]...")] = None,
) -> None:
    """Run the repetitions, print the headline figures, write the JSON as it goes."""
    if merging != bool(files):
        raise fail("--merge takes the JSON files of earlier runs (and only it takes files)")
    if merging:
        merge(files or [], out, label)
        return
    chosen = [m for m in modes.split(",") if m]
    if any(m not in MODES for m in chosen):
        raise fail(f"--modes takes {', '.join(MODES)}")
    raw_path(dataset)  # an unknown dataset fails here, before any server starts
    if shutil.which("redis-server") is None:
        raise SystemExit("error: this benchmark runs a real Redis: apt-get install redis-server")

    sim_threads = sorted(
        {int(t) for t in threads_text.split(",") if t} or {torch.get_num_threads(), 1}
    )
    result: dict[str, Any] = {
        "dataset": dataset,
        "label": label,
        "config": {
            "rounds": rounds,
            "workers": workers,
            "database": "sqlite",
            "redis": True,
            "worker_poll_max_s": poll_max_s,
            "watch_s": watch_s,
            "worker_torch_threads": worker_torch_threads(workers),
            "repeats": repeats,
            "load_avg_1m_at_start": os.getloadavg()[0],
            "simulator_threads": sim_threads,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "ratio_target": 1.5,
        "modes": {},
        "repetitions": [],
    }
    train = TrainConfig(rounds=rounds, shards=workers)
    for rep in range(repeats):
        for mode in chosen:
            grouped = mode == "grouped"
            # the run (and the simulator it is timed against) with this mode's grouping
            run = train.replace(upload_grouping="worker") if mode == "partial" else train
            with (
                tempfile.TemporaryDirectory(prefix="fedrec-bench-") as tmp,
                contextlib.ExitStack() as stack,
            ):
                redis_url = stack.enter_context(redis_server(Path(tmp))).url
                workdir = Path(tmp) / "up"
                http = http_run(
                    run,
                    dataset,
                    workers,
                    poll_max_s,
                    workdir,
                    redis_url,
                    grouped,
                    watch_s,
                )
            timed = {t: simulator_seconds(dataset, run, t) for t in sim_threads}
            sims = {t: w for t, (w, _) in timed.items()}
            best = min(sims.values())
            best_cpu = min(timed.values())[1]
            workers_cpu = sum(v for k, v in http["cpu_seconds"].items() if k != "aggregator")
            row = {
                "repetition": rep,
                "mode": mode,
                "http_wall_seconds": http["run_seconds"],
                "http_wall_seconds_seen_by_polls": http["run_seconds_seen_by_polls"],
                "http_startup_seconds": http["startup_seconds"],
                "simulator_wall_seconds_by_threads": sims,
                "simulator_wall_seconds": best,
                "ratio": http["run_seconds"] / best,
                "final_model_version": http["version"],
                "load_avg_1m": os.getloadavg()[0],
                "breakdown": http["breakdown"],
                "cpu": {
                    "aggregator_seconds": http["cpu_seconds"].get("aggregator", 0.0),
                    "workers_seconds": workers_cpu,
                    "per_process_seconds": http["cpu_seconds"],
                    "machine_busy_seconds": http["machine_busy_seconds"],
                    "window_seconds": http["cpu_window_seconds"],
                    "simulator_seconds": best_cpu,
                    # the services' CPU time against the simulator's, for the same run
                    "services_over_simulator": (
                        http["cpu_seconds"].get("aggregator", 0.0) + workers_cpu
                    )
                    / best_cpu,
                },
            }
            if rep == 0 and check_agreement:
                ref = run.replace(grouped_uploads=grouped)
                sim, exact = exact_reference(dataset, ref, workers)
                row["agreement"] = agreement(http, sim, exact)
            result["repetitions"].append(row)
            result["modes"][mode] = summary([r for r in result["repetitions"] if r["mode"] == mode])
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")
            agree: dict[str, Any] = row.get("agreement", {})
            print(
                f"[{rep} {mode}] http {http['run_seconds']:.1f}s, simulator {best:.1f}s "
                f"({', '.join(f'{t} thr {s:.1f}s' for t, s in sims.items())}), "
                f"ratio {row['ratio']:.2f}, load {row['load_avg_1m']:.1f}"
                + (
                    f"; final model max diff {agree['final_model_max_abs_diff']:.3g}"
                    if agree
                    else ""
                ),
                flush=True,
            )
    for mode, s in result["modes"].items():
        print(f"{mode}: median ratio {s['ratio_median']:.2f} over {len(s['ratios'])} -> {out}")


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
