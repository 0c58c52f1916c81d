"""Work beside a round's critical path yields the CPU to it.

A federated round waits on a chain of steps (the last upload, the aggregator's close, the
download, the cohort's computation). Work beside that chain only has to be done eventually:
the aggregator's storage passes (freeing finished rounds' bodies, pruning versions), and a
worker's scoring of a model version once its upload turned out not to be the round's last
(the round then waits for another worker's upload and the aggregator's close, not for this
scoring). On a machine whose cores are shared, such a thread runs with a higher nice value,
so the scheduler gives the chain's threads the cores first. Linux keeps a nice value per
thread; elsewhere this is a no-op.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how much nicer background threads are than the process (0 = as nice as it, 19 = the most)
BACKGROUND_NICENESS = 10


def lower_thread_priority(increment: int = BACKGROUND_NICENESS, tid: int | None = None) -> None:
    """Make a thread of this process (the calling one unless ``tid``, a native thread id)
    ``increment`` nicer, capped at 19, and only it. Never raises: where a thread's nice value
    cannot be set, it keeps the process's. Without privileges a nice value can be raised but
    not lowered back, so a thread made nicer stays so."""
    try:
        tid = threading.get_native_id() if tid is None else tid
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + increment))
    except (AttributeError, OSError) as err:  # no per-thread priorities here
        log.debug("thread priority left as it is: %s", err)


class Background(Generic[T]):
    """``fn(*args)`` in a thread of its own, started at the caller's priority, that
    :meth:`yield_cpu` makes nicer while it runs (a new thread each time, as a thread's nice
    value is not lowered back)."""

    def __init__(self, fn: Callable[..., T], *args: Any) -> None:
        self._out: list[T] = []
        self._error: BaseException | None = None
        self._tid: int | None = None
        started = threading.Event()

        def run() -> None:
            self._tid = threading.get_native_id()
            started.set()
            try:
                self._out.append(fn(*args))
            except BaseException as err:  # re-raised by result(), in the caller's thread
                self._error = err

        self._thread = threading.Thread(target=run, name="background", daemon=True)
        self._thread.start()
        started.wait()

    def yield_cpu(self) -> None:
        """From here on the thread is :data:`BACKGROUND_NICENESS` nicer (if still running)."""
        if self._thread.is_alive() and self._tid is not None:
            lower_thread_priority(tid=self._tid)

    def result(self) -> T:
        """Wait for the call; its value, or its exception raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._out[0]
