"""A service app served by uvicorn in a thread on a free loopback port, for the fuzz tests,
and an address-space limit that turns a runaway allocation into an error of the server under
test instead of an out-of-memory kill of the machine."""

from __future__ import annotations

import contextlib
import resource
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from tests.support.loopback import free_port


@contextlib.contextmanager
def served(app: object, timeout_s: float = 60.0) -> Iterator[str]:
    """Serve ``app`` (lifespan included) on 127.0.0.1; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host="127.0.0.1",
        port=port,
        log_level="critical",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"fuzz-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server under test did not start (see its log)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server under test did not start in {timeout_s:.0f}s")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


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
