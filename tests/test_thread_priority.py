"""Background threads (the aggregator's storage passes) are made nicer than the process, so
that the threads of a round's critical path get the cores first."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from services.priority import BACKGROUND_NICENESS, lower_thread_priority


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_only_the_calling_thread_becomes_nicer() -> None:
    main_tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, main_tid)
    seen: dict[str, int] = {}

    def background() -> None:
        tid = threading.get_native_id()
        seen["start"] = os.getpriority(os.PRIO_PROCESS, tid)
        lower_thread_priority()
        seen["after"] = os.getpriority(os.PRIO_PROCESS, tid)
        lower_thread_priority()  # capped at 19, never an error
        seen["again"] = os.getpriority(os.PRIO_PROCESS, tid)

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen["start"] == before
    assert seen["after"] == min(19, before + BACKGROUND_NICENESS)
    assert seen["again"] == min(19, before + 2 * BACKGROUND_NICENESS)
    assert os.getpriority(os.PRIO_PROCESS, main_tid) == before
