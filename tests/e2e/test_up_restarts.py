"""`fedrec up` starts a service that dies again, with backoff (1 s doubling to 30 s, back to 1 s
after it stayed up a while), says so on its console, and gives up only after repeated fast
failures (services/restarts.py); on real processes, a SIGKILLed aggregator and worker come back
and the run finishes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from harness.procs import descendants, fedrec_up_on, spawned, wait_for_text
from services.restarts import RestartPolicy, Restarts
from services.supervise import LaunchError
from tests.support.loopback import free_port


@dataclass
class FakeProc:
    name: str
    code: int | None = None

    def exit_code(self) -> int | None:
        return self.code

    def exited(self, code: int) -> LaunchError:
        return LaunchError(f"{self.name} exited with code {code}; see {self.name}.log")


class World:
    """A fake clock and services: ``restarts`` starts a new FakeProc, the newest per name."""

    def __init__(self, policy: RestartPolicy | None = None) -> None:
        self.now = 0.0
        self.said: list[str] = []
        self.procs = {"aggregator": FakeProc("aggregator"), "worker-0": FakeProc("worker-0")}
        self.restarts = Restarts(
            start=self._start,
            say=self.said.append,
            finished=lambda name, code: name.startswith("worker") and code == 0,
            policy=policy or RestartPolicy(),
            clock=lambda: self.now,
        )

    def _start(self, name: str) -> FakeProc:
        self.procs[name] = FakeProc(name)
        return self.procs[name]

    def poll(self, after_s: float = 0.0) -> None:
        self.now += after_s
        self.restarts.poll(list(self.procs.values()))

    def die(self, name: str, code: int = -9) -> FakeProc:
        proc = self.procs[name]
        proc.code = code
        return proc


def test_a_dead_service_is_announced_then_started_again_after_the_delay() -> None:
    w = World()
    w.poll()
    dead = w.die("aggregator")
    w.poll(5.0)
    assert w.said == ["aggregator exited with code -9; restarting in 1 s (restart 1)"]
    assert w.procs["aggregator"] is dead  # not yet: the delay runs
    w.poll(0.5)
    assert w.procs["aggregator"] is dead and len(w.said) == 1  # announced once
    w.poll(0.5)
    assert w.procs["aggregator"] is not dead and w.procs["aggregator"].code is None
    assert w.restarts.restarts("aggregator") == 1 and w.restarts.restarts("worker-0") == 0


def test_fast_failures_double_the_delay_then_give_up_with_a_message() -> None:
    w = World()
    w.poll()
    delays = []
    for _ in range(5):
        w.die("aggregator", 3)
        w.poll(1.0)
        delays.append(w.said[-1])
        w.poll(16.0)  # every delay here is at most 16 s
    assert delays == [
        f"aggregator exited with code 3; restarting in {d} s (restart {i + 1})"
        for i, d in enumerate([1, 2, 4, 8, 16])
    ]
    assert w.restarts.restarts("aggregator") == 5
    w.die("aggregator", 3)
    with pytest.raises(LaunchError) as info:
        w.poll(1.0)
    assert str(info.value) == (
        "aggregator exited with code 3; see aggregator.log; it was restarted 5 times in a row "
        "and died each time within 60 s: giving up"
    )


def test_the_delay_stops_at_30_s_and_goes_back_to_1_s_after_a_stable_run() -> None:
    w = World(RestartPolicy(max_fast_restarts=20))
    w.poll()
    said = []
    for _ in range(7):
        w.die("aggregator")
        w.poll(1.0)
        said.append(w.said[-1].split("restarting in ")[1])
        w.poll(30.0)
    assert said == [f"{d} s (restart {i + 1})" for i, d in enumerate([1, 2, 4, 8, 16, 30, 30])]
    w.poll(60.0)  # the new process stays up a minute: its death is a fresh failure
    w.die("aggregator")
    w.poll(0.1)
    assert w.said[-1] == "aggregator exited with code -9; restarting in 1 s (restart 8)"


def test_a_worker_that_finished_stays_down_and_one_that_died_comes_back() -> None:
    w = World()
    w.poll()
    w.die("worker-0", 0)
    w.poll(10.0)
    assert w.said == [] and w.procs["worker-0"].code == 0
    w.procs["worker-0"] = FakeProc("worker-0")
    w.die("worker-0", 1)
    w.poll(10.0)
    w.poll(1.0)
    assert w.said == ["worker-0 exited with code 1; restarting in 1 s (restart 1)"]
    assert w.procs["worker-0"].code is None


def _wait_closed(agg_url: str, rounds: int, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the run has closed ``rounds`` rounds."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            body = httpx.get(f"{agg_url}/v1/runs/current/history", timeout=5).json()
            if len(body.get("rounds", [])) >= rounds:
                return
        time.sleep(0.3)
    raise AssertionError(f"{rounds} rounds not closed in time")


def _pid_of(launcher: int, module: str) -> int:
    """The pid of the launcher's child running ``python -m <module>``."""
    for pid in descendants(launcher):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if module.encode() in args:
            return pid
    raise AssertionError(f"no {module} below {launcher}")


@pytest.mark.slow
def test_a_sigkilled_aggregator_and_worker_come_back_and_the_run_finishes(tmp_path: Path) -> None:
    agg, rec, http0 = free_port(), free_port(), free_port(2)
    log_path = tmp_path / "up.log"
    args = fedrec_up_on(tmp_path / "up", (agg, rec, http0), "--rounds", "4", "--no-dashboard")
    with (
        log_path.open("w") as log,
        spawned(args, log, env={**os.environ, "COLUMNS": "300"}) as proc,
    ):
        wait_for_text(log_path, "clients registered", proc, timeout_s=400)
        _wait_closed(f"http://127.0.0.1:{agg}", 1, proc)  # then kill it mid-run
        os.kill(_pid_of(proc.pid, "services.aggregator"), signal.SIGKILL)
        worker = _pid_of(proc.pid, "services.client_sim")
        os.kill(worker, signal.SIGKILL)
        wait_for_text(log_path, "aggregator exited with code -9; restarting in 1 s", proc, 60)
        code = proc.wait(600)
    text = log_path.read_text()
    assert code == 0, text
    assert "aggregator exited with code -9; restarting in 1 s (restart 1)" in text, text
    assert "worker-0 exited with code -9; restarting in 1 s (restart 1)" in text or (
        "worker-1 exited with code -9; restarting in 1 s (restart 1)" in text
    ), text
    assert "final round 4: HR@10" in text and "Traceback" not in text, text
