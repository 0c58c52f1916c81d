"""End-to-end over HTTP with real processes on loopback.

The aggregator (``python -m services.aggregator``) and the client workers
(``python -m services.client_sim``) run as subprocesses on free ports, started through the
launcher's helpers (:mod:`services.launcher`, what ``fedrec up`` uses), with a real
redis-server and SQLite, and again with PostgreSQL. The federated run over HTTP must compute
what the in-process :class:`~fedrecgel.simulate.Simulator` computes (Architecture invariant 5),
also when the aggregator or a worker is SIGKILLed mid-run (invariant 3). That no body on the
wire carries a user's private state or interactions (invariant 1) is checked by
``test_wire_privacy.py``.

The simulator reference is computed once per session (``conftest.py``): a 20-round run,
snapshotted after :data:`~tests.e2e.http_run.SHORT` rounds for the shorter crash and privacy
runs (the first rounds of a run do not depend on its length).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from fedrecgel.data import Split
from tests.e2e.http_run import (
    PARTIAL,
    ROUNDS,
    SHORT,
    Reference,
    assert_matches,
    compare,
    finish,
    round_status,
    services,
    start_training,
    wait_closed,
    wait_partial_round,
)

pytestmark = pytest.mark.slow


# ----------------------------------------------------------------------------- cases 1, 2


@pytest.mark.parametrize(
    ("server", "option", "healthy"),
    [
        pytest.param(
            "redis_url", "redis_url", "redis", id="redis-and-sqlite", marks=pytest.mark.redis
        ),
        pytest.param(
            "postgres_url", "database_url", "database", id="postgres", marks=pytest.mark.postgres
        ),
    ],
)
def test_http_run_matches_simulator(
    server: str,
    option: str,
    healthy: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    split: Split,
    reference: Reference,
) -> None:
    """20 FilmTrust rounds: aggregator + 2 workers over HTTP, with Redis events and SQLite, and
    again with the aggregator on PostgreSQL (no Redis). ``server`` is the fixture of the real
    server the run uses, ``option`` the aggregator setting it goes into, ``healthy`` the part
    of /healthz that must then say ok."""
    url: str = request.getfixturevalue(server)
    server_url: dict[str, Any] = {option: url}  # redis_url or database_url
    with services(tmp_path, ROUNDS, **server_url) as c:
        health = httpx.get(f"{c.agg_url}/healthz", timeout=10).json()
        assert health[healthy] == "ok", health
        start_training(c, split)
        history, model = finish(c)
    assert_matches(history, model, reference, ROUNDS)


# ----------------------------------------------------------------------------- case 3


def test_aggregator_sigkill_mid_round_changes_nothing(
    tmp_path: Path, split: Split, reference: Reference
) -> None:
    """SIGKILL the aggregator while a round holds some but not all updates, restart it on the
    same database and port: the workers ride it out and the run ends with the simulator's
    model."""
    with services(tmp_path, SHORT) as c:
        start_training(c, split)
        wait_closed(c, 1)
        slow = c.latest("worker-1")
        slow.send(signal.SIGSTOP)  # the open round now waits for worker-1's update
        try:
            before = wait_partial_round(c, after_round=1)
            agg = c.latest("aggregator")
            assert agg.kill() == -signal.SIGKILL
            c.start_aggregator()
            after = round_status(c, before["round_id"])
        finally:
            slow.send(signal.SIGCONT)
        # every acknowledged update survived the crash, the round is still open
        assert after["state"] == "open", after
        assert after["attempt"] == before["attempt"], (before, after)
        assert after["updates_received"] >= before["updates_received"], (before, after)
        history, model = finish(c)
        print(f"aggregator killed in round {before['round_id']} with {before['updates_received']}")
    assert_matches(history, model, reference, SHORT)


# ----------------------------------------------------------------------------- case 4


def test_worker_sigkill_mid_run_changes_nothing(
    tmp_path: Path, split: Split, reference: Reference
) -> None:
    """SIGKILL a worker mid-run (its part of the open round missing), restart it on the same
    store: the run completes with the simulator's model."""
    with services(tmp_path, SHORT) as c:
        start_training(c, split)
        wait_closed(c, 1)
        victim = c.latest("worker-1")
        victim.send(signal.SIGSTOP)
        try:
            st = wait_partial_round(c, after_round=1)
        finally:
            code = victim.kill()  # SIGKILL also ends a stopped process
        assert code == -signal.SIGKILL
        c.start_worker(1)
        history, model = finish(c)
        print(f"worker-1 killed in round {st['round_id']} at {st['updates_received']} updates")
    assert_matches(history, model, reference, SHORT)


# ----------------------------------------------------------------------------- case 5


def test_worker_partial_sums_match_the_simulator_bit_for_bit(
    tmp_path: Path, split: Split, partial_reference: Reference
) -> None:
    """``upload_grouping=worker``: each worker uploads one partial sum per round; the simulator
    with the same grouping (one partial sum per shard, combined in the same order) computes the
    same model, to the last bit, and the same losses and metrics. A worker is SIGKILLed
    mid-run and restarted on its store: its recomputed partial sum is the same body."""
    reference = partial_reference
    with services(tmp_path, SHORT, train=PARTIAL) as c:
        start_training(c, split)
        wait_closed(c, 1)
        victim = c.latest("worker-1")
        victim.send(signal.SIGSTOP)
        try:
            wait_partial_round(c, after_round=1)
        finally:
            assert victim.kill() == -signal.SIGKILL
        c.start_worker(1)
        history, model = finish(c)
    assert_matches(history, model, reference, SHORT)
    agree, _ = compare(history, model, reference, SHORT)
    assert agree.max_param == 0.0 and agree.loss == 0.0, agree
