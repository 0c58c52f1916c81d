"""Sparse secure aggregation (``secure_aggregation=sparse``) over HTTP with the real aggregator
process (SQLite) and the two FilmTrust workers stepped in this process behind a recording
transport (:class:`~harness.stepped.Stepped`), as ``test_secagg_http.py`` drives dense runs.

A sparse run publishes the plain run's models (the same negative pool) to the fixed-point
step: B's words are 32 bits (step 2^-20 for these cohorts, 2^-28 on item rows), and the server
optimizer (Adam) divides by the root of the second moment, so a coordinate whose mean
gradient is within a few steps of zero can take a visibly different step; the bound is the
one the simulator's sparse test uses (``tests/core/test_secagg_sparse.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from fedrecgel.cohort import client_groups, select_cohort
from fedrecgel.data import Split
from fedrecgel.secagg import messages
from fedrecgel.secagg.aggregate import update_spec
from fedrecgel.secagg.layout import vector_length
from fedrecgel.secagg.protocol import Client, Masked
from fedrecgel.simulate import TrainConfig
from fedrecgel.wire import decode_model
from harness.parity import aggregator_started, parity_options
from harness.stepped import Stepped
from services.client_sim.secure import SecureParticipant
from services.client_sim.worker import Worker
from services.launcher import UpOptions
from tests.e2e.http_run import DATASET, assert_matches
from tests.e2e.test_secagg_http import Kills, killed_run, simulate

pytestmark = pytest.mark.slow

ROUNDS = 2
# 5% of FilmTrust's 1,227 users: cohorts of 61, each client masking with 2 x 4 neighbours
PLAIN = TrainConfig(rounds=ROUNDS, shards=2, fraction=0.05, negative_pool=128)
SPARSE = PLAIN.replace(secure_aggregation="sparse", secagg_neighbours=4)


def options(train: TrainConfig, tmp_path: Path, **run: Any) -> UpOptions:
    """The launcher's options of ``train`` (``run``: other run settings)."""
    opts = parity_options(train, DATASET, tmp_path, workers=2, worker_poll_max_s=0.5)
    if run:
        opts.run = opts.run.model_copy(update=run)
    return opts


def stepped_run(
    opts: UpOptions, split: Split, participant: type[SecureParticipant] = SecureParticipant
) -> tuple[dict[str, Any], bytes, Stepped]:
    with aggregator_started(opts) as c:
        s = Stepped(c, split, participant)
        if isinstance(s.workers[1].secure, Misbehaves):
            s.workers[1].secure.setup(s.workers[1])
        try:
            history, model = s.run(split)
        finally:
            s.close()
    return history, model, s


