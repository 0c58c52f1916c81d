"""Aggregator endpoints one by one: registration, rounds, models, uploads, evaluations and run
control, on an in-process app with two credentials and a started run."""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from fedrecgel.metrics import METRIC_NAMES
from fedrecgel.model import init_shared
from fedrecgel.uploads import Update
from fedrecgel.wire import decode_model
from tests.aggregator.started_run import MODEL, RUN, Ctx, make_updates
from tests.support.aggregator import (
    bearer,
    current_cohort,
    enrol_headers,
    operator_headers,
    post_run,
    post_updates,
    register,
    report_sums,
)

# ----------------------------------------------------------------------------- endpoints


def test_register_clients_returns_token_and_refuses_taken_ids(app_client: TestClient) -> None:
    r = app_client.post("/v1/clients", json={"client_ids": [3, 1, 2]}, headers=enrol_headers())
    assert r.status_code == 201
    assert r.json()["client_ids"] == [1, 2, 3] and len(r.json()["token"]) >= 32
    # id 2 is also shard 0 of 2's: that other credential cannot take it
    again = app_client.post("/v1/clients", json={"client_ids": [2, 8]}, headers=enrol_headers(0, 2))
    assert again.status_code == 409 and again.json()["error"] == "clients_held"
    bad = app_client.post("/v1/clients", json={"client_ids": []}, headers=enrol_headers())
    assert bad.status_code == 422 and set(bad.json()) == {"error", "detail"}


def test_tokens_are_stored_hashed(app_client: TestClient, tmp_path: Path) -> None:
    token = register(app_client, [0])
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("aggregator.db*"))
    assert token.encode() not in raw
    with sqlite3.connect(tmp_path / "aggregator.db") as conn:
        rows = conn.execute("SELECT client_id, token_hash FROM clients").fetchall()
    assert rows == [(0, hashlib.sha256(token.encode()).hexdigest())]


def test_current_round_is_idle_without_a_run(app_client: TestClient) -> None:
    tok = register(app_client, [0])
    body = app_client.get("/v1/rounds/current", headers=bearer(tok)).json()
    assert body["state"] == "idle" and body["run_id"] is None and body["cohort"] == []


def test_current_round_shows_only_the_callers_cohort_members(ctx: Ctx) -> None:
    mine = ctx.client.get("/v1/rounds/current", headers=bearer(ctx.token)).json()
    theirs = ctx.client.get("/v1/rounds/current", headers=bearer(ctx.other)).json()
    assert mine["state"] == "open" and mine["round_id"] == 1 and mine["attempt"] == 0
    assert mine["model_version"] == 0 and mine["cohort_size"] == 5
    assert mine["config"]["seed"] == 7 and mine["deadline"]
    assert sorted(mine["cohort"] + theirs["cohort"]) == ctx.cohort
    assert all(c < 10 for c in mine["cohort"]) and all(c >= 10 for c in theirs["cohort"])


def test_start_run_needs_operator_and_refuses_a_second_run(ctx: Ctx) -> None:
    assert ctx.client.post("/v1/runs", json=RUN).status_code == 401
    assert ctx.client.post("/v1/runs", json=RUN, headers=bearer(ctx.token)).status_code == 401
    second = ctx.client.post("/v1/runs", json=RUN, headers=operator_headers())
    assert second.status_code == 409 and second.json()["error"] == "run_active"
    bad = ctx.client.post("/v1/runs", json={**RUN, "fraction": 2.0}, headers=operator_headers())
    assert bad.status_code == 422


def test_model_download_is_version_zero_with_etag_and_304(ctx: Ctx) -> None:
    r = ctx.client.get("/v1/models/latest", headers=bearer(ctx.token))
    assert r.status_code == 200 and r.headers["X-Model-Version"] == "0"
    assert r.headers["ETag"] == f'"{hashlib.sha256(r.content).hexdigest()}"'
    cfg, shared, version = decode_model(r.content)
    assert cfg == MODEL and version == 0
    want = init_shared(MODEL, 7)
    assert all(torch.equal(shared[k], want[k]) for k in want)
    cached = ctx.client.get(
        "/v1/models/latest", headers={**bearer(ctx.token), "If-None-Match": r.headers["ETag"]}
    )
    assert cached.status_code == 304 and cached.content == b""
    assert cached.headers["X-Model-Version"] == "0"
    by_number = ctx.client.get("/v1/models/0", headers=bearer(ctx.token))
    assert by_number.content == r.content
    missing = ctx.client.get("/v1/models/5", headers=bearer(ctx.token))
    assert missing.status_code == 404 and missing.json()["error"] == "version_not_found"
    assert ctx.client.get("/v1/models/latest").status_code == 401


