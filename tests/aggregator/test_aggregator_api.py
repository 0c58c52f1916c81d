"""Aggregator endpoints, one by one, and every refusal the API names (model left unchanged)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient
from safetensors.torch import save as st_save

from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.sam import Update
from fedrecgel.wire import decode_model, encode_updates
from services.aggregator.app import create_app
from services.aggregator.models import Base
from services.aggregator.settings import Settings
from tests.support.aggregator import (
    bearer,
    enrol_headers,
    make_settings,
    operator_headers,
    random_update,
    register,
    sqlite_url,
    upload_headers,
)

MODEL = ModelConfig(n_items=50, kind="ncf", factor=4, layers=2)
RUN = {"n_items": 50, "factor": 4, "layers": 2, "rounds": 3, "fraction": 0.25, "seed": 7}


@dataclass
class Ctx:
    """An in-process app with 20 registered clients (two credentials) and a started run."""

    client: TestClient
    token: str  # holds clients 0..9
    other: str  # holds clients 10..19
    cohort: list[int]

    def owner(self, cid: int) -> str:
        return self.token if cid < 10 else self.other

    def upload(
        self,
        round_id: int,
        updates: list[Update],
        token: str | None = None,
        path_round: int | None = None,
    ) -> httpx.Response:
        tok = token or self.owner(updates[0].client_id)
        return self.client.post(
            f"/v1/rounds/{path_round or round_id}/updates",
            content=encode_updates(round_id, updates),
            headers={**bearer(tok), "Content-Type": "application/octet-stream"},
        )

    def latest(self) -> tuple[int, bytes]:
        r = self.client.get("/v1/models/latest", headers=bearer(self.token))
        assert r.status_code == 200
        return int(r.headers["X-Model-Version"]), r.content

    def received(self, round_id: int = 1) -> int:
        return int(self.client.get(f"/v1/rounds/{round_id}").json()["updates_received"])


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(make_settings(sqlite_url(tmp_path), max_body_bytes=200_000))
    with TestClient(app) as client:
        yield client


@pytest.fixture
def ctx(app_client: TestClient) -> Ctx:
    a = register(app_client, list(range(10)))
    b = register(app_client, list(range(10, 20)))
    r = app_client.post("/v1/runs", json=RUN, headers=operator_headers())
    assert r.status_code == 201, r.text
    cohort = app_client.get("/v1/rounds/current", headers=operator_headers()).json()["cohort"]
    assert len(cohort) == 5
    return Ctx(app_client, a, b, cohort)


def _updates(ids: list[int], seed: int = 0) -> list[Update]:
    rng = np.random.default_rng(seed)
    return [random_update(MODEL, c, rng) for c in ids]


# ----------------------------------------------------------------------------- endpoints


def test_register_clients_returns_token_and_refuses_taken_ids(app_client: TestClient) -> None:
    r = app_client.post("/v1/clients", json={"client_ids": [3, 1, 2]}, headers=enrol_headers())
    assert r.status_code == 201
    assert r.json()["client_ids"] == [1, 2, 3] and len(r.json()["token"]) >= 32
    # id 2 is also shard 0 of 2's: that other credential cannot take it
    again = app_client.post("/v1/clients", json={"client_ids": [2, 8]}, headers=enrol_headers(0, 2))
    assert again.status_code == 409 and again.json()["error"] == "already_registered"
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
    ups = _updates(ctx.cohort)
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
    u = _updates(mine[:1])
    first = ctx.upload(1, u)
    again = ctx.upload(1, u)
    assert first.json()["results"][0]["status"] == "accepted"
    assert again.status_code == 200 and again.json()["results"][0]["status"] == "duplicate"
    assert ctx.received() == 1


def test_conflicting_second_update_is_refused_409(ctx: Ctx) -> None:
    cid = ctx.cohort[0]
    assert ctx.upload(1, _updates([cid], seed=1)).status_code == 200
    r = ctx.upload(1, _updates([cid], seed=2))
    assert r.status_code == 409 and r.json()["error"] == "conflicting_update"
    assert ctx.received() == 1
    assert ctx.latest()[0] == 0


def test_a_refused_body_stores_none_of_its_updates(ctx: Ctx) -> None:
    cohort_mine = [c for c in ctx.cohort if ctx.owner(c) == ctx.owner(ctx.cohort[0])]
    outsider = next(
        c for c in range(20) if c not in ctx.cohort and ctx.owner(c) == ctx.owner(ctx.cohort[0])
    )
    r = ctx.upload(1, _updates([*cohort_mine, outsider]))
    assert r.status_code == 403 and r.json()["error"] == "not_in_cohort"
    assert ctx.received() == 0


# ----------------------------------------------------------------------------- refusals


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
    u = _updates([cid])[0]
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
    r = ctx.upload(99, _updates(ctx.cohort[:1]))
    assert r.status_code == 409 and r.json()["error"] == "round_not_open"
    assert ctx.latest() == before


def test_closed_round_is_refused_409(ctx: Ctx) -> None:
    for c in ctx.cohort:
        assert ctx.upload(1, _updates([c])).status_code == 200
    after_close = ctx.latest()
    assert after_close[0] == 1
    outsider = next(c for c in range(20) if c not in ctx.cohort)
    r = ctx.upload(1, _updates([outsider]))
    assert r.status_code == 409 and r.json()["error"] == "round_not_open"
    late_conflict = ctx.upload(1, _updates([ctx.cohort[0]], seed=5))
    assert late_conflict.status_code == 409
    # the lost-answer retry of an accepted update is still only a duplicate
    retry = ctx.upload(1, _updates([ctx.cohort[0]]))
    assert retry.status_code == 200 and retry.json()["results"][0]["status"] == "duplicate"
    assert ctx.latest() == after_close


def test_client_not_in_cohort_is_refused_403(ctx: Ctx) -> None:
    before = ctx.latest()
    outsider = next(c for c in range(20) if c not in ctx.cohort)
    r = ctx.upload(1, _updates([outsider]))
    assert r.status_code == 403 and r.json()["error"] == "not_in_cohort"
    assert ctx.received() == 0 and ctx.latest() == before


def test_client_of_another_token_is_refused_403(ctx: Ctx) -> None:
    before = ctx.latest()
    cid = ctx.cohort[0]
    thief = ctx.other if cid < 10 else ctx.token
    r = ctx.upload(1, _updates([cid]), token=thief)
    assert r.status_code == 403 and r.json()["error"] == "not_owned"
    op = ctx.upload(1, _updates([cid]), token="test-operator-token")
    assert op.status_code == 403
    assert ctx.received() == 0 and ctx.latest() == before


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc", "Bearer "])
def test_missing_or_wrong_token_is_refused_401(ctx: Ctx, header: str | None) -> None:
    before = ctx.latest()
    headers = {} if header is None else {"Authorization": header}
    r = ctx.client.post(
        "/v1/rounds/1/updates", content=encode_updates(1, _updates(ctx.cohort[:1])), headers=headers
    )
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert ctx.received() == 0 and ctx.latest() == before


def test_refusals_are_counted_by_reason(ctx: Ctx) -> None:
    ctx.upload(99, _updates(ctx.cohort[:1]))
    ctx.client.post("/v1/rounds/1/updates", content=b"x")
    text = ctx.client.get("/metrics").text
    assert 'fedrec_agg_updates_refused_total{reason="round_not_open"} 1.0' in text
    assert 'fedrec_agg_updates_refused_total{reason="unauthorized"} 1.0' in text


# ----------------------------------------------------------------------------- evaluation


def _report(version: int, ids: list[int], hr: float) -> dict[str, object]:
    return {
        "model_version": version,
        "sums": {"hr@10": hr * len(ids), "ndcg@10": 0.5 * len(ids), "count": float(len(ids))},
        "count": len(ids),
        "client_ids": ids,
    }


def test_evaluations_become_version_metrics_once_every_client_reported(ctx: Ctx) -> None:
    for c in ctx.cohort:
        ctx.upload(1, _updates([c]))
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
    assert metrics == pytest.approx({"hr@10": 0.3, "ndcg@10": 0.5})
    history = ctx.client.get("/v1/runs/current/history").json()
    assert history["rounds"][0]["metrics"] == pytest.approx({"hr@10": 0.3, "ndcg@10": 0.5})


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


# ----------------------------------------------------------------------------- run control


def test_pause_refuses_uploads_and_resume_reopens(ctx: Ctx) -> None:
    assert ctx.client.post("/v1/runs/current/pause").status_code == 401
    r = ctx.client.post("/v1/runs/current/pause", headers=operator_headers())
    assert r.status_code == 200 and r.json()["state"] == "paused"
    cur = ctx.client.get("/v1/rounds/current", headers=bearer(ctx.token)).json()
    assert cur["state"] == "paused"
    refused = ctx.upload(1, _updates(ctx.cohort[:1]))
    assert refused.status_code == 409 and refused.json()["error"] == "round_not_open"
    r = ctx.client.post("/v1/runs/current/resume", headers=operator_headers())
    assert r.status_code == 200 and r.json()["state"] == "running"
    assert ctx.client.get("/v1/rounds/current", headers=bearer(ctx.token)).json()["state"] == "open"
    assert ctx.upload(1, _updates(ctx.cohort[:1])).status_code == 200


def test_stop_finishes_the_run_and_allows_a_new_one(ctx: Ctx) -> None:
    r = ctx.client.post("/v1/runs/current/stop", headers=operator_headers())
    assert r.status_code == 200 and r.json()["state"] == "stopped"
    cur = ctx.client.get("/v1/rounds/current", headers=bearer(ctx.token)).json()
    assert cur["state"] == "finished" and cur["cohort"] == []
    assert ctx.upload(1, _updates(ctx.cohort[:1])).status_code == 409
    again = ctx.client.post("/v1/runs/current/stop", headers=operator_headers())
    assert again.status_code == 409 and again.json()["error"] == "no_run"
    new = ctx.client.post("/v1/runs", json=RUN, headers=operator_headers())
    assert new.status_code == 201 and new.json()["run_id"] == 2


# ----------------------------------------------------------------------------- ops


def test_healthz_pings_the_database(app_client: TestClient) -> None:
    r = app_client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "database": "ok", "redis": "disabled"}


def test_healthz_is_503_when_the_database_is_gone(tmp_path: Path) -> None:
    app = create_app(make_settings(sqlite_url(tmp_path)))
    with TestClient(app) as client:
        service = client.app.state.service  # type: ignore[attr-defined]
        from services.aggregator.db import make_engine

        service.db.engine = make_engine(f"sqlite:///{tmp_path}/missing/dir/x.db")
        r = client.get("/healthz")
        assert r.status_code == 503
        assert r.json()["status"] == "error" and r.json()["database"].startswith("error")


def test_metrics_are_prometheus_text_per_app(tmp_path: Path) -> None:
    a = create_app(make_settings(sqlite_url(tmp_path, "a.db")))
    b = create_app(make_settings(sqlite_url(tmp_path, "b.db")))
    with TestClient(a) as ca, TestClient(b) as cb:
        ra, rb = ca.get("/metrics"), cb.get("/metrics")
    assert ra.status_code == rb.status_code == 200
    for name in (
        "fedrec_agg_rounds_closed_total",
        "fedrec_agg_updates_accepted_total",
        "fedrec_agg_round_duration_seconds_bucket",
        "fedrec_agg_round_close_seconds",
    ):
        assert name in ra.text


def test_errors_have_the_error_detail_shape(app_client: TestClient) -> None:
    for r in (
        app_client.get("/nope"),
        app_client.get("/v1/rounds/1"),
        app_client.post("/v1/clients", json={"client_ids": "x"}),
    ):
        assert r.status_code >= 400 and set(r.json()) == {"error", "detail"}


def test_operator_placeholder_token_is_refused_outside_development() -> None:
    with pytest.raises(ValueError, match="OPERATOR_TOKEN"):
        Settings(environment="production")
    assert Settings(environment="development").operator_token == "changethis"


def test_settings_come_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDREC_AGG_DATABASE_URL", "sqlite:///x.db")
    monkeypatch.setenv("FEDREC_AGG_OPERATOR_TOKEN", "s3cret-0123456789abcdef")
    monkeypatch.setenv("FEDREC_AGG_ENVIRONMENT", "production")
    monkeypatch.setenv("FEDREC_AGG_MAX_BODY_BYTES", "1234")
    monkeypatch.setenv("FEDREC_AGG_POPULATION", "1227")
    s = Settings()
    assert (s.database_url, s.operator_token, s.max_body_bytes, s.population) == (
        "sqlite:///x.db",
        "s3cret-0123456789abcdef",
        1234,
        1227,
    )


def test_migrations_match_the_models(app_client: TestClient) -> None:
    engine = app_client.app.state.service.db.engine  # type: ignore[attr-defined]
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_no_response_schema_can_carry_private_user_state(app_client: TestClient) -> None:
    spec = json.dumps(app_client.get("/openapi.json").json())
    for word in ("user_gmf", "user_mlp", "embedding", "interactions", "exp_avg"):
        assert word not in spec


def test_aggregator_never_unpickles() -> None:
    import services.aggregator as pkg

    root = Path(pkg.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        # spelled in pieces so that this file does not itself match a search for them
        banned_calls = (
            "import pickle",
            "torch." + "load(",
            "pickle." + "loads",
            "weights_only=False",
        )
        for banned in banned_calls:
            assert banned not in text, f"{path}: {banned}"


def test_client_count_and_read_only_token(tmp_path: Path) -> None:
    app = create_app(make_settings(sqlite_url(tmp_path), reader_token="reader-secret-123456"))
    with TestClient(app) as client:
        assert client.get("/v1/clients/count").json() == {"registered": 0}
        register(client, [0, 1, 2, 3])
        assert client.get("/v1/clients/count").json() == {"registered": 4}
        assert client.post("/v1/runs", json=RUN, headers=operator_headers()).status_code == 201
        reader = bearer("reader-secret-123456")
        assert client.get("/v1/models/latest", headers=reader).status_code == 200
        assert client.get("/v1/rounds/current", headers=reader).json()["cohort"] == []
        # the reader owns no client: it cannot upload, nor act as the operator
        cohort = client.get("/v1/rounds/current", headers=operator_headers()).json()["cohort"]
        up = encode_updates(1, [random_update(MODEL, cohort[0], np.random.default_rng(0))])
        r = client.post(
            "/v1/rounds/1/updates",
            content=up,
            headers={**reader, "Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 403
        assert client.post("/v1/runs/current/pause", headers=reader).status_code == 401
        assert client.get("/v1/models/latest", headers=bearer("wrong")).status_code == 401
