"""CPU time of processes and of the machine (Linux ``/proc``), and how much arithmetic the
machine's CPUs do at once.

    .venv/bin/python -m bench.cpu_accounting [--repeats 5] [--seconds 2]

:func:`parallel_capacity` asks what the machine's logical CPUs give when several run at once:
the float32 matmul rate of one single-threaded process alone, then of each of N such
processes running together (N = the number of CPUs), interleaved ``--repeats`` times. On a
machine whose CPUs are separate cores, N processes together do about N times one alone; on
one whose CPUs share a core's vector units (hyperthreads of one core, as a virtual machine's
CPUs may be on its host), about once. Writes bench/results/parallel_capacity.json.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_cli import OutFile, Positive

OUT = Path(__file__).resolve().parent / "results" / "parallel_capacity.json"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

#: a single-threaded process that multiplies 512x512 float32 matrices for a given time after
#: a start signal (a line on stdin), then prints its rate (FLOP/s)
_PROBE = """
import sys, time, torch
torch.set_num_threads(1)
a, b, out = torch.randn(512, 512), torch.randn(512, 512), torch.empty(512, 512)
for _ in range(20):
    torch.mm(a, b, out=out)
print("ready", flush=True)
seconds = float(sys.stdin.readline())
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < seconds:
    for _ in range(10):
        torch.mm(a, b, out=out)
    n += 10
print(2.0 * 512**3 * n / (time.perf_counter() - t0), flush=True)
"""


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far; 0.0 once gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15)


class CpuWatch:
    """The CPU seconds of some processes, read every ``interval_s`` in a thread, so that a
    process that exits (a worker ends once it has evaluated the run's last version, and its
    parent reaps it, which removes its ``/proc`` entry) keeps its last reading instead of
    counting 0 (what :func:`process_cpu_seconds` gives once it is gone)."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.05) -> None:
        self.pids = dict(pids)
        self.last = {name: process_cpu_seconds(pid) for name, pid in self.pids.items()}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), daemon=True)
        self._thread.start()

    def _read(self) -> dict[str, float]:
        with self._lock:
            for name, pid in self.pids.items():
                now = process_cpu_seconds(pid)
                if now > 0.0:  # 0.0: gone (a live process never reads less than before)
                    self.last[name] = max(self.last[name], now)
            return dict(self.last)

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self._read()

    def seconds(self) -> dict[str, float]:
        """Each process's CPU seconds so far (for one that exited, its last reading)."""
        return self._read()

    def stop(self) -> dict[str, float]:
        """Stop reading; the final :meth:`seconds`."""
        self._stop.set()
        self._thread.join()
        return self._read()


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every CPU, every process) so far."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK


def _rates(n: int, seconds: float) -> list[float]:
    """The matmul rate of each of ``n`` probe processes started together."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROBE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for _ in range(n)
    ]
    try:
        for p in procs:  # all warmed up before any starts timing
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a probe process did not start")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{seconds}\n")
            p.stdin.flush()
        return [float(p.communicate(timeout=seconds + 60)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def parallel_capacity(repeats: int, seconds: float, n: int) -> dict[str, Any]:
    """One probe alone against ``n`` probes at once, interleaved ``repeats`` times."""
    alone: list[float] = []
    together: list[float] = []
    for _ in range(repeats):
        alone += _rates(1, seconds)
        rates = _rates(n, seconds)
        together.append(sum(rates))
    one = statistics.median(alone)
    all_ = statistics.median(together)
    return {
        "processes": n,
        "seconds_each": seconds,
        "one_alone_gflops": [r / 1e9 for r in alone],
        "together_sum_gflops": [r / 1e9 for r in together],
        "one_alone_gflops_median": one / 1e9,
        "together_sum_gflops_median": all_ / 1e9,
        # N for N separate cores, 1 when the CPUs share one core's arithmetic
        "capacity_in_cpus": all_ / one,
    }


def main(repeats: Positive = 5, seconds: float = 2.0, out: OutFile = OUT) -> None:
    """Measure and write bench/results/parallel_capacity.json."""
    cpus = os.cpu_count() or 1
    load = os.getloadavg()[0]
    t0 = time.time()
    busy0 = machine_busy_seconds()
    result = parallel_capacity(repeats, seconds, cpus)
    report = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.cpu_accounting",
        "machine": {"cpus": cpus, "python": platform.python_version()},
        "load_avg_1m_at_start": load,
        "load_avg_1m_at_end": os.getloadavg()[0],
        "machine_busy_fraction": (machine_busy_seconds() - busy0) / (time.time() - t0) / cpus,
        **result,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"one process alone {result['one_alone_gflops_median']:.0f} GFLOP/s, {cpus} together "
        f"{result['together_sum_gflops_median']:.0f} GFLOP/s in all: the CPUs do "
        f"{result['capacity_in_cpus']:.2f}x one -> {out}"
    )


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