def test_uploads_complete_the_cohort_and_close_the_round(ctx: Ctx) -> None:
    ups = make_updates(ctx.cohort)
    by_owner: dict[str, list[Update]] = {}
    for u in ups:
        by_owner.setdefault(ctx.owner(u.client_id), []).append(u)
    for tok, batch in by_owner.items():
        r = ctx.upload(1, batch, token=tok)
        assert r.status_code == 200, r.text
        assert {x["status"] for x in r.json()["results"]} == {"accepted"}
    version, _ = ctx.latest()
    assert version == 1
    info = ctx.client.get("/v1/rounds/1").json()
    assert info["state"] == "closed" and info["model_version"] == 1
    assert info["updates_received"] == 5 and info["base_version"] == 0
    current = ctx.client.get("/v1/rounds/current", headers=bearer(ctx.token)).json()
    assert current["round_id"] == 2 and current["model_version"] == 1
    history = ctx.client.get("/v1/runs/current/history").json()
    assert [h["round_id"] for h in history["rounds"]] == [1]
    assert history["rounds"][0]["n_updates"] == 5
    assert history["rounds"][0]["loss"] == pytest.approx(float(np.mean([u.loss for u in ups])))


def test_identical_retry_is_a_duplicate_stored_once(ctx: Ctx) -> None:
    mine = [c for c in ctx.cohort if c < 10] or ctx.cohort[:1]
    u = make_updates(mine[:1])
    first = ctx.upload(1, u)
    again = ctx.upload(1, u)
    assert first.json()["results"][0]["status"] == "accepted"
    assert again.status_code == 200 and again.json()["results"][0]["status"] == "duplicate"
    assert ctx.received() == 1


def test_conflicting_second_update_is_refused_409(ctx: Ctx) -> None:
    cid = ctx.cohort[0]
    assert ctx.upload(1, make_updates([cid], seed=1)).status_code == 200
    r = ctx.upload(1, make_updates([cid], seed=2))
    assert r.status_code == 409 and r.json()["error"] == "conflicting_update"
    assert ctx.received() == 1
    assert ctx.latest()[0] == 0


def test_a_second_update_differing_only_in_its_loss_is_refused_409(ctx: Ctx) -> None:
    """Only an identical retry is a duplicate: the digest left the loss out, so another loss
    with the same tensors was answered `duplicate` and dropped."""
    u = make_updates(ctx.cohort[:1])
    assert ctx.upload(1, u).status_code == 200
    r = ctx.upload(1, [dataclasses.replace(u[0], loss=u[0].loss + 0.1)])
    assert r.status_code == 409 and r.json()["error"] == "conflicting_update", r.text
    assert ctx.received() == 1


def test_a_refused_body_stores_none_of_itsmake_updates(ctx: Ctx) -> None:
    cohort_mine = [c for c in ctx.cohort if ctx.owner(c) == ctx.owner(ctx.cohort[0])]
    outsider = next(
        c for c in range(20) if c not in ctx.cohort and ctx.owner(c) == ctx.owner(ctx.cohort[0])
    )
    r = ctx.upload(1, make_updates([*cohort_mine, outsider]))
    assert r.status_code == 403 and r.json()["error"] == "not_in_cohort"
    assert ctx.received() == 0


# ----------------------------------------------------------------------------- evaluation


def _report(version: int, ids: list[int], hr: float) -> dict[str, object]:
    return {
        "model_version": version,
        "sums": {
            **report_sums(0.5 * len(ids)),
            "hr@10": hr * len(ids),
        },
        "count": len(ids),
        "client_ids": ids,
    }


def test_evaluations_become_version_metrics_once_every_client_reported(ctx: Ctx) -> None:
    for c in ctx.cohort:
        ctx.upload(1, make_updates([c]))
    first = ctx.client.post(
        "/v1/evaluations", json=_report(1, list(range(10)), 0.2), headers=bearer(ctx.token)
    )
    assert first.status_code == 202 and first.json()["complete"] is False
    repeat = ctx.client.post(
        "/v1/evaluations", json=_report(1, list(range(10)), 0.9), headers=bearer(ctx.token)
    )
    assert repeat.status_code == 202 and repeat.json()["ignored"] == 10
    assert ctx.client.get("/v1/rounds/1").json()["metrics"] is None
    last = ctx.client.post(
        "/v1/evaluations", json=_report(1, list(range(10, 20)), 0.4), headers=bearer(ctx.other)
    )
    assert last.status_code == 202 and last.json()["complete"] is True
    metrics = ctx.client.get("/v1/rounds/1").json()["metrics"]
    expected = {**{name: 0.5 for name in METRIC_NAMES}, "hr@10": 0.3}
    assert metrics == pytest.approx(expected)
    history = ctx.client.get("/v1/runs/current/history").json()
    assert history["rounds"][0]["metrics"] == pytest.approx(expected)


