"""Background threads (the aggregator's storage passes, a worker's scoring once its upload was
not the round's last) are made nicer than the process, so that the threads of a round's
critical path get the cores first."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from services.priority import BACKGROUND_NICENESS, Background, lower_thread_priority


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


def test_a_background_call_gives_its_value_or_raises_its_error() -> None:
    assert Background(lambda a, b: a + b, 2, 3).result() == 5

    def fail() -> None:
        raise ValueError("scoring failed")

    with pytest.raises(ValueError, match="scoring failed"):
        Background(fail).result()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_yield_cpu_makes_only_the_background_thread_nicer() -> None:
    main_tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, main_tid)
    go = threading.Event()

    def niceness() -> int:
        go.wait(10)
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    started = Background(niceness)  # at the caller's priority until told
    started.yield_cpu()
    go.set()
    assert started.result() == min(19, before + BACKGROUND_NICENESS)
    assert os.getpriority(os.PRIO_PROCESS, main_tid) == before
    fresh = Background(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    assert fresh.result() == before  # the next call's thread starts as nice as the caller
