"""Every refusal of an upload the API names (422, 413, 409, 403, 401), each leaving the model
unchanged, and their counts in the metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from safetensors.torch import save as st_save

from fedrecgel.uploads import Update
from fedrecgel.wire import encode_updates
from tests.aggregator.started_run import MODEL, Ctx, make_updates
from tests.support.aggregator import bearer, upload_headers


def _raw_body(
    round_id: int,
    tensors: dict[str, torch.Tensor],
    info: list[dict[str, object]],
    **extra_meta: str,
) -> bytes:
    meta = {
        "format": "fedrecgel-updates",
        "round": str(round_id),
        "updates": json.dumps(info),
        **extra_meta,
    }
    return st_save(tensors, metadata=meta)


def _tensors(u: Update) -> dict[str, torch.Tensor]:
    out = {}
    for name, (idx, vals) in u.rows.items():
        out[f"0/{name}.rows"], out[f"0/{name}.values"] = idx, vals
    for name, g in u.dense.items():
        out[f"0/{name}"] = g
    return out


def _bad_body(kind: str, cid: int) -> bytes:
    u = make_updates([cid])[0]
    info: list[dict[str, object]] = [{"client_id": cid, "n_samples": u.n_samples, "loss": 0.1}]
    t = _tensors(u)
    if kind == "wrong_shape":
        t["0/item_gmf.values"] = torch.zeros(len(u.rows["item_gmf"][0]), MODEL.factor + 1)
    elif kind == "wrong_dtype":
        t["0/item_gmf.values"] = t["0/item_gmf.values"].to(torch.float64)
    elif kind == "nan":
        t["0/tower.0.weight"] = t["0/tower.0.weight"].clone()
        t["0/tower.0.weight"][0, 0] = float("nan")
    elif kind == "inf":
        t["0/item_mlp.values"] = t["0/item_mlp.values"].clone()
        t["0/item_mlp.values"][0, 0] = float("inf")
    elif kind == "row_out_of_range":
        idx = t["0/item_gmf.rows"].clone()
        idx[-1] = MODEL.n_items
        t["0/item_gmf.rows"] = idx
    elif kind == "missing_tensor":
        del t["0/predict.bias"]
    elif kind == "user_embedding_tensor":
        t["0/user_gmf"] = torch.zeros(MODEL.factor)
    elif kind == "user_data_in_metadata":
        return _raw_body(1, t, info, user_gmf="[0.1, 0.2]")
    elif kind == "user_data_in_entry":
        info[0]["interactions"] = [1, 2, 3]
    elif kind == "garbage":
        return b"\x00" * 64
    elif kind == "round_mismatch":
        return _raw_body(2, t, info)
    elif kind == "infinite_client_id":
        info[0]["client_id"] = float("inf")
    elif kind == "fractional_client_id":
        info[0]["client_id"] = cid + 0.5
    elif kind == "nested_metadata":
        return _raw_body(1, t, [], updates="[" * 20_000 + "]" * 20_000)
    return _raw_body(1, t, info)


@pytest.mark.parametrize(
    "kind",
    [
        "wrong_shape",
        "wrong_dtype",
        "nan",
        "inf",
        "row_out_of_range",
        "missing_tensor",
        "user_embedding_tensor",
        "user_data_in_metadata",
        "user_data_in_entry",
        "garbage",
        "round_mismatch",
        "infinite_client_id",
        "fractional_client_id",
        "nested_metadata",
    ],
)
def test_malformed_update_is_refused_422_and_model_unchanged(ctx: Ctx, kind: str) -> None:
    before = ctx.latest()
    cid = ctx.cohort[0]
    r = ctx.client.post(
        "/v1/rounds/1/updates", content=_bad_body(kind, cid), headers=upload_headers(ctx.owner(cid))
    )
    assert r.status_code == 422, r.text
    assert set(r.json()) == {"error", "detail"} and r.json()["detail"]
    assert ctx.received() == 0
    assert ctx.latest() == before


@pytest.mark.parametrize(
    "body",
    [b"", b"\x00" * 100, (2**63).to_bytes(8, "little") + b"{}", b"\x02" + b"\x00" * 7 + b"[]"],
)
def test_an_unreadable_body_is_malformed_not_the_other_grouping(ctx: Ctx, body: bytes) -> None:
    """A body whose format cannot be read was answered `wrong_upload_grouping`, as if it were
    a partial sum sent to a per-client run."""
    cid = ctx.cohort[0]
    r = ctx.client.post(
        "/v1/rounds/1/updates", content=body, headers=upload_headers(ctx.owner(cid))
    )
    assert r.status_code == 422 and r.json()["error"] == "malformed_update", r.text
    assert ctx.received() == 0


@pytest.mark.parametrize("body", [b"[{}]", b"not json"])
def test_a_secure_message_in_a_plain_run_is_not_secure(ctx: Ctx, body: bytes) -> None:
    """It was read first: a message the run would never take was answered as malformed."""
    cid = ctx.cohort[0]
    headers = {**bearer(ctx.owner(cid)), "Content-Type": "application/json"}
    r = ctx.client.post("/v1/rounds/1/secagg/keys", content=body, headers=headers)
    assert r.status_code == 409 and r.json()["error"] == "not_secure", r.text


def test_too_large_body_is_refused_413(ctx: Ctx) -> None:
    before = ctx.latest()
    cid = ctx.cohort[0]
    big = b"\x00" * 300_000
    r = ctx.client.post("/v1/rounds/1/updates", content=big, headers=upload_headers(ctx.owner(cid)))
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
        for _ in range(30):
            yield b"\x00" * 10_000

    r = ctx.client.post(
        "/v1/rounds/1/updates", content=chunks(), headers=upload_headers(ctx.owner(cid))
    )
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
    assert ctx.received() == 0 and ctx.latest() == before


def test_unknown_round_is_refused_409(ctx: Ctx) -> None:
    before = ctx.latest()
    r = ctx.upload(99, make_updates(ctx.cohort[:1]))
    assert r.status_code == 409 and r.json()["error"] == "round_not_open"
    assert ctx.latest() == before


def test_closed_round_is_refused_409(ctx: Ctx) -> None:
    for c in ctx.cohort:
        assert ctx.upload(1, make_updates([c])).status_code == 200
    after_close = ctx.latest()
    assert after_close[0] == 1
    outsider = next(c for c in range(20) if c not in ctx.cohort)
    r = ctx.upload(1, make_updates([outsider]))
    assert r.status_code == 409 and r.json()["error"] == "round_not_open"
    late_conflict = ctx.upload(1, make_updates([ctx.cohort[0]], seed=5))
    assert late_conflict.status_code == 409
    # the lost-answer retry of an accepted update is still only a duplicate
    retry = ctx.upload(1, make_updates([ctx.cohort[0]]))
    assert retry.status_code == 200 and retry.json()["results"][0]["status"] == "duplicate"
    assert ctx.latest() == after_close


def test_client_not_in_cohort_is_refused_403(ctx: Ctx) -> None:
    before = ctx.latest()
    outsider = next(c for c in range(20) if c not in ctx.cohort)
    r = ctx.upload(1, make_updates([outsider]))
    assert r.status_code == 403 and r.json()["error"] == "not_in_cohort"
    assert ctx.received() == 0 and ctx.latest() == before


def test_client_of_another_token_is_refused_403(ctx: Ctx) -> None:
    before = ctx.latest()
    cid = ctx.cohort[0]
    thief = ctx.other if cid < 10 else ctx.token
    r = ctx.upload(1, make_updates([cid]), token=thief)
    assert r.status_code == 403 and r.json()["error"] == "not_owned"
    op = ctx.upload(1, make_updates([cid]), token="test-operator-token")
    assert op.status_code == 403
    assert ctx.received() == 0 and ctx.latest() == before


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc", "Bearer "])
def test_missing_or_wrong_token_is_refused_401(ctx: Ctx, header: str | None) -> None:
    before = ctx.latest()
    headers = {} if header is None else {"Authorization": header}
    r = ctx.client.post(
        "/v1/rounds/1/updates",
        content=encode_updates(1, make_updates(ctx.cohort[:1])),
        headers=headers,
    )
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert ctx.received() == 0 and ctx.latest() == before


def test_refusals_are_counted_by_reason(ctx: Ctx) -> None:
    ctx.upload(99, make_updates(ctx.cohort[:1]))
    ctx.client.post("/v1/rounds/1/updates", content=b"x")
    text = ctx.client.get("/metrics").text
    assert 'fedrec_agg_updates_refused_total{reason="round_not_open"} 1.0' in text
    assert 'fedrec_agg_updates_refused_total{reason="unauthorized"} 1.0' in text


def test_an_unknown_secure_aggregation_step_is_named_once(ctx: Ctx) -> None:
    """The step is a path parameter of the endpoint and of its body dependency: both refuse
    it, and the answer says so once."""
    r = ctx.client.post(
        "/v1/rounds/1/secagg/bogus",
        content=b"[]",
        headers={**upload_headers(ctx.token), "Content-Type": "application/json"},
    )
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail.count("path.step") == 1, detail
