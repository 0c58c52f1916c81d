"""Helpers for tests and benchmarks of the aggregator: settings, fake clocks, valid random
updates, in-process aggregators on SQLite files (:class:`AggregatorFactory`, the aggregator
tests' fixture), and an in-process federated driver that computes uploads exactly like
:class:`fedrecgel.simulate.Simulator` does (same seed, cohort, samples, private state)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from fastapi.testclient import TestClient

from fedrecgel.client_round import ClientRound
from fedrecgel.data import Split
from fedrecgel.metrics import METRIC_NAMES
from fedrecgel.model import ModelConfig
from fedrecgel.private_store import PrivateStore
from fedrecgel.simulate import TrainConfig
from fedrecgel.uploads import Update
from fedrecgel.wire import encode_updates
from services.aggregator.app import create_app
from services.aggregator.models import utcnow
from services.aggregator.schemas import RunConfig
from services.aggregator.service import AggregatorService
from services.aggregator.settings import Settings
from services.enrolment import enrolment_token

OPERATOR_TOKEN = "test-operator-token"
ENROLMENT_SECRET = "test-enrolment-secret-0123456789abcdef"
#: the population of a test aggregator unless a test sets its own
TEST_POPULATION = 100_000


def sqlite_url(directory: Path, name: str = "aggregator.db") -> str:
    """A SQLite URL for a file in ``directory``."""
    return f"sqlite:///{directory / name}"


def make_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for an in-process app: test environment, the test enrolment secret and
    population, no background polling by default."""
    values: dict[str, Any] = {
        "environment": "test",
        "database_url": database_url,
        "operator_token": OPERATOR_TOKEN,
        "enrolment_secret": ENROLMENT_SECRET,
        "population": TEST_POPULATION,
        "deadline_poll_s": 3600.0,
        "max_body_bytes": 4 * 1024 * 1024,
    }
    values.update(overrides)
    # an override of None leaves the setting at its default (e.g. no population)
    return Settings(**{k: v for k, v in values.items() if v is not None})


def service_of(client: Any) -> AggregatorService:
    """The service behind an in-process app (a started TestClient)."""
    service: AggregatorService = client.app.state.service
    return service


def report_sums(total: float) -> dict[str, float]:
    """An evaluation report's sums: every metric a report carries, each summing to ``total``."""
    return {name: total for name in METRIC_NAMES}


