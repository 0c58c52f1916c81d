"""A race of several aggregator instances over one round (tests run it with and without Redis)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from fedrecgel.model import ModelConfig
from services.aggregator.models import ModelVersion
from services.aggregator.service import AggregatorService
from tests.support.aggregator import (
    FakeClock,
    bearer,
    current_cohort,
    post_run,
    post_updates,
    random_update,
    register,
    service_of,
)

RACE_MODEL = ModelConfig(n_items=40, kind="ncf", factor=4, layers=2)
RACE_RUN = {
    "n_items": 40,
    "factor": 4,
    "layers": 2,
    "rounds": 3,
    "fraction": 0.3,
    "seed": 2,
    "deadline_s": 30.0,
    "quorum": 0.5,
}


def start_race_run(client: TestClient) -> tuple[str, dict[str, Any]]:
    """Register clients 0..19 and start :data:`RACE_RUN`; their token and the run's body."""
    token = register(client, list(range(20)))
    return token, post_run(client, RACE_RUN)


def upload_whole_cohort(
    client: TestClient, token: str, round_id: int, rng: np.random.Generator
) -> None:
    """Upload random updates of every member of the open round's cohort in one body."""
    cohort = current_cohort(client, bearer(token))
    r = post_updates(client, token, round_id, [random_update(RACE_MODEL, c, rng) for c in cohort])
    assert r.status_code == 200, r.text


def race_ticks(services: list[AggregatorService]) -> list[str | None]:
    """Call ``tick`` on every instance at the same moment; their outcomes."""
    barrier = threading.Barrier(len(services))
    outcomes: list[str | None] = [None] * len(services)

    def go(i: int) -> None:
        barrier.wait()
        outcomes[i] = services[i].tick()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(services))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


def count_versions(service: AggregatorService, version: int) -> int:
    """Rows of one model version (over all runs)."""
    with service.db.transaction() as s:
        stmt = select(func.count()).select_from(ModelVersion).where(ModelVersion.version == version)
        return int(s.scalar(stmt) or 0)


def two_instances_close_once(
    a: TestClient, b: TestClient, clock: FakeClock, on_closed: Callable[[], None] | None = None
) -> list[str | None]:
    """Both instances hold some of round 1's updates and race to close it at the deadline."""
    token, _ = start_race_run(a)
    cohort = current_cohort(b, bearer(token))
    rng = np.random.default_rng(0)
    ups = [random_update(RACE_MODEL, c, rng) for c in cohort[:4]]
    for client, part in ((a, ups[:2]), (b, ups[2:])):
        r = post_updates(client, token, 1, part)
        assert r.status_code == 200, r.text
    clock.advance(31)
    outcomes = race_ticks([service_of(a), service_of(b)])
    assert outcomes.count("closed") == 1, outcomes
    assert count_versions(service_of(a), 1) == 1
    ra = a.get("/v1/models/latest", headers=bearer(token))
    rb = b.get("/v1/models/latest", headers=bearer(token))
    assert ra.headers["X-Model-Version"] == rb.headers["X-Model-Version"] == "1"
    assert ra.content == rb.content
    assert a.get("/v1/runs/current/history").json()["rounds"][0]["n_updates"] == 4
    for client in (a, b):
        cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
        assert cur["round_id"] == 2 and cur["attempt"] == 0
    return outcomes
