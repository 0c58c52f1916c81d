"""A round's deadline does not run while no aggregator does (services/aggregator/
deadlines.py): the aggregator SIGKILLed mid-round and started again after longer than the
round's deadline continues the same attempt with the same cohort, and the run ends with the
simulator's model, as an undisturbed run does."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from fedrecgel.data import Split
from harness.parity import aggregator_started, parity_options
from tests.e2e.http_run import (
    DATASET,
    SHORT,
    TRAIN,
    Reference,
    assert_matches,
    finish,
    round_status,
    start_training,
    wait_closed,
    wait_partial_round,
)

pytestmark = pytest.mark.slow

#: the round deadline of this run: far above a round's time here (a few seconds), far below
#: the parity runs' hour, so that the aggregator can be down for longer
DEADLINE_S = 20.0


def test_aggregator_down_longer_than_the_deadline_changes_nothing(
    tmp_path: Path, split: Split, reference: Reference
) -> None:
    opts = parity_options(TRAIN, DATASET, tmp_path, rounds=SHORT, workers=2, worker_poll_max_s=0.5)
    opts.run = opts.run.model_copy(update={"deadline_s": DEADLINE_S})
    with aggregator_started(opts) as c:
        start_training(c, split)
        wait_closed(c, 1)
        slow = c.latest("worker-1")
        slow.send(signal.SIGSTOP)  # the open round now waits for worker-1's update
        try:
            before = wait_partial_round(c, after_round=1)
            assert c.latest("aggregator").kill() == -signal.SIGKILL
            time.sleep(DEADLINE_S + 5)  # the round's wall-clock deadline passes meanwhile
            c.start_aggregator()
            after = round_status(c, before["round_id"])
        finally:
            slow.send(signal.SIGCONT)
        assert after["state"] == "open", after
        assert after["attempt"] == before["attempt"], (before, after)
        assert after["cohort_size"] == before["cohort_size"], (before, after)
        history, model = finish(c)
    assert_matches(history, model, reference, SHORT)
