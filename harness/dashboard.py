"""A fake aggregator's long history behind the real dashboard service on a loopback port: the
dashboard's browser tests and ``bench/dashboard_redraw.py`` draw the page over it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from harness.loopback import serve_app
from services.dashboard.app import create_app
from services.dashboard.settings import DashboardSettings

#: the rounds the fake run plans (its config), and the history the browser tests draw
ROUNDS = 100_000
CONFIG = {"n_items": 100, "factor": 4, "layers": 1, "rounds": ROUNDS}


def round_row(rid: int, evaluated: bool = True) -> dict[str, Any]:
    """One closed round of the history (its metrics None while not evaluated)."""
    return {
        "round_id": rid,
        "model_version": rid,
        "n_updates": 2,
        "loss": 1.0 / rid,
        "metrics": {"hr@10": 0.5, "ndcg@10": 0.25} if evaluated else None,
        "closed_at": "2026-01-01T00:00:00Z",
        "seconds": 0.5,
        "epsilon": None,
    }


class FakeAggregator(httpx.AsyncBaseTransport):
    """The aggregator's current round and paged history over rounds held here; every other
    service refuses to connect."""

    def __init__(self, n: int, eval_every: int = 1) -> None:
        """``n`` closed rounds, each evaluated but the newest; with ``eval_every``, only every
        ``eval_every``-th (the run's config says so)."""
        self.eval_every = eval_every
        self.rounds = [
            round_row(rid, evaluated=rid < n and rid % eval_every == 0) for rid in range(1, n + 1)
        ]

    def _history(self, request: httpx.Request) -> dict[str, Any]:
        after = int(request.url.params.get("after", "0"))
        limit = int(request.url.params.get("limit", "1000"))
        page = self.rounds[after : after + limit]  # round ids are 1..n
        done = [r["model_version"] for r in self.rounds if r["metrics"]]
        return {
            "run_id": 1,
            "planned_rounds": ROUNDS,
            "rounds": page,
            "next_after": page[-1]["round_id"] if after + limit < len(self.rounds) else None,
            "evaluated_through": max(done, default=None),
        }

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "aggregator":
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/v1/runs/current/history":
            return httpx.Response(200, json=self._history(request))
        if path == "/v1/rounds/current":
            n = len(self.rounds)
            return httpx.Response(
                200,
                json={
                    "run_id": 1,
                    "round_id": n + 1,
                    "attempt": 0,
                    "state": "open",
                    "deadline": None,
                    "model_version": n,
                    "cohort": [],
                    "cohort_size": 2,
                    "config": {**CONFIG, "eval_every": self.eval_every},
                },
            )
        return httpx.Response(404, json={"error": "not_found", "detail": path})


@contextmanager
def served(agg: FakeAggregator) -> Iterator[str]:
    """The dashboard over ``agg`` on a loopback port; its page's address."""
    settings = DashboardSettings(
        environment="test",
        aggregator_url="http://aggregator",
        recommend_url=None,
        poll_interval_s=0.3,
    )
    app = create_app(settings, transport=agg)
    with serve_app(app, timeout_s=30, log_level="warning") as url:
        yield f"{url}/ui/"
