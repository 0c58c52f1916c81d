"""Operations of the aggregator: health, metrics, error shape, settings, migrations, what the
API never exposes or does, and the read-only token."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient

from fedrecgel.wire import encode_updates
from harness.aggregator import AggregatorFactory
from services.aggregator.db import make_engine
from services.aggregator.models import Base
from services.aggregator.settings import Settings
from tests.aggregator.started_run import MODEL, RUN
from tests.support.aggregator import bearer, operator_headers, random_update, register, service_of


def test_healthz_pings_the_database(app_client: TestClient) -> None:
    r = app_client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "database": "ok", "redis": "disabled"}


def test_healthz_is_503_when_the_database_is_gone(
    aggregator: AggregatorFactory, tmp_path: Path
) -> None:
    client = aggregator()
    service_of(client).db.engine = make_engine(f"sqlite:///{tmp_path}/missing/dir/x.db")
    r = client.get("/healthz")
    assert r.status_code == 503
    assert r.json()["status"] == "error" and r.json()["database"].startswith("error")


def test_metrics_are_prometheus_text_per_app(aggregator: AggregatorFactory) -> None:
    ra, rb = aggregator().get("/metrics"), aggregator().get("/metrics")
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


def test_client_count_and_read_only_token(aggregator: AggregatorFactory) -> None:
    client = aggregator(reader_token="reader-secret-123456")
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
