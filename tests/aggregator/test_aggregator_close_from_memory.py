"""Closing a FilmTrust-size round (2,059 items, 122 updates) uses the updates decoded at upload
time: nothing is decoded again from the database. How fast it closes is measured by
``bench/aggregator_ingest.py`` (``round_close``), not asserted here."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from fedrecgel.model import ModelConfig
from harness.aggregator import AggregatorFactory
from services.aggregator.__main__ import configure_process
from tests.support.aggregator import (
    bearer,
    current_cohort,
    post_run,
    post_updates,
    random_update,
    register,
    service_of,
)

FILMTRUST = ModelConfig(n_items=2059, kind="ncf", factor=32, layers=3)


@pytest.fixture
def server_process_settings() -> Iterator[None]:
    """Torch threads as ``python -m services.aggregator`` sets them, restored afterwards."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_filmtrust_size_round_closes_from_memory(
    aggregator: AggregatorFactory,
    server_process_settings: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="services.aggregator")
    client = aggregator(max_body_bytes=256 * 1024 * 1024)
    configure_process(service_of(client).settings)
    token = register(client, list(range(1220)))
    run = {"n_items": 2059, "rounds": 2, "fraction": 0.1, "seed": 0}
    post_run(client, run)
    cohort = current_cohort(client, bearer(token))
    assert len(cohort) == 122
    rng = np.random.default_rng(0)
    updates = [random_update(FILMTRUST, c, rng, n_rows=85) for c in cohort]
    for start in range(0, 122, 41):
        r = post_updates(client, token, 1, updates[start : start + 41])
        assert r.status_code == 200, r.text
    assert client.get("/v1/rounds/1").json()["state"] == "closed"
    registry = client.app.state.metrics.registry  # type: ignore[attr-defined]
    assert registry.get_sample_value("fedrec_agg_round_close_seconds_count") == 1
    decoded = [r for r in caplog.records if "stored updates" in r.getMessage()]
    assert decoded == []  # every update came from memory
    r = client.get("/v1/models/latest", headers=bearer(token))
    assert r.status_code == 200 and r.headers["X-Model-Version"] == "1"
