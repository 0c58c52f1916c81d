"""Per-worker partial sums (``upload_grouping=worker``): a worker's one body per round covers
its cohort members; the aggregator checks every listed client (held by the token, in the
cohort, not counted yet), stores the body once and counts every client, answers a retry as a
duplicate and a second, different body for a counted client with 409, keeps what it
acknowledged across a restart, and aggregates exactly :func:`fedrecgel.strategy.combine_partials`
(what the simulator computes). Runs that need per-client updates refuse the setting."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save as st_save

from fedrecgel.strategy import combine_partials, make_strategy, partial_loss
from fedrecgel.uploads import PartialSum
from fedrecgel.wire import decode_model, encode_partial
from harness.aggregator import AggregatorFactory
from tests.aggregator.started_run import MODEL, RUN, make_updates
from tests.support.aggregator import bearer, operator_headers, register, upload_headers

GROUPED = {**RUN, "upload_grouping": "worker"}


def make_partial(ids: list[int], seed: int = 0, n_rows: int = 12) -> PartialSum:
    """A valid random partial sum of :data:`MODEL` over ``ids`` (ascending)."""
    rng = np.random.default_rng(seed)
    shapes = MODEL.shared_shapes()
    idx = torch.from_numpy(np.sort(rng.choice(MODEL.n_items, n_rows, replace=False)))
    rows = {
        t: (idx, torch.from_numpy(rng.normal(0, 0.01, (n_rows, shapes[t][1])).astype(np.float32)))
        for t in MODEL.item_tables()
    }
    dense = {
        n: torch.from_numpy(rng.normal(0, 0.01, shapes[n]).astype(np.float32))
        for n in MODEL.dense_names()
    }
    sizes = tuple(int(v) for v in rng.integers(5, 50, len(ids)))
    return PartialSum(tuple(sorted(ids)), sizes, rows, dense, float(rng.random() * len(ids)))


class Grouped:
    """An in-process aggregator, clients 0..9 (``a``) and 10..19 (``b``), a grouped run."""

    def __init__(self, client: TestClient, start: bool = True) -> None:
        self.client = client
        self.a = register(client, list(range(10)))
        self.b = register(client, list(range(10, 20)))
        if start:
            r = client.post("/v1/runs", json=GROUPED, headers=operator_headers())
            assert r.status_code == 201, r.text
        self.cohort: list[int] = self.current()["cohort"] if start else []

    def current(self) -> dict[str, Any]:
        body: dict[str, Any] = self.client.get(
            "/v1/rounds/current", headers=operator_headers()
        ).json()
        return body

    def mine(self, token: str) -> list[int]:
        return [c for c in self.cohort if (c < 10) == (token == self.a)]

    def send(self, p: PartialSum, token: str, round_id: int = 1, body: bytes | None = None):  # type: ignore[no-untyped-def]
        return self.client.post(
            f"/v1/rounds/{round_id}/updates",
            content=body if body is not None else encode_partial(round_id, p),
            headers=upload_headers(token),
        )

    def received(self) -> int:
        return int(self.client.get("/v1/rounds/1").json()["updates_received"])

    def model(self, version: int) -> dict[str, torch.Tensor]:
        r = self.client.get(f"/v1/models/{version}", headers=bearer(self.a))
        assert r.status_code == 200, r.text
        return decode_model(r.content)[1]


def _split_tokens(g: Grouped) -> tuple[list[int], list[int]]:
    ours, theirs = g.mine(g.a), g.mine(g.b)
    if not ours or not theirs:
        pytest.skip("the cohort lies under one credential")  # not with RUN's seed
    return ours, theirs


@pytest.fixture
def grouped(aggregator: AggregatorFactory) -> Grouped:
    return Grouped(aggregator(database_url=aggregator.url()))


def expected_version_1(g: Grouped, partials: list[PartialSum]) -> dict[str, torch.Tensor]:
    """Version 0 stepped by the run's strategy with the combined partial sums."""
    params = {k: v.clone() for k, v in g.model(0).items()}
    shapes = {k: tuple(v.shape) for k, v in params.items()}
    strategy = make_strategy("adam", 0.001, "mean", None)
    strategy.apply(params, combine_partials(partials, shapes, "mean"))
    return params


