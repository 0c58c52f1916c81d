"""The same determinism, restart and exactly-once checks against a real PostgreSQL server."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from services.aggregator.app import create_app
from services.aggregator.races import two_instances_close_once
from services.aggregator.scenario import (
    federated_matches_simulator,
    restart_mid_round_matches_simulator,
)
from services.aggregator.testing import FakeClock, make_settings

pytestmark = pytest.mark.postgres


def test_federated_run_on_postgres_equals_the_simulator(postgres_url: str) -> None:
    assert postgres_url.startswith("postgresql+psycopg://")
    federated_matches_simulator(make_settings(postgres_url))


def test_restart_mid_round_on_postgres_resumes_with_acknowledged_updates(
    postgres_url: str,
) -> None:
    restart_mid_round_matches_simulator(lambda: make_settings(postgres_url))


def test_two_instances_on_postgres_close_a_round_once_without_redis(postgres_url: str) -> None:
    clock = FakeClock()
    settings = make_settings(postgres_url)
    with (
        TestClient(create_app(settings, clock=clock)) as a,
        TestClient(create_app(settings, clock=clock)) as b,
    ):
        outcomes = two_instances_close_once(a, b, clock)
    assert sorted(o or "" for o in outcomes) == ["closed", "not_open"]
