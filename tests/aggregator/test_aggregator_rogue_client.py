"""A hostile client cannot steer a run (issue 8): a holder of a valid client token, registered
through a shard enrolment token, sends out-of-range evaluation reports, junk uploads and calls
it has no right to, every round; the run ends with the SAME model bytes and metrics as the
same run without it."""

from __future__ import annotations

import hashlib

import numpy as np
from fastapi.testclient import TestClient

from fedrecgel.wire import decode_model, encode_updates
from harness.aggregator import AggregatorFactory
from tests.aggregator.junk import junk_reports, junk_uploads
from tests.aggregator.scenarios import TRAIN, small_split, start_run
from tests.support.aggregator import (
    FederatedDriver,
    bearer,
    enrol_headers,
    operator_headers,
    register,
    report_sums,
    run_config_for,
    upload_headers,
)

SHARDS = 2
#: the scenario's run with every version evaluated: the honest workers report each one, and
#: the rogue's reports meet the report checks (a version the run does not evaluate is refused
#: before them)
EVALUATED = TRAIN.replace(eval_every=1)


def _metric(ids: list[int], version: int) -> dict[str, float]:
    """Deterministic per-client metric values in [0, 1], summed over ``ids``."""
    return {
        **report_sums(float(sum((c + version) % 3 for c in ids)) / 2.0),
        "hr@10": float(sum((c * 7 + version) % 5 for c in ids)) / 4.0,
    }


def _rogue_round(client: TestClient, token: str, owned: list[int], round_id: int) -> None:
    """Everything the rogue tries in one round; each must be refused with a 4xx."""
    cur = client.get("/v1/rounds/current", headers=bearer(token)).json()
    cfg = run_config_for(EVALUATED, small_split().n_items).model()
    target = (cur["cohort"] or owned)[0]
    for name, (body, content_type) in junk_uploads(cfg, round_id, target, seed=round_id).items():
        headers = (
            bearer(token)
            if content_type is None
            else {**bearer(token), "Content-Type": content_type}
        )
        r = client.post(f"/v1/rounds/{round_id}/updates", content=body, headers=headers)
        assert 400 <= r.status_code < 500, (name, r.text)
    foreign = [c for c in range(small_split().n_users) if c % SHARDS != owned[0] % SHARDS][:3]
    for name, bad in junk_reports(round_id - 1, owned[:3], foreign).items():
        if isinstance(bad, str):
            r = client.post(
                "/v1/evaluations",
                content=bad,
                headers={**bearer(token), "Content-Type": "application/json"},
            )
        else:
            r = client.post("/v1/evaluations", json=bad, headers=bearer(token))
        assert 400 <= r.status_code < 500, (name, r.text)
    refused = [
        client.post("/v1/clients", json={"client_ids": [10_000]}, headers=bearer(token)),
        client.post("/v1/clients", json={"client_ids": foreign}, headers=enrol_headers(0, 7)),
        client.post("/v1/runs/current/pause", headers=bearer(token)),
        client.post("/v1/runs/current/stop", headers=bearer(token)),
        client.post("/v1/runs", json={"n_items": 5}, headers=bearer(token)),
        client.get("/v1/rounds/40471355875263758336"),
        client.get("/v1/models/99999999999999999999", headers=bearer(token)),
    ]
    for r in refused:
        assert 400 <= r.status_code < 500, r.text


def _run(client: TestClient, rogue: bool) -> tuple[str, list[dict[str, float] | None]]:
    """The federated run over two shards; the final model's sha256 and every version's metrics."""
    split = small_split()
    driver = FederatedDriver(split, run_config_for(EVALUATED, split.n_items))
    shard_ids = [[c for c in range(split.n_users) if c % SHARDS == s] for s in range(SHARDS)]
    tokens = [register(client, ids, s, SHARDS) for s, ids in enumerate(shard_ids)]
    owner = {c: tokens[c % SHARDS] for c in range(split.n_users)}
    start_run(client, split, EVALUATED)
    for round_id in range(1, EVALUATED.rounds + 1):
        if rogue:  # shard 1's client token, in hostile hands
            _rogue_round(client, tokens[1], shard_ids[1], round_id)
        cur = client.get("/v1/rounds/current", headers=operator_headers()).json()
        assert cur["round_id"] == round_id and cur["state"] == "open", cur
        _, shared, _ = decode_model(
            client.get("/v1/models/latest", headers=bearer(tokens[0])).content
        )
        uploads = driver.uploads(shared, round_id, np.asarray(cur["cohort"]))
        for s in range(SHARDS):
            mine = [u for u in uploads if u.client_id % SHARDS == s]
            if mine:
                r = client.post(
                    f"/v1/rounds/{round_id}/updates",
                    content=encode_updates(round_id, mine),
                    headers=upload_headers(tokens[s]),
                )
                assert r.status_code == 200, r.text
        assert client.get(f"/v1/rounds/{round_id}").json()["state"] == "closed"
        for ids in shard_ids:  # the honest evaluation of the new version
            report = {
                "model_version": round_id,
                "sums": _metric(ids, round_id),
                "count": len(ids),
                "client_ids": ids,
            }
            r = client.post("/v1/evaluations", json=report, headers=bearer(owner[ids[0]]))
            assert r.status_code == 202, r.text
    final = client.get("/v1/models/latest", headers=bearer(tokens[0]))
    assert final.headers["X-Model-Version"] == str(EVALUATED.rounds)
    history = client.get("/v1/runs/current/history").json()["rounds"]

    return hashlib.sha256(final.content).hexdigest(), [h["metrics"] for h in history]


def test_a_rogue_client_does_not_change_the_run(aggregator: AggregatorFactory) -> None:
    population = small_split().n_users
    honest_model, honest_metrics = _run(aggregator(population=population), rogue=False)
    rogue_model, rogue_metrics = _run(aggregator(population=population), rogue=True)
    assert rogue_model == honest_model  # bit-identical final model
    assert rogue_metrics == honest_metrics
    assert all(m is not None for m in honest_metrics)