def test_two_partial_sums_close_the_round_with_their_combination(grouped: Grouped) -> None:
    g = grouped
    ours, theirs = _split_tokens(g)
    pa, pb = make_partial(ours, 1), make_partial(theirs, 2)
    ra = g.send(pa, g.a)
    assert ra.status_code == 200, ra.text
    assert ra.json()["results"] == [{"client_id": c, "status": "accepted"} for c in ours]
    assert g.received() == len(ours)  # every listed client counts toward the quorum
    assert g.send(pb, g.b).status_code == 200
    got = g.model(1)
    want = expected_version_1(g, [pb, pa])  # the order of arrival does not matter
    for name, t in want.items():
        assert torch.equal(got[name], t), name
    (row,) = g.client.get("/v1/runs/current/history").json()["rounds"]
    assert row["n_updates"] == len(g.cohort)
    assert row["loss"] == pytest.approx(partial_loss([pa, pb]), abs=0.0)
    # after the close: the lost-answer retry is still a duplicate, another body is refused
    late = g.send(pa, g.a)
    assert late.status_code == 200 and {e["status"] for e in late.json()["results"]} == {
        "duplicate"
    }
    assert g.send(make_partial(ours, 7), g.a).status_code == 409


def test_a_retry_is_a_duplicate_and_a_different_body_for_counted_clients_is_409(
    grouped: Grouped,
) -> None:
    g = grouped
    ours, _ = _split_tokens(g)
    p = make_partial(ours, 1)
    assert g.send(p, g.a).status_code == 200
    again = g.send(p, g.a)
    assert again.status_code == 200
    assert {e["status"] for e in again.json()["results"]} == {"duplicate"}
    other = make_partial(ours, 9)
    r = g.send(other, g.a)
    assert r.status_code == 409 and r.json()["error"] == "conflicting_update", r.text
    if len(ours) > 1:  # a sub-set of counted clients is counted already, too
        r = g.send(make_partial(ours[:1], 3), g.a)
        assert r.status_code == 409 and r.json()["error"] == "conflicting_update"
    assert g.received() == len(ours)


def test_foreign_and_outside_clients_are_refused_403(grouped: Grouped) -> None:
    g = grouped
    ours, theirs = _split_tokens(g)
    r = g.send(make_partial([*ours, *theirs]), g.a)
    assert r.status_code == 403 and r.json()["error"] == "not_owned", r.text
    outsider = next(c for c in range(10) if c not in g.cohort)
    r = g.send(make_partial([*ours, outsider]), g.a)
    assert r.status_code == 403 and r.json()["error"] == "not_in_cohort", r.text
    assert g.received() == 0


def _raw(p: PartialSum, **meta_changes: str) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    for name, (idx, vals) in p.rows.items():
        tensors[f"{name}.rows"], tensors[f"{name}.values"] = idx.clone(), vals
    tensors.update(p.dense)
    clients = [
        {"client_id": c, "n_samples": n} for c, n in zip(p.client_ids, p.n_samples, strict=True)
    ]
    meta = {"format": "fedrecgel-partial", "round": "1", "clients": json.dumps(clients)}
    meta["loss"] = repr(p.loss)
    meta.update(meta_changes)
    return st_save(tensors, metadata=meta)