def test_a_sparse_secure_run_over_http_publishes_the_plain_runs_model(
    tmp_path: Path, split: Split, threads: None
) -> None:
    """The same FilmTrust run over HTTP, plain and sparse secure, negatives from the same pool
    of 128: the same cohorts and losses, and models equal to the fixed-point step as Adam
    takes it; the sparse run equals the simulator's sparse run (the same integer sums,
    :data:`~tests.e2e.http_run.TOL`); it sent no plain update, and B's inputs laid out the
    union's rows only."""
    plain, plain_model, _ = stepped_run(options(PLAIN, tmp_path / "plain"), split)
    secure, secure_model, s = stepped_run(options(SPARSE, tmp_path / "sparse"), split)
    assert_matches(secure, secure_model, simulate(split, SPARSE), ROUNDS)
    assert [r["n_updates"] for r in secure["rounds"]] == [r["n_updates"] for r in plain["rounds"]]
    assert [r["loss"] for r in secure["rounds"]] == pytest.approx(
        [r["loss"] for r in plain["rounds"]], abs=1e-6
    )
    _, want, v1 = decode_model(plain_model)
    _, got, v2 = decode_model(secure_model)
    assert v1 == v2 == ROUNDS
    diff = torch.cat([(got[n] - p).abs().flatten() for n, p in want.items()]).double()
    above = {t: float((diff > t).double().mean()) for t in (1e-5, 1e-4)}
    print(f"sparse vs plain over HTTP: max {float(diff.max()):.3g}, fraction above {above}")
    # FilmTrust, 2 rounds: 1.3% of the coordinates differ by more than 1e-5, 0.1% by more
    # than 1e-4 (those of a mean gradient within a few steps of zero: an Adam step of up to
    # lr either way, a round)
    assert above[1e-5] < 0.03 and above[1e-4] < 0.005
    assert float(diff.max()) < 3 * ROUNDS * SPARSE.server_lr
    ok = [e for e in s.recorder.exchanges if e.status == 200]
    assert not any(e.path.endswith("/updates") for e in ok), "a plain upload went out"
    sent = {e.path.rsplit("/", 1)[1] for e in ok if "/secagg/" in e.path}
    assert sent == {"keys", "shares", "masked", "reveal", "masked_b", "reveal_b"}
    # B's inputs (several a body): U's rows in 32-bit words, each under half of a dense
    # input's bytes
    b_inputs = [
        len(one)
        for e in ok
        if e.path.endswith("/secagg/masked_b")
        for _, one in messages.split_masked_batch(e.request_body, split.n_users)
    ]
    dense_bytes = 8 * vector_length(SPARSE.model(split.n_items))
    assert b_inputs and max(b_inputs) < dense_bytes / 2, (max(b_inputs), dense_bytes)


def test_a_sparse_run_of_whole_groups_over_http_is_the_simulators(
    tmp_path: Path, split: Split, threads: None
) -> None:
    """``cohort_groups`` over HTTP: the aggregator draws the simulator's cohorts of whole
    groups (100 groups, 5 a round) and the sparse run equals the simulator's."""
    grouped = SPARSE.replace(cohort_groups=100)
    secure, model, _ = stepped_run(options(grouped, tmp_path / "groups"), split)
    assert_matches(secure, model, simulate(split, grouped), ROUNDS)
    groups = client_groups(np.arange(split.n_users), 100, grouped.seed)
    for r in range(1, ROUNDS + 1):
        cohort = select_cohort(np.arange(split.n_users), 0.05, grouped.seed, r, groups=100)
        assert secure["rounds"][r - 1]["n_updates"] == len(cohort)
        assert len(set(groups[cohort].tolist())) == 5


class Misbehaves(SecureParticipant):
    """In round 1: its first client holds back its count (A's masked input) and later sends a
    B input all the same; its second client sends its count, then drops before B; and before
    its real B inputs it sends one of U's length minus one. The answers are kept."""

    worker: Worker
    answers: dict[str, tuple[int, str]]
    withheld: int | None
    dropped: int | None
    held: Client | None

    def setup(self, worker: Worker) -> None:
        self.worker, self.answers, self.withheld, self.dropped, self.held = (
            worker,
            {},
            None,
            None,
            None,
        )

    def _post(self, what: str, r: int, step: str, body: bytes) -> None:
        resp = httpx.post(
            f"{self.worker.settings.aggregator}/v1/rounds/{r}/secagg/{step}",
            content=body,
            headers={
                "Authorization": f"Bearer {self.worker.client.token}",
                "Content-Type": "application/octet-stream",
            },
            timeout=60,
        )
        self.answers[what] = (resp.status_code, resp.json().get("error", ""))

    def _masked(self, att: Any, cfg: Any, view: Any) -> Iterable[tuple[list[int], bytes]]:
        if att.key[1] == 1:
            self.withheld = u = min(att.clients)
            self.held = att.clients_b[u]
            att.clients.pop(u)
        return super()._masked(att, cfg, view)

    def _masked_b(self, att: Any, cfg: Any, view: Any) -> Iterable[tuple[list[int], bytes]]:
        if att.key[1] != 1:
            return super()._masked_b(att, cfg, view)
        u = self.withheld
        assert u is not None and u not in att.clients_b and self.held is not None
        self.dropped = min(att.clients_b)
        att.clients_b.pop(self.dropped)
        bodies = list(super()._masked_b(att, cfg, view))
        spec = update_spec(cfg.model(), cfg, 1, view.cohort, np.asarray(view.union))
        ids, body = bodies[0]  # a batch of this worker's inputs
        first = messages.split_masked_batch(body, len(ids))[0][1]
        y = messages.decode_masked(first, spec.length, np.uint32).y
        short = messages.encode_masked(Masked(ids[0], y[:-1]))
        self._post("a B input one word short of U", 1, "masked_b", short)
        self.held.respec(spec)
        got = self._received({u: self.held}, view)[u]
        stray = self.held.masked(np.zeros(spec.length), got)
        self._post(
            "a B input of a client not counted", 1, "masked_b", messages.encode_masked(stray)
        )
        return bodies


