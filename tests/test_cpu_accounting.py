"""bench/cpu_accounting.py: a process's CPU seconds are kept once it exited and was reaped
(bench/http_vs_simulator.py counted a worker that ended before the run was seen complete as
having used less CPU during the run than before it, a negative figure)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.cpu_accounting import CpuWatch, process_cpu_seconds

_BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"


def test_a_reaped_process_keeps_its_last_reading() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _BURN])
    watch = CpuWatch({"burner": proc.pid}, interval_s=0.02)
    proc.wait(timeout=60)  # reaped: its /proc entry is gone
    time.sleep(0.1)
    assert process_cpu_seconds(proc.pid) == 0.0
    assert watch.stop()["burner"] >= 0.2
