"""Federated-evaluation reports on each database, with reports covering more clients than one
``IN`` list holds (the coverage checks and inserts run as Core statements): two reports
complete a version, a repeated report is ignored, an overlapping one is 409, and the mean is
the clients' mean."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from harness.aggregator import AggregatorFactory
from services.aggregator import evaluation_repository
from services.aggregator.evaluation_repository import EvaluationRepository
from services.aggregator.repository import Repository
from tests.support.aggregator import bearer, operator_headers, register, report_sums

N = 2400  # two credentials of 1200 clients: each report spans two IN lists of 1000


def _report(ids: list[int], hr: float) -> dict[str, object]:
    return {
        "model_version": 0,
        "sums": report_sums(hr * len(ids)),
        "count": len(ids),
        "client_ids": ids,
    }


@pytest.mark.parametrize("driver_sql", [True, False], ids=["driver-executemany", "core"])
def test_large_reports_complete_a_version_on_each_database(
    aggregator: AggregatorFactory,
    database_url: str,
    driver_sql: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Coverage rows go in as the driver's executemany of plain tuples, or (for a driver of
    a parameter style not written out) as SQLAlchemy's Core executemany: the same outcomes."""
    if not driver_sql:
        monkeypatch.setattr(evaluation_repository, "_coverage_insert", lambda style: None)
    client = aggregator(database_url=database_url, population=N, max_register_per_request=N)
    evens, odds = list(range(0, N, 2)), list(range(1, N, 2))
    a, b = register(client, evens), register(client, odds)
    run = {"n_items": 50, "factor": 4, "layers": 2, "rounds": 3, "fraction": 0.01, "seed": 7}
    assert client.post("/v1/runs", json=run, headers=operator_headers()).status_code == 201
    post = client.post
    first = post("/v1/evaluations", json=_report(evens, 0.2), headers=bearer(a))
    assert first.status_code == 202, first.text
    assert first.json() == {"model_version": 0, "accepted": 1200, "ignored": 0, "complete": False}
    again = post("/v1/evaluations", json=_report(evens, 0.9), headers=bearer(a))
    assert again.json() == {"model_version": 0, "accepted": 0, "ignored": 1200, "complete": False}
    overlap = post("/v1/evaluations", json=_report(evens[-1:] + odds[:5], 0.1), headers=bearer(a))
    assert overlap.status_code in (403, 409)  # odd clients are b's: refused before any insert
    mixed = post("/v1/evaluations", json=_report(evens[1100:] + evens[:1], 0.1), headers=bearer(a))
    assert mixed.status_code == 202 and mixed.json()["ignored"] == 101
    part = post("/v1/evaluations", json=_report(odds[:1100], 0.4), headers=bearer(b))
    assert part.status_code == 202 and part.json()["complete"] is False
    clash = post("/v1/evaluations", json=_report(odds[1099:], 0.4), headers=bearer(b))
    assert clash.status_code == 409 and clash.json()["error"] == "evaluation_overlap"
    last = post("/v1/evaluations", json=_report(odds[1100:], 0.4), headers=bearer(b))
    assert last.status_code == 202 and last.json()["complete"] is True
    history = client.get("/v1/runs/current/history", headers=operator_headers()).json()
    assert history["evaluated_through"] == 0
    db = client.app.state.service.db  # type: ignore[attr-defined]
    with db.read() as s:
        row = Repository(s).version_meta(history["run_id"], 0)
        assert row is not None
        assert row.metrics is not None
        assert row.metrics["hr@10"] == pytest.approx((0.2 * 1200 + 0.4 * 1200) / N)


def test_a_fresh_report_is_stored_without_looking_its_clients_up(
    aggregator: AggregatorFactory, database_url: str
) -> None:
    """The unique constraint finds clients reported before; the ``IN`` lookup of which ones
    runs only when it did (a repeat), not for the usual first report of a version."""
    client = aggregator(database_url=database_url, population=N, max_register_per_request=N)
    evens = list(range(0, N, 2))
    a = register(client, evens)
    register(client, list(range(1, N, 2)))  # (so that the evens alone do not complete it)
    run = {"n_items": 50, "factor": 4, "layers": 2, "rounds": 3, "fraction": 0.01, "seed": 7}
    assert client.post("/v1/runs", json=run, headers=operator_headers()).status_code == 201
    lookups: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "client_id IN" in statement and "evaluations" in statement:
            lookups.append(statement)

    engine = client.app.state.service.db.engine  # type: ignore[attr-defined]
    event.listen(engine, "before_cursor_execute", count)
    try:
        first = client.post("/v1/evaluations", json=_report(evens, 0.2), headers=bearer(a))
        assert first.status_code == 202 and first.json()["accepted"] == 1200
        assert lookups == []
        again = client.post("/v1/evaluations", json=_report(evens, 0.2), headers=bearer(a))
        assert again.json()["ignored"] == 1200
        assert lookups  # the repeat was looked up, after the constraint refused it
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_a_complete_versions_coverage_is_dropped_and_its_reports_ignored(
    aggregator: AggregatorFactory, database_url: str
) -> None:
    """Once a version's metrics are written, the storage pass deletes its per-client rows
    (they would grow by the population every round), and any later report of it, repeated or
    new, is ignored: the metrics are final."""
    client = aggregator(database_url=database_url, population=N, max_register_per_request=N)
    evens, odds = list(range(0, N, 2)), list(range(1, N, 2))
    a, b = register(client, evens), register(client, odds)
    run = {"n_items": 50, "factor": 4, "layers": 2, "rounds": 3, "fraction": 0.01, "seed": 7}
    assert client.post("/v1/runs", json=run, headers=operator_headers()).status_code == 201
    assert (
        client.post("/v1/evaluations", json=_report(evens, 0.2), headers=bearer(a)).json()[
            "complete"
        ]
        is False
    )
    done = client.post("/v1/evaluations", json=_report(odds, 0.4), headers=bearer(b))
    assert done.json()["complete"] is True
    service = client.app.state.service  # type: ignore[attr-defined]
    run_id = client.get("/v1/runs/current/history").json()["run_id"]
    with service.db.read() as s:
        assert EvaluationRepository(s).count_evaluated(run_id, 0) == N
    service.storage.free()
    with service.db.read() as s:
        assert EvaluationRepository(s).count_evaluated(run_id, 0) == 0
        row = Repository(s).version_meta(run_id, 0)
        assert row is not None and row.metrics == pytest.approx(report_sums(0.3))
    again = client.post("/v1/evaluations", json=_report(odds[:7], 0.9), headers=bearer(b))
    assert again.status_code == 202
    assert again.json() == {"model_version": 0, "accepted": 0, "ignored": 7, "complete": True}
    with service.db.read() as s:
        assert EvaluationRepository(s).count_evaluated(run_id, 0) == 0
        meta = Repository(s).version_meta(run_id, 0)
        assert meta is not None and meta.metrics == pytest.approx(report_sums(0.3))
