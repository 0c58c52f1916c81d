"""A client step's freed memory is reused without page faults (glibc), in a fresh process."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")

# allocates, writes and frees a 48 MiB block (above glibc's automatic 32 MiB limit, below the
# raised 64 MiB threshold) three times and counts the page faults of the third time
_PROBE = """
import json, resource, sys
import torch
if sys.argv[1] == "step":
    import numpy as np
    from fedrecgel.model import ModelConfig
    from fedrecgel.sam import PrivateState, SAMConfig, client_samples, client_rng, cohort_step
    cfg = ModelConfig(n_items=50, factor=4, layers=1)
    shared = {k: torch.zeros(s) for k, s in cfg.shared_shapes().items()}
    users = np.arange(2)
    samples = [client_samples(np.array([1, 2]), 50, 2, client_rng(0, 1, int(u))) for u in users]
    cohort_step(cfg, shared, users, PrivateState.fresh(cfg, 0, users), samples, SAMConfig())
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(12 << 20)  # 48 MiB, every page written
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _faults(mode: str) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    faults: list[int] = json.loads(out.stdout.strip().splitlines()[-1])
    return faults


def test_memory_freed_after_a_step_is_reused_without_faults() -> None:
    plain = _faults("plain")
    after_step = _faults("step")
    # without the step's setting every 48 MiB block is a fresh mapping: ~12k faults each time
    assert plain[2] > 5000, plain
    # after a client step the freed block stays in the heap: the third one costs no new pages
    assert after_step[2] < 500, after_step
