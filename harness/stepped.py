"""Client workers stepped in this process against a real aggregator process, every body on
the wire recorded: the harness of the secure-aggregation end-to-end tests and of
``bench/secagg_http.py`` (a test or benchmark chooses when each worker moves, and can swap a
worker's secure-aggregation side for one that misbehaves)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import SecretStr

from fedrecgel.data import Split
from harness.recording import RecordingTransport
from services.client_sim.aggregator_client import AggregatorCallError
from services.client_sim.secure import SecureParticipant
from services.client_sim.settings import WorkerSettings
from services.client_sim.worker import Worker
from services.launcher import Cluster, run_config


class Stepped:
    """Two workers in this process, stepped in turn against the real aggregator process,
    every body recorded."""

    def __init__(
        self,
        c: Cluster,
        split: Split,
        participant: type[SecureParticipant] = SecureParticipant,
        keep_bodies: bool = True,
    ) -> None:
        self.c = c
        self.recorder = RecordingTransport(keep_bodies)
        self.workers = []
        for i in range(2):
            w = Worker(
                WorkerSettings(
                    aggregator=c.agg_url,
                    shard=i,
                    shards=2,
                    enrolment_token=SecretStr(c.enrolment_token(i)),
                    dataset=c.opts.dataset,
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
            "/v1/runs",
            json=run_config(self.c.opts, split.n_items),
            headers=self.c.operator_headers(),
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

    def run(self, split: Split) -> tuple[dict[str, Any], bytes]:
        """Start the run, step the workers until they finish: its history and latest model."""
        self.start(split)
        self.step()
        return self.result()

    def result(self) -> tuple[dict[str, Any], bytes]:
        """The run's history and its latest model."""
        history = self.operator.get("/v1/runs/current/history").json()
        resp = httpx.get(
            f"{self.c.agg_url}/v1/models/latest", headers=self.c.operator_headers(), timeout=60
        )
        assert resp.status_code == 200, resp.text
        return history, resp.content

    def close(self) -> None:
        self.operator.close()
        for w in self.workers:
            w.close()
