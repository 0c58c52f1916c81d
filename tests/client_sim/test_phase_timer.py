"""The worker's phase timer: wall seconds and CPU seconds of each phase, per round."""

from __future__ import annotations

import threading
import time

from services.client_sim.timings import PhaseTimer


def _spin(seconds: float) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


def test_a_phase_records_its_wall_and_its_cpu_seconds() -> None:
    timer = PhaseTimer()
    with timer.phase("wait"):
        time.sleep(0.2)
    with timer.phase("compute"):
        _spin(0.2)
    got = timer.take()
    assert got["wait"] >= 0.2 and got["compute"] >= 0.2
    assert got["cpu_wait"] < 0.1  # sleeping costs no CPU
    assert got["cpu_compute"] > 0.02  # spinning does, even on a loaded machine
    assert timer.take() == {}  # reset


def test_cpu_seconds_are_those_of_the_thread_that_ran_the_phase() -> None:
    """A phase in another thread is not charged with this thread's CPU, and the reverse."""
    timer = PhaseTimer()
    done = threading.Event()

    def upload() -> None:
        with timer.phase("upload"):
            done.wait(5.0)  # idle while the main thread computes

    t = threading.Thread(target=upload)
    t.start()
    with timer.phase("compute"):
        _spin(0.2)
    done.set()
    t.join()
    got = timer.take()
    assert got["upload"] >= 0.2
    assert got["cpu_upload"] < 0.1
    assert got["cpu_compute"] > 0.02
