"""Two workers run three rounds against the real aggregator app (uvicorn on loopback, one
process) and reproduce the in-process simulator."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.synthetic import synthetic_split
from fedrecgel.wire import decode_model

app_module = pytest.importorskip("services.aggregator.app")
settings_module = pytest.importorskip("services.aggregator.settings")
uvicorn = pytest.importorskip("uvicorn")

from services.client_sim.settings import WorkerSettings  # noqa: E402
from services.client_sim.worker import Worker  # noqa: E402

OPERATOR = "operator-secret-for-tests"
FACTOR, LAYERS, SEED, ROUNDS = 8, 2, 4, 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def aggregator(tmp_path: Path) -> Iterator[str]:
    """The real aggregator app served on a free loopback port for the test."""
    settings = settings_module.Settings(
        environment="test",
        database_url=f"sqlite:///{tmp_path / 'agg.db'}",
        operator_token=OPERATOR,
        deadline_poll_s=0.2,
    )
    port = _free_port()
    config = uvicorn.Config(
        app_module.create_app(settings), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("aggregator did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_two_workers_three_rounds_over_http_match_the_simulator(tmp_path, aggregator):
    split = synthetic_split(n_users=60, n_items=80, seed=7, n_test_negatives=20)
    workers = [
        Worker(
            WorkerSettings(
                aggregator=aggregator,
                shard=i,
                shards=2,
                dataset="synthetic",
                store=str(tmp_path / f"worker-{i}.db"),
                poll_min_s=0.01,
                poll_max_s=0.05,
            ),
            split=split,
        )
        for i in range(2)
    ]
    for w in workers:
        w.register()
    run = {
        "n_items": split.n_items,
        "kind": "ncf",
        "factor": FACTOR,
        "layers": LAYERS,
        "rounds": ROUNDS,
        "fraction": 0.3,
        "seed": SEED,
        "chunk_size": 16,
        "deadline_s": 600.0,
        "dataset": "synthetic",
    }
    with httpx.Client(base_url=aggregator) as http:
        resp = http.post("/v1/runs", json=run, headers={"Authorization": f"Bearer {OPERATOR}"})
        assert resp.status_code == 201, resp.text

        threads = [threading.Thread(target=w.run) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)

        history = http.get("/v1/runs/current/history").json()
        token = workers[0].store.get_meta("token")
        blob = http.get("/v1/models/latest", headers={"Authorization": f"Bearer {token}"})
        assert blob.status_code == 200

    sim = Simulator(
        split,
        TrainConfig(
            rounds=ROUNDS, fraction=0.3, factor=FACTOR, layers=LAYERS, seed=SEED, chunk_size=16
        ),
    )
    result = sim.run()
    _, shared, version = decode_model(blob.content)
    assert version == ROUNDS
    for name, t in sim.shared.items():
        torch.testing.assert_close(shared[name], t, rtol=1e-5, atol=1e-6)
    rounds = history["rounds"]
    assert [r["model_version"] for r in rounds] == [1, 2, 3]
    for rec, row in zip(result.rounds, rounds, strict=True):
        assert row["metrics"], row  # every client reported: the means are set
        for k, v in rec.test.items():
            assert row["metrics"][k] == pytest.approx(v, abs=1e-9), (rec.round, k)
    for w in workers:
        w.close()
