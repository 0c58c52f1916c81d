"""A run with a robust server mean over HTTP: accepted with per-client uploads, refused (422,
saying why) with per-worker partial sums, which cannot be trimmed."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from services.aggregator.app import create_app
from tests.support.aggregator import make_settings, operator_headers, register, sqlite_url

RUN = {"n_items": 30, "factor": 4, "layers": 2, "rounds": 2, "fraction": 0.5, "seed": 1}


def test_robust_mean_needs_per_client_uploads(tmp_path: Path) -> None:
    with TestClient(create_app(make_settings(sqlite_url(tmp_path), population=20))) as client:
        register(client, list(range(20)))
        worker = {**RUN, "server_mean": "trimmed", "upload_grouping": "worker"}
        r = client.post("/v1/runs", json=worker, headers=operator_headers())
        assert r.status_code == 422, r.text
        assert "a partial sum cannot be trimmed" in r.json()["detail"]
        assert "Traceback" not in r.text
        per_client = {**RUN, "server_mean": "trimmed", "trim_fraction": 0.2}
        r = client.post("/v1/runs", json=per_client, headers=operator_headers())
        assert r.status_code == 201, r.text
        assert r.json()["config"]["server_mean"] == "trimmed"
