"""Sparse secure aggregation on the aggregator, in process (real app, real SQLite, a settable
clock): the protocol's clients drive the six phases (both instances' keys and shares, A's
masked item counts and reveals, B's masked updates on the union and reveals), and the
published model is the plain aggregation of B's survivors' inputs to the fixed-point step."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from alembic import command
from sqlalchemy import create_engine, inspect, text

from fedrecgel.sam import negative_pool
from fedrecgel.secagg import messages
from fedrecgel.secagg.aggregate import counts_spec, item_indicator, sparse_input, update_spec
from fedrecgel.secagg.protocol import Client, Keys, Masked, Shares
from fedrecgel.wire import decode_model
from harness.aggregator import AggregatorFactory
from tests.aggregator.migrating import alembic_connection
from tests.aggregator.test_aggregator_secagg import IDS, MODEL, Round
from tests.support.aggregator import bearer, random_update

POOL = 8
OCTETS = "application/octet-stream"


class SparseRound(Round):
    """The 8 clients of a started sparse secure run, each with a protocol client per
    instance, driven step by step (updates of 3 rows per table: the union is not every item)."""

    def __init__(
        self, aggregator: AggregatorFactory, tmp_path: Path, url: str | None = None, **run: Any
    ) -> None:
        run = {"secure_aggregation": "sparse", "negative_pool": POOL, **run}
        super().__init__(aggregator, tmp_path, url, **run)
        self.pool = negative_pool(self.cfg.seed, 1, MODEL.n_items, POOL)
        self.spec = counts_spec(MODEL, self.cfg, 1, IDS)
        self.clients = {u: Client(self.spec, u) for u in IDS}
        first_b = update_spec(MODEL, self.cfg, 1, IDS, self.pool)
        self.clients_b = {u: Client(first_b, u, self.clients[u]) for u in IDS}  # as a worker
        rng = np.random.default_rng(0)
        self.updates = {u: random_update(MODEL, u, rng, n_rows=3) for u in IDS}

    def keys(self, who: list[int] = IDS) -> None:
        for u in who:
            a = messages.encode_keys(self.clients[u].advertise())
            b = messages.encode_keys(self.clients_b[u].advertise(), "b")
            r = self.post("keys", u, b"[" + a + b"," + b + b"]")
            assert r.status_code == 200, r.text

    def shares_body(self, u: int) -> bytes:
        keys: dict[str, dict[int, Keys]] = {"a": {}, "b": {}}
        for d in self.view(u)["messages"]:
            k = messages.decode_keys(json.dumps(d).encode())
            keys[messages.instance_of(d)][k.client_id] = k
        a = messages.encode_shares(self.clients[u].share(keys["a"]))
        b = messages.encode_shares(self.clients_b[u].share(keys["b"]), "b")
        return b"[" + a + b"," + b + b"]"

    def masked_body(self, u: int) -> bytes:
        got = self._shares(u)
        x = item_indicator(MODEL, self.updates[u], self.pool)
        return messages.encode_masked(self.clients[u].masked(x, got))

    def _shares(self, u: int) -> dict[int, Shares]:
        got: dict[int, Shares] = {}
        for d in self.view(u)["messages"]:
            sh = messages.decode_shares(json.dumps(d).encode())
            got[sh.client_id] = sh
        return got

    def union(self) -> np.ndarray:
        v = self.view(0)
        assert v["phase"] == "masked_b", v["phase"]
        return np.asarray(v["union"], dtype=np.int64)

    def masked_b_body(self, u: int) -> bytes:
        union = self.union()
        spec = update_spec(MODEL, self.cfg, 1, IDS, union)
        assert self.view(u)["length"] == spec.length
        self.clients_b[u].respec(spec)
        x = sparse_input(MODEL, self.cfg, self.updates[u], union)
        return messages.encode_masked(self.clients_b[u].masked(x, self._shares(u)))

    def masked_b(self, who: list[int] = IDS) -> None:
        bodies = {u: self.masked_b_body(u) for u in who}
        for u in who:
            r = self.post("masked_b", u, bodies[u], OCTETS)
            assert r.status_code == 200, r.text

    def reveal_b(self, who: list[int] = IDS) -> None:
        for u in who:
            v = self.view(u)
            rv = self.clients_b[u].reveal(v["survivors"], v["dropped"])
            r = self.post("reveal_b", u, b"[" + messages.encode_reveal(rv, "b") + b"]")
            assert r.status_code == 200, r.text

    def check_model(self, who: list[int]) -> None:
        r = self.http.get("/v1/models/1", headers=bearer(self.tokens[0]))
        assert r.status_code == 200, r.text
        _, shared, _ = decode_model(r.content)
        for name, want in self.expected(who).items():
            # 32-bit words: a step of 2^-scale (2^-(scale + 8) on item rows)
            assert torch.allclose(shared[name], want, atol=1e-5), name


@pytest.fixture
def sparse(aggregator: AggregatorFactory, tmp_path: Path) -> SparseRound:
    return SparseRound(aggregator, tmp_path)


def test_a_sparse_round_publishes_the_plain_aggregate_on_the_union(sparse: SparseRound) -> None:
    _full_round(sparse)


@pytest.mark.postgres
def test_a_sparse_round_on_postgres(
    aggregator: AggregatorFactory, tmp_path: Path, postgres_url: str
) -> None:
    _full_round(SparseRound(aggregator, tmp_path, postgres_url))


def _full_round(sparse: SparseRound) -> None:
    sparse.keys()
    assert sparse.phase() == "shares"
    sparse.shares()
    assert sparse.phase() == "masked"
    sparse.masked()
    assert sparse.phase() == "unmask"
    sparse.reveal()
    union = sparse.union()
    touched = set(sparse.pool.tolist())
    for upd in sparse.updates.values():
        for idx, _ in upd.rows.values():
            touched |= set(idx.tolist())
    assert union.tolist() == sorted(touched) and len(union) < MODEL.n_items
    v = sparse.view(3)
    assert v["word_bits"] == 32 and v["scale_bits"] >= 20
    assert all(d.get("instance") == "b" for d in v["messages"])
    sparse.masked_b()
    assert sparse.phase() == "unmask_b"
    sparse.reveal_b()
    assert sparse.version() == 1
    sparse.check_model(IDS)


def test_a_client_gone_after_its_count_leaves_the_mean_of_bs_survivors(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    """Client 0's count arrives (it is in U), then it never sends B's input: B's phase ends at
    its deadline, its B mask key is rebuilt, and the mean is over the other seven."""
    rnd = SparseRound(aggregator, tmp_path, quorum=0.5)
    rnd.keys()
    rnd.shares()
    rnd.masked()
    rnd.reveal()
    rnd.masked_b(IDS[1:])
    assert rnd.phase() == "masked_b"
    rnd.clock.advance(61)
    rnd.http.app.state.service.tick()  # type: ignore[attr-defined]
    assert rnd.view(1)["dropped"] == [0] and rnd.view(1)["survivors"] == IDS[1:]
    rnd.reveal_b(IDS[1:])
    assert rnd.version() == 1
    rnd.check_model(IDS[1:])
    hist = rnd.http.get("/v1/runs/current/history").json()["rounds"][0]
    assert hist["n_updates"] == 7


def _rows(url: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            q = "SELECT instance, step, client_id FROM secagg_messages ORDER BY 1, 2, 3"
            return [tuple(r) for r in conn.execute(text(q))]
    finally:
        engine.dispose()


def test_bad_update_inputs_are_refused_and_store_nothing(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    """A B input of the wrong length for U is 422 and stores nothing; a client whose count
    did not arrive is refused B (409 ``not_a_survivor``) and counts as dropped there; a keys
    body without B's keys, with A's keys again as B's, or with A's mask key as B's encryption
    key, is 422 (B's encryption key may be A's: the worker's are)."""
    rnd = SparseRound(aggregator, tmp_path, quorum=0.5)
    a = messages.encode_keys(rnd.clients[0].advertise())
    r = rnd.post("keys", 0, b"[" + a + b"]")
    assert (r.status_code, r.json()["error"]) == (422, "malformed_message"), r.text
    again = messages.encode_keys(rnd.clients[0].advertise(), "b")
    r = rnd.post("keys", 0, b"[" + a + b"," + again + b"]")
    assert (r.status_code, r.json()["error"]) == (422, "malformed_message"), r.text
    assert "fresh mask key" in r.json()["detail"]
    keys_b = rnd.clients_b[0].advertise()
    assert keys_b.c_pk == rnd.clients[0].advertise().c_pk  # one share-encryption key for both
    mask_as_c = messages.encode_keys(replace(keys_b, c_pk=rnd.clients[0].advertise().s_pk), "b")
    r = rnd.post("keys", 0, b"[" + a + b"," + mask_as_c + b"]")
    assert (r.status_code, r.json()["error"]) == (422, "malformed_message"), r.text
    rnd.keys()
    rnd.shares()
    held_back = rnd.masked_body(0)  # client 0 masks its count, but it never arrives
    rnd.masked(IDS[1:])
    rnd.clock.advance(61)
    rnd.http.app.state.service.tick()  # type: ignore[attr-defined]
    assert rnd.phase() == "unmask"
    r = rnd.post("masked", 0, held_back, OCTETS)
    assert (r.status_code, r.json()["error"]) == (409, "wrong_phase")
    rnd.reveal(IDS[1:])
    union = rnd.union()
    before = _rows(rnd.url)
    # client 0 (not one of A's survivors: its rows may be outside U) sends a B input of U's
    # length all the same
    spec = update_spec(MODEL, rnd.cfg, 1, IDS, union)
    rnd.clients_b[0].respec(spec)
    stray = rnd.clients_b[0].masked(np.zeros(spec.length), rnd._shares(0))
    r = rnd.post("masked_b", 0, messages.encode_masked(stray), OCTETS)
    assert (r.status_code, r.json()["error"]) == (409, "not_a_survivor"), r.text
    short = messages.encode_masked(Masked(1, np.zeros(spec.length - 1, dtype=np.uint32)))
    r = rnd.post("masked_b", 1, short, OCTETS)
    assert (r.status_code, r.json()["error"]) == (422, "malformed_message"), r.text
    assert _rows(rnd.url) == before  # nothing stored by either refusal
    rnd.masked_b(IDS[1:])
    v = rnd.view(2)
    assert v["phase"] == "unmask_b" and 0 in v["dropped"] and 0 not in v["survivors"]
    rnd.reveal_b(IDS[1:])
    assert rnd.version() == 1
    rnd.check_model(IDS[1:])


def test_a_restarted_aggregator_goes_on_with_the_update_instance(sparse: SparseRound) -> None:
    sparse.keys()
    sparse.shares()
    sparse.masked()
    sparse.reveal()
    union = sparse.union()
    sparse.masked_b(IDS[:4])  # half of B's inputs are in B's running sum
    sparse.aggregator.stop(sparse.http)
    sparse.http = sparse.aggregator(population=8, clock=sparse.clock, database_url=sparse.url)
    assert np.array_equal(sparse.union(), union)
    sparse.masked_b(IDS[4:])
    sparse.reveal_b()
    sparse.check_model(IDS)


# ----------------------------------------------------------------------------- migration 0009


def _migration_roundtrip(url: str) -> None:
    """At revision 0008, an attempt's messages and running sum; upgraded, they are instance
    A's, and a union and B's rows can be stored; downgraded, A's rows are back as they were,
    B's and the union gone."""
    t = datetime(2025, 1, 1, tzinfo=UTC)
    with alembic_connection(url) as (conn, cfg):
        command.upgrade(cfg, "0008")
        conn.execute(
            text(
                "INSERT INTO runs (id, config, state, active, created_at) "
                "VALUES (1, '{}', 'running', :a, :t)"
            ),
            {"a": True, "t": t},
        )
        conn.execute(
            text(
                "INSERT INTO rounds (id, run_id, round_id, attempt, state, cohort, base_version, "
                "opened_at, deadline, secagg_phase) VALUES (1, 1, 1, 0, 'open', '[1, 2]', 0, "
                ":t, :t, 'masked')"
            ),
            {"t": t},
        )
        for step, cid in (("keys", 1), ("keys", 2), ("masked", 1)):
            conn.execute(
                text(
                    "INSERT INTO secagg_messages (round_pk, step, client_id, digest, body) "
                    "VALUES (1, :s, :c, 'd', :b)"
                ),
                {"s": step, "c": cid, "b": f"{step}{cid}".encode()},
            )
        conn.execute(
            text("INSERT INTO secagg_totals (round_pk, total) VALUES (1, :b)"), {"b": b"t"}
        )
        command.upgrade(cfg, "0009")
        got = conn.execute(
            text("SELECT instance, step, client_id, body FROM secagg_messages ORDER BY 2, 3")
        ).fetchall()
        assert [(i, s, c, bytes(b)) for i, s, c, b in got] == [
            ("a", "keys", 1, b"keys1"),
            ("a", "keys", 2, b"keys2"),
            ("a", "masked", 1, b"masked1"),
        ]
        assert conn.execute(text("SELECT instance FROM secagg_totals")).scalar_one() == "a"
        # instance B beside A under the same (round, step, client), and the union
        conn.execute(
            text(
                "INSERT INTO secagg_messages (round_pk, instance, step, client_id, digest, body) "
                "VALUES (1, 'b', 'keys', 1, 'd', :b)"
            ),
            {"b": b"keys1b"},
        )
        conn.execute(
            text("INSERT INTO secagg_totals (round_pk, instance, total) VALUES (1, 'b', :b)"),
            {"b": b"tb"},
        )
        conn.execute(text("UPDATE rounds SET secagg_union = '[0, 3]' WHERE id = 1"))
        command.downgrade(cfg, "0008")
        back = conn.execute(
            text("SELECT step, client_id, body FROM secagg_messages ORDER BY 1, 2")
        ).fetchall()
        assert [(s, c, bytes(b)) for s, c, b in back] == [
            ("keys", 1, b"keys1"),
            ("keys", 2, b"keys2"),
            ("masked", 1, b"masked1"),
        ]
        totals = conn.execute(text("SELECT round_pk, total FROM secagg_totals")).fetchall()
        assert [(p, bytes(b)) for p, b in totals] == [(1, b"t")]
        insp = inspect(conn)
        assert "secagg_union" not in {c["name"] for c in insp.get_columns("rounds")}
        for table in ("secagg_messages", "secagg_totals"):
            assert "instance" not in {c["name"] for c in insp.get_columns(table)}
        pk = insp.get_pk_constraint("secagg_messages")["constrained_columns"]
        assert pk == ["round_pk", "step", "client_id"]
        command.upgrade(cfg, "head")


def test_migration_0009_adds_the_instances_and_downgrades(tmp_path: Path) -> None:
    _migration_roundtrip(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_migration_0009_on_postgres(postgres_url: str) -> None:
    _migration_roundtrip(postgres_url)
