"""How a request is authenticated: a token the credentials' cache knows is checked on the
event loop without the database; only an unknown one goes to the database (in a worker
thread), and the answers are the same either way."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from harness.aggregator import AggregatorFactory
from services.aggregator.auth import Credentials
from services.aggregator.errors import Unauthorized
from tests.aggregator.started_run import start_run
from tests.support.aggregator import bearer


def _credentials(client: TestClient) -> Credentials:
    creds: Credentials = client.app.state.service.credentials  # type: ignore[attr-defined]
    return creds


def _count_database_lookups(
    monkeypatch: pytest.MonkeyPatch, creds: Credentials
) -> list[threading.Thread]:
    """Record the thread of every call of the database path of ``creds``."""
    calls: list[threading.Thread] = []
    original = creds.authenticate

    def counted(token: str | None) -> object:
        calls.append(threading.current_thread())
        return original(token)

    monkeypatch.setattr(creds, "authenticate", counted)
    return calls


def test_a_cached_token_is_not_looked_up_again(
    aggregator: AggregatorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: every request of a client called the blocking ``authenticate`` in a worker
    thread of its own, even for a token the cache held."""
    ctx = start_run(aggregator())
    creds = _credentials(ctx.client)
    with creds._lock:
        creds._tokens.clear()  # as after a restart: the next request must ask the database
    calls = _count_database_lookups(monkeypatch, creds)
    for _ in range(5):
        r = ctx.client.get("/v1/rounds/current", headers=bearer(ctx.token))
        assert r.status_code == 200, r.text
    assert len(calls) == 1  # the first request, then the cache
    assert calls[0] is not threading.main_thread()  # the database is not read on the loop
    assert r.json()["cohort"] == [c for c in ctx.cohort if c < 10]


def test_unknown_and_missing_tokens_are_refused_alike(
    aggregator: AggregatorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = start_run(aggregator())
    calls = _count_database_lookups(monkeypatch, _credentials(ctx.client))
    unknown = ctx.client.get("/v1/rounds/current", headers=bearer("no-such-token-0123456789"))
    assert unknown.status_code == 401
    assert "unknown token" in unknown.text
    assert len(calls) == 1  # only the database can tell that a token is unknown
    missing = ctx.client.get("/v1/rounds/current")
    assert missing.status_code == 401
    assert "missing bearer token" in missing.text
    assert len(calls) == 1  # no token: refused without the database


def test_known_answers_without_the_database_or_says_it_cannot(
    aggregator: AggregatorFactory,
) -> None:
    ctx = start_run(aggregator())
    creds = _credentials(ctx.client)
    with pytest.raises(Unauthorized):
        creds.known(None)
    caller = creds.known(ctx.client.app.state.service.settings.operator_token)  # type: ignore[attr-defined]
    assert caller is not None and caller.operator
    with creds._lock:
        creds._tokens.clear()
    assert creds.known(ctx.token) is None  # only the database knows it now
    assert creds.authenticate(ctx.token).client_ids == frozenset(range(10))
    cached = creds.known(ctx.token)
    assert cached is not None and cached.client_ids == frozenset(range(10))
