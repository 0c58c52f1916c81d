"""Registration needs a shard enrolment token (issue 8, findings 1 and 6): only ids of the
token's shard, within the declared population, at most ``max_register_per_request`` at once;
and never ids another credential holds (issue 30: the shard's own token took a live worker's
users): only the holder's token registers them again, or anyone of the shard once the
operator released them (a worker that lost its store)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session

from harness.aggregator import AggregatorFactory
from services.aggregator.repository import Repository
from services.aggregator.schemas import RunConfig
from services.enrolment import enrolment_token
from tests.support.aggregator import (
    ENROLMENT_SECRET,
    OPERATOR_TOKEN,
    bearer,
    enrol_headers,
    operator_headers,
    post_updates,
    random_update,
    register,
)

#: the most variables one SQLite statement may bind, in this build of SQLite
SQLITE_VARIABLES = sqlite3.connect(":memory:").getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
RUN: dict[str, Any] = {
    "n_items": 30,
    "factor": 4,
    "layers": 2,
    "rounds": 2,
    "fraction": 1.0,
    "seed": 1,
}
RELEASE = "/v1/clients/release"
#: a client token a registrant chose (43 URL-safe characters, as secrets.token_urlsafe(32))
CHOSEN = "worker-chosen-token-0123456789abcdefghijklm"


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
    token = register(client, list(range(n)), token=CHOSEN)
    assert client.get("/v1/clients/count").json() == {"registered": n}
    assert client.get("/v1/rounds/current", headers=bearer(token)).status_code == 200
    # again under the same token (reads every one), refused under another (names them all),
    # released and registered again (rewrites every one)
    assert register(client, list(range(n)), token=CHOSEN) == CHOSEN
    r = client.post("/v1/clients", json={"client_ids": list(range(n))}, headers=enrol_headers())
    assert r.status_code == 409 and f"{n} client ids are held" in r.json()["detail"]
    r = client.post(RELEASE, json={"client_ids": list(range(n))}, headers=operator_headers())
    assert r.status_code == 200 and r.json()["released"] == list(range(n))
    again = register(client, list(range(n)))
    assert client.get("/v1/rounds/current", headers=bearer(again)).status_code == 200


def test_repository_in_lists_are_chunked(aggregator: AggregatorFactory) -> None:
    client = aggregator(population=20)
    register(client, [0, 1, 2])
    service = client.app.state.service  # type: ignore[attr-defined]
    with Session(service.db.engine) as s:
        found = Repository(s).existing_clients(range(SQLITE_VARIABLES + 1))
    assert sorted(found) == [0, 1, 2]


def test_the_shard_token_cannot_take_the_users_of_a_live_worker(
    aggregator: AggregatorFactory,
) -> None:
    """Issue 30: the shard-0 enrolment token registered the ids worker 0 held under a new
    token (201), and worker 0's uploads for them were refused from then on. Now: 409
    clients_held naming them, nothing stored, and worker 0 still uploads for its users."""
    client = aggregator(population=400)
    evens = list(range(0, 400, 2))
    worker = register(client, evens, shard=0, shards=2)
    register(client, list(range(1, 400, 2)), shard=1, shards=2)
    shard0 = enrol_headers(0, 2)
    r = client.post("/v1/clients", json={"client_ids": evens}, headers=shard0)
    assert r.status_code == 409, r.text
    assert set(r.json()) == {"error", "detail"} and r.json()["error"] == "clients_held"
    detail = r.json()["detail"]
    assert detail.startswith("200 client ids are held by another credential: 0, 2, 4, ")
    assert "196, 198 and 100 more. Only the token holding them" in detail
    assert client.get("/v1/clients/count").json() == {"registered": 400}
    # worker 0 still holds every one of its users: in the cohort it sees, and uploads
    start = client.post("/v1/runs", json={**RUN, "rounds": 1}, headers=operator_headers())
    assert start.status_code == 201, start.text
    cur = client.get("/v1/rounds/current", headers=bearer(worker)).json()
    assert cur["cohort"] == evens
    cfg = RunConfig(**RUN).model()
    rng = np.random.default_rng(0)
    updates = [random_update(cfg, c, rng, n_rows=3) for c in evens[:5]]
    up = post_updates(client, worker, cur["round_id"], updates)
    assert up.status_code == 200, up.text
    assert {x["status"] for x in up.json()["results"]} == {"accepted"}


def test_new_ids_beside_held_ones_are_refused_with_them(aggregator: AggregatorFactory) -> None:
    client = aggregator(population=20)
    first = register(client, [0, 2], shard=0, shards=2)
    r = client.post("/v1/clients", json={"client_ids": [2, 4, 6]}, headers=enrol_headers(0, 2))
    assert r.status_code == 409 and r.json()["error"] == "clients_held"
    assert r.json()["detail"].startswith("1 client ids are held by another credential: 2.")
    assert client.get("/v1/clients/count").json() == {"registered": 2}  # 4, 6 not stored
    assert register(client, [4, 6], shard=0, shards=2) != first  # free ids: a new credential


def test_the_holder_registers_again_under_its_own_token(aggregator: AggregatorFactory) -> None:
    """A worker keeps the token it chose before asking: asking again after a lost answer or
    a crash is the same registration, and the token keeps working."""
    client = aggregator(population=20)
    assert register(client, [0, 2, 4], shard=0, shards=2, token=CHOSEN) == CHOSEN
    assert register(client, [0, 2, 4], shard=0, shards=2, token=CHOSEN) == CHOSEN
    assert register(client, [0, 2, 4, 6], shard=0, shards=2, token=CHOSEN) == CHOSEN
    assert client.get("/v1/clients/count").json() == {"registered": 4}
    cur = client.get("/v1/rounds/current", headers=bearer(CHOSEN))
    assert cur.status_code == 200
    client.post("/v1/runs", json=RUN, headers=operator_headers())
    cohort = client.get("/v1/rounds/current", headers=bearer(CHOSEN)).json()["cohort"]
    assert cohort == [0, 2, 4, 6]
    # another chosen token is another credential: it takes none of them
    r = client.post(
        "/v1/clients",
        json={"client_ids": [0], "token": "B" * 43},
        headers=enrol_headers(0, 2),
    )
    assert r.status_code == 409 and r.json()["error"] == "clients_held"


@pytest.mark.parametrize(
    ("token", "status", "error"),
    [
        ("short", 422, "validation_error"),
        ("x" * 31, 422, "validation_error"),
        ("a" * 40 + "+/=", 422, "validation_error"),
        ("x" * 129, 422, "validation_error"),
        (12345678901234567890123456789012345, 422, "validation_error"),
        ("R" * 40, 409, "token_in_use"),  # the reader's
    ],
)
def test_a_chosen_token_must_be_a_fresh_secret(
    aggregator: AggregatorFactory, token: object, status: int, error: str
) -> None:
    client = aggregator(population=20, reader_token="R" * 40)
    r = client.post(
        "/v1/clients", json={"client_ids": [0], "token": token}, headers=enrol_headers()
    )
    assert r.status_code == status and r.json()["error"] == error, r.text
    assert client.get("/v1/clients/count").json() == {"registered": 0}


def test_a_chosen_token_holds_one_shards_clients(aggregator: AggregatorFactory) -> None:
    client = aggregator(population=20)
    register(client, [1, 3], shard=1, shards=2, token=CHOSEN)
    r = client.post(
        "/v1/clients", json={"client_ids": [0], "token": CHOSEN}, headers=enrol_headers(0, 2)
    )
    assert r.status_code == 409 and r.json()["error"] == "token_in_use", r.text
    assert client.get("/v1/clients/count").json() == {"registered": 2}


def test_the_operator_releases_the_users_of_a_worker_that_lost_its_store(
    aggregator: AggregatorFactory, database_url: str
) -> None:
    client = aggregator(population=20, database_url=database_url)
    lost = register(client, [0, 2, 4], shard=0, shards=2)
    for headers in (enrol_headers(0, 2), bearer(lost), {}):
        r = client.post(RELEASE, json={"client_ids": [0, 2, 4]}, headers=headers)
        assert r.status_code == 401, r.text
    r = client.post(RELEASE, json={"client_ids": [0, 6, 2**70, 8]}, headers=operator_headers())
    assert r.status_code == 404 and r.json()["error"] == "not_registered"
    assert r.json()["detail"] == f"3 client ids are not registered: 6, 8, {2**70}"
    assert client.get("/v1/rounds/current", headers=bearer(lost)).status_code == 200
    body: dict[str, Any]
    for body in (
        {"client_ids": []},
        {"client_ids": [0, 0]},
        {"client_ids": ["0"]},
        {"client_ids": [-1]},
        {},
    ):
        r = client.post(RELEASE, json=body, headers=operator_headers())
        assert r.status_code == 422 and set(r.json()) == {"error", "detail"}, r.text
    r = client.post(RELEASE, json={"client_ids": [4, 0, 2]}, headers=operator_headers())
    assert r.status_code == 200 and r.json() == {"released": [0, 2, 4]}
    assert client.get("/v1/rounds/current", headers=bearer(lost)).status_code == 401
    assert client.get("/v1/clients/count").json() == {"registered": 3}  # still registered
    # another shard that does not own them still cannot take them; their own shard can
    r = client.post("/v1/clients", json={"client_ids": [0]}, headers=enrol_headers(1, 2))
    assert r.status_code == 403
    fresh = register(client, [0, 2, 4], shard=0, shards=2)
    assert client.get("/v1/rounds/current", headers=bearer(fresh)).status_code == 200
    r = client.post("/v1/clients", json={"client_ids": [0]}, headers=enrol_headers(0, 2))
    assert r.status_code == 409 and r.json()["error"] == "clients_held"


def test_another_shard_cannot_take_registered_ids(aggregator: AggregatorFactory) -> None:
    """Regression: pre-registering id 0 made worker 0 exit with a 409; now only a holder of
    worker 0's shard token can register id 0, and another shard credential cannot take it."""
    client = aggregator(population=20)
    token = register(client, [0, 2], shard=0, shards=2)
    r = client.post("/v1/clients", json={"client_ids": [0]}, headers=enrol_headers(0, 4))
    assert r.status_code == 409 and r.json()["error"] == "clients_held"
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
