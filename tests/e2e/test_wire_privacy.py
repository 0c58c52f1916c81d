"""No body on the wire carries a user's private state or interactions (Architecture invariant
1): a short run with the workers in-process behind a recording transport and the real
aggregator process; every body is checked against the API's keys and the shared model's
tensors, searched for every private vector and Adam moment and for every user's item list,
and the recorded run still computes what the simulator computes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from pydantic import SecretStr

from fedrecgel.data import Split
from harness.recording import RecordingTransport
from services.client_sim.settings import WorkerSettings
from services.client_sim.worker import Worker
from services.launcher import run_config, worker_torch_threads
from tests.e2e.http_run import (
    DATASET,
    PARTIAL,
    SHORT,
    TRAIN,
    Reference,
    assert_matches,
    services,
)
from tests.e2e.wire_record import (
    check_json,
    check_safetensors,
    find_needles,
    interaction_problems,
    private_vectors,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("grouping", ["client", "worker"])
def test_no_private_state_or_interactions_on_the_wire(
    tmp_path: Path, split: Split, grouping: str, request: pytest.FixtureRequest
) -> None:
    """Record every body of a run (workers in-process behind a recording transport, the real
    aggregator process) and look for anything private in it; per-client uploads, and one
    partial sum per worker and round (``grouping``)."""
    train = TRAIN if grouping == "client" else PARTIAL
    reference: Reference = request.getfixturevalue(
        "reference" if grouping == "client" else "partial_reference"
    )
    recorder = RecordingTransport()
    with services(tmp_path, SHORT, train=train) as c:
        workers = [
            Worker(
                WorkerSettings(
                    aggregator=c.agg_url,
                    shard=i,
                    shards=2,
                    enrolment_token=SecretStr(c.enrolment_token(i)),
                    dataset=DATASET,
                    store=str(c.worker_store(i)),
                ),
                split=split,
                transport=recorder,
            )
            for i in range(2)
        ]
        operator = httpx.Client(base_url=c.agg_url, transport=recorder, timeout=30)
        threads = torch.get_num_threads()
        torch.set_num_threads(worker_torch_threads(2))  # as the worker processes run
        try:
            for w in workers:
                w.register()
            resp = operator.post(
                "/v1/runs", json=run_config(c.opts, split.n_items), headers=c.operator_headers()
            )
            assert resp.status_code == 201, resp.text
            mid_needles: list[bytes] = []
            for _ in range(20 * SHORT):
                for w in workers:
                    w.step()
                history = operator.get("/v1/runs/current/history").json()
                if not mid_needles and len(history["rounds"]) >= SHORT // 2:
                    mid_needles = private_vectors([w.store for w in workers])
                if all(w.finished() for w in workers):
                    break
            assert all(w.finished() for w in workers), "the in-process workers did not finish"
            model = operator.get("/v1/models/latest", headers=c.operator_headers()).content
            history = operator.get("/v1/runs/current/history").json()
            end_needles = private_vectors([w.store for w in workers])
        finally:
            torch.set_num_threads(threads)
            operator.close()
            for w in workers:
                w.close()
    exchanges = recorder.exchanges
    assert {ex.path for ex in exchanges} >= {"/v1/clients", "/v1/rounds/current", "/v1/evaluations"}
    assert any(ex.path.endswith("/updates") for ex in exchanges)
    problems: list[str] = []
    n_blobs = 0
    for ex in exchanges:
        for direction, ctype, body in ex.bodies():
            if "json" in ctype:
                problems += check_json(ex, direction, body)
            elif ctype.startswith("application/octet-stream"):
                n_blobs += 1
                problems += check_safetensors(ex, direction, body)
            else:
                problems.append(f"{ex.method} {ex.path} {direction}: content type {ctype!r}")
    assert n_blobs > 0
    assert not problems, problems[:20]

    # (b) no private vector or Adam moment, mid-run or final, in any body
    needles = sorted(set(mid_needles) | set(end_needles))
    assert len(mid_needles) > split.n_users and len(end_needles) > len(mid_needles) // 2
    for ex in exchanges:
        for direction, _, body in ex.bodies():
            hits = find_needles(body, needles)
            assert not hits, (
                f"{ex.method} {ex.path} {direction} carries {len(hits)} private vectors"
            )

    # (d) no training-item list
    problems = interaction_problems(split, exchanges)
    assert not problems, problems[:20]

    # and the recorded run computed what the simulator computes
    assert_matches(history, model, reference, SHORT)
