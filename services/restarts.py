"""Restarting the services of ``fedrec up`` that die: the aggregator, a worker, the
recommendation API or the dashboard is started again (same database, store, port and tokens)
after a backoff, and the launcher gives up only after repeated fast failures.

The policy, per service: the first restart waits ``first_delay_s`` (1 s), each further one in a
row twice as long, at most ``max_delay_s`` (30 s). A process that stayed up ``stable_s`` (60 s)
before dying counts as a fresh failure: its restart waits ``first_delay_s`` again. After
``max_fast_restarts`` (5) restarts in a row whose process each died within ``stable_s``, the
next such death is final: :class:`~services.supervise.LaunchError` says so and everything stops.

Nothing here blocks: :meth:`Restarts.poll` is called from the launcher's waiting loops; a
death is announced on the console when it is seen, and the process started once its delay
has passed.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from services.supervise import LaunchError

#: log lines that say nothing of why a service stopped (uvicorn's closing lines)
QUIET_LOG_LINES = ("ERROR:    Application startup failed", "ERROR:    Traceback", "Traceback")


@dataclass
class Proc:
    """A started child process and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def send(self, sig: int) -> None:
        """Send ``sig`` to the process (nothing when it has exited already)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def exit_code(self) -> int | None:
        """The exit status, None while it runs."""
        return self.popen.poll()

    def kill(self) -> int:
        """SIGKILL the process and reap it; returns its exit status."""
        self.send(signal.SIGKILL)
        return self.popen.wait()

    def last_error(self) -> str:
        """The last line of the log that says something (an exception's own line, not its
        traceback's indented frames nor the server's closing line); '' when none."""
        for line in reversed(self.log_tail().splitlines()):
            line = line.strip()
            if line and not line.startswith(QUIET_LOG_LINES) and line == line.lstrip():
                return line
        return ""

    def exited(self, code: int) -> LaunchError:
        """The error of this process's exit with ``code``: what went wrong, and its log."""
        why = self.last_error()
        return LaunchError(
            f"{self.name} exited with code {code}"
            + (f": {why}" if why else "")
            + f"; see {self.log_path}"
        )

    def log_tail(self, n_bytes: int = 4000) -> str:
        """The end of the process's log (for error messages)."""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-n_bytes:].decode(errors="replace")


class Started(Protocol):
    """What :class:`Restarts` needs of a started process (:class:`services.launcher.Proc`)."""

    name: str

    def exit_code(self) -> int | None:
        """The exit status, None while it runs."""

    def exited(self, code: int) -> LaunchError:
        """The error of its exit with ``code``."""


@dataclass
class RestartPolicy:
    """The backoff of :class:`Restarts` (see the module's text)."""

    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    stable_s: float = 60.0
    max_fast_restarts: int = 5

    def delay(self, fast_in_a_row: int) -> float:
        """The wait before a restart that follows ``fast_in_a_row`` fast restarts."""
        return float(min(self.max_delay_s, self.first_delay_s * 2**fast_in_a_row))


@dataclass
class _Service:
    started_at: float
    fast_in_a_row: int = 0  # restarts in a row whose process died within stable_s
    restarts: int = 0
    due: float | None = None  # when the pending restart starts; None: none pending
    seen_dead: object = None  # the process whose death was announced


@dataclass
class Restarts:
    """Starts dead services again with :class:`RestartPolicy`'s backoff.

    ``start(name)`` starts the service ``name`` again and returns its new process;
    ``finished(name, code)`` says whether an exit is the end of the service's work rather than
    a death (a worker that exits 0 at the end of the run); ``say`` prints a line.
    """

    start: Callable[[str], Started]
    say: Callable[[str], None]
    finished: Callable[[str, int], bool] = lambda name, code: False
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    clock: Callable[[], float] = time.monotonic
    _services: dict[str, _Service] = field(default_factory=dict)

    def poll(self, procs: Iterable[Started]) -> None:
        """Look at the newest process of each service: announce a death and schedule its
        restart, or start the restart that is due. Raises LaunchError when a service failed
        fast too often."""
        now = self.clock()
        for proc in procs:
            svc = self._services.setdefault(proc.name, _Service(started_at=now))
            code = proc.exit_code()
            if code is None or self.finished(proc.name, code):
                continue
            if svc.due is None and svc.seen_dead is not proc:
                self._schedule(proc, svc, code, now)
            if svc.due is not None and now >= svc.due:
                svc.due, svc.restarts = None, svc.restarts + 1
                svc.started_at = self.clock()
                self.start(proc.name)

    def _schedule(self, proc: Started, svc: _Service, code: int, now: float) -> None:
        pol = self.policy
        if now - svc.started_at >= pol.stable_s:
            svc.fast_in_a_row = 0  # it stayed up a while: back to the first delay
        elif svc.fast_in_a_row >= pol.max_fast_restarts:
            raise LaunchError(
                f"{proc.exited(code)}; it was restarted {svc.fast_in_a_row} times in a row and "
                f"died each time within {pol.stable_s:.0f} s: giving up"
            )
        delay = pol.delay(svc.fast_in_a_row)
        svc.fast_in_a_row += 1
        svc.seen_dead, svc.due = proc, now + delay
        self.say(
            f"{proc.name} exited with code {code}; restarting in {delay:g} s (restart {svc.restarts + 1})"
        )

    def restarts(self, name: str) -> int:
        """How many times the service ``name`` was started again."""
        svc = self._services.get(name)
        return svc.restarts if svc else 0
