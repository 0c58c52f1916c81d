"""Secure aggregation over HTTP with real processes: the aggregator process (SQLite) and
FilmTrust workers, either as processes or in this process behind a recording transport (so a
test can step them phase by phase, drop a client, tamper with a message or kill the aggregator
at a chosen moment).

Every run is compared with the simulator's secure run of the same settings
(``fedrec train --secure-aggregation dense``): the fixed-point sum of the same inputs is the
same integer whichever way it is taken, so an HTTP run that computes the right sums publishes
the simulator's models (to float32 rounding of the server step: :data:`TOL`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from fedrecgel.data import Split
from fedrecgel.secagg import messages, shamir
from fedrecgel.secagg.aggregate import round_spec
from fedrecgel.secagg.layout import vector_length
from fedrecgel.secagg.protocol import RoundFailed
from fedrecgel.secagg.server import Server
from fedrecgel.simulate import RoundRecord, Simulator, TrainConfig
from services.client_sim.aggregator_client import AggregatorCallError
from services.client_sim.secure import SecureParticipant
from services.client_sim.settings import WorkerSettings
from services.client_sim.worker import Worker
from services.launcher import Cluster, UpOptions, run_config, worker_torch_threads
from tests.e2e.http_run import DATASET, Reference, assert_matches, finish, latest_model
from tests.e2e.wire_record import RecordingTransport
from tests.support.parity import aggregator_started, parity_options, start_workers

pytestmark = pytest.mark.slow

ROUNDS = 2
# 5% of FilmTrust's 1,227 users: cohorts of 61, each client masking with 2 x 4 neighbours
SECURE = TrainConfig(
    rounds=ROUNDS,
    shards=2,
    fraction=0.05,
    secure_aggregation="dense",
    secagg_neighbours=4,
)


def simulate(split: Split, train: TrainConfig) -> Reference:
    """The simulator's secure run (torch threads as the workers get them)."""
    before = torch.get_num_threads()
    torch.set_num_threads(worker_torch_threads(train.shards))
    try:
        sim = Simulator(split, train)
        result = sim.run()
    finally:
        torch.set_num_threads(before)
    params = {train.rounds: {k: v.clone() for k, v in sim.shared.items()}}
    return Reference(result.rounds, params, result.wall_seconds)


@pytest.fixture(scope="module")
def secure_reference(split: Split) -> Reference:
    """The simulator's secure run of :data:`SECURE`."""
    return simulate(split, SECURE)


def options(tmp_path: Path, deadline_s: float | None = None) -> UpOptions:
    """The launcher's options of :data:`SECURE` (``deadline_s``: each phase's deadline; by
    default one no phase reaches)."""
    opts = parity_options(
        SECURE, DATASET, tmp_path, workers=2, worker_poll_max_s=0.5, worker_log_level="INFO"
    )
    if deadline_s is not None:
        opts.run = opts.run.model_copy(update={"deadline_s": deadline_s})
    return opts


def test_a_secure_run_over_http_publishes_the_simulators_models(
    tmp_path: Path, split: Split, secure_reference: Reference
) -> None:
    """Aggregator and two worker processes: the run finishes and equals the simulator's."""
    with aggregator_started(options(tmp_path)) as c:
        start_workers(c, split.n_users)
        c.start_run(split.n_items)
        history, model = finish(c)
    assert_matches(history, model, secure_reference, ROUNDS)


# ----------------------------------------------------------------------------- in-process


class Stepped:
    """Two workers in this process, stepped in turn against the real aggregator process,
    every body recorded."""

    def __init__(self, c: Cluster, split: Split, participant: type[SecureParticipant]) -> None:
        self.c = c
        self.recorder = RecordingTransport()
        self.workers = []
        for i in range(2):
            w = Worker(
                WorkerSettings(
                    aggregator=c.agg_url,
                    shard=i,
                    shards=2,
                    enrolment_token=c.enrolment_token(i),
                    dataset=DATASET,
                    store=str(c.worker_store(i)),
                    backoff_s=0.05,
                ),
                split=split,
                transport=self.recorder,
            )
            if i == 1:
                w.secure = participant(w.client, w.store, w._compute)
            self.workers.append(w)
        self.operator = httpx.Client(base_url=c.agg_url, transport=self.recorder, timeout=60)

    def start(self, split: Split) -> None:
        for w in self.workers:
            w.register()
        resp = self.operator.post(
            "/v1/runs", json=run_config(self.c.opts, split.n_items), headers=self.c.operator_headers()
        )
        assert resp.status_code == 201, resp.text

    def phase(self) -> tuple[int, str] | None:
        """(round, phase) of the open round, None when there is none."""
        w = self.workers[0]
        info = w.client.current_round()
        if info.state != "open" or info.round_id is None:
            return None
        try:
            return info.round_id, w.client.secagg_round(info.round_id).phase
        except AggregatorCallError:
            return None

    def step(self, until: Callable[[], bool] = lambda: False, timeout_s: float = 300.0) -> None:
        """Step the workers in turn until every one finished or ``until()``."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            did = False
            for w in self.workers:
                try:
                    did = w.step() or did
                except AggregatorCallError as err:
                    if not err.retryable:
                        raise
            if until() or all(w.finished() for w in self.workers):
                return
            if not did:
                time.sleep(0.1)
        raise AssertionError("the in-process workers did not get there in time")

    def result(self) -> tuple[dict[str, Any], bytes]:
        history = self.operator.get("/v1/runs/current/history").json()
        return history, latest_model(self.c)

    def close(self) -> None:
        self.operator.close()
        for w in self.workers:
            w.close()


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(worker_torch_threads(2))  # as the worker processes run
    try:
        yield
    finally:
        torch.set_num_threads(before)


class NeverReveals(SecureParticipant):
    """Its clients send their masked inputs in round 1, then vanish (no reveal)."""

    def _reveal(self, att: Any, cfg: Any, view: Any) -> list[tuple[list[int], bytes]]:
        if att.key[1] == 1:
            att.clients.clear()
            return []
        return super()._reveal(att, cfg, view)


def test_clients_that_vanish_after_masking_leave_the_sum_right(
    tmp_path: Path, split: Split, secure_reference: Reference, threads: None
) -> None:
    """Worker 1's clients send their masked inputs in round 1 and never reveal: the round
    closes at its deadline with the survivors' sum recovered from worker 0's shares (they all
    count: their inputs arrived), so the model still equals the simulator's."""
    with aggregator_started(options(tmp_path, deadline_s=30.0)) as c:
        s = Stepped(c, split, NeverReveals)
        try:
            s.start(split)
            s.step()
            history, model = s.result()
        finally:
            s.close()
    assert_matches(history, model, secure_reference, ROUNDS)
