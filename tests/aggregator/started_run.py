"""An in-process aggregator with 20 registered clients under two credentials and a started run:
what the endpoint, refusal, evaluation and operations tests of the aggregator API share."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import numpy as np
from fastapi.testclient import TestClient

from fedrecgel.model import ModelConfig
from fedrecgel.uploads import Update
from tests.support.aggregator import (
    bearer,
    current_cohort,
    post_run,
    post_updates,
    random_update,
    register,
)

MODEL = ModelConfig(n_items=50, kind="ncf", factor=4, layers=2)
RUN = {"n_items": 50, "factor": 4, "layers": 2, "rounds": 3, "fraction": 0.25, "seed": 7}
#: the request body limit of the API tests' aggregator
MAX_BODY_BYTES = 200_000


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
        response: httpx.Response = post_updates(self.client, tok, round_id, updates, path_round)
        return response

    def latest(self) -> tuple[int, bytes]:
        r = self.client.get("/v1/models/latest", headers=bearer(self.token))
        assert r.status_code == 200
        return int(r.headers["X-Model-Version"]), r.content

    def received(self, round_id: int = 1) -> int:
        return int(self.client.get(f"/v1/rounds/{round_id}").json()["updates_received"])


def start_run(client: TestClient) -> Ctx:
    """Register clients 0..9 and 10..19 under two credentials and start :data:`RUN`."""
    a = register(client, list(range(10)))
    b = register(client, list(range(10, 20)))
    post_run(client, RUN)
    cohort = current_cohort(client)
    assert len(cohort) == 5
    return Ctx(client, a, b, cohort)


def make_updates(ids: list[int], seed: int = 0) -> list[Update]:
    """Valid random updates of :data:`MODEL` for ``ids``."""
    rng = np.random.default_rng(seed)
    return [random_update(MODEL, c, rng) for c in ids]
