"""Registration needs a shard enrolment token (issue 8, findings 1 and 6): only ids of the
token's shard, within the declared population, at most ``max_register_per_request`` at once;
the same shard may register again (a worker that lost its token)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from services.aggregator.repository import Repository
from services.enrolment import enrolment_token
from tests.aggregator.conftest import AggregatorFactory
from tests.support.aggregator import (
    ENROLMENT_SECRET,
    OPERATOR_TOKEN,
    bearer,
    enrol_headers,
    operator_headers,
    register,
)

#: the most variables one SQLite statement may bind, in this build of SQLite
SQLITE_VARIABLES = sqlite3.connect(":memory:").getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
RUN = {"n_items": 30, "factor": 4, "layers": 2, "rounds": 2, "fraction": 1.0, "seed": 1}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("nope"),
        bearer(OPERATOR_TOKEN),
        bearer(enrolment_token("another-secret-0123456789", 0, 1)),
        {"Authorization": "Basic abc"},
    ],
)
def test_registration_without_a_valid_enrolment_token_is_401(
    aggregator: AggregatorFactory, headers: dict[str, str]
) -> None:
    client = aggregator(population=20)
    r = client.post("/v1/clients", json={"client_ids": [0]}, headers=headers)
    assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
    assert client.get("/v1/clients/count").json() == {"registered": 0}


def test_ids_outside_the_shard_or_population_are_403_naming_the_id(
    aggregator: AggregatorFactory,
) -> None:
    client = aggregator(population=20)
    shard1 = enrol_headers(1, 4)  # ids 1, 5, 9, 13, 17
    for ids, bad in (([1, 5, 6], 6), ([1, 21], 21), ([2**63], 2**63), ([0], 0)):
        r = client.post("/v1/clients", json={"client_ids": ids}, headers=shard1)
        assert r.status_code == 403, r.text
        assert r.json()["error"] == "not_your_ids" and str(bad) in r.json()["detail"]
    ok = client.post("/v1/clients", json={"client_ids": [13, 1, 17]}, headers=shard1)
    assert ok.status_code == 201 and ok.json()["client_ids"] == [1, 13, 17]
    assert client.get("/v1/clients/count").json() == {"registered": 3}


def test_without_a_population_registration_is_409(aggregator: AggregatorFactory) -> None:
    client = aggregator(population=None)
    r = client.post("/v1/clients", json={"client_ids": [0]}, headers=enrol_headers())
    assert r.status_code == 409 and r.json()["error"] == "no_population"


def test_without_an_enrolment_secret_registration_is_closed(
    aggregator: AggregatorFactory,
) -> None:
    client = aggregator(population=20, enrolment_secret=None)
    r = client.post("/v1/clients", json={"client_ids": [0]}, headers=enrol_headers())
    assert r.status_code == 401


def test_forty_thousand_fake_ids_are_refused_by_the_per_request_limit(
    aggregator: AggregatorFactory,
) -> None:
    """Regression: 40,000 fake ids in one request became a cohort of 7,122."""
    client = aggregator(population=1_000_000)
    r = client.post(
        "/v1/clients", json={"client_ids": list(range(40_000))}, headers=enrol_headers()
    )
    assert r.status_code == 422 and r.json()["error"] == "too_many_clients", r.text
    assert client.get("/v1/clients/count").json() == {"registered": 0}
    # a million ids is refused before it is even parsed
    r = client.post(
        "/v1/clients", json={"client_ids": list(range(1_000_000))}, headers=enrol_headers()
    )
    assert r.status_code in (413, 422) and set(r.json()) == {"error", "detail"}


def test_registering_more_ids_than_sqlite_binds_at_once_works(
    aggregator: AggregatorFactory,
) -> None:
    """Regression: "too many SQL variables" (500) with long id lists on SQLite."""
    n = SQLITE_VARIABLES + 1
    client = aggregator(population=n, max_register_per_request=n, max_json_bytes=16 << 20)
    token = register(client, list(range(n)))
    assert client.get("/v1/clients/count").json() == {"registered": n}
    assert client.get("/v1/rounds/current", headers=bearer(token)).status_code == 200
    # and again from the same shard (re-registration reads and rewrites every one)
    register(client, list(range(n)))


def test_repository_in_lists_are_chunked(aggregator: AggregatorFactory) -> None:
    client = aggregator(population=20)
    register(client, [0, 1, 2])
    service = client.app.state.service  # type: ignore[attr-defined]
    with Session(service.db.engine) as s:
        found = Repository(s).existing_clients(range(SQLITE_VARIABLES + 1))
    assert sorted(found) == [0, 1, 2]


def test_the_same_shard_registers_again_and_the_old_token_stops_working(
    aggregator: AggregatorFactory,
) -> None:
    """A worker that crashed between registering and saving its token registers again."""
    client = aggregator(population=20)
    first = register(client, [0, 2, 4], shard=0, shards=2)
    assert client.get("/v1/rounds/current", headers=bearer(first)).status_code == 200
    again = client.post(
        "/v1/clients", json={"client_ids": [0, 2, 4, 6]}, headers=enrol_headers(0, 2)
    )
    assert again.status_code == 201 and again.json()["client_ids"] == [0, 2, 4, 6]
    second = again.json()["token"]
    assert second != first
    assert client.get("/v1/rounds/current", headers=bearer(first)).status_code == 401
    assert client.get("/v1/rounds/current", headers=bearer(second)).status_code == 200
    assert client.get("/v1/clients/count").json() == {"registered": 4}


def test_another_shard_cannot_take_registered_ids(aggregator: AggregatorFactory) -> None:
    """Regression: pre-registering id 0 made worker 0 exit with a 409; now only a holder of
    worker 0's shard token can register id 0, and another shard credential cannot take it."""
    client = aggregator(population=20)
    token = register(client, [0, 2], shard=0, shards=2)
    r = client.post("/v1/clients", json={"client_ids": [0]}, headers=enrol_headers(0, 4))
    assert r.status_code == 409 and r.json()["error"] == "already_registered"
    assert client.get("/v1/rounds/current", headers=bearer(token)).status_code == 200


def test_a_run_draws_its_cohort_from_enrolled_clients_only(
    aggregator: AggregatorFactory,
) -> None:
    client = aggregator(population=8)
    register(client, [0, 2, 4, 6], shard=0, shards=2)
    register(client, [1, 3, 5, 7], shard=1, shards=2)
    r = client.post("/v1/runs", json=RUN, headers=operator_headers())
    assert r.status_code == 201 and r.json()["cohort_size"] == 8


def test_enrolment_secret_read_from_a_file(aggregator: AggregatorFactory, tmp_path: Path) -> None:
    path = tmp_path / "enrolment"
    path.write_text(ENROLMENT_SECRET + "\n")
    client = aggregator(population=4, enrolment_secret=None, enrolment_secret_file=path)
    assert register(client, [0, 1])
