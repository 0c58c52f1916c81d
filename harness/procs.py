"""Child processes of a test that never outlive it: start a command in its own process group,
and at the end (also when the test fails or times out) stop it and everything it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from harness.loopback import free_port


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid`` from /proc, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children in other sessions included)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                children.setdefault(st[1], []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` that is still alive."""
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def spawned(
    args: list[str], log: IO[Any], grace_s: float = 60.0, **kwargs: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """``args`` running in a new session with output to ``log``.

    At the end of the block, whatever happened in it: SIGTERM to the process, SIGKILL to its
    group after ``grace_s``, and SIGKILL to every descendant seen while it ran that is left.
    """
    proc = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
    )
    try:
        yield proc
    finally:
        seen = descendants(proc.pid)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while proc.poll() is None and time.monotonic() < deadline:
                seen += [p for p in descendants(proc.pid) if p not in seen]
                time.sleep(0.1)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        kill_all(seen)


def wait_for_text(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """Wait until the file ``path`` contains ``text``; its content. Fails if ``proc`` exits
    first or on timeout, with the file's content."""
    deadline = time.monotonic() + timeout_s
    while True:
        content = path.read_text(errors="replace") if path.exists() else ""
        if text in content:
            return content
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {text!r}:\n{content}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} within {timeout_s:.0f}s:\n{content}")
        time.sleep(0.5)


def fedrec_up(*args: str) -> list[str]:
    """The command line of ``fedrec up`` with ``args``, run by this interpreter."""
    return [sys.executable, "-m", FEDREC_MODULE, "up", *args]


def fedrec_up_on(
    workdir: Path, ports: tuple[int, int, int], *args: str, dashboard_port: int | None = None
) -> list[str]:
    """:func:`fedrec_up` in ``workdir`` with the aggregator, recommend_api and first worker
    HTTP ports ``ports``, the dashboard on ``dashboard_port`` (else a free port), and
    ``args``."""
    agg, rec, http0 = ports
    return fedrec_up(
        "--workdir",
        str(workdir),
        "--aggregator-port",
        str(agg),
        "--recommend-port",
        str(rec),
        "--worker-http-port",
        str(http0),
        "--dashboard-port",
        str(free_port() if dashboard_port is None else dashboard_port),
        *args,
    )


# the module whose ``python -m`` is the ``fedrec`` command
FEDREC_MODULE = "services.cli"
