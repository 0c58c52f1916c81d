"""What the demo's settings cost and give: ``fedrec up`` on FilmTrust (the default preset, seed
0, two workers, SQLite, no Redis, no dashboard or recommendation API), 300 rounds in each arm:
each worker's uploads one per client (``fedrec up``'s default) or one partial sum of its cohort
members' gradients (``--upload-grouping worker``, what ``scripts/demo.sh`` runs), and the model
evaluated every round (the default) or every 10th and after the last (``--eval-every 10``, what
``scripts/demo.sh`` runs). The arms run one after the other on the same machine.

Per arm: the wall seconds of the whole command (start-up and registration included), the
seconds a worker spent computing its cohort members' rounds and scoring its users over its
training rounds (the sums of the ``compute`` and ``evaluate`` phases of its ``round timings``
log lines, services/client_sim/timings.py, mean over the two workers; the last version is
scored after the last round, outside them), and the figures ``fedrec up``
prints at the end: the last round's test HR@10 / NDCG@10, the round chosen on validation and its
figures, and the popularity count on the same candidates. Writes
``bench/results/demo_settings.json``.

    python -m bench.demo_settings [--rounds 300] [--arms client-1,worker-1,client-10,worker-10]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_cli import OutFile, Positive, fail, run, write_result
from harness.loopback import free_port

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "demo_settings.json"
#: arm name -> (upload grouping, eval_every)
ARMS = {
    "client-1": ("client", 1),
    "worker-1": ("worker", 1),
    "client-10": ("client", 10),
    "worker-10": ("worker", 10),
}
#: the end of ``fedrec up``'s output (services/up.py), one line each with a wide console
FIGURES = re.compile(r"HR@10 ([\d.]+) NDCG@10 ([\d.]+)")
FINAL = re.compile(r"^final round (\d+): ")
BEST = re.compile(r"^best round (\d+) on (validation|test): ")
POPULARITY = re.compile(r"^popularity \(")


def phase_seconds(log: str) -> dict[str, float]:
    """The sum over a worker's rounds of each phase's wall seconds (its ``round timings``)."""
    totals: dict[str, float] = {}
    for line in log.splitlines():
        if "round timings {" not in line:
            continue
        row = json.loads(line.split("round timings ", 1)[1])
        for k in ("compute", "evaluate", "upload"):
            totals[k] = totals.get(k, 0.0) + float(row.get(k, 0.0))
    return totals


def figures(output: str) -> dict[str, Any]:
    """The final, validation-selected and popularity figures ``fedrec up`` printed."""
    out: dict[str, Any] = {}
    for line in output.splitlines():
        line = line.strip()
        m = FIGURES.search(line)
        if m is None:
            continue
        hr, ndcg = float(m.group(1)), float(m.group(2))
        if (f := FINAL.match(line)) is not None:
            out["final"] = {"round": int(f.group(1)), "hr@10": hr, "ndcg@10": ndcg}
        elif (b := BEST.match(line)) is not None:
            out["selected"] = {"round": int(b.group(1)), "on": b.group(2), "hr@10": hr}
            out["selected"]["ndcg@10"] = ndcg
        elif POPULARITY.match(line):
            out["popularity"] = {"hr@10": hr, "ndcg@10": ndcg}
    return out


def one_arm(name: str, rounds: int) -> dict[str, Any]:
    """``fedrec up`` with the arm's settings, timed from outside."""
    grouping, every = ARMS[name]
    with tempfile.TemporaryDirectory(prefix="fedrec-demo-settings-") as tmp:
        cmd = [
            str(Path(sys.executable).parent / "fedrec"),
            "up",
            "--rounds",
            str(rounds),
            "--eval-every",
            str(every),
            "--upload-grouping",
            grouping,
            "--no-dashboard",
            "--no-recommend",
            "--workdir",
            tmp,
            "--aggregator-port",
            str(free_port()),
            "--worker-http-port",
            str(free_port(2)),
        ]
        env = {**os.environ, "COLUMNS": "300"}  # no wrapped lines in the figures printed
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} -> {done.returncode}:\n{done.stderr[-3000:]}")
        workers = [phase_seconds(p.read_text()) for p in sorted(Path(tmp).glob("worker-*.log"))]
    phases = {
        k: sum(w.get(k, 0.0) for w in workers) / max(1, len(workers))
        for k in ("compute", "evaluate", "upload")
    }
    return {
        "arm": name,
        "upload_grouping": grouping,
        "eval_every": every,
        "rounds": rounds,
        "wall_seconds": wall,
        "worker_seconds": phases,
        **figures(done.stderr),  # (fedrec up prints to stderr)
    }


def main(rounds: Positive = 300, arms: str = ",".join(ARMS), out: OutFile = OUT) -> None:
    names = [a.strip() for a in arms.split(",") if a.strip()]
    unknown = [a for a in names if a not in ARMS]
    if unknown or not names:
        raise fail(f"--arms: unknown {unknown or 'none given'}; choose among {', '.join(ARMS)}")
    started = time.perf_counter()
    results = []
    for name in names:
        r = one_arm(name, rounds)
        print(
            f"{name}: {r['wall_seconds']:.0f} s, final HR@10 {100 * r['final']['hr@10']:.2f}, "
            f"popularity {100 * r['popularity']['hr@10']:.2f}",
            flush=True,
        )
        results.append(r)
    command = f"python -m bench.demo_settings --rounds {rounds} --arms {','.join(names)}"
    write_result(out, {"command": command, "runs": results}, started)


if __name__ == "__main__":
    run(main)
