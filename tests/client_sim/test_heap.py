"""The worker process freezes its start-up heap (services/heap.py), in a process of its own."""

from __future__ import annotations

import subprocess
import sys

_ENTRY = """
import gc, runpy, sys
sys.argv = ["services.client_sim", "--help"]
try:
    runpy.run_module("services.client_sim", run_name="__main__")
except SystemExit:
    pass
print(gc.get_freeze_count())
"""

_AFTER = """
import gc
import torch  # the bulk of a worker's start-up objects
from services.heap import freeze_startup_heap
frozen = freeze_startup_heap()
walked = len(gc.get_objects())
a, b = [], []
a.append(b)
b.append(a)
del a, b
print(frozen, walked, gc.collect())
"""


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_the_worker_entry_freezes_its_imports() -> None:
    assert int(_run(_ENTRY)) > 50_000


def test_later_passes_walk_only_new_objects_and_still_free_cycles() -> None:
    frozen, walked, collected = map(int, _run(_AFTER).split())
    assert frozen > 50_000
    assert walked < frozen // 10
    assert collected >= 2  # a cycle made after the freeze is still collected
