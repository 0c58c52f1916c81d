"""Bounded inputs (issue 8, findings 1, 2, 4, 6 and 9): every out-of-range value is a clear
4xx before anything is built or stored, never a 500, and changes nothing."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from fedrecgel import wire
from fedrecgel.metrics import METRIC_NAMES
from fedrecgel.model import ModelConfig, init_shared
from harness.aggregator import AggregatorFactory
from services.aggregator import runs as runs_module
from services.aggregator.settings import Population, Settings, resolve_population
from services.launcher import Cluster, UpOptions
from tests.aggregator.junk import junk_reports, junk_uploads
from tests.support.aggregator import (
    bearer,
    enrol_headers,
    operator_headers,
    post_run,
    post_updates,
    random_update,
    register,
    report_sums,
    upload_headers,
)

MODEL = ModelConfig(n_items=30, kind="ncf", factor=4, layers=2)
RUN = {"n_items": 30, "factor": 4, "layers": 2, "rounds": 3, "fraction": 1.0, "seed": 1}


@dataclass
class Started:
    """An aggregator with clients 0, 2, 4, 6 (token ``a``, shard 0 of 2) and 1, 3, 5, 7
    (token ``b``, shard 1 of 2) and a started run."""

    client: TestClient
    a: str
    b: str

    def latest(self) -> tuple[str, bytes]:
        r = self.client.get("/v1/models/latest", headers=bearer(self.a))
        return r.headers["X-Model-Version"], r.content


def _start(aggregator: AggregatorFactory, **settings: Any) -> Started:
    client = aggregator(population=8, **settings)
    a = register(client, [0, 2, 4, 6], 0, 2)
    b = register(client, [1, 3, 5, 7], 1, 2)
    post_run(client, RUN)
    return Started(client, a, b)


@pytest.fixture
def started(aggregator: AggregatorFactory) -> Started:
    return _start(aggregator)


def _close_round_1(s: Started) -> None:
    for token, ids in ((s.a, [0, 2, 4, 6]), (s.b, [1, 3, 5, 7])):
        rng = np.random.default_rng(ids[0])
        r = post_updates(s.client, token, 1, [random_update(MODEL, c, rng) for c in ids])
        assert r.status_code == 200, r.text
    assert s.client.get("/v1/rounds/1").json()["state"] == "closed"


# ----------------------------------------------------------------------------- finding 1


@pytest.mark.parametrize("kind", list(junk_reports(1, [0], [1])))
def test_out_of_range_evaluation_reports_are_422_and_honest_ones_complete(
    started: Started, kind: str
) -> None:
    """Regression: {"sums": {"hr@10": 1e308}, "count": 1} overflowed the mean (and on
    PostgreSQL made the honest reports fail with 500 for good)."""
    s = started
    _close_round_1(s)
    bad = junk_reports(1, [0, 2], [1, 3])[kind]
    if isinstance(bad, str):
        r = s.client.post(
            "/v1/evaluations",
            content=bad,
            headers={**bearer(s.a), "Content-Type": "application/json"},
        )
    else:
        r = s.client.post("/v1/evaluations", json=bad, headers=bearer(s.a))
    assert r.status_code in (403, 422), r.text
    assert set(r.json()) == {"error", "detail"}
    for token, ids, hr in ((s.a, [0, 2, 4, 6], 0.5), (s.b, [1, 3, 5, 7], 0.25)):
        report = {"model_version": 1, "sums": report_sums(hr * 4), "count": 4, "client_ids": ids}
        r = s.client.post("/v1/evaluations", json=report, headers=bearer(token))
        assert r.status_code == 202, r.text
    assert r.json()["complete"] is True
    assert s.client.get("/v1/rounds/1").json()["metrics"]["hr@10"] == 0.375


@pytest.mark.parametrize(
    "sums",
    [
        {"bogus": 0.0},
        {"hr@10": 2.0},
        {**report_sums(2.0), "bogus": 0.0},
        {**report_sums(2.0), "val/hr@10": 2.0},
    ],
    ids=["unknown-name", "a-subset", "an-extra-name", "some-validation-metrics"],
)
def test_a_report_without_exactly_the_runs_metrics_is_422_and_locks_nothing_out(
    started: Started, sums: dict[str, float]
) -> None:
    """Regression (issue 30, 3): the first report fixed a version's metric names, so
    ``{"bogus": 0.0}`` for one client got 202 and every honest report after it 422: the version
    could never complete. The names are the run's (every metric a worker computes)."""
    s = started
    _close_round_1(s)
    first = {"model_version": 1, "sums": sums, "count": 4, "client_ids": [0, 2, 4, 6]}
    r = s.client.post("/v1/evaluations", json=first, headers=bearer(s.a))
    assert r.status_code == 422 and r.json()["error"] == "invalid_metrics", r.text
    assert "a report carries exactly the metrics ['hr@5', 'ndcg@5'" in r.json()["detail"]
    for token, ids, hr in ((s.a, [0, 2, 4, 6], 2.0), (s.b, [1, 3, 5, 7], 1.0)):
        honest = {"model_version": 1, "sums": report_sums(hr), "count": 4, "client_ids": ids}
        r = s.client.post("/v1/evaluations", json=honest, headers=bearer(token))
        assert r.status_code == 202, r.text
    assert r.json()["complete"] is True
    metrics = s.client.get("/v1/rounds/1").json()["metrics"]
    assert metrics["hr@10"] == 0.375 and "bogus" not in metrics


