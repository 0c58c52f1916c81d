"""Aggregator replicas behind a balancer, for real on loopback: three ``fedrec aggregator``
processes over one PostgreSQL and one Redis behind Debian's haproxy (round-robin, health
checks on ``/healthz``), two client workers training through the balancer, and one replica
SIGKILLed mid-round. The run finishes, every model version exists (and is announced) exactly
once, and the final model is the in-process simulator's."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from fedrecgel.data import Split
from harness.parity import parity_options
from services.aggregator.events import VERSIONS_CHANNEL
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
from tests.support.replicas import replicas_behind_balancer

pytestmark = [pytest.mark.slow, pytest.mark.haproxy]

REPLICAS = 3


class VersionEvents:
    """Every message on the Redis version channel, collected in a thread."""

    def __init__(self, url: str) -> None:
        self.seen: list[dict[str, int]] = []
        self.pubsub = redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(**{VERSIONS_CHANNEL: self._on})
        self.thread = self.pubsub.run_in_thread(sleep_time=0.05, daemon=True)

    def _on(self, msg: dict[str, bytes]) -> None:
        self.seen.append(json.loads(msg["data"]))

    def stop(self) -> None:
        self.thread.stop()
        self.thread.join(5)
        self.pubsub.close()


def _stored(database_url: str) -> tuple[Counter[int], list[tuple[int, int, str, int | None]]]:
    """The newest run's model versions (version -> rows) and round attempts (round, attempt,
    state, model version), read from the database itself."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            run_id = conn.execute(text("SELECT max(id) FROM runs")).scalar_one()
            versions = Counter(
                int(v)
                for (v,) in conn.execute(
                    text("SELECT version FROM model_versions WHERE run_id = :r"), {"r": run_id}
                )
            )
            rounds = [
                (int(r), int(a), str(s), None if v is None else int(v))
                for r, a, s, v in conn.execute(
                    text(
                        "SELECT round_id, attempt, state, model_version FROM rounds "
                        "WHERE run_id = :r ORDER BY round_id, attempt"
                    ),
                    {"r": run_id},
                )
            ]
    finally:
        engine.dispose()
    return versions, rounds


def test_replicas_behind_haproxy_survive_a_sigkill_and_match_the_simulator(
    tmp_path: Path,
    split: Split,
    reference: Reference,
    postgres_url: str,
    redis_url: str,
) -> None:
    """Worker-1 is stopped so that a round waits half-received; a replica is SIGKILLed
    then, the balancer takes it out, worker-1 goes on through the others; the killed replica
    is started again (its caches from before: a stale model state, no pending uploads) and
    rejoins. Every closed round is counted once, by whichever replica closed it."""
    opts = parity_options(
        TRAIN,
        DATASET,
        tmp_path,
        rounds=SHORT,
        workers=2,
        redis_url=redis_url,
        database_url=postgres_url,
        worker_poll_max_s=0.5,
        worker_log_level="INFO",
        aggregator_log_level="info",
    )
    events = VersionEvents(redis_url)
    try:
        with replicas_behind_balancer(opts, REPLICAS) as (c, lb):
            start_training(c, split)
            wait_closed(c, 1)
            slow = c.latest("worker-1")
            slow.send(signal.SIGSTOP)  # the open round now waits for worker-1's uploads
            try:
                before = wait_partial_round(c, after_round=1)
                assert c.kill("aggregator-1") == -signal.SIGKILL
                lb.wait_status("aggregator-1", "DOWN")
            finally:
                slow.send(signal.SIGCONT)
            wait_closed(c, before["round_id"])
            after = round_status(c, before["round_id"])
            c.start_replica("aggregator-1")
            lb.wait_status("aggregator-1", "UP")
            history, model = finish(c)
            served = {name: int(row["stot"]) for name, row in lb.servers().items()}
            closes = c.closes()
        print(f"killed aggregator-1 in round {before['round_id']} at {before['updates_received']}")
        print(f"requests per replica {served}; closes (replica, round, version) {closes}")
    finally:
        events.stop()
    assert after["attempt"] == before["attempt"] and after["state"] == "closed", (before, after)
    assert all(n > 0 for n in served.values()), served
    # each round closed once, by one replica, into the version of its number
    assert sorted((r, v) for _, r, v in closes) == [(r, r) for r in range(1, SHORT + 1)], closes
    versions, rounds = _stored(postgres_url)
    assert versions == Counter(range(SHORT + 1)), versions
    assert rounds == [(r, 0, "closed", r) for r in range(1, SHORT + 1)], rounds
    assert sorted(e["version"] for e in events.seen) == list(range(1, SHORT + 1)), events.seen
    assert_matches(history, model, reference, SHORT)
