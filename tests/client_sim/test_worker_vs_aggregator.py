"""Two workers run three rounds against the real aggregator app (uvicorn on loopback, one
process) and reproduce the in-process simulator."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from pydantic import SecretStr

from fedrecgel.data import Split
from fedrecgel.rank_fit import RankFit, ranking_params
from fedrecgel.simulate import Simulator
from fedrecgel.synthetic import synthetic_split
from fedrecgel.wire import decode_model
from harness.parity import served_and_model
from services.client_sim.loop import follow_rounds
from services.client_sim.settings import WorkerSettings
from services.client_sim.worker import Worker
from services.enrolment import enrolment_token
from tests.client_sim.conftest import LiveAggregator
from tests.client_sim.worker_run import run_body, train_config
from tests.support.aggregator import ENROLMENT_SECRET, OPERATOR_TOKEN

SEED, ROUNDS = 4, 3
N_USERS = 60


@pytest.fixture()
def aggregator(live_aggregator: LiveAggregator) -> Iterator[str]:
    with live_aggregator(population=N_USERS, deadline_poll_s=0.2) as url:
        yield url


#: training settings beyond the paper's, each reaching the workers and the server over HTTP
WIDER = {
    "local_steps": 2,
    "client_weight_decay": 0.1,
    "client_lr": 0.03,
    "server_lr": 0.01,
    "server_warmup": 1,
    "server_decay": "cosine",
    "server_beta1": 0.8,
    "server_weight_decay": 3.0,
}

#: users fit their embeddings to each version before ranking it (keyed draws, no upload)
RANK_FIT = {"rank_fit_steps": 4, "rank_fit_lr": 0.2}

#: the fit, with versions 2 and 3 (the last) evaluated only
EVERY_2ND = {"eval_every": 2, **RANK_FIT}


@pytest.mark.parametrize(
    ("extra", "validation"),
    [({}, False), (WIDER, False), ({}, True), (RANK_FIT, True), (EVERY_2ND, True)],
    ids=["paper", "wider-settings", "validation-and-prior", "rank-fit", "eval-every-2"],
)
def test_two_workers_three_rounds_over_http_match_the_simulator(
    tmp_path: Path, aggregator: str, extra: dict[str, Any], validation: bool
) -> None:
    """With validation items the workers report their item counts and rank with the run's
    popularity prior: the aggregator then publishes the served figures, the weight and the
    model's own, each as the simulator computes them."""
    split = synthetic_split(
        n_users=N_USERS, n_items=80, seed=7, n_test_negatives=20, validation=validation
    )
    workers, history, blob = _run_over_http(tmp_path, aggregator, split, ROUNDS, extra)
    sim = Simulator(split, train_config(SEED, ROUNDS, **extra))
    result = sim.run()
    _, shared, version = decode_model(blob.content)
    assert version == ROUNDS
    for name, param in sim.shared.items():
        torch.testing.assert_close(shared[name], param, rtol=1e-5, atol=1e-6)
    rounds = history["rounds"]
    assert [r["model_version"] for r in rounds] == [1, 2, 3]
    scheduled = [sim.config.evaluates(r, ROUNDS) for r in range(1, ROUNDS + 1)]
    assert [bool(r["metrics"]) for r in rounds] == [bool(r.test) for r in result.rounds]
    assert [bool(r["metrics"]) for r in rounds] == scheduled, scheduled
    evaluated = [rec for rec in result.rounds if rec.test]
    for rec, row in zip(result.rounds, rounds, strict=True):
        if not rec.test:  # a version the run does not evaluate: no worker scored it
            continue
        assert row["metrics"], row  # every client reported: the means are set
        assert row["metrics"].get("prior_weight") == rec.prior_weight, rec.round
        for k, v in served_and_model(rec).items():
            assert row["metrics"][k] == pytest.approx(v, abs=1e-9), (rec.round, k)
    if validation:  # the prior was ranked, and served in some round (else nothing was shown)
        assert all(r.prior_weight is not None for r in evaluated)
        assert any(r.prior_weight for r in evaluated), [r.prior_weight for r in evaluated]
    if "rank_fit_steps" in extra:  # the fit moved the figures (else it was not shown to run)
        unfitted = {k: v for k, v in extra.items() if k not in RANK_FIT}
        plain = Simulator(split, train_config(SEED, ROUNDS, **unfitted)).run()
        assert [served_and_model(r) for r in plain.rounds] != [
            served_and_model(r) for r in result.rounds
        ]
        # what a device of the worker sends for recommendations: the vector ranked with
        users = workers[1].users[:3]
        fit = RankFit(steps=extra["rank_fit_steps"], lr=extra["rank_fit_lr"])
        want = ranking_params(
            sim.model_cfg,
            sim.shared,
            sim.store.get(users),
            users,
            split.user_train,
            sim.hp,
            fit,
            SEED,
            ROUNDS,
        )
        for i, u in enumerate(users.tolist()):
            got = workers[1].evaluation.fitted_vector(u)
            assert got is not None
            for name, rows in want.items():
                torch.testing.assert_close(torch.tensor(got[name]), rows[i], rtol=1e-5, atol=1e-6)
    for w in workers:
        w.close()