def test_validation_metrics_are_published_only_when_every_report_carried_them(
    started: Started,
) -> None:
    """A worker with a validation split reports the ``val/`` twins as well; a version whose
    clients are partly in a worker without one publishes the test metrics alone (the others'
    validation sums would count as 0)."""
    s = started
    _close_round_1(s)
    with_val = {**report_sums(2.0), **{f"val/{k}": 1.0 for k in METRIC_NAMES}}
    for token, ids, sums in ((s.a, [0, 2, 4, 6], with_val), (s.b, [1, 3, 5, 7], report_sums(1.0))):
        report = {"model_version": 1, "sums": sums, "count": 4, "client_ids": ids}
        r = s.client.post("/v1/evaluations", json=report, headers=bearer(token))
        assert r.status_code == 202, r.text
    assert set(s.client.get("/v1/rounds/1").json()["metrics"]) == set(METRIC_NAMES)


def test_the_operator_cannot_report_evaluations_for_clients(started: Started) -> None:
    _close_round_1(started)
    report = {"model_version": 1, "sums": report_sums(1.0), "count": 1, "client_ids": [0]}
    r = started.client.post("/v1/evaluations", json=report, headers=operator_headers())
    assert r.status_code == 403 and r.json()["error"] == "not_owned"


def test_an_evaluation_over_too_many_ids_is_422(aggregator: AggregatorFactory) -> None:
    client = aggregator(population=8, max_register_per_request=3)
    token = register(client, [0, 1, 2])
    report = {"model_version": 0, "sums": report_sums(0.0), "count": 4, "client_ids": [0, 1, 2, 3]}
    r = client.post("/v1/evaluations", json=report, headers=bearer(token))
    assert r.status_code == 422 and r.json()["error"] == "too_many_clients"


# ----------------------------------------------------------------------------- finding 2


