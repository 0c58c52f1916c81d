"""Background threads that yield the CPU to a round's critical path.

A federated round waits on a chain of steps (the last upload, the aggregator's close, the
download, the cohort's computation); work beside that chain (the aggregator's storage passes,
which free finished rounds' bodies and prune versions) only has to be done eventually. On a machine whose cores are shared, such a thread
runs with a higher nice value, so the scheduler gives the chain's threads the cores first.
Linux keeps a nice value per thread; elsewhere this is a no-op.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

#: how much nicer background threads are than the process (0 = as nice as it, 19 = the most)
BACKGROUND_NICENESS = 10


def lower_thread_priority(increment: int = BACKGROUND_NICENESS) -> None:
    """Make the calling thread ``increment`` nicer (capped at 19), and only it: a thread
    started by this one inherits its nice value. Never raises: where a thread's nice value
    cannot be set, the thread keeps the process's."""
    try:
        tid = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + increment))
    except (AttributeError, OSError) as err:  # no per-thread priorities here
        log.debug("thread priority left as it is: %s", err)
