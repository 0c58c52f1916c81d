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

import base64
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from fedrecgel.data import Split
from fedrecgel.secagg import crypto, messages, shamir
from fedrecgel.secagg.aggregate import round_spec
from fedrecgel.secagg.layout import flatten, vector_length
from fedrecgel.secagg.protocol import Masked, Reveal, RoundFailed
from fedrecgel.secagg.server import Server
from fedrecgel.simulate import Simulator, TrainConfig
from harness.parity import aggregator_started, parity_options, start_workers
from harness.recording import RecordingTransport
from harness.stepped import Stepped
from services.client_sim.secure import SecureParticipant
from services.client_sim.worker import Worker
from services.launcher import Cluster, UpOptions, worker_torch_threads
from tests.e2e.http_run import DATASET, Reference, assert_matches, finish

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


class NeverReveals(SecureParticipant):
    """Its first client sends its masked input in round 1, then vanishes (never reveals)."""

    vanished: list[int]

    def _reveal(self, att: Any, cfg: Any, view: Any) -> list[tuple[list[int], bytes]]:
        if att.key[1] == 1:
            gone = min(att.clients)
            att.clients.pop(gone)
            self.vanished.append(gone)
        return super()._reveal(att, cfg, view)


def test_a_client_that_vanishes_after_masking_leaves_the_sum_right(
    tmp_path: Path, split: Split, secure_reference: Reference, threads: None
) -> None:
    """A client sends its masked input in round 1 and never reveals: the unmask phase ends at
    its deadline, the vanished client's self mask is recovered from its neighbours' shares (its
    input arrived, so it counts), and the model still equals the simulator's."""
    with aggregator_started(options(tmp_path, deadline_s=30.0)) as c:
        NeverReveals.vanished = []
        s = Stepped(c, split, NeverReveals)
        try:
            history, model = s.run(split)
            reveals = [
                e
                for e in s.recorder.exchanges
                if e.path == "/v1/rounds/1/secagg/reveal" and e.status == 200
            ]
        finally:
            s.close()
    [gone] = NeverReveals.vanished
    assert all(f'"client_id": {gone},'.encode() not in e.request_body for e in reveals)
    assert_matches(history, model, secure_reference, ROUNDS)


class Kills(SecureParticipant):
    """A participant that SIGKILLs the aggregator process at the steps a subclass chooses and
    starts it again on the same database (:func:`killed_run` sets ``cluster``); ``kills``: when
    it did."""

    cluster: Cluster
    kills: list[str]

    def _kill(self, when: str) -> None:
        self.cluster.latest("aggregator").kill()
        self.kills.append(when)
        self.cluster.start_aggregator()


def killed_run(
    opts: UpOptions, split: Split, participant: type[Kills]
) -> tuple[dict[str, Any], bytes]:
    """The stepped run of ``opts`` with ``participant`` as the second worker's: its history
    and final model."""
    with aggregator_started(opts) as c:
        participant.cluster, participant.kills = c, []
        s = Stepped(c, split, participant)
        try:
            return s.run(split)
        finally:
            s.close()


class KillsTheAggregator(Kills):
    """Before its clients' masked inputs (round 1) and reveals (round 2), the aggregator
    process is SIGKILLed and started again on the same database: half of the round's messages
    are in, half are not."""

    def _masked(self, att: Any, cfg: Any, view: Any) -> Iterable[tuple[list[int], bytes]]:
        if att.key[1] == 1:
            self._kill("masked")
        return super()._masked(att, cfg, view)

    def _reveal(self, att: Any, cfg: Any, view: Any) -> list[tuple[list[int], bytes]]:
        if att.key[1] == 2:
            self._kill("unmask")
        return super()._reveal(att, cfg, view)


def test_an_aggregator_killed_mid_round_resumes_and_publishes_the_right_model(
    tmp_path: Path, split: Split, secure_reference: Reference, threads: None
) -> None:
    """SIGKILL the aggregator with half of round 1's masked inputs summed, and again with
    half of round 2's reveals in: the restarted process resumes each phase from the database
    and publishes the simulator's models, never another one."""
    history, model = killed_run(options(tmp_path), split, KillsTheAggregator)
    assert KillsTheAggregator.kills == ["masked", "unmask"]
    assert_matches(history, model, secure_reference, ROUNDS)


# ----------------------------------------------------------------------------- bad actors