@pytest.mark.parametrize(
    "kind",
    ["twice", "unsorted", "nan", "wrong_shape", "extra_meta", "user_tensor", "zero_samples"],
)
def test_malformed_partial_sums_are_refused_422(grouped: Grouped, kind: str) -> None:
    g = grouped
    ours, _ = _split_tokens(g)
    p = make_partial(ours)
    body: bytes
    if kind == "twice":
        clients = [{"client_id": ours[0], "n_samples": 5}] * 2
        body = _raw(p, clients=json.dumps(clients))
    elif kind == "unsorted":
        if len(ours) < 2:
            pytest.skip("one client")
        clients = [{"client_id": c, "n_samples": 5} for c in reversed(ours)]
        body = _raw(p, clients=json.dumps(clients))
    elif kind == "zero_samples":
        clients = [{"client_id": c, "n_samples": 0} for c in ours]
        body = _raw(p, clients=json.dumps(clients))
    elif kind == "extra_meta":
        body = _raw(p, user_gmf="[0.1]")
    else:
        if kind == "nan":
            p.dense["predict.bias"] = torch.tensor([float("nan")])
        elif kind == "wrong_shape":
            idx, _ = p.rows["item_gmf"]
            p.rows["item_gmf"] = (idx, torch.zeros(len(idx), MODEL.factor + 1))
        elif kind == "user_tensor":
            p.dense["user_gmf"] = torch.zeros(MODEL.factor)
        body = _raw(p)
    r = g.send(p, g.a, body=body)
    assert r.status_code == 422, r.text
    assert g.received() == 0


def test_the_grouping_of_the_body_must_be_the_runs(
    grouped: Grouped, aggregator: AggregatorFactory
) -> None:
    g = grouped
    ours, _ = _split_tokens(g)
    per_client = g.send(make_partial(ours), g.a, body=None)
    assert per_client.status_code == 200  # the grouped run takes partial sums
    from fedrecgel.wire import encode_updates

    r = g.send(make_partial(ours), g.a, body=encode_updates(1, make_updates(ours[:1])))
    assert r.status_code == 422 and r.json()["error"] == "wrong_upload_grouping", r.text
    plain = Grouped(aggregator(), start=False)
    assert plain.client.post("/v1/runs", json=RUN, headers=operator_headers()).status_code == 201
    plain.cohort = plain.current()["cohort"]
    mine = plain.mine(plain.a) or plain.mine(plain.b)
    token = plain.a if plain.mine(plain.a) else plain.b
    r = plain.send(make_partial(mine), token)
    assert r.status_code == 422 and r.json()["error"] == "wrong_upload_grouping", r.text


@pytest.mark.parametrize(
    ("setting", "word"),
    [
        ({"clip": 1.0}, "clip"),
        ({"dp_noise": 1.0}, "differential privacy"),
        ({"target_epsilon": 3.0}, "differential privacy"),
        ({"secure_aggregation": "dense"}, "secure aggregation"),
    ],
)
def test_settings_that_need_per_client_updates_refuse_partial_sums(
    aggregator: AggregatorFactory, setting: dict[str, object], word: str
) -> None:
    client = aggregator()
    register(client, list(range(20)))
    r = client.post("/v1/runs", json={**GROUPED, **setting}, headers=operator_headers())
    assert r.status_code == 422, r.text
    assert "upload_grouping" in r.text and word in r.text


def test_an_acknowledged_partial_sum_survives_a_restart(aggregator: AggregatorFactory) -> None:
    g = Grouped(aggregator(database_url=aggregator.url()))
    ours, theirs = _split_tokens(g)
    pa, pb = make_partial(ours, 1), make_partial(theirs, 2)
    assert g.send(pa, g.a).status_code == 200
    aggregator.stop(g.client)
    g.client = aggregator(database_url=aggregator.url())  # a fresh process, same database
    assert g.received() == len(ours)
    again = g.send(pa, g.a)
    assert {e["status"] for e in again.json()["results"]} == {"duplicate"}
    assert g.send(pb, g.b).status_code == 200
    want = expected_version_1(g, [pa, pb])
    got = g.model(1)
    for name, t in want.items():
        assert torch.equal(got[name], t), name