def _registered_workers(
    tmp_path: Path, aggregator: str, split: Split, **settings: Any
) -> list[Worker]:
    """The two shards' workers of ``split`` (stores in ``tmp_path``), registered."""
    workers = [
        Worker(
            WorkerSettings(
                aggregator=aggregator,
                shard=i,
                shards=2,
                enrolment_token=SecretStr(enrolment_token(ENROLMENT_SECRET, i, 2)),
                dataset="synthetic",
                store=str(tmp_path / f"worker-{i}.db"),
                **settings,
            ),
            split=split,
        )
        for i in range(2)
    ]
    for w in workers:
        w.register()
    return workers


def _run_over_http(
    tmp_path: Path, aggregator: str, split: Split, rounds: int, extra: dict[str, Any]
) -> tuple[list[Worker], dict[str, Any], httpx.Response]:
    """Two workers run ``rounds`` rounds of the run ``extra`` sets: the workers, the run's
    history and its latest model."""
    workers = _registered_workers(tmp_path, aggregator, split, poll_min_s=0.01, poll_max_s=0.05)
    run = run_body(split.n_items, SEED, rounds, kind="ncf", deadline_s=600.0, **extra)
    with httpx.Client(base_url=aggregator) as http:
        resp = http.post(
            "/v1/runs", json=run, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        )
        assert resp.status_code == 201, resp.text

        threads = [threading.Thread(target=follow_rounds, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)

        history = http.get("/v1/runs/current/history").json()
        token = workers[0].store.get_meta("token")
        blob = http.get("/v1/models/latest", headers={"Authorization": f"Bearer {token}"})
        assert blob.status_code == 200
    return workers, history, blob


#: a sparse secure run: its prior from the rounds' counts, fixed at round 7 (18 clients a round)
SPARSE = {"secure_aggregation": "sparse", "negative_pool": 16, "secagg_neighbours": 3}


def test_a_sparse_secure_run_over_http_ranks_with_the_simulators_round_prior(
    tmp_path: Path, aggregator: str
) -> None:
    """No worker reports counts; the aggregator fixes the prior from instance A's counts at
    the round the simulator does, and the served figures and weights are the simulator's."""
    split = synthetic_split(
        n_users=N_USERS, n_items=80, seed=7, n_test_negatives=20, validation=True
    )
    rounds = 8
    workers, history, blob = _run_over_http(tmp_path, aggregator, split, rounds, SPARSE)
    sim = Simulator(split, train_config(SEED, rounds, **SPARSE))
    result = sim.run()
    _, shared, version = decode_model(blob.content)
    assert version == rounds
    for name, param in sim.shared.items():  # the same integer sums: the same model
        torch.testing.assert_close(shared[name], param, rtol=1e-5, atol=1e-6)
    weights = [r.prior_weight for r in result.rounds]
    assert weights[:6] == [None] * 6 and None not in weights[6:], weights
    for rec, row in zip(result.rounds, history["rounds"], strict=True):
        assert row["metrics"].get("prior_weight") == rec.prior_weight, rec.round
        for k, v in served_and_model(rec).items():
            assert row["metrics"][k] == pytest.approx(v, abs=1e-6), (rec.round, k)
    for w in workers:
        assert w.store.get_meta("item_counts_run") is None  # no count report
        w.close()


def test_a_stopped_run_evaluates_the_version_it_stopped_at(tmp_path: Path, aggregator: str) -> None:
    """eval_every 2 over 10 rounds, stopped by the operator once round 3 closed: version 3 is
    the run's last and every worker scores it, one of them though it passed it over before."""
    split = synthetic_split(n_users=N_USERS, n_items=80, seed=7, n_test_negatives=20)
    workers = _registered_workers(tmp_path, aggregator, split)
    run = run_body(split.n_items, SEED, 10, kind="ncf", deadline_s=600.0, eval_every=2)
    operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    with httpx.Client(base_url=aggregator) as http:
        assert http.post("/v1/runs", json=run, headers=operator).status_code == 201

        def closed() -> list[dict[str, Any]]:
            rounds: list[dict[str, Any]] = http.get("/v1/runs/current/history").json()["rounds"]
            return rounds

        for _ in range(200):
            if len(closed()) >= 3:
                break
            for w in workers:
                w.step()
        assert len(closed()) == 3
        # worker 0 trains its part of round 4 from version 3 and passes it over (not due);
        # worker 1 has not seen version 3 when the run stops
        workers[0].step()
        assert len(closed()) == 3
        assert [w.evaluation.done() for w in workers] == [3, 2]
        assert http.post("/v1/runs/current/stop", headers=operator).status_code == 200
        for _ in range(50):
            for w in workers:
                w.step()
            if all(w.finished() for w in workers):
                break
        assert all(w.finished() for w in workers)
        rounds = closed()
    assert [r["model_version"] for r in rounds] == [1, 2, 3]
    assert [bool(r["metrics"]) for r in rounds] == [False, True, True]
    for w in workers:
        w.close()
