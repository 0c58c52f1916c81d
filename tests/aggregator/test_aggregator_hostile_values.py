"""A hostile but well-formed upload cannot freeze or hijack the model (issue 30, 1): an enrolled
client fills every row and dense tensor of two of its cohort members' uploads with huge values
and claims the largest loss and sample count. Values whose square overflows float32 are refused;
smaller ones are bounded by the robust screen (fedrecgel/robust.py) when the round closes, the
round names the bounded clients, the published loss stays honest-sized and the model keeps
learning. Without the screen the attackers' loss is published (the check can fail).

What the screen does not bound: the direction. Adam moves every coordinate by about its step
size in the sign of the round's mean, so two attackers who write every item row move rows no
honest client touched, with or without the screen; measured here, the bounded attack moves the
final model 2.2 times as far as the same clients uploading their honest gradient reversed."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import select

from fedrecgel.strategy import scaled
from fedrecgel.uploads import Update
from fedrecgel.wire import decode_model, decode_state, encode_updates
from harness.aggregator import AggregatorFactory
from services.aggregator.models import OPTIMIZER_STATE, Round
from services.aggregator.repository import Repository
from tests.aggregator.scenarios import TRAIN, small_split, start_run
from tests.support.aggregator import (
    FederatedDriver,
    bearer,
    operator_headers,
    register,
    run_config_for,
    service_of,
    upload_headers,
)

SHARDS = 2
ROUNDS = TRAIN.rounds


def _hostile(u: Update, value: float) -> Update:
    """``u`` with every value replaced by ``value``, the largest loss and sample count."""
    return Update(
        u.client_id,
        2**31 - 1,
        {k: (i, torch.full_like(v, value)) for k, (i, v) in u.rows.items()},
        {k: torch.full_like(g, value) for k, g in u.dense.items()},
        1e6,
    )


def _run(
    client: TestClient, attack: Callable[[Update], Update] | None
) -> tuple[list[dict[str, torch.Tensor]], list[int]]:
    """ROUNDS rounds over two shards; two of shard 1's members are hostile in round 1 when
    ``attack`` is given (it makes their uploads). Every version's shared params, version 0 first, and the clients
    that were hostile."""
    split = small_split()
    driver = FederatedDriver(split, run_config_for(TRAIN, split.n_items))
    shard_ids = [[c for c in range(split.n_users) if c % SHARDS == s] for s in range(SHARDS)]
    tokens = [register(client, ids, s, SHARDS) for s, ids in enumerate(shard_ids)]
    start_run(client, split)
    versions = []
    hostile: list[int] = []
    for round_id in range(1, ROUNDS + 1):
        cur = client.get("/v1/rounds/current", headers=operator_headers()).json()
        _, shared, _ = decode_model(
            client.get("/v1/models/latest", headers=bearer(tokens[0])).content
        )
        versions.append(shared)
        uploads = driver.uploads(shared, round_id, np.asarray(cur["cohort"]))
        for s in range(SHARDS):
            mine = [u for u in uploads if u.client_id % SHARDS == s]
            if s == 1 and round_id == 1 and attack is not None:
                # a minority of the cohort (a median the attackers hold bounds nothing)
                mine = [attack(u) for u in mine[:2]] + mine[2:]
                hostile = [u.client_id for u in mine[:2]]
            if not mine:
                continue
            r = client.post(
                f"/v1/rounds/{round_id}/updates",
                content=encode_updates(round_id, mine),
                headers=upload_headers(tokens[s]),
            )
            assert r.status_code == 200, r.text
        assert client.get(f"/v1/rounds/{round_id}").json()["state"] == "closed"
    _, shared, _ = decode_model(client.get("/v1/models/latest", headers=bearer(tokens[0])).content)
    versions.append(shared)
    return versions, sorted(hostile)


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    squares = sum(((a[k] - b[k]).double() ** 2).sum() for k in a)
    assert isinstance(squares, torch.Tensor)  # not the empty sum's 0
    return float(torch.sqrt(squares))


def test_values_whose_square_overflows_are_refused(aggregator: AggregatorFactory) -> None:
    split = small_split()
    client = aggregator(population=split.n_users)
    token = register(client, list(range(split.n_users)))
    start_run(client, split)
    cur = client.get("/v1/rounds/current", headers=operator_headers()).json()
    driver = FederatedDriver(split, run_config_for(TRAIN, split.n_items))
    _, shared, _ = decode_model(client.get("/v1/models/latest", headers=bearer(token)).content)
    honest = driver.uploads(shared, 1, np.asarray(cur["cohort"]))[0]
    r = client.post(
        "/v1/rounds/1/updates",
        content=encode_updates(1, [_hostile(honest, 3.0e38)]),
        headers=upload_headers(token),
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "update_values_too_large"
    assert client.get("/v1/rounds/1").json()["updates_received"] == 0


@pytest.mark.parametrize("factor", ["default", 0.0])
def test_a_hostile_upload_is_bounded_and_the_model_keeps_learning(
    aggregator: AggregatorFactory, factor: float | str
) -> None:
    population = small_split().n_users
    honest, _ = _run(aggregator(population=population), attack=None)
    settings: dict[str, Any] = {} if factor == "default" else {"upload_screen_factor": factor}
    client = aggregator(population=population, **settings)
    attacked, hostile = _run(client, attack=lambda u: _hostile(u, 1.0e17))
    # the damage of an honest-sized attack: the same clients upload their gradient reversed
    flipped, _ = _run(aggregator(population=population), attack=lambda u: scaled(u, -1.0))
    page = client.get("/v1/runs/current/history").json()
    history = page["rounds"]
    learned = _distance(honest[-1], honest[0])  # what the honest run moved in ROUNDS rounds
    off = _distance(attacked[-1], honest[-1])
    off_flipped = _distance(flipped[-1], honest[-1])
    if factor == 0.0:  # off: the published loss is the attacker's
        assert history[0]["n_bounded"] == 0
        assert history[0]["loss"] > 1000 * history[1]["loss"]
        return
    assert history[0]["n_bounded"] == len(hostile) == 2
    assert all(h["n_bounded"] == 0 for h in history[1:])
    with service_of(client).db.read() as s:  # the operator's record names them
        named = s.scalars(
            select(Round.bounded).where(Round.round_id == 1, Round.state == "closed")
        ).one()
    assert named == hostile
    assert history[0]["loss"] < 100 * history[1]["loss"]  # honest-sized, not 1e6
    with service_of(client).db.read() as s:
        found = Repository(s).version_with_blobs(page["run_id"], ROUNDS)
    assert found is not None
    state, _ = decode_state(found[1][OPTIMIZER_STATE])
    assert all(bool(torch.isfinite(t).all()) for t in state.values())
    # every version moved (the model is not frozen) and stays finite
    for before, after in itertools.pairwise(attacked):
        assert _distance(after, before) > 0.2 * learned / ROUNDS
        assert all(bool(torch.isfinite(t).all()) for t in after.values())
    # Adam steps by the sign of the mean wherever honest clients barely touch a coordinate,
    # whatever the magnitude: the bounded attack does about what two reversed honest
    # gradients do (measured 2.2x), not more; a direction-robust mean is not built yet
    assert off < 3 * off_flipped
    assert off < 2 * learned