def _post(w: Worker, round_id: int, step: str, body: bytes, media: str) -> httpx.Response:
    """A raw POST with the worker's token (no retries: the answer itself is under test)."""
    return httpx.post(
        f"{w.settings.aggregator}/v1/rounds/{round_id}/secagg/{step}",
        content=body,
        headers={"Authorization": f"Bearer {w.client.token}", "Content-Type": media},
        timeout=60,
    )


class SendsMalformedMessages(SecureParticipant):
    """Before each of its real messages of round 1, sends malformed ones in its clients'
    names, and keeps the answers; the plain inputs of its clients are kept as ground truth
    for the wire test (they never leave the process)."""

    worker: Worker
    answers: list[tuple[str, int, str]]
    inputs: dict[int, np.ndarray]

    def _try(
        self, what: str, r: int, step: str, body: bytes, media: str = "application/json"
    ) -> None:
        resp = _post(self.worker, r, step, body, media)
        self.answers.append((what, resp.status_code, resp.json().get("error", "")))

    def _shares(self, att: Any, cfg: Any, view: Any) -> list[tuple[list[int], bytes]]:
        bodies = super()._shares(att, cfg, view)
        r = att.key[1]
        if r == 1:
            docs = json.loads(bodies[0][1])
            good = docs[0]
            u = int(good["client_id"])
            first = next(iter(good["sealed"]))
            short = dict(good, sealed={**good["sealed"], first: good["sealed"][first][:40]})
            near = att.spec.neighbours_of(u)
            outsider = next(c for c in view.cohort if c not in near and c != u)
            stray = dict(
                good,
                sealed={**good["sealed"], str(outsider): good["sealed"][first]},
                commits={**good["commits"], str(outsider): good["commits"][first]},
            )
            self._try("not json", r, "shares", b"{not json")
            self._try("short ciphertext", r, "shares", json.dumps([short]).encode())
            self._try("share to a non-neighbour", r, "shares", json.dumps([stray]).encode())
            self._try("bad base64", r, "shares", json.dumps([dict(good, b_commit="@@")]).encode())
        return bodies

    def _masked(self, att: Any, cfg: Any, view: Any) -> Iterable[tuple[list[int], bytes]]:
        bodies = list(super()._masked(att, cfg, view))
        if att.key[1] == 1:
            for i, u in enumerate(att.todo):
                self.inputs[u] = flatten(cfg.model(), att.result.uploads[i])
            self._try(
                "truncated masked input",
                1,
                "masked",
                bodies[0][1][:-8],
                "application/octet-stream",
            )
        return bodies

    def _reveal(self, att: Any, cfg: Any, view: Any) -> list[tuple[list[int], bytes]]:
        bodies = super()._reveal(att, cfg, view)
        if att.key[1] == 1:
            docs = json.loads(bodies[0][1])
            good = docs[0]
            owner = next(iter(good["b"]))
            y = bytearray(base64.b64decode(good["b"][owner]))
            y[-1] ^= 1
            bad = dict(good, b={**good["b"], owner: base64.b64encode(bytes(y)).decode()})
            self._try("tampered share", 1, "reveal", json.dumps([bad]).encode())
            swapped = dict(good, s={owner: good["b"][owner]}, b={})
            self._try("seed share named a key share", 1, "reveal", json.dumps([swapped]).encode())
        return bodies


def test_malformed_messages_are_refused_and_the_wire_never_shows_one_clients_update(
    tmp_path: Path, split: Split, secure_reference: Reference, threads: None
) -> None:
    """(1) Malformed shares, masked inputs and reveals in round 1 are each refused with a 4xx
    and the reason, and the run still publishes the simulator's models. (2) On the recorded
    wire no plain update travels; each masked input is still masked after the server removes
    what it can learn (the self mask, from the revealed seed shares): the pairwise masks stay,
    since no share of a surviving client's mask key is ever sent; and unmasking a secret with
    fewer than the threshold of its shares fails."""
    with aggregator_started(options(tmp_path)) as c:
        s = Stepped(c, split, SendsMalformedMessages)
        p = s.workers[1].secure
        assert isinstance(p, SendsMalformedMessages)
        p.worker, p.answers, p.inputs = s.workers[1], [], {}
        try:
            history, model = s.run(split)
        finally:
            s.close()
    answers = {what: (code, err) for what, code, err in p.answers}
    assert answers == {
        "not json": (422, "malformed_message"),
        "short ciphertext": (422, "malformed_share"),
        "share to a non-neighbour": (422, "malformed_share"),
        "bad base64": (422, "malformed_message"),
        "truncated masked input": (422, "malformed_message"),
        "tampered share": (422, "malformed_share"),
        "seed share named a key share": (422, "malformed_share"),
    }
    assert_matches(history, model, secure_reference, ROUNDS)
    wire_shows_no_single_update(s.recorder, split, p.inputs)


