"""Batches of masked inputs (:func:`fedrecgel.secagg.messages.encode_masked_batch`) on the
aggregator, in process: a batch is summed as the same inputs sent one body each; a bad client
of a batch is refused on its own, with its reason, and the others are taken; a batch malformed
as a whole is 422 and stores nothing; a retried batch is answered ``duplicate``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedrecgel.secagg import messages
from fedrecgel.secagg.aggregate import update_spec
from fedrecgel.secagg.protocol import Masked
from harness.aggregator import AggregatorFactory, register
from services.aggregator.repository import Repository
from services.aggregator.secagg_repository import SecAggRepository
from tests.aggregator.test_aggregator_secagg import IDS, MODEL, Round
from tests.aggregator.test_aggregator_secagg_sparse import SparseRound, _rows
from tests.support.aggregator import bearer

OCTETS = "application/octet-stream"
EVEN, ODD = IDS[0::2], IDS[1::2]  # the clients of token 0 and of token 1


@pytest.fixture
def rnd(aggregator: AggregatorFactory, tmp_path: Path) -> Round:
    r = Round(aggregator, tmp_path)
    r.keys()
    r.shares()
    assert r.phase() == "masked"
    return r


def batch(bodies: dict[int, bytes]) -> bytes:
    return messages.encode_masked_batch(list(bodies.items()))


def send(rnd: Round, step: str, u: int, body: bytes) -> Any:
    return rnd.post(step, u, body, OCTETS)


def results(r: Any) -> dict[int, tuple[str, str | None]]:
    assert r.status_code == 200, r.text
    return {e["client_id"]: (e["status"], e.get("reason")) for e in r.json()["results"]}


def running_sum(rnd: Round, inst: str = "a") -> bytes | None:
    service = rnd.http.app.state.service  # type: ignore[attr-defined]
    with service.secure.db.transaction() as s:
        run = Repository(s).active_run()
        assert run is not None
        live = Repository(s).live_round(run.id)
        assert live is not None
        total: bytes | None = SecAggRepository(s).total(live.id, inst)
        return total


def test_a_batch_is_summed_exactly_as_single_bodies_are(rnd: Round) -> None:
    bodies = {u: rnd.masked_body(u) for u in IDS}
    want = np.zeros(rnd.spec.length, dtype=np.uint64)
    for body in bodies.values():
        want += messages.decode_masked(body, rnd.spec.length).y
    r = send(rnd, "masked", 0, batch({u: bodies[u] for u in EVEN}))
    assert results(r) == {u: ("accepted", None) for u in EVEN}
    assert rnd.phase() == "masked"
    r = send(rnd, "masked", 1, batch({u: bodies[u] for u in ODD}))
    assert results(r) == {u: ("accepted", None) for u in ODD}
    assert running_sum(rnd) == want.astype("<u8").tobytes()
    assert rnd.phase() == "unmask"
    assert rnd.view(0)["survivors"] == IDS
    rnd.reveal()
    assert rnd.version() == 1
    rnd.check_model(IDS)


def test_a_bad_client_of_a_batch_is_refused_on_its_own(rnd: Round) -> None:
    bodies = {u: rnd.masked_body(u) for u in IDS}
    y = messages.decode_masked(bodies[2], rnd.spec.length).y
    short = messages.encode_masked(Masked(2, y[:-1]))
    mixed = messages.encode_masked_batch(
        [(0, bodies[0]), (2, short), (1, bodies[1]), (6, bodies[4])]
    )
    r = send(rnd, "masked", 0, mixed)
    assert results(r) == {
        0: ("accepted", None),
        2: ("refused", "malformed_message"),  # a vector one word short of the layout
        1: ("refused", "not_owned"),  # client 1 is token 1's
        6: ("refused", "malformed_message"),  # client 4's message framed as 6's
    }
    detail = {e["client_id"]: e.get("detail", "") for e in r.json()["results"]}
    assert "masked vector" in detail[2] and "not held by this token" in detail[1]
    # the refused clients send again, right; the others' inputs were summed once
    r = send(rnd, "masked", 0, batch({u: bodies[u] for u in EVEN}))
    assert results(r) == {
        0: ("duplicate", None),
        2: ("accepted", None),
        4: ("accepted", None),
        6: ("accepted", None),
    }
    # a different second input of a client that was taken is refused, its neighbours' taken
    r = send(rnd, "masked", 1, batch({1: bodies[1], 3: bodies[3]}))
    assert results(r) == {1: ("accepted", None), 3: ("accepted", None)}
    y1 = messages.decode_masked(bodies[1], rnd.spec.length).y
    changed = messages.encode_masked(Masked(1, y1 + np.uint64(1)))
    r = send(rnd, "masked", 1, batch({1: changed, 5: bodies[5], 7: bodies[7]}))
    assert results(r) == {
        1: ("refused", "conflicting_message"),
        5: ("accepted", None),
        7: ("accepted", None),
    }
    assert rnd.phase() == "unmask"
    rnd.reveal()
    rnd.check_model(IDS)  # each client's first input, summed once


def test_a_client_outside_the_cohort_is_refused_in_a_batch_the_others_taken(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    rnd = Round(aggregator, tmp_path, population=10)  # clients 8 and 9 are not registered yet
    rnd.keys()
    rnd.shares()
    # token 0 takes client 8 on once the cohort was drawn
    late = register(rnd.http, [*EVEN, 8], 0, 2, token=rnd.tokens[0])
    bodies = {u: rnd.masked_body(u) for u in IDS}
    y = messages.decode_masked(bodies[0], rnd.spec.length).y
    stray = messages.encode_masked(Masked(8, y, ()))
    assert 8 not in rnd.view(0)["cohort"]
    r = rnd.http.post(
        "/v1/rounds/1/secagg/masked",
        content=batch({0: bodies[0], 8: stray, 2: bodies[2]}),
        headers={**bearer(late), "Content-Type": OCTETS},
    )
    assert results(r) == {
        0: ("accepted", None),
        8: ("refused", "not_in_cohort"),
        2: ("accepted", None),
    }
    for u in [1, *IDS[3:]]:
        assert results(send(rnd, "masked", u, bodies[u])) == {u: ("accepted", None)}
    rnd.reveal()
    rnd.check_model(IDS)


def test_a_batch_of_only_refused_clients_is_refused_as_a_single_body_is(rnd: Round) -> None:
    y = messages.decode_masked(rnd.masked_body(0), rnd.spec.length).y
    r = send(rnd, "masked", 0, batch({0: messages.encode_masked(Masked(0, y[:-1]))}))
    assert (r.status_code, r.json()["error"]) == (422, "malformed_message"), r.text
    r = send(rnd, "masked", 0, batch({1: rnd.masked_body(1)}))
    assert (r.status_code, r.json()["error"]) == (403, "not_owned"), r.text
    assert running_sum(rnd) is None


def test_a_malformed_batch_is_422_and_stores_nothing(rnd: Round) -> None:
    bodies = {u: rnd.masked_body(u) for u in IDS}
    good = batch({u: bodies[u] for u in EVEN})
    twice = messages.encode_masked_batch([(0, bodies[0]), (0, bodies[0])])
    count = len(messages.BATCH_MAGIC)
    cases = {
        "cut short": good[:-1],
        "bytes left over": good + b"\x00",
        "no count": messages.BATCH_MAGIC,
        "no client": messages.BATCH_MAGIC + (0).to_bytes(4, "little"),
        "more clients than the token holds": good[:count]
        + (5).to_bytes(4, "little")
        + good[count + 4 :],
        "a client twice": twice,
        "a length past the end": good[: count + 12] + (1 << 60).to_bytes(8, "little"),
    }
    for what, body in cases.items():
        r = send(rnd, "masked", 0, body)
        assert (r.status_code, r.json()["error"]) == (422, "malformed_message"), (what, r.text)
    assert running_sum(rnd) is None
    assert rnd.view(0)["phase"] == "masked"
    rnd.masked()  # every client's input is still taken, once
    rnd.reveal()
    rnd.check_model(IDS)


def test_a_retried_batch_is_answered_duplicate_and_summed_once(rnd: Round) -> None:
    bodies = {u: rnd.masked_body(u) for u in IDS}
    even = batch({u: bodies[u] for u in EVEN})
    assert results(send(rnd, "masked", 0, even)) == {u: ("accepted", None) for u in EVEN}
    once = running_sum(rnd)
    assert results(send(rnd, "masked", 0, even)) == {u: ("duplicate", None) for u in EVEN}
    r = send(rnd, "masked", 0, bodies[0])  # one client's input alone, as before
    assert r.json()["results"] == [{"client_id": 0, "status": "duplicate"}]
    assert running_sum(rnd) == once
    for u in ODD:  # single bodies still taken
        assert results(send(rnd, "masked", 1, bodies[u])) == {u: ("accepted", None)}
    rnd.reveal()
    rnd.check_model(IDS)


def test_a_batch_of_update_inputs_refuses_a_client_whose_count_did_not_arrive(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    rnd = SparseRound(aggregator, tmp_path, quorum=0.5)
    rnd.keys()
    rnd.shares()
    counts = {u: rnd.masked_body(u) for u in IDS[1:]}  # client 0's count never arrives
    assert results(send(rnd, "masked", 0, batch({u: counts[u] for u in EVEN[1:]}))) == {
        u: ("accepted", None) for u in EVEN[1:]
    }
    assert results(send(rnd, "masked", 1, batch({u: counts[u] for u in ODD}))) == {
        u: ("accepted", None) for u in ODD
    }
    rnd.clock.advance(61)
    rnd.http.app.state.service.tick()  # type: ignore[attr-defined]
    rnd.reveal(IDS[1:])
    union = rnd.union()
    spec = update_spec(MODEL, rnd.cfg, 1, IDS, union)
    rnd.clients_b[0].respec(spec)
    stray = messages.encode_masked(rnd.clients_b[0].masked(np.zeros(spec.length), rnd._shares(0)))
    b = {u: rnd.masked_b_body(u) for u in IDS[1:]}
    before = _rows(rnd.url)
    r = send(rnd, "masked_b", 0, batch({0: stray, **{u: b[u] for u in EVEN[1:]}}))
    assert results(r) == {
        0: ("refused", "not_a_survivor"),
        **{u: ("accepted", None) for u in EVEN[1:]},
    }
    assert len(_rows(rnd.url)) == len(before) + len(EVEN[1:])
    assert results(send(rnd, "masked_b", 1, batch({u: b[u] for u in ODD}))) == {
        u: ("accepted", None) for u in ODD
    }
    v = rnd.view(2)
    assert v["phase"] == "unmask_b" and 0 in v["dropped"]
    rnd.reveal_b(IDS[1:])
    assert rnd.version() == 1
    rnd.check_model(IDS[1:])
