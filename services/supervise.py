"""Supervising the processes of ``fedrec up``: stop signals, the work directory's lock and what
the launcher may clear in it, and children that die with their launcher."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class LaunchError(RuntimeError):
    """A process did not start or the run could not be driven; the message says which."""


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: stop everything, as Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        """The signal's name (``SIGTERM``)."""
        return signal.Signals(self.signum).name


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
LOCK_FILE = "fedrec-up.lock"
TOKEN_FILE = "operator.token"
# what a launcher leaves in its work directory; only these are cleared by the next one
#: the names of the files a launcher writes in its work directory (databases with their SQLite
#: companions, the services' logs, the operator token): nothing else there is ever removed
OWN_FILES = re.compile(
    r"(aggregator|worker-\d+)\.db(-wal|-shm|-journal)?"
    r"|(aggregator|recommend_api|dashboard|worker-\d+)\.log"
    rf"|{re.escape(TOKEN_FILE)}"
)


@contextlib.contextmanager
def _signals_handled(
    handler: Callable[[int, Any], None] | signal.Handlers, signals: tuple[signal.Signals, ...]
) -> Iterator[None]:
    """``handler`` for ``signals`` during the block, the previous handlers back after; only in
    the main thread (elsewhere Python cannot set handlers, and the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stop_on_signals() -> contextlib.AbstractContextManager[None]:
    """Turn SIGTERM and SIGHUP into :class:`Stopped` in the main thread for the block, so that
    the cleanup of an interrupted ``with`` runs as it does on Ctrl-C (whether or not SIGINT is
    ignored, as it is for a background job of a script). Previous handlers come back after."""

    def handler(signum: int, frame: object) -> None:
        raise Stopped(signum)

    return _signals_handled(handler, STOP_SIGNALS)


def uninterrupted() -> contextlib.AbstractContextManager[None]:
    """Ignore Ctrl-C, SIGTERM and SIGHUP for the block (a cleanup that must not be cut short)."""
    return _signals_handled(signal.SIG_IGN, (signal.SIGINT, *STOP_SIGNALS))


@contextlib.contextmanager
def locked_workdir(workdir: Path) -> Iterator[Path]:
    """Hold an exclusive lock on ``workdir`` (created if needed) for the block.

    The lock is an ``flock`` on ``workdir/fedrec-up.lock``, which holds the owner's pid; the
    kernel drops it when the owner exits, however it exits. Raises LaunchError, having changed
    nothing, when another process holds it.
    """
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(workdir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise LaunchError(f"cannot use work directory {workdir}: {err.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise LaunchError(f"cannot lock work directory {workdir}: {err}") from None
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise LaunchError(
                f"work directory {workdir} is in use by another `fedrec up` (pid {owner}); "
                "stop that one first or choose another --workdir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield workdir
    finally:
        os.close(fd)


def _own_files(workdir: Path) -> list[Path]:
    return sorted(
        path
        for path in workdir.iterdir()
        if OWN_FILES.fullmatch(path.name) and (path.is_symlink() or path.is_file())
    )


def check_workdir(workdir: Path, launchers: bool) -> None:
    """LaunchError, removing nothing, when ``workdir`` holds files of the names a launcher
    writes (an aggregator's database, say) but no launcher has used it (``launchers``: the lock
    file was there before this one's): they are someone else's, not for the launcher to clear."""
    found = [path.name for path in _own_files(workdir)]
    if found and not launchers:
        raise LaunchError(
            f"work directory {workdir} holds {', '.join(found)}, which no `fedrec up` wrote "
            f"(there is no {LOCK_FILE}) and which `fedrec up` would replace; choose another "
            "--workdir, or move them away"
        )


def clear_workdir(workdir: Path) -> None:
    """Remove what an earlier launcher left in ``workdir`` (databases, stores, logs, token):
    files of exactly those names; any other file, and every folder, is left alone."""
    for path in _own_files(workdir):
        path.unlink(missing_ok=True)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux SIGTERM the child when the launcher dies (also by
    SIGKILL); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
