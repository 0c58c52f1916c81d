"""Client-level DP on the aggregator: an upload beyond the clipping norm is refused (422, and
nothing is stored), clipped ones are aggregated into a noisy model, each closed round reports
the privacy spent (history and /metrics), and a target epsilon ends the run early."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from fedrecgel.accountant import plan_privacy
from fedrecgel.config import RunParams
from fedrecgel.model import ModelConfig
from fedrecgel.strategy import clip_update, scaled, update_norm
from fedrecgel.wire import encode_updates
from harness.aggregator import AggregatorFactory
from tests.support.aggregator import operator_headers, random_update, register, upload_headers

MODEL = ModelConfig(n_items=30, kind="ncf", factor=4, layers=2)
DP = {"dp_noise": 1.0, "dp_clip": 0.5}
RUN: dict[str, Any] = {
    "n_items": 30,
    "factor": 4,
    "layers": 2,
    "rounds": 6,
    "fraction": 1.0,
    "seed": 1,
    **DP,
}
IDS = [0, 1, 2, 3]


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m is not None, text
    return float(m.group(1))


def test_dp_uploads_are_checked_noised_and_accounted(aggregator: AggregatorFactory) -> None:
    client = aggregator(population=4)
    token = register(client, IDS)
    plan = plan_privacy(RunParams(**{k: v for k, v in RUN.items() if k != "n_items"}), 4)
    assert plan is not None
    target = (plan.epsilon(2) + plan.epsilon(3)) / 2  # room for exactly 2 rounds
    r = client.post("/v1/runs", json={**RUN, "target_epsilon": target}, headers=operator_headers())
    assert r.status_code == 201, r.text
    rng = np.random.default_rng(0)
    ups = [scaled(random_update(MODEL, c, rng), 100.0) for c in IDS]
    assert all(update_norm(u) > 0.5 for u in ups)
    # one unclipped upload in the body: the whole body is refused, nothing stored
    body = encode_updates(1, [clip_update(u, 0.5) for u in ups[:3]] + [ups[3]])
    r = client.post("/v1/rounds/1/updates", content=body, headers=upload_headers(token))
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "update_norm_too_large", r.text
    assert client.get("/v1/rounds/1").json()["updates_received"] == 0
    for round_id in (1, 2):
        ups = [clip_update(scaled(random_update(MODEL, c, rng), 100.0), 0.5) for c in IDS]
        body = encode_updates(round_id, ups)
        r = client.post(
            f"/v1/rounds/{round_id}/updates", content=body, headers=upload_headers(token)
        )
        assert r.status_code == 200, r.text
    whole = client.get("/v1/runs/current/history", headers=operator_headers()).json()
    # the delta every epsilon is at (1 / registered clients by default) and the noise z
    assert whole["delta"] == plan.delta == 0.25 and whole["noise_multiplier"] == 1.0
    assert whole["planned_rounds"] == 2
    history = whole["rounds"]
    assert [h["round_id"] for h in history] == [1, 2]  # the target stopped a 6-round run
    eps = [h["epsilon"] for h in history]
    assert eps == pytest.approx([plan.epsilon(1), plan.epsilon(2)], rel=1e-9)
    assert eps[-1] <= target
    metrics = client.get("/metrics").text
    assert _metric(metrics, "fedrec_agg_dp_epsilon") == pytest.approx(eps[-1], rel=1e-6)
    assert client.get("/v1/rounds/3").status_code == 404  # no third round was opened


def test_an_unreachable_target_epsilon_is_422(aggregator: AggregatorFactory) -> None:
    client = aggregator(population=4)
    register(client, IDS)
    body = {**RUN, "dp_noise": 0.05, "target_epsilon": 0.01}
    r = client.post("/v1/runs", json=body, headers=operator_headers())
    assert r.status_code == 422, r.text
    assert "target_epsilon" in r.text


@pytest.mark.parametrize(
    "settings",
    [
        # z^2 underflows: the accountant divides by zero (the run was started, then every
        # close failed with a ZeroDivisionError at ERROR and no round ever closed)
        {"dp_noise": 1e-300, "fraction": 0.5},
        # no noise multiplier reaches a delta this small: calibration finds no interval (500)
        {"target_epsilon": 0.5, "dp_delta": 1e-300, "fraction": 1.0},
    ],
)
def test_settings_the_accountant_cannot_compute_are_422_before_the_run_starts(
    aggregator: AggregatorFactory, settings: dict[str, float]
) -> None:
    client = aggregator(population=4)
    register(client, IDS)
    body = {**{k: v for k, v in RUN.items() if k != "dp_noise"}, **settings}
    r = client.post("/v1/runs", json=body, headers=operator_headers())
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_config"
    assert "privacy accountant cannot compute epsilon" in r.json()["detail"]
    assert client.get("/v1/runs/current/history").json()["run_id"] is None  # nothing started


def test_concurrent_history_reads_share_one_calibration(
    aggregator: AggregatorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target epsilon is calibrated (seconds of CPU) for each number of registered clients;
    after a registration, unauthenticated history readers arriving together each calibrated
    again in parallel (6 reads: 92 s of CPU on FilmTrust's 1227 clients). One computes it, the
    others wait for it."""
    from services.aggregator import privacy

    calls: list[int] = []
    lock = threading.Lock()

    def slow_plan(params: RunParams, n_users: int) -> object:
        with lock:
            calls.append(n_users)
        time.sleep(0.3)  # a calibration's seconds, shortened
        return plan_privacy(params, n_users)

    monkeypatch.setattr(privacy, "plan_privacy", slow_plan)
    privacy._cached_plan.cache_clear()
    client = aggregator(population=5)
    register(client, IDS)
    body = {**{k: v for k, v in RUN.items() if k != "dp_noise"}, "target_epsilon": 50.0}
    r = client.post("/v1/runs", json=body, headers=operator_headers())
    assert r.status_code == 201, r.text
    register(client, [4])  # the number of clients changed: the plan is computed again
    calls.clear()
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: client.get("/v1/runs/current/history"), range(6)))
    assert [a.status_code for a in answers] == [200] * 6
    assert len({a.json()["noise_multiplier"] for a in answers}) == 1
    assert calls == [5]


@pytest.mark.parametrize(("field", "value"), [("dp_clip_quantile", 0.5), ("dp_item_share", 0.3)])
def test_simulator_only_dp_settings_are_refused_over_http_before_the_run_starts(
    aggregator: AggregatorFactory, field: str, value: float
) -> None:
    """The workers do not report whether they were within the clip norm, nor their users'
    co-occurrence: a run asking for adaptive clipping or spectral item tables is 422, not a
    run that silently keeps C fixed or trains its item tables."""
    client = aggregator(population=4)
    register(client, IDS)
    r = client.post("/v1/runs", json={**RUN, field: value}, headers=operator_headers())
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_config"
    assert field in r.json()["detail"]
    assert client.get("/v1/runs/current/history").json()["run_id"] is None
