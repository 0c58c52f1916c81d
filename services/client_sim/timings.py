"""Where a worker's time goes: wall seconds per phase of its loop, as a Prometheus histogram
(``fedrec_worker_phase_seconds{phase}``) and as one log line per trained round.

Phases: ``poll`` (asking for the current round), ``wait`` (idle between polls, until a version
event or the poll interval), ``download`` (model versions), ``evaluate`` (scoring all owned
users), ``report`` (posting the metric sums), ``compute`` (the cohort's SAM step), ``encode``
(the upload bodies), ``upload`` (posting them: the aggregator's validation and group commit
included), ``commit`` (the new private states into the store). ``encode`` and ``upload`` run in
the worker's upload thread at the same time as the scoring of the round's base version
(``evaluate``), and so does ``report`` after the commit, at the same time as the worker's next
poll, download and compute: a round's phases can add up to more than its wall time. The log
line also gives each phase's CPU seconds (``cpu_<phase>``: the CPU time of the thread that ran
it), which tells computing from waiting.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram

PHASES = (
    "poll",
    "wait",
    "download",
    "evaluate",
    "report",
    "compute",
    "encode",
    "upload",
    "commit",
)


class PhaseTimer:
    """Seconds per phase: cumulative in the histogram, per round in :meth:`take`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.seconds = Histogram(
            "fedrec_worker_phase_seconds",
            "Wall seconds of one phase of the worker's loop",
            ["phase"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()  # the upload thread times its phases too
        #: wall clock of the newest answer to a poll (the one a round's work started from)
        self.seen = 0.0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name``."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            dt, dc = time.perf_counter() - t0, time.thread_time() - c0
            self.seconds.labels(phase=name).observe(dt)
            cpu = f"cpu_{name}"
            with self._lock:
                self._since[name] = self._since.get(name, 0.0) + dt
                self._since[cpu] = self._since.get(cpu, 0.0) + dc

    def take(self) -> dict[str, float]:
        """Seconds per phase since the last call (then reset): wall seconds under the phase's
        name, CPU seconds under ``cpu_<phase>``."""
        with self._lock:
            out, self._since = self._since, {}
        return out

    def line(self, round_id: int, phases: dict[str, float]) -> str:
        """The log line of a trained round: its phases, the wall clock of the poll answer it
        started from (``seen``) and at its end."""
        body = {
            "round": round_id,
            "seen": self.seen,
            "end": time.time(),
            **{k: round(v, 6) for k, v in phases.items()},
        }
        return "round timings " + json.dumps(body, sort_keys=True)
