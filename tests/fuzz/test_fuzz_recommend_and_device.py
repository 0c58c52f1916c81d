"""recommend_api (a model loaded) and a worker's device API (in front of that recommend_api)
under schema-driven fuzzing: no 5xx, no answer their OpenAPI documents do not describe, no
invalid request accepted, no hang.

recommend_api is fuzzed twice: with its document as served, and with the document narrowed to
the served model (vector lengths, float32 range, k, catalogue ids), so that generated vectors
(huge, tiny, signed zeros) reach the ranking. recommend_api takes no credential; the device
API is fuzzed without one and with its device token.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
from pydantic import SecretStr

from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.sam import PrivateState
from fedrecgel.synthetic import synthetic_split
from harness.fuzz import Tally, fuzz, load_schema, operation_labels
from harness.fuzz_targets import pinned_schema
from services.client_sim.server import create_app as create_device_app
from services.client_sim.settings import WorkerSettings
from services.client_sim.store import WorkerStore
from services.recommend_api.app import create_app as create_recommend_app
from services.recommend_api.ranking import ModelHolder, RankingConfig
from services.recommend_api.settings import Settings as RecommendSettings
from tests.support.loopback import serve_app

EXAMPLES = 25  # per operation and generation mode
CFG = ModelConfig(n_items=30, factor=4, layers=2)
LABELS = [f"film-{i}" for i in range(CFG.n_items)]
N_USERS = 12
MAX_K = 50
DEVICE_TOKEN = "fuzz-device-token-8d2f6b1a7c4e93"
DEVICE_KINDS = {"anonymous": None, "device": {"Authorization": f"Bearer {DEVICE_TOKEN}"}}


@dataclass(frozen=True)
class Services:
    """recommend_api and the device API of worker shard 0 of 2, served on loopback."""

    recommend: str
    device: str


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    tmp = tmp_path_factory.mktemp("fuzz-device")
    holder = ModelHolder(RankingConfig(max_k=MAX_K), labels=LABELS)
    holder.swap(holder.build(CFG, init_shared(CFG, 1), 4))
    rec = create_recommend_app(RecommendSettings(aggregator_url=None, workers=2), holder=holder)
    split = synthetic_split(n_users=N_USERS, n_items=CFG.n_items, seed=3, n_test_negatives=10)
    store = WorkerStore(tmp / "worker.db")
    users = [u for u in range(N_USERS) if u % 2 == 0]
    store.add_users(split, users)
    # half of the shard's users have joined a run (a private state), half not yet
    joined = users[: len(users) // 2]
    store.reset_states(joined, PrivateState.fresh(CFG, 7, np.asarray(joined)))
    with serve_app(rec) as rec_url:
        settings = WorkerSettings(
            shard=0,
            shards=2,
            dataset="synthetic",
            store=str(tmp / "worker.db"),
            recommend_url=rec_url,
            device_token=SecretStr(DEVICE_TOKEN),
        )
        with serve_app(create_device_app(settings, store, LABELS)) as device_url:
            yield Services(rec_url, device_url)


def _assert_clean(tally: Tally, service: str) -> None:
    assert tally.requests >= 2 * len(tally.by_operation)
    assert tally.clean, f"{service}: {tally.requests} requests:\n{tally.report()}"


@pytest.mark.timeout(180)
def test_recommend_api_survives_fuzzing(services: Services) -> None:
    schema = load_schema(services.recommend)
    tally = fuzz(
        schema,
        services.recommend,
        service="recommend_api",
        token="anonymous",
        max_examples=EXAMPLES,
    )
    assert set(tally.by_operation) == operation_labels(schema)
    _assert_clean(tally, "recommend_api")


@pytest.mark.timeout(180)
def test_recommend_api_survives_fuzzed_vectors_of_the_right_length(services: Services) -> None:
    schema = pinned_schema(services.recommend, CFG.private_dims(), LABELS, MAX_K)
    tally = fuzz(
        schema,
        services.recommend,
        service="recommend_api",
        token="anonymous",
        max_examples=2 * EXAMPLES,
        include=lambda label: label == "POST /v1/recommendations",
    )
    # the narrowed document lets most valid requests through to the ranking
    assert tally.answered(200, 300) >= EXAMPLES // 2, tally
    _assert_clean(tally, "recommend_api")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", DEVICE_KINDS)
def test_device_api_survives_fuzzing(services: Services, kind: str) -> None:
    schema = load_schema(services.device, headers=DEVICE_KINDS["device"])
    tally = fuzz(
        schema,
        services.device,
        service="worker",
        token=kind,
        headers=DEVICE_KINDS[kind],
        max_examples=EXAMPLES,
    )
    assert set(tally.by_operation) == operation_labels(schema)
    _assert_clean(tally, "worker")


def test_a_body_that_is_not_json_is_a_documented_422(services: Services) -> None:
    """Found by fuzzing: such a body was answered 400, which the document does not list."""
    r = httpx.post(
        f"{services.recommend}/v1/recommendations",
        content=b"\xff\x17K",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request"


def test_metrics_are_documented_as_text() -> None:
    """Found by fuzzing: recommend_api's /metrics answered text while its document said JSON."""
    doc = create_recommend_app(RecommendSettings(aggregator_url=None)).openapi()
    answer = doc["paths"]["/metrics"]["get"]["responses"]["200"]
    assert "application/json" not in answer.get("content", {})
