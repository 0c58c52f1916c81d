"""End-to-end scenarios over the real app (tests run them on SQLite and PostgreSQL).

:func:`federated_rounds` plays every client of a synthetic split against an in-process
aggregator: it reads the round, downloads the model, computes the cohort's uploads exactly as
:class:`fedrecgel.simulate.Simulator` does and uploads them in two bodies in shuffled order.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch
from fastapi.testclient import TestClient

from fedrecgel.data import Split
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.synthetic import synthetic_split
from fedrecgel.wire import decode_model, encode_updates
from services.aggregator.app import create_app
from services.aggregator.settings import Settings
from tests.support.aggregator import (
    FederatedDriver,
    bearer,
    operator_headers,
    register,
    run_config_for,
    upload_headers,
)

TRAIN = TrainConfig(
    rounds=3,
    fraction=0.2,
    factor=8,
    layers=2,
    seed=3,
    chunk_size=16,
    eval_every=0,
    per_client_uploads=True,
)


@lru_cache(maxsize=1)
def small_split() -> Split:
    """The determinism checks' data: 60 users x 80 items."""
    return synthetic_split(
        n_users=60, n_items=80, interactions_per_user=12.0, seed=11, n_test_negatives=20
    )


def simulator_params(split: Split, train: TrainConfig = TRAIN) -> list[dict[str, torch.Tensor]]:
    """Shared params after each round of the in-process simulator (cached for the default run)."""
    if split is small_split() and train == TRAIN:
        return _default_simulator_params()
    return _simulate(split, train)


@lru_cache(maxsize=1)
def _default_simulator_params() -> list[dict[str, torch.Tensor]]:
    return _simulate(small_split(), TRAIN)


def _simulate(split: Split, train: TrainConfig) -> list[dict[str, torch.Tensor]]:
    sim = Simulator(split, train)
    out = []
    for _ in range(train.rounds):
        sim.step()
        out.append({k: v.clone() for k, v in sim.shared.items()})
    return out


def register_all(client: TestClient, n_users: int) -> str:
    """Register every user under one credential (a single worker, shard 0 of 1)."""
    return register(client, list(range(n_users)))


def start_run(client: TestClient, split: Split, train: TrainConfig = TRAIN) -> None:
    """Start the run that mirrors ``train`` on ``split``."""
    cfg = run_config_for(train, split.n_items)
    r = client.post("/v1/runs", json=cfg.model_dump(mode="json"), headers=operator_headers())
    assert r.status_code == 201, r.text


def play_round(
    client: TestClient,
    token: str,
    driver: FederatedDriver,
    rng: np.random.Generator,
    stop_after_first_body: bool = False,
) -> int:
    """Train and upload the current round's cohort; returns the round id."""
    cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
    assert cur["state"] == "open", cur
    model = client.get("/v1/models/latest", headers=bearer(token))
    _, shared, version = decode_model(model.content)
    assert version == cur["model_version"]
    round_id = int(cur["round_id"])
    uploads = driver.uploads(shared, round_id, np.asarray(cur["cohort"]))
    order = rng.permutation(len(uploads))
    half = len(order) // 2
    for part in (order[:half], order[half:]):
        body = encode_updates(round_id, [uploads[i] for i in part])
        r = client.post(
            f"/v1/rounds/{round_id}/updates", content=body, headers=upload_headers(token)
        )
        assert r.status_code == 200, r.text
        if stop_after_first_body:
            driver.pending = [uploads[i] for i in order[half:]]  # type: ignore[attr-defined]
            return round_id
    return round_id


def latest_params(client: TestClient, token: str) -> tuple[int, dict[str, torch.Tensor]]:
    """The newest version and its shared params."""
    r = client.get("/v1/models/latest", headers=bearer(token))
    _, shared, version = decode_model(r.content)
    return version, shared


def assert_params_close(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float = 1e-6
) -> None:
    """Same names, every tensor equal within ``atol``."""
    assert set(got) == set(want)
    for k in want:
        assert torch.allclose(got[k], want[k], atol=atol, rtol=0), (
            k,
            float((got[k] - want[k]).abs().max()),
        )


def federated_matches_simulator(settings: Settings) -> None:
    """Three rounds over HTTP equal three simulator rounds (atol 1e-6), version by version."""
    split = small_split()
    want = simulator_params(split)
    driver = FederatedDriver(split, run_config_for(TRAIN, split.n_items))
    rng = np.random.default_rng(0)
    with TestClient(create_app(settings)) as client:
        token = register_all(client, split.n_users)
        start_run(client, split)
        for r in range(1, TRAIN.rounds + 1):
            assert play_round(client, token, driver, rng) == r
            version, params = latest_params(client, token)
            assert version == r
            assert_params_close(params, want[r - 1])
        assert client.get("/v1/rounds/current", headers=bearer(token)).json()["state"] == "finished"
        for v in range(1, TRAIN.rounds + 1):  # every version stays as it was made
            r = client.get(f"/v1/models/{v}", headers=bearer(token))
            _, params, version = decode_model(r.content)
            assert version == v and r.headers["X-Model-Version"] == str(v)
            assert_params_close(params, want[v - 1])


def restart_mid_round_matches_simulator(make_settings: Callable[[], Settings]) -> None:
    """Dispose the app after the first body of round 2; a new app on the same database
    resumes the round with its acknowledged updates, and the run ends where the simulator does."""
    split = small_split()
    want = simulator_params(split)
    driver = FederatedDriver(split, run_config_for(TRAIN, split.n_items))
    rng = np.random.default_rng(1)
    with TestClient(create_app(make_settings())) as client:
        token = register_all(client, split.n_users)
        start_run(client, split)
        play_round(client, token, driver, rng)
        play_round(client, token, driver, rng, stop_after_first_body=True)
        received = client.get("/v1/rounds/2").json()["updates_received"]
        assert 0 < received < client.get("/v1/rounds/2").json()["cohort_size"]
    rest = driver.pending  # type: ignore[attr-defined]
    with TestClient(create_app(make_settings())) as client:
        info = client.get("/v1/rounds/2").json()
        assert info["state"] == "open" and info["updates_received"] == received
        r = client.post(
            "/v1/rounds/2/updates", content=encode_updates(2, rest), headers=upload_headers(token)
        )
        assert r.status_code == 200, r.text
        version, params = latest_params(client, token)
        assert version == 2
        assert_params_close(params, want[1])
        play_round(client, token, driver, rng)
        version, params = latest_params(client, token)
        assert version == 3
        assert_params_close(params, want[2])
