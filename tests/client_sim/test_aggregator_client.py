"""AggregatorClient against httpx.MockTransport: ETags, retries, errors, body splitting."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from fedrecgel import wire
from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.sam import PrivateState, SAMConfig, client_rng, client_samples, cohort_step
from fedrecgel.uploads import Update
from fedrecgel.wire import decode_updates, encode_model, update_digest
from services.client_sim.aggregator_client import AggregatorCallError, AggregatorClient
from services.retry import RetryPolicy

CFG = ModelConfig(n_items=50, factor=4, layers=2)


class Recorder:
    """A MockTransport handler: answers from a queue, records every request."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.bodies: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.bodies.append(request.read())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _client(
    handler: Callable[[httpx.Request], httpx.Response], **kw: Any
) -> tuple[AggregatorClient, list[float]]:
    waits: list[float] = []
    retry = RetryPolicy(
        retries=kw.pop("retries", 3), backoff_s=0.1, max_backoff_s=0.25, sleep=waits.append
    )
    client = AggregatorClient(
        "http://agg", token="t0", transport=httpx.MockTransport(handler), retry=retry, **kw
    )
    return client, waits


def _updates(n: int = 6) -> list[Update]:
    shared = init_shared(CFG, 0)
    users = np.arange(n)
    hp = SAMConfig(chunk_size=8)
    rng = np.random.default_rng(0)
    samples = [
        client_samples(
            rng.choice(50, size=int(rng.integers(3, 12)), replace=False),
            50,
            hp.n_negatives,
            client_rng(0, 1, int(u)),
        )
        for u in range(n)
    ]
    return cohort_step(CFG, shared, users, PrivateState.fresh(CFG, 0, users), samples, hp).uploads


def _ok_results(request: httpx.Request) -> httpx.Response:
    decoded = decode_updates(request.read(), CFG)
    return httpx.Response(
        200,
        json={
            "results": [{"client_id": u.client_id, "status": "accepted"} for u in decoded.updates]
        },
    )


def test_model_download_uses_the_etag_cache() -> None:
    blob = encode_model(CFG, init_shared(CFG, 0), 7)
    rec = Recorder(
        httpx.Response(200, content=blob, headers={"ETag": '"abc"', "X-Model-Version": "7"}),
        httpx.Response(304, headers={"ETag": '"abc"'}),
    )
    client, _ = _client(rec)
    first = client.download_model(7)
    second = client.download_model(7)
    assert first.version == 7 and first.etag == '"abc"' and second is first
    assert "if-none-match" not in rec.requests[0].headers
    assert rec.requests[1].headers["If-None-Match"] == '"abc"'
    assert rec.requests[1].url.path == "/v1/models/7"
    assert rec.requests[0].headers["Authorization"] == "Bearer t0"


def test_model_download_refuses_a_version_other_than_asked() -> None:
    blob = encode_model(CFG, init_shared(CFG, 0), 3)
    client, _ = _client(Recorder(httpx.Response(200, content=blob)))
    with pytest.raises(AggregatorCallError, match="version_mismatch"):
        client.download_model(4)
    assert client.download_model("latest").version == 3


def test_5xx_and_connection_errors_are_retried_with_backoff() -> None:
    rec = Recorder(
        httpx.ConnectError("refused"),
        httpx.Response(503),
        httpx.Response(502),
        httpx.Response(200, json={"state": "idle"}),
    )
    client, waits = _client(rec)
    assert client.current_round().state == "idle"
    assert len(rec.requests) == 4
    # doubling, capped, each lengthened by up to half at random
    for wait, base in zip(waits, [0.1, 0.2, 0.25], strict=True):
        assert base <= wait <= 1.5 * base


def test_retry_after_of_a_503_is_waited_out() -> None:
    rec = Recorder(
        httpx.Response(
            503,
            json={"error": "database_unavailable", "detail": "x"},
            headers={"Retry-After": "5"},
        ),
        httpx.Response(200, json={"state": "idle"}),
    )
    client, waits = _client(rec)
    assert client.current_round().state == "idle"
    assert len(waits) == 1 and 5.0 <= waits[0] <= 7.5


def test_retries_give_up_with_the_last_error() -> None:
    client, waits = _client(
        Recorder(httpx.Response(503, json={"error": "busy", "detail": "x"})), retries=2
    )
    with pytest.raises(AggregatorCallError) as info:
        client.current_round()
    assert info.value.status_code == 503 and info.value.code == "busy" and info.value.retryable
    assert len(waits) == 2


def test_unreachable_server_is_a_retryable_error_with_status_0() -> None:
    client, _ = _client(Recorder(httpx.ConnectTimeout("slow")), retries=1)
    with pytest.raises(AggregatorCallError) as info:
        client.current_round()
    assert info.value.status_code == 0 and info.value.retryable


@pytest.mark.parametrize("status", [401, 403, 409, 413, 422])
def test_4xx_is_not_retried_and_carries_the_server_error(status: int) -> None:
    rec = Recorder(httpx.Response(status, json={"error": "nope", "detail": "because"}))
    client, waits = _client(rec)
    with pytest.raises(AggregatorCallError) as info:
        client.upload(1, _updates(2))
    err = info.value
    assert (err.status_code, err.code, err.detail) == (status, "nope", "because")
    assert not err.retryable and waits == [] and len(rec.requests) == 1


def test_error_without_json_body_keeps_the_text() -> None:
    client, _ = _client(Recorder(httpx.Response(400, text="plain failure")))
    with pytest.raises(AggregatorCallError) as info:
        client.current_round()
    assert info.value.detail == "plain failure" and info.value.code == "http_error"


