"""A worker's masked inputs of secure aggregation go several to a body
(:meth:`SecureParticipant._masked_bodies`), within a byte budget, each body built while the one
before it is sent; a client the aggregator refuses on its own in a batch leaves the attempt,
the batch's others stay; a send that fails and may be retried keeps every unsent body, built
once; the client step taken after the keys keeps its failure for the masked step."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from fedrecgel.cohort import client_groups, select_cohort
from fedrecgel.secagg import messages
from services.client_sim.aggregator_client import AggregatorCallError
from services.client_sim.secure import MASKED_BODY_BYTES, Attempt, SecureParticipant
from services.contract import CurrentRound, RunConfig, SecAggRound


def test_masked_inputs_are_batched_within_the_budget() -> None:
    inputs = [(u, bytes([u]) * (100 + u)) for u in range(10)]
    bodies = list(SecureParticipant._masked_bodies(inputs, budget=400))
    assert [ids for ids, _ in bodies] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    for ids, body in bodies:
        assert len(body) <= 400
        assert messages.split_masked_batch(body, len(ids)) == [inputs[u] for u in ids]
    big = [(1, b"x" * 500), (2, b"y" * 10)]
    assert [ids for ids, _ in SecureParticipant._masked_bodies(big, budget=400)] == [[1], [2]]
    one = list(SecureParticipant._masked_bodies(inputs))
    assert len(one) == 1 and MASKED_BODY_BYTES >= 1 << 20


class Answers:
    """An aggregator client that answers every masked body with fixed statuses."""

    def __init__(self, statuses: dict[int, str]) -> None:
        self.statuses = statuses
        self.sent: list[bytes] = []

    def secagg_send(self, round_id: int, step: str, body: bytes) -> dict[int, str]:
        self.sent.append(body)
        return dict(self.statuses)


def test_a_client_refused_in_a_batch_leaves_the_attempt_alone() -> None:
    fake = Answers({1: "accepted", 2: "refused", 3: "duplicate"})
    p = SecureParticipant(fake, None, None)  # type: ignore[arg-type]
    att = Attempt((1, 1, 0), 0, [1, 2, 3])
    att.clients = {1: object(), 2: object(), 3: object()}  # type: ignore[dict-item]
    body: Any = messages.encode_masked_batch([(1, b"a"), (2, b"b"), (3, b"c")])
    ok = p._send(att, "masked", [([1, 2, 3], body)])
    assert ok == {1, 3} and set(att.clients) == {1, 3} and fake.sent == [body]


class FailsOnce:
    """An aggregator client whose answer to the ``nth`` body sent is a retryable failure."""

    def __init__(self, nth: int) -> None:
        self.nth = nth
        self.sent: list[bytes] = []

    def secagg_send(self, round_id: int, step: str, body: bytes) -> dict[int, str]:
        self.sent.append(body)
        if len(self.sent) == self.nth:
            raise AggregatorCallError(503, "unavailable", "the database is down")
        ids = [u for u, _ in messages.split_masked_batch(body, 10)]
        return dict.fromkeys(ids, "accepted")


def test_bodies_are_built_as_they_are_sent_and_a_failed_send_keeps_the_rest_built() -> None:
    built: list[int] = []

    def inputs() -> Iterator[tuple[int, bytes]]:
        for u in range(6):
            built.append(u)
            yield u, bytes([u]) * 150

    fake = FailsOnce(nth=2)
    p = SecureParticipant(fake, None, None)  # type: ignore[arg-type]
    att = Attempt((1, 1, 0), 0, list(range(6)))
    att.clients = dict.fromkeys(range(6), object())  # type: ignore[arg-type]
    bodies = SecureParticipant._masked_bodies(inputs(), budget=400)  # two inputs a body
    assert built == []  # nothing is masked before it is read
    with pytest.raises(AggregatorCallError):
        p._send(att, "masked", bodies)
    assert built == list(range(6))  # the rest was built (once) when the send failed
    assert att.taken["masked"] == {0, 1}  # the first body's clients were taken
    kept = list(att.outbox["masked"])
    assert [ids for ids, _ in kept] == [[2, 3], [4, 5]]
    assert kept[0][1] == fake.sent[1]  # the failed body goes again, the same bytes
    ok = p._send(att, "masked", att.outbox.pop("masked"))
    assert ok == set(range(6)) and set(att.clients) == set(range(6))
    assert fake.sent[2:] == [body for _, body in kept]


def test_a_client_step_failed_after_the_keys_raises_at_the_masked_step_then_runs_anew() -> None:
    calls: list[list[int]] = []

    def compute(cfg: Any, version: int, r: int, users: list[int], n: int) -> Any:
        calls.append(users)
        if len(calls) == 1:
            raise RuntimeError("the step failed")
        return "the step's result"

    p = SecureParticipant(None, None, compute)  # type: ignore[arg-type]
    att = Attempt((1, 1, 0), 0, [4, 5])
    att.training = p._train_now(None, att, 2)  # type: ignore[arg-type]
    assert calls == [[4, 5]]  # taken at once, in this thread
    with pytest.raises(RuntimeError, match="the step failed"):
        p._trained(att, None, 2)  # type: ignore[arg-type]
    assert p._trained(att, None, 2) == "the step's result"  # type: ignore[arg-type,comparison-overlap]
    assert calls == [[4, 5], [4, 5]]


class Shows:
    """An aggregator client that shows one attempt's keys phase with a given cohort and records
    what is sent."""

    def __init__(self, cohort: list[int]) -> None:
        self.cohort = cohort
        self.sent: list[str] = []

    def secagg_round(self, round_id: int) -> SecAggRound:
        deadline = datetime(2026, 1, 1, tzinfo=UTC)
        return SecAggRound(
            round_id=round_id, attempt=0, phase="keys", deadline=deadline, cohort=self.cohort
        )

    def secagg_send(self, round_id: int, step: str, body: bytes) -> dict[int, str]:
        self.sent.append(step)
        ids = [int(d["client_id"]) for d in json.loads(body)]
        return dict.fromkeys(ids, "accepted")


def test_a_worker_keeps_its_clients_out_of_a_cohort_that_splits_one_of_their_groups(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run of whole groups: the worker's clients take part only when the cohort holds each
    of its groups whole, as far as this worker's clients show (an aggregator that draws part
    of a group to single a client out is caught by the group's other clients here)."""
    cfg = RunConfig(n_items=50, secure_aggregation="dense", cohort_groups=4, fraction=0.5, seed=7)
    owned = list(range(0, 40, 2))  # this worker's clients; the others are another worker's
    everyone = np.arange(40)
    groups = client_groups(everyone, 4, 7)
    whole = select_cohort(everyone, 0.5, 7, 1, groups=4).tolist()
    mine = [u for u in owned if u in whole]
    info = CurrentRound(run_id=1, round_id=1, attempt=0, state="open", cohort=mine, config=cfg)

    victim = mine[0]
    mates = [u for u in whole if groups[u] == groups[victim] and u != victim and u in owned]
    assert mates  # the victim's group has other members on this worker
    partial = [u for u in whole if u not in mates]  # the victim's group without its mates here
    fake = Shows(partial)
    p = SecureParticipant(fake, None, lambda *a: None, owned)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="services.client_sim.secure"):
        assert not p.step(info, cfg, 0, [u for u in mine if u in partial])
    assert fake.sent == [] and p.attempt is not None and p.attempt.out
    assert f"part of group(s) [{groups[victim]}]" in caplog.text

    fair = Shows(whole)
    p = SecureParticipant(fair, None, lambda *a: None, owned)  # type: ignore[arg-type]
    assert p.step(info, cfg, 0, mine)
    assert fair.sent == ["keys"]