def test_no_model_is_built_while_a_run_is_active(
    started: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: POST /v1/runs built the model before finding the active run (with a huge
    model: 21 GB, then OOM)."""
    built: list[object] = []
    real = init_shared

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(runs_module, "init_shared", counting)
    big = {**RUN, "factor": 64, "n_items": 5000}
    r = started.client.post("/v1/runs", json=big, headers=operator_headers())
    assert r.status_code == 409 and r.json()["error"] == "run_active"
    assert built == []


def test_a_model_over_the_parameter_budget_is_422_before_allocation(
    aggregator: AggregatorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = aggregator(population=2, max_model_params=10_000)
    register(client, [0, 1])
    monkeypatch.setattr(runs_module, "init_shared", None)  # calling it would fail
    r = client.post("/v1/runs", json={**RUN, "n_items": 2000}, headers=operator_headers())
    assert r.status_code == 422 and r.json()["error"] == "model_too_large", r.text


def test_a_run_over_another_catalogue_than_the_populations_dataset_is_422(
    aggregator: AggregatorFactory,
) -> None:
    # the workers of a FilmTrust population stop on a run of another catalogue: refuse it
    client = aggregator(population=None, population_dataset="filmtrust")
    register(client, [0])
    for bad in ({"n_items": 10}, {"n_items": 2059, "dataset": "amazon-video"}):
        r = client.post("/v1/runs", json={**RUN, **bad}, headers=operator_headers())
        assert r.status_code == 422 and r.json()["error"] == "invalid_config", r.text
        assert "filmtrust (2059 items" in r.json()["detail"]
    r = client.post("/v1/runs", json={**RUN, "n_items": 2059}, headers=operator_headers())
    assert r.status_code == 201, r.text


def test_a_run_over_another_catalogue_than_a_numeric_populations_is_422(
    aggregator: AggregatorFactory,
) -> None:
    client = aggregator(population=2, population_items=30)
    register(client, [0])
    r = client.post("/v1/runs", json={**RUN, "n_items": 10}, headers=operator_headers())
    assert r.status_code == 422 and r.json()["error"] == "invalid_config", r.text
    assert "catalogue of 30 items (FEDREC_AGG_POPULATION_ITEMS)" in r.json()["detail"]
    r = client.post("/v1/runs", json={**RUN, "n_items": 30}, headers=operator_headers())
    assert r.status_code == 201, r.text


def test_a_catalogue_size_without_a_numeric_population_is_a_settings_error() -> None:
    with pytest.raises(ValidationError, match="POPULATION_ITEMS goes with"):
        Settings(environment="development", population_dataset="filmtrust", population_items=3)


def test_fedrec_up_gives_its_aggregator_the_catalogue(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cluster(UpOptions(workdir=tmp_path))
    c.population, c.population_items = 5, 30
    for name, value in c.aggregator_env().items():
        monkeypatch.setenv(name, value)
    want = Population(5, "filmtrust", 30)
    assert resolve_population(Settings(environment="development")) == want


def test_a_run_over_another_dataset_than_fedrec_ups_is_422(aggregator: AggregatorFactory) -> None:
    """Regression: the aggregator of `fedrec up` knew its catalogue's size but not its name,
    so a run naming another dataset (the dashboard's run form offers three) was started and
    every worker stopped on it. The population's numbers come with the dataset's name now."""
    client = aggregator(population=2, population_items=30, population_dataset="filmtrust")
    register(client, [0])
    r = client.post("/v1/runs", json={**RUN, "dataset": "lastfm-2k"}, headers=operator_headers())
    assert r.status_code == 422 and r.json()["error"] == "invalid_config", r.text
    assert "filmtrust (30 items" in r.json()["detail"]
    r = client.post("/v1/runs", json={**RUN, "dataset": "filmtrust"}, headers=operator_headers())
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "field,value",
    [("layers", 10**10), ("n_items", 10**8), ("seed", 2**70), ("factor", 0), ("seed", -1)],
)
def test_out_of_bound_run_configs_are_422(started: Started, field: str, value: int) -> None:
    r = started.client.post("/v1/runs", json={**RUN, field: value}, headers=operator_headers())
    assert r.status_code == 422 and r.json()["error"] == "validation_error", r.text


# ----------------------------------------------------------------------------- finding 4


@pytest.mark.parametrize("kind", list(junk_uploads(MODEL, 1, 0)))
def test_junk_uploads_are_refused_with_a_clear_body_and_change_nothing(
    started: Started, kind: str
) -> None:
    """Regression: loss NaN -> 500 on SQLite (200 on PostgreSQL), Inf accepted, n_samples
    2**70 -> 500: now 4xx with an ErrorBody, and the honest upload is accepted after."""
    s = started
    before = s.latest()
    body, content_type = junk_uploads(MODEL, 1, 0)[kind]
    headers = bearer(s.a) if content_type is None else {**bearer(s.a), "Content-Type": content_type}
    r = s.client.post("/v1/rounds/1/updates", content=body, headers=headers)
    assert r.status_code in (409, 415, 422), r.text
    assert set(r.json()) == {"error", "detail"} and r.json()["detail"]
    if kind.startswith(("loss", "n_samples_2")):  # n_samples 0: the wire refuses it
        assert r.status_code == 422 and r.json()["error"] == "invalid_update_metadata"
    if kind in ("text_plain", "json", "no_content_type"):
        assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type"
    assert s.client.get("/v1/rounds/1").json()["updates_received"] == 0
    assert s.latest() == before
    _close_round_1(s)
    loss = s.client.get("/v1/rounds/1").json()["loss"]
    assert loss is not None and math.isfinite(loss)


# ----------------------------------------------------------------------------- finding 6


@pytest.mark.parametrize(
    "path",
    [
        "/v1/rounds/40471355875263758336",
        "/v1/rounds/2147483648",
        "/v1/rounds/-1",
        "/v1/models/40471355875263758336",
        "/v1/models/9223372036854775808",
    ],
)
def test_huge_integers_in_paths_are_422(started: Started, path: str) -> None:
    """Regression: GET /v1/rounds/40471355875263758336 and /v1/models/<huge> were 500s."""
    r = started.client.get(path, headers=bearer(started.a))
    assert r.status_code == 422 and r.json()["error"] == "validation_error", r.text


def test_huge_round_in_an_upload_path_is_422(started: Started) -> None:
    r = started.client.post(
        "/v1/rounds/99999999999999999999/updates", content=b"x", headers=upload_headers(started.a)
    )
    assert r.status_code == 422


@pytest.mark.postgres
def test_a_database_outage_answers_503_json_with_retry_after(
    aggregator: AggregatorFactory, postgres_url: str
) -> None:
    """Regression: a database outage answered a plain-text 500."""
    client = aggregator(database_url=postgres_url, population=4)
    token = register(client, [0, 1])
    name = postgres_url.rsplit("/", 1)[1]
    admin = postgres_url.rsplit("/", 1)[0].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(f"{admin}/postgres", autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
    try:
        for method, path, kw in (
            ("GET", "/v1/rounds/current", {"headers": bearer(token)}),
            ("GET", "/v1/rounds/1", {}),
            ("GET", "/v1/clients/count", {}),
            ("POST", "/v1/runs", {"json": RUN, "headers": operator_headers()}),
        ):
            r = client.request(method, path, **kw)
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"] == "database_unavailable"
            assert int(r.headers["Retry-After"]) > 0
        health = client.get("/healthz")
        assert health.status_code == 503 and health.json()["status"] == "error"
    finally:
        with psycopg.connect(f"{admin}/postgres", autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert client.get("/v1/clients/count").json() == {"registered": 2}


# ----------------------------------------------------------------------------- finding 9


@pytest.mark.parametrize(
    "body",
    [
        {"client_ids": [False]},
        {"client_ids": ["1"]},
        {"client_ids": [1.0]},
        {"client_ids": [True, 2]},
    ],
)
def test_registration_ids_are_not_coerced(aggregator: AggregatorFactory, body: object) -> None:
    """Regression: client_ids: [false] registered client 0."""
    client = aggregator(population=4)
    r = client.post("/v1/clients", json=body, headers=enrol_headers())
    assert r.status_code == 422 and r.json()["error"] == "validation_error", r.text
    assert client.get("/v1/clients/count").json() == {"registered": 0}


@pytest.mark.parametrize("field,value", [("layers", "2"), ("seed", True), ("rounds", 3.0)])
def test_run_config_fields_are_not_coerced(
    aggregator: AggregatorFactory, field: str, value: object
) -> None:
    client = aggregator(population=2)
    register(client, [0, 1])
    r = client.post("/v1/runs", json={**RUN, field: value}, headers=operator_headers())
    assert r.status_code == 422, r.text


def test_a_body_that_is_not_json_is_422(started: Started) -> None:
    r = started.client.post(
        "/v1/runs",
        content=b"\xff\x17K",
        headers={**operator_headers(), "Content-Type": "application/json"},
    )
    assert r.status_code == 422 and set(r.json()) == {"error", "detail"}


def test_405_names_the_allowed_methods(started: Started) -> None:
    r = started.client.delete("/v1/clients")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    assert r.headers["Allow"] == "POST"


def test_openapi_describes_the_upload_body_and_every_refusal(started: Started) -> None:
    spec = started.client.get("/openapi.json").json()
    upload = spec["paths"]["/v1/rounds/{round_id}/updates"]["post"]
    assert upload["requestBody"]["required"] is True
    assert upload["requestBody"]["content"] == {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
    }
    assert {"401", "403", "409", "413", "415", "422", "503"} <= set(upload["responses"])
    params = {p["name"]: p["schema"] for p in upload["parameters"]}
    assert params["round_id"]["maximum"] == 2**31 - 1
    version = spec["paths"]["/v1/models/{version}"]["get"]["parameters"][0]["schema"]
    assert version["maximum"] == 2**31 - 1
    json.dumps(spec)  # serialisable


def test_a_json_body_over_the_limit_without_content_length_is_413(
    aggregator: AggregatorFactory,
) -> None:
    """A chunked JSON body is cut off while read: 413 body_too_large, not a parse error."""
    client = aggregator(population=8)

    def chunks() -> Iterator[bytes]:
        yield b'{"client_ids": ['
        for _ in range(300):
            yield b"0," * 5000

    headers = {**enrol_headers(), "Content-Type": "application/json"}
    r = client.post("/v1/clients", content=chunks(), headers=headers)
    assert r.status_code == 413 and r.json()["error"] == "body_too_large", r.text
    assert "limit" in r.json()["detail"]
    assert client.get("/v1/clients/count").json() == {"registered": 0}


def test_a_run_config_under_another_media_type_is_415(started: Started) -> None:
    for media in ("text/plain", "application/x-www-form-urlencoded"):
        r = started.client.post(
            "/v1/runs",
            content=json.dumps(RUN).encode(),
            headers={**operator_headers(), "Content-Type": media},
        )
        assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type", r.text
        assert "application/json" in r.json()["detail"]


@pytest.mark.parametrize("grouping", ["client", "worker"])
def test_an_upload_header_over_the_limit_is_422_before_it_is_parsed(
    aggregator: AggregatorFactory, grouping: str
) -> None:
    """Regression: a 64 MB body whose safetensors header was empty JSON lists cost the
    aggregator 2.5 GB and 28 s of CPU to parse (twice) before it was refused; a header within
    the limit but holding millions of update entries in its metadata, 1.1 GB for 32 MB. The
    header's length is now checked before any of it is parsed."""
    client = aggregator(population=8, max_body_bytes=2 * wire.MAX_HEADER_BYTES)
    token = register(client, [0, 1])
    post_run(client, {**RUN, "upload_grouping": grouping})
    n = wire.MAX_HEADER_BYTES + 8
    header = b'{"x":[' + b"[]," * ((n - 10) // 3) + b"[]]}"
    header += b" " * (-len(header) % 8)
    body = len(header).to_bytes(8, "little") + header
    r = client.post("/v1/rounds/1/updates", content=body, headers=upload_headers(token))
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "malformed_update"
    assert "over the limit" in r.json()["detail"]
    assert client.get("/v1/rounds/1").json()["updates_received"] == 0
