"""An address-space limit for the fuzz tests, which turns a runaway allocation into an error
of the server under test instead of an out-of-memory kill of the machine (the servers run in
threads of the test process: :func:`harness.loopback.serve_app`)."""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator
from pathlib import Path


def _vm_size() -> int:
    """This process's mapped address space (bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


@contextlib.contextmanager
def address_space_headroom(headroom_bytes: int) -> Iterator[None]:
    """Limit this process's address space to what it maps now plus ``headroom_bytes`` for the
    block (the previous limit comes back after it). An allocation beyond fails with an error
    (a 5xx of the service under test: a finding) instead of exhausting the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + headroom_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
