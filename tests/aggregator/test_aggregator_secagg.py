"""Secure aggregation on the aggregator, in process (real app, real SQLite, a settable clock):
the protocol's clients (:mod:`fedrecgel.secagg.protocol`) drive the ``/secagg`` endpoints,
and the published model is the plain aggregation of the same inputs to the fixed-point step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.secagg import messages
from fedrecgel.secagg.aggregate import round_spec
from fedrecgel.secagg.layout import flatten
from fedrecgel.secagg.protocol import Client, Keys, Shares
from fedrecgel.strategy import make_strategy
from fedrecgel.wire import decode_model, encode_updates
from harness.aggregator import AggregatorFactory
from services.contract import RunConfig
from tests.support.aggregator import (
    FakeClock,
    bearer,
    operator_headers,
    random_update,
    register,
    upload_headers,
)

MODEL = ModelConfig(n_items=30, kind="ncf", factor=4, layers=2)
RUN: dict[str, Any] = {
    "n_items": 30,
    "factor": 4,
    "layers": 2,
    "rounds": 2,
    "fraction": 1.0,
    "seed": 1,
    "secure_aggregation": "dense",
    "secagg_neighbours": 2,
    "deadline_s": 60.0,
}
IDS = list(range(8))
JSON = {"Content-Type": "application/json"}


class Round:
    """The 8 clients of a started secure run (two tokens), driven step by step."""

    def __init__(
        self,
        aggregator: AggregatorFactory,
        tmp_path: Path,
        url: str | None = None,
        population: int = 8,
        **run: Any,
    ) -> None:
        self.clock = FakeClock()
        self.url = url or aggregator.url("secagg.db")
        self.aggregator = aggregator
        self.http = aggregator(population=population, clock=self.clock, database_url=self.url)
        self.tokens = {
            0: register(self.http, IDS[0::2], 0, 2),
            1: register(self.http, IDS[1::2], 1, 2),
        }
        r = self.http.post("/v1/runs", json={**RUN, **run}, headers=operator_headers())
        assert r.status_code == 201, r.text
        self.cfg = RunConfig.model_validate({**RUN, **run})
        self.spec = round_spec(MODEL, self.cfg, 1, IDS)
        self.clients = {u: Client(self.spec, u) for u in IDS}
        rng = np.random.default_rng(0)
        self.updates = {u: random_update(MODEL, u, rng) for u in IDS}

    def token(self, u: int) -> str:
        return self.tokens[u % 2]

    def post(self, step: str, u: int, body: bytes, media: str = "application/json") -> Any:
        return self.http.post(
            f"/v1/rounds/1/secagg/{step}",
            content=body,
            headers={**bearer(self.token(u)), "Content-Type": media},
        )

    def view(self, u: int) -> dict[str, Any]:
        r = self.http.get("/v1/rounds/1/secagg", headers=bearer(self.token(u)))
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def keys(self, who: list[int] = IDS) -> None:
        for u in who:
            body = b"[" + messages.encode_keys(self.clients[u].advertise()) + b"]"
            assert self.post("keys", u, body).status_code == 200

    def shares_body(self, u: int) -> bytes:
        docs = self.view(u)["messages"]
        keys: dict[int, Keys] = {}
        for d in docs:
            k = messages.decode_keys(json.dumps(d).encode())
            keys[k.client_id] = k
        return b"[" + messages.encode_shares(self.clients[u].share(keys)) + b"]"

    def shares(self, who: list[int] = IDS) -> None:
        bodies = {u: self.shares_body(u) for u in who}
        for u in who:
            r = self.post("shares", u, bodies[u])
            assert r.status_code == 200, r.text

    def masked_body(self, u: int) -> bytes:
        got: dict[int, Shares] = {}
        for d in self.view(u)["messages"]:
            sh = messages.decode_shares(json.dumps(d).encode())
            got[sh.client_id] = sh
        x = flatten(MODEL, self.updates[u])
        return messages.encode_masked(self.clients[u].masked(x, got))

    def masked(self, who: list[int] = IDS) -> None:
        bodies = {u: self.masked_body(u) for u in who}
        for u in who:
            r = self.post("masked", u, bodies[u], "application/octet-stream")
            assert r.status_code == 200, r.text

    def reveal_body(self, u: int) -> bytes:
        v = self.view(u)
        return (
            b"["
            + messages.encode_reveal(self.clients[u].reveal(v["survivors"], v["dropped"]))
            + b"]"
        )

    def reveal(self, who: list[int] = IDS) -> None:
        bodies = {u: self.reveal_body(u) for u in who}
        for u in who:
            r = self.post("reveal", u, bodies[u])
            assert r.status_code == 200, r.text

    def phase(self) -> str:
        return str(self.view(0)["phase"])

    def version(self) -> int:
        r = self.http.get("/v1/models/latest", headers=bearer(self.tokens[0]))
        return int(r.headers["X-Model-Version"])

    def expected(self, who: list[int]) -> dict[str, torch.Tensor]:
        """The plain aggregation of ``who``'s inputs from version 0."""
        params = init_shared(MODEL, self.cfg.seed)
        strategy = make_strategy(self.cfg.optimizer, self.cfg.server_lr, "mean", None)
        strategy.round(params, [self.updates[u] for u in who])
        return params

    def check_model(self, who: list[int]) -> None:
        r = self.http.get("/v1/models/1", headers=bearer(self.tokens[0]))
        assert r.status_code == 200, r.text
        _, shared, _ = decode_model(r.content)
        for name, want in self.expected(who).items():
            assert torch.allclose(shared[name], want, atol=1e-6), name