def test_upload_retry_resends_the_same_bytes() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.read())
        if len(calls) == 1:
            raise httpx.ReadTimeout("lost answer")
        return _ok_results(request)

    client, _ = _client(handler)
    updates = _updates(3)
    statuses = client.upload(5, updates)
    assert statuses == {0: "accepted", 1: "accepted", 2: "accepted"}
    assert len(calls) == 2 and calls[0] == calls[1]
    decoded = decode_updates(calls[1], CFG)
    assert decoded.round_id == 5
    assert decoded.digests == [update_digest(5, u) for u in updates]


def test_upload_splits_bodies_to_the_byte_budget() -> None:
    updates = _updates(6)
    whole = AggregatorClient("http://x").split_bodies(1, updates)[0][1]
    budget = len(whole) // 3
    client, _ = _client(_ok_results, max_body_bytes=budget)
    bodies = client.split_bodies(1, updates)
    assert len(bodies) > 1
    assert all(len(b) <= budget for _, b in bodies)
    assert [c for ids, _ in bodies for c in ids] == list(range(6))
    assert client.upload(1, updates) == dict.fromkeys(range(6), "accepted")


def test_upload_splits_bodies_to_the_aggregators_header_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many updates of a small model make a body that is mostly header: it is split to the
    header limit the aggregator enforces, whatever the byte budget allows."""
    updates = _updates(6)
    whole = AggregatorClient("http://x").split_bodies(1, updates)[0][1]
    limit = int.from_bytes(whole[:8], "little") // 3
    monkeypatch.setattr(wire, "MAX_HEADER_BYTES", limit)
    client, _ = _client(_ok_results)
    bodies = client.split_bodies(1, updates)
    assert len(bodies) > 1
    assert all(int.from_bytes(b[:8], "little") <= limit for _, b in bodies)
    assert [c for ids, _ in bodies for c in ids] == list(range(6))


def test_upload_content_type_and_path() -> None:
    rec = Recorder(httpx.Response(200, json={"results": [{"client_id": 0, "status": "duplicate"}]}))
    client, _ = _client(rec)
    assert client.upload(2, _updates(1)) == {0: "duplicate"}
    req = rec.requests[0]
    assert req.url.path == "/v1/rounds/2/updates"
    assert req.headers["Content-Type"] == "application/octet-stream"


def test_register_keeps_the_token_for_later_calls() -> None:
    rec = Recorder(
        httpx.Response(201, json={"token": "secret", "client_ids": [1, 3]}),
        httpx.Response(200, json={"state": "idle"}),
    )
    client = AggregatorClient("http://agg", transport=httpx.MockTransport(rec))
    # numpy ids (as a worker holds them) go out as plain JSON integers
    assert client.register(np.array([1, 3]), "enrol-token") == "secret"  # type: ignore[arg-type]
    assert rec.requests[0].headers["Authorization"] == "Bearer enrol-token"
    assert json.loads(rec.bodies[0]) == {"client_ids": [1, 3]}
    client.current_round()
    assert rec.requests[1].headers["Authorization"] == "Bearer secret"


def test_register_sends_the_chosen_token_and_checks_the_answer() -> None:
    chosen = "c" * 43
    rec = Recorder(
        httpx.Response(201, json={"token": chosen, "client_ids": [1]}),
        httpx.Response(201, json={"token": "another", "client_ids": [1]}),
    )
    client = AggregatorClient("http://agg", transport=httpx.MockTransport(rec))
    assert client.register([1], "enrol-token", chosen) == chosen
    assert json.loads(rec.bodies[0]) == {"client_ids": [1], "token": chosen}
    with pytest.raises(AggregatorCallError) as err:
        client.register([1], "enrol-token", chosen)
    assert err.value.code == "token_mismatch" and not err.value.retryable


def test_report_evaluation_sends_only_sums_count_and_ids() -> None:
    rec = Recorder(httpx.Response(202, json={}))
    client, _ = _client(rec)
    client.report_evaluation(4, {"hr@10": 3.0, "ndcg@10": 1.5, "count": 9.0}, 9, [0, 2])
    assert json.loads(rec.bodies[0]) == {
        "model_version": 4,
        "sums": {"hr@10": 3.0, "ndcg@10": 1.5},
        "count": 9,
        "client_ids": [0, 2],
    }


def test_current_round_parses_the_run_config() -> None:
    body = {
        "run_id": 3,
        "round_id": 2,
        "attempt": 1,
        "state": "open",
        "deadline": None,
        "model_version": 1,
        "cohort": [4],
        "cohort_size": 6,
        "config": {
            "n_items": 50,
            "kind": "mf",
            "factor": 4,
            "layers": 2,
            "rounds": 5,
            "seed": 9,
            "rho_sh": 0.0,
            "something_new": 1,
        },
    }
    client, _ = _client(Recorder(httpx.Response(200, json=body)))
    info = client.current_round()
    assert info.cohort == [4] and info.attempt == 1 and info.config is not None
    assert info.config.model() == ModelConfig(n_items=50, kind="mf", factor=4, layers=2)
    assert info.config.sam().rho_sh == 0.0


def test_no_answer_is_told_as_an_unreachable_aggregator_not_as_status_0(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker logged 'POST /v1/clients -> 0 unreachable: ...': a status no answer had."""
    client, _ = _client(Recorder(httpx.ConnectError("[Errno 111] Connection refused")), retries=1)
    with caplog.at_level("WARNING"), pytest.raises(AggregatorCallError) as err:
        client.register([0, 2], "enrol-token")
    said = "POST /v1/clients: aggregator unreachable (ConnectError: [Errno 111] Connection refused)"
    assert str(err.value) == said and err.value.retryable
    assert said in caplog.text and "-> 0" not in caplog.text
    refused = AggregatorCallError(403, "forbidden", "no", "POST", "/v1/clients")
    assert str(refused) == "POST /v1/clients -> 403 forbidden: no"