def test_clients_gone_before_or_after_their_count_leave_bs_survivors_mean(
    tmp_path: Path, split: Split, threads: None
) -> None:
    """Round 1 of a sparse run: one client never sends its count (A ends at its deadline; its
    B input, sent anyway, is refused ``not_a_survivor``), another sends its count and drops
    before B (B ends at its deadline); a B input one word short of the union's layout is 422
    and stores nothing (the same client's real input is then accepted). The round closes over
    B's survivors: the cohort less the two."""
    opts = options(SPARSE, tmp_path, deadline_s=45.0, quorum=0.5)
    history, model, s = stepped_run(opts, split, Misbehaves)
    p = s.workers[1].secure
    assert isinstance(p, Misbehaves)
    assert p.answers == {
        "a B input one word short of U": (422, "malformed_message"),
        "a B input of a client not counted": (409, "not_a_survivor"),
    }
    rounds = history["rounds"]
    assert [r["round_id"] for r in rounds] == [1, 2]
    cohort = rounds[1]["n_updates"]  # round 2: everyone
    assert rounds[0]["n_updates"] == cohort - 2
    assert all(np.isfinite(r["loss"]) for r in rounds)
    reveals = [
        json.loads(e.request_body)
        for e in s.recorder.exchanges
        if e.path == "/v1/rounds/1/secagg/reveal_b" and e.status == 200
    ]
    revealers = {int(d["client_id"]) for body in reveals for d in body}
    assert p.dropped not in revealers and p.withheld not in revealers
    assert decode_model(model)[2] == ROUNDS


class KillsTheAggregator(Kills):
    """Before its clients' B inputs (round 1) and B reveals (round 2), the aggregator process
    is SIGKILLed and started again on the same database: A is over and the union stored, and
    half of B's messages are in, half are not."""

    def _masked_b(self, att: Any, cfg: Any, view: Any) -> Iterable[tuple[list[int], bytes]]:
        if att.key[1] == 1:
            self._kill("masked_b")
        return super()._masked_b(att, cfg, view)

    def _reveal_b(self, att: Any, cfg: Any, view: Any) -> list[tuple[list[int], bytes]]:
        if att.key[1] == 2:
            self._kill("unmask_b")
        return super()._reveal_b(att, cfg, view)


def test_an_aggregator_killed_in_bs_phases_resumes_and_publishes_the_simulators_model(
    tmp_path: Path, split: Split, threads: None
) -> None:
    """SIGKILL the aggregator with half of round 1's B inputs summed, and again with half of
    round 2's B reveals in: the restarted process resumes B from the database (the stored
    union, the running sums, the reveals) and publishes the simulator's sparse models."""
    history, model = killed_run(options(SPARSE, tmp_path), split, KillsTheAggregator)
    assert KillsTheAggregator.kills == ["masked_b", "unmask_b"]
    assert_matches(history, model, simulate(split, SPARSE), ROUNDS)