@pytest.fixture
def rnd(aggregator: AggregatorFactory, tmp_path: Path) -> Round:
    return Round(aggregator, tmp_path)


def test_a_secure_round_publishes_the_plain_aggregate_of_its_inputs(rnd: Round) -> None:
    assert rnd.phase() == "keys"
    rnd.keys()
    assert rnd.phase() == "shares"
    rnd.shares()
    assert rnd.phase() == "masked"
    rnd.masked()
    assert rnd.phase() == "unmask"
    assert rnd.view(0)["survivors"] == IDS and rnd.view(0)["dropped"] == []
    rnd.reveal()
    assert rnd.version() == 1
    rnd.check_model(IDS)
    hist = rnd.http.get("/v1/runs/current/history").json()["rounds"][0]
    assert hist["n_updates"] == 8
    assert hist["loss"] == pytest.approx(np.mean([u.loss for u in rnd.updates.values()]))


def test_a_client_that_vanishes_after_masking_still_counts(rnd: Round) -> None:
    rnd.keys()
    rnd.shares()
    rnd.masked()
    rnd.reveal(IDS[1:])  # client 0 never reveals
    assert rnd.phase() == "unmask" and rnd.version() == 0
    rnd.clock.advance(61)
    rnd.http.app.state.service.tick()  # type: ignore[attr-defined]
    assert rnd.version() == 1
    rnd.check_model(IDS)