def operator_headers() -> dict[str, str]:
    """Authorization header of the test operator."""
    return {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def bearer(token: str) -> dict[str, str]:
    """Authorization header for a client token."""
    return {"Authorization": f"Bearer {token}"}


def upload_headers(token: str) -> dict[str, str]:
    """Headers of an upload: the client token and the body's media type."""
    return {**bearer(token), "Content-Type": "application/octet-stream"}


def enrol_headers(
    shard: int = 0, shards: int = 1, secret: str = ENROLMENT_SECRET
) -> dict[str, str]:
    """Authorization header with the enrolment token of one shard."""
    return bearer(enrolment_token(secret, shard, shards))


class _Poster(Protocol):
    def post(self, url: str, *, json: Any = None, headers: Any = None) -> Any: ...


def register(
    client: _Poster,
    client_ids: list[int],
    shard: int = 0,
    shards: int = 1,
    token: str | None = None,
) -> str:
    """Register ``client_ids`` (of one shard) with its enrolment token, under ``token`` when
    given (a client token the registrant chose); the client token. ``client`` is a
    TestClient or an httpx.Client with the aggregator's base URL."""
    body: dict[str, Any] = {"client_ids": client_ids}
    if token is not None:
        body["token"] = token
    r = client.post("/v1/clients", json=body, headers=enrol_headers(shard, shards))
    assert r.status_code == 201, r.text
    issued: str = r.json()["token"]
    return issued


def post_run(client: _Poster, body: Mapping[str, Any]) -> dict[str, Any]:
    """Start a run of ``body`` as the operator (it must be accepted); the answer."""
    r = client.post("/v1/runs", json=dict(body), headers=operator_headers())
    assert r.status_code == 201, r.text
    answer: dict[str, Any] = r.json()
    return answer


def current_cohort(client: Any, headers: Mapping[str, str] | None = None) -> list[int]:
    """The cohort of the current round as ``headers`` see it (the operator's: all of it)."""
    r = client.get("/v1/rounds/current", headers=dict(headers or operator_headers()))
    return [int(c) for c in r.json()["cohort"]]


def post_updates(
    client: Any,
    token: str,
    round_id: int,
    updates: Sequence[Update],
    path_round: int | None = None,
) -> Any:
    """Upload ``updates`` of round ``round_id`` in one body under ``token`` (to the URL of
    ``path_round`` if given: a body and a path that disagree); the response."""
    return client.post(
        f"/v1/rounds/{path_round or round_id}/updates",
        content=encode_updates(round_id, list(updates)),
        headers=upload_headers(token),
    )


class FakeClock:
    """A settable UTC clock (thread-safe) to drive deadlines without sleeping."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or utcnow()
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        """The current fake time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        with self._lock:
            self._now += timedelta(seconds=seconds)


def random_update(
    cfg: ModelConfig, client_id: int, rng: np.random.Generator, n_rows: int = 20
) -> Update:
    """A valid update with ``n_rows`` random item rows per table and random dense gradients."""
    rows = {}
    for table, shape in cfg.shared_shapes().items():
        if table in cfg.item_tables():
            idx = np.sort(rng.choice(cfg.n_items, size=min(n_rows, cfg.n_items), replace=False))
            vals = rng.normal(0.0, 0.01, size=(len(idx), shape[1])).astype(np.float32)
            rows[table] = (torch.from_numpy(idx.astype(np.int64)), torch.from_numpy(vals))
    dense = {
        name: torch.from_numpy(
            rng.normal(0.0, 0.01, size=cfg.shared_shapes()[name]).astype(np.float32)
        )
        for name in cfg.dense_names()
    }
    return Update(client_id, int(5 * n_rows), rows, dense, float(rng.random()))


def run_config_for(train: TrainConfig, n_items: int, **overrides: Any) -> RunConfig:
    """The RunConfig that makes the aggregator compute what ``Simulator(split, train)`` does."""
    return train.run_config(n_items, **{"dataset": "synthetic", **overrides})


class FederatedDriver:
    """Computes cohort members' uploads as the simulator does, keeping their private state."""

    def __init__(self, split: Split, config: RunConfig) -> None:
        self.split = split
        self.config = config
        self.model_cfg = config.model()
        self.clients = ClientRound(self.model_cfg, config.sam(), config.seed)
        self.store = PrivateStore(self.model_cfg, config.seed, split.n_users)

    def uploads(
        self, shared: dict[str, torch.Tensor], round_id: int, cohort: np.ndarray
    ) -> list[Update]:
        """The cohort's SAM-gradient uploads for ``round_id`` (commits their private state)."""
        return self.clients.step_in(
            self.store, shared, round_id, cohort, self.split.user_train
        ).uploads


class AggregatorFactory:
    """``aggregator(**settings)``: a started in-process aggregator. Each call gets a fresh
    SQLite file unless it names ``database_url`` (two calls on one URL are two instances on
    one database); ``clock`` replaces the aggregator's UTC clock."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._clients: list[TestClient] = []
        self._started = 0

    def url(self, name: str = "aggregator.db") -> str:
        """The URL of a SQLite file of this test, for several calls on one database."""
        return sqlite_url(self.directory, name)

    def __call__(
        self,
        *,
        clock: Callable[[], datetime] | None = None,
        database_url: str | None = None,
        **overrides: Any,
    ) -> TestClient:
        url = database_url or self.url(f"a{self._started}.db")
        self._started += 1
        client = TestClient(create_app(make_settings(url, **overrides), clock=clock))
        client.__enter__()
        self._clients.append(client)
        return client

    def stop(self, client: TestClient) -> None:
        """Stop one aggregator now (its lifespan ends as at a process exit)."""
        self._clients.remove(client)
        client.__exit__(None, None, None)

    def stop_all(self) -> None:
        """Stop every aggregator still running, newest first."""
        while self._clients:
            self.stop(self._clients[-1])