def wire_shows_no_single_update(
    recorder: RecordingTransport, split: Split, inputs: dict[int, np.ndarray]
) -> None:
    """What a curious server holds of round 1, from the recorded bodies."""
    ex = [e for e in recorder.exchanges if e.status == 200]
    assert not any(e.path.endswith("/updates") for e in ex), "a plain upload went out"
    r1 = [e for e in ex if e.path.startswith("/v1/rounds/1/secagg/")]
    bodies: dict[str, list[bytes]] = {}
    for e in r1:
        bodies.setdefault(e.path.rsplit("/", 1)[1], []).append(e.request_body)
    keys = {k.client_id: k for b in bodies["keys"] for k in map(_keys, json.loads(b))}
    shares = {
        m.client_id: m
        for b in bodies["shares"]
        for m in (messages.decode_shares(json.dumps(d).encode()) for d in json.loads(b))
    }
    cohort = sorted(keys)
    train = SECURE.run_params(dataset=DATASET)
    model_cfg = SECURE.model(split.n_items)
    spec = round_spec(model_cfg, train, 1, cohort)
    length = vector_length(model_cfg)
    masked = {}
    for b in bodies["masked"]:  # batches of a worker's clients' inputs
        for _, one in messages.split_masked_batch(b, split.n_users):
            m = messages.decode_masked(one, length)
            masked[m.client_id] = m.y
    reveals = [
        messages.decode_reveal(json.dumps(d).encode())
        for b in bodies["reveal"]
        for d in json.loads(b)
    ]
    assert sorted(masked) == cohort and inputs, "every client masked; ground truth kept"
    # no share of a surviving client's mask key ever travels
    assert all(not rv.s_shares for rv in reveals)
    fixed = spec.fixed
    for u, x in inputs.items():
        words, _ = fixed.encode(x)
        b_sh = {
            rv.client_id + 1: shamir.from_bytes(rv.b_shares[u])
            for rv in reveals
            if u in rv.b_shares
        }
        t = spec.threshold(u)
        assert len(b_sh) >= t
        # fewer than t shares: not enough, and any t - 1 interpolate to a wrong secret
        few = dict(sorted(b_sh.items())[: t - 1])
        with pytest.raises(shamir.NotEnoughShares):
            shamir.combine(few, t)
        try:
            wrong = shamir.combine(few, t - 1) if t > 1 else b""
        except ValueError:
            wrong = b""
        assert crypto.commit("seed", 1, u, wrong) != shares[u].b_commit
        # t shares recover the self-mask seed (what the protocol lets the server learn) ...
        seed = shamir.combine(b_sh, t)
        assert crypto.commit("seed", 1, u, seed) == shares[u].b_commit
        y = masked[u] - crypto.prg_words(crypto.derive(seed, "self", 1, u, u), length)
        # ... and what is left is still masked by the pairwise masks: not the input
        assert not np.array_equal(y, words)
        decoded = fixed.decode(y)
        assert np.mean(np.abs(decoded) > fixed.range_) > 0.9, "pairwise masks removed?"
        # the input's own words appear in no recorded body
        nz = words[np.flatnonzero(words)][:16].tobytes()
        assert len(nz) == 128
        for e in ex:
            assert nz not in e.request_body and nz not in e.response_body
    # the server's own unmasking, given fewer than the threshold of every survivor's seed
    # shares, outputs no sum
    server = Server(spec)
    for u in cohort:
        server.add_keys(keys[u])
    for u in cohort:
        server.add_shares(shares[u])
    for u in cohort:
        server.add_masked(Masked(u, masked[u]))
    allowed = {
        u: sorted(rv.client_id for rv in reveals if u in rv.b_shares)[: spec.threshold(u) - 1]
        for u in cohort
    }
    starved = [
        Reveal(
            rv.client_id, {u: y for u, y in rv.b_shares.items() if rv.client_id in allowed[u]}, {}
        )
        for rv in reveals
    ]
    with pytest.raises(RoundFailed, match="valid shares"):
        server.unmask(starved)
    assert server.unmask(reveals).survivors == tuple(cohort)


def _keys(doc: dict[str, Any]) -> Any:
    return messages.decode_keys(json.dumps(doc).encode())