def test_a_client_that_drops_before_masking_is_left_out_of_the_sum(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    rnd = Round(aggregator, tmp_path, quorum=0.5)
    rnd.keys()
    rnd.shares()
    rnd.masked(IDS[1:])  # client 0 shared, then dropped: its mask key is rebuilt
    rnd.clock.advance(61)
    rnd.http.app.state.service.tick()  # type: ignore[attr-defined]
    assert rnd.view(1)["dropped"] == [0]
    rnd.reveal(IDS[1:])
    assert rnd.version() == 1
    rnd.check_model(IDS[1:])


def test_with_cohort_groups_a_group_that_masked_in_part_fails_the_attempt(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    rnd = Round(aggregator, tmp_path, quorum=0.5, cohort_groups=2)
    assert rnd.view(0)["cohort"] == IDS  # fraction 1: both groups
    rnd.keys()
    rnd.shares()
    rnd.masked(IDS[1:])  # client 0 dropped: its group would be summed in part
    rnd.clock.advance(61)
    rnd.http.app.state.service.tick()  # type: ignore[attr-defined]
    info = rnd.http.get("/v1/rounds/1").json()
    assert info["attempt"] == 1 and rnd.version() == 0  # never unmasked: a new attempt
    view = rnd.http.get("/v1/rounds/1/secagg", headers=bearer(rnd.tokens[0])).json()
    assert view["phase"] == "keys" and view["survivors"] == []


def test_with_cohort_groups_whole_groups_are_unmasked(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    rnd = Round(aggregator, tmp_path, cohort_groups=2)
    rnd.keys()
    rnd.shares()
    rnd.masked()
    rnd.reveal()
    assert rnd.version() == 1
    rnd.check_model(IDS)


def test_too_few_clients_fail_the_attempt_and_publish_nothing(rnd: Round) -> None:
    rnd.keys()
    rnd.shares(IDS[:1])
    rnd.clock.advance(61)
    rnd.http.app.state.service.tick()  # type: ignore[attr-defined]
    info = rnd.http.get("/v1/rounds/1").json()
    assert info["attempt"] == 1 and rnd.version() == 0
    assert (
        rnd.http.get("/v1/rounds/1/secagg", headers=bearer(rnd.tokens[0])).json()["phase"] == "keys"
    )


def test_malformed_and_out_of_turn_messages_are_refused_and_change_nothing(rnd: Round) -> None:
    good_keys = b"[" + messages.encode_keys(rnd.clients[0].advertise()) + b"]"
    huge_id = good_keys.replace(b'"client_id": 0', b'"client_id": 1e400')  # read as infinity
    assert huge_id != good_keys
    cases = [
        ("keys", 0, b"{", "application/json", 422, "malformed_message"),
        ("keys", 0, b"[]", "application/json", 422, "malformed_message"),
        ("keys", 0, good_keys, "text/plain", 415, "unsupported_media_type"),
        ("keys", 1, good_keys, "application/json", 403, "not_owned"),  # 0 is token 0's
        ("shares", 0, good_keys, "application/json", 422, "malformed_message"),  # wrong kind
        ("masked", 0, b"\x00" * 64, "application/octet-stream", 422, "malformed_message"),
        ("keys", 0, b"[" * 20_000 + b"]" * 20_000, "application/json", 422, "malformed_message"),
        ("keys", 0, huge_id, "application/json", 422, "malformed_message"),
    ]
    for step, who, body, media, code, err in cases:
        r = rnd.post(step, who, body, media)
        assert (r.status_code, r.json()["error"]) == (code, err), (step, r.text)
    rnd.keys(IDS[:1])
    other = b"[" + messages.encode_keys(Client(rnd.spec, 0).advertise()) + b"]"
    r = rnd.post("keys", 0, other)
    assert (r.status_code, r.json()["error"]) == (409, "conflicting_message")
    r = rnd.post("keys", 0, good_keys)
    assert r.json()["results"] == [{"client_id": 0, "status": "duplicate"}]
    rnd.keys(IDS[1:])
    r = rnd.post("keys", 1, b"[" + messages.encode_keys(rnd.clients[1].advertise()) + b"]")
    assert (r.status_code, r.json()["error"]) == (409, "wrong_phase")
    body = json.loads(rnd.shares_body(0))[0]
    first = next(iter(body["sealed"]))
    short = dict(body, sealed={**body["sealed"], first: body["sealed"][first][:20]})
    r = rnd.post("shares", 0, json.dumps([short]).encode())
    assert (r.status_code, r.json()["error"]) == (422, "malformed_share")
    few = dict(body, sealed={first: body["sealed"][first]}, commits={first: body["commits"][first]})
    r = rnd.post("shares", 0, json.dumps([few]).encode())
    assert (r.status_code, r.json()["error"]) == (422, "malformed_share")
    rnd.shares()
    rnd.masked()
    good = json.loads(rnd.reveal_body(0))[0]
    owner = next(iter(good["b"]))
    tampered = dict(good, b={**good["b"], owner: good["b"][next(iter(reversed(good["b"])))]})
    if tampered != good:
        r = rnd.post("reveal", 0, json.dumps([tampered]).encode())
        assert (r.status_code, r.json()["error"]) == (422, "malformed_share")
    rnd.reveal()
    rnd.check_model(IDS)


def test_plain_uploads_and_unsupported_settings_are_refused(
    rnd: Round, aggregator: AggregatorFactory
) -> None:
    u = rnd.updates[0]
    r = rnd.http.post(
        "/v1/rounds/1/updates",
        content=encode_updates(1, [u]),
        headers=upload_headers(rnd.tokens[0]),
    )
    assert (r.status_code, r.json()["error"]) == (409, "secure_run")
    other = aggregator(population=8)
    register(other, IDS)
    r = other.post("/v1/runs", json={**RUN, "dp_noise": 1.0}, headers=operator_headers())
    assert (r.status_code, r.json()["error"]) == (422, "unsupported_setting")
    r = other.post("/v1/runs", json={**RUN, "fraction": 0.1}, headers=operator_headers())
    assert (r.status_code, r.json()["error"]) == (422, "invalid_config")


def test_a_restarted_aggregator_resumes_the_phase_from_the_database(rnd: Round) -> None:
    rnd.keys()
    rnd.shares()
    rnd.masked(IDS[:4])  # half of the masked inputs are in the running sum
    rnd.aggregator.stop(rnd.http)
    rnd.http = rnd.aggregator(population=8, clock=rnd.clock, database_url=rnd.url)
    rnd.masked(IDS[4:])
    rnd.reveal()
    rnd.check_model(IDS)


def test_a_body_of_more_messages_than_the_token_holds_clients_is_422(rnd: Round) -> None:
    good_keys = messages.encode_keys(rnd.clients[0].advertise())
    r = rnd.post("keys", 0, b"[" + b",".join([good_keys] * 1000) + b"]")
    assert (r.status_code, r.json()["error"]) == (422, "malformed_message"), r.text
    assert "this token holds 4" in r.json()["detail"]
    rnd.keys()  # nothing was stored: every client still advertises its keys
    assert rnd.phase() == "shares"