def test_evaluation_refusals(ctx: Ctx) -> None:
    post = ctx.client.post
    assert post("/v1/evaluations", json=_report(0, [1], 0.1)).status_code == 401
    foreign = post("/v1/evaluations", json=_report(0, [15], 0.1), headers=bearer(ctx.token))
    assert foreign.status_code == 403
    unknown = post("/v1/evaluations", json=_report(9, [1], 0.1), headers=bearer(ctx.token))
    assert unknown.status_code == 404 and unknown.json()["error"] == "version_not_found"
    body = {**_report(0, [1, 2], 0.1), "count": 5}
    assert post("/v1/evaluations", json=body, headers=bearer(ctx.token)).status_code == 422
    assert (
        post("/v1/evaluations", json=_report(0, [1], 0.1), headers=bearer(ctx.token)).status_code
        == 202
    )
    overlap = post("/v1/evaluations", json=_report(0, [1, 2], 0.1), headers=bearer(ctx.token))
    assert overlap.status_code == 409 and overlap.json()["error"] == "evaluation_overlap"


def test_only_the_versions_the_run_evaluates_take_reports(app_client: TestClient) -> None:
    """eval_every 2 over 3 rounds: versions 0, 2 and 3 (the last) are evaluated, 1 is not;
    once the run is stopped after round 1, version 1 is its last and is evaluated."""
    token = register(app_client, list(range(10)))
    post_run(app_client, {**RUN, "eval_every": 2})
    for c in current_cohort(app_client):
        assert post_updates(app_client, token, 1, make_updates([c])).status_code == 200
    post = app_client.post

    def report(version: int) -> int:
        r = post("/v1/evaluations", json=_report(version, [1], 0.1), headers=bearer(token))
        return int(r.status_code)

    assert report(0) == 202
    refused = post("/v1/evaluations", json=_report(1, [1], 0.1), headers=bearer(token))
    assert refused.status_code == 409 and refused.json()["error"] == "version_not_evaluated"
    assert "multiples of eval_every 2" in refused.json()["detail"]
    assert post("/v1/runs/current/stop", headers=operator_headers()).status_code == 200
    assert report(1) == 202


# ----------------------------------------------------------------------------- run control


def test_pause_refuses_uploads_and_resume_reopens(ctx: Ctx) -> None:
    assert ctx.client.post("/v1/runs/current/pause").status_code == 401
    r = ctx.client.post("/v1/runs/current/pause", headers=operator_headers())
    assert r.status_code == 200 and r.json()["state"] == "paused"
    cur = ctx.client.get("/v1/rounds/current", headers=bearer(ctx.token)).json()
    assert cur["state"] == "paused"
    refused = ctx.upload(1, make_updates(ctx.cohort[:1]))
    assert refused.status_code == 409 and refused.json()["error"] == "round_not_open"
    r = ctx.client.post("/v1/runs/current/resume", headers=operator_headers())
    assert r.status_code == 200 and r.json()["state"] == "running"
    assert ctx.client.get("/v1/rounds/current", headers=bearer(ctx.token)).json()["state"] == "open"
    assert ctx.upload(1, make_updates(ctx.cohort[:1])).status_code == 200


def test_stop_finishes_the_run_and_allows_a_new_one(ctx: Ctx) -> None:
    r = ctx.client.post("/v1/runs/current/stop", headers=operator_headers())
    assert r.status_code == 200 and r.json()["state"] == "stopped"
    cur = ctx.client.get("/v1/rounds/current", headers=bearer(ctx.token)).json()
    assert cur["state"] == "finished" and cur["cohort"] == []
    assert ctx.upload(1, make_updates(ctx.cohort[:1])).status_code == 409
    again = ctx.client.post("/v1/runs/current/stop", headers=operator_headers())
    assert again.status_code == 409 and again.json()["error"] == "no_run"
    new = ctx.client.post("/v1/runs", json=RUN, headers=operator_headers())
    assert new.status_code == 201 and new.json()["run_id"] == 2
