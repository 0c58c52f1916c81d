"""The history copy of the dashboard and ``fedrec up``: after the first read, a refresh asks
the aggregator only for the rounds closed since (and one page for metrics still missing),
never the whole history again; a replaced run is read from its start."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import pytest

from services.history import HistoryCopy


class FakeHistory:
    """An aggregator's ``GET /v1/runs/current/history?after=`` over rounds held here."""

    def __init__(self, limit: int = 3, says_evaluated: bool = False) -> None:
        self.run_id = 1
        self.limit = limit
        self.says_evaluated = says_evaluated  # the answer has ``evaluated_through``
        self.rounds: list[dict[str, Any]] = []
        self.asked: list[int] = []
        self.down = False

    def close(self, n: int, metrics: bool = True) -> None:
        for _ in range(n):
            rid = len(self.rounds) + 1
            self.rounds.append(
                {
                    "round_id": rid,
                    "model_version": rid,
                    "metrics": {"hr@10": rid / 100} if metrics else None,
                }
            )

    def evaluate(self, round_id: int) -> None:
        self.rounds[round_id - 1]["metrics"] = {"hr@10": round_id / 100}

    def read(self, after: int) -> dict[str, Any] | None:
        self.asked.append(after)
        if self.down:
            return None
        page = [r for r in self.rounds if r["round_id"] > after][: self.limit + 1]
        more = len(page) > self.limit
        page = page[: self.limit]
        body = {
            "run_id": self.run_id,
            "planned_rounds": 100,
            "rounds": [dict(r) for r in page],
            "next_after": page[-1]["round_id"] if more else None,
        }
        if self.says_evaluated:
            done = [r["model_version"] for r in self.rounds if r["metrics"]]
            body["evaluated_through"] = max(done, default=None)
        return body


def _ids(copy: HistoryCopy) -> list[int]:
    return [r["round_id"] for r in copy.rounds]


def test_a_refresh_reads_only_the_rounds_closed_since() -> None:
    agg, copy = FakeHistory(limit=3), HistoryCopy()
    agg.close(7)
    assert copy.refresh(agg.read)
    assert _ids(copy) == list(range(1, 8)) and agg.asked == [0, 3, 6]  # three pages
    assert copy.body()["planned_rounds"] == 100 and copy.body()["next_after"] is None
    agg.asked.clear()
    assert copy.refresh(agg.read)
    assert agg.asked == [7]  # nothing new: one short read, not the history again
    agg.close(2)
    agg.asked.clear()
    copy.refresh(agg.read)
    assert agg.asked == [7] and _ids(copy) == list(range(1, 10))


def test_metrics_that_arrive_late_are_read_a_page_at_a_time() -> None:
    agg, copy = FakeHistory(limit=3), HistoryCopy()
    agg.close(4)
    agg.close(4, metrics=False)  # rounds 5..8 not evaluated yet
    copy.refresh(agg.read)
    for r in agg.rounds[4:6]:
        r["metrics"] = {"hr@10": 0.5}
    agg.asked.clear()
    copy.refresh(agg.read)
    assert agg.asked == [8, 4]  # the new rounds, then one page from the first unevaluated
    assert [r["metrics"] is not None for r in copy.rounds] == [True] * 6 + [False] * 2
    assert _ids(copy) == list(range(1, 9))


def test_a_round_never_evaluated_is_not_read_again_and_later_metrics_arrive() -> None:
    """Every second version evaluated, more than a page of rounds: the odd rounds never get
    metrics and are not read again; metrics that come late, pages beyond the oldest round
    without them, are read once, when ``evaluated_through`` moves past their round."""
    agg, copy = FakeHistory(limit=3, says_evaluated=True), HistoryCopy()
    agg.close(12, metrics=False)
    for rid in range(2, 7, 2):
        agg.evaluate(rid)  # 2, 4, 6 evaluated; 8, 10, 12 to come; odd ones never
    assert copy.refresh(agg.read) and agg.asked == [0, 3, 6, 9]
    agg.asked.clear()
    for _ in range(3):  # nothing evaluated since: no read but the one for new rounds
        copy.refresh(agg.read)
    assert agg.asked == [12] * 3
    agg.evaluate(10)  # late, three pages beyond round 1 (never evaluated)
    agg.asked.clear()
    copy.refresh(agg.read)
    assert agg.asked == [12, 6, 9]  # from round 7, the oldest that could still get metrics
    assert [r["round_id"] for r in copy.rounds if r["metrics"]] == [2, 4, 6, 10]
    agg.evaluate(8)  # older than an evaluated version: never read again (versions complete
    agg.asked.clear()  # in order; the aggregator's workers report in version order)
    copy.refresh(agg.read)
    assert agg.asked == [12]
    agg.close(2, metrics=False)
    agg.evaluate(14)
    agg.asked.clear()
    copy.refresh(agg.read)
    assert agg.asked == [12, 10]  # the new rounds; then rounds 11 and 12, still open
    assert [r["round_id"] for r in copy.rounds if r["metrics"]] == [2, 4, 6, 10, 14]
    agg.asked.clear()
    copy.refresh(agg.read)
    assert agg.asked == [14]


def test_a_replaced_run_is_read_from_its_start() -> None:
    agg, copy = FakeHistory(), HistoryCopy()
    agg.close(5)
    copy.refresh(agg.read)
    agg.run_id, agg.rounds = 2, []
    agg.close(2)
    agg.asked.clear()
    copy.refresh(agg.read)
    assert copy.run_id == 2 and _ids(copy) == [1, 2] and agg.asked == [5, 0]


def test_a_failed_read_keeps_the_copy() -> None:
    agg, copy = FakeHistory(), HistoryCopy()
    agg.close(2)
    copy.refresh(agg.read)
    agg.down = True
    assert copy.refresh(agg.read) is False and _ids(copy) == [1, 2]


def test_the_asynchronous_refresh_reads_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    agg, copy = FakeHistory(limit=2), HistoryCopy()
    agg.close(5)

    async def read(after: int) -> dict[str, Any] | None:
        return agg.read(after)

    assert asyncio.run(copy.arefresh(read)) and _ids(copy) == [1, 2, 3, 4, 5]
    assert agg.asked == [0, 2, 4]


def test_a_reader_of_the_copy_gets_only_the_rounds_new_or_changed_since_its_token() -> None:
    agg, copy = FakeHistory(limit=3), HistoryCopy()
    agg.close(3)
    agg.close(1, metrics=False)
    copy.refresh(agg.read)
    everything, full = copy.since(None)
    assert full and [r["round_id"] for r in everything] == [1, 2, 3, 4]
    token = copy.token
    assert copy.since(token) == ([], False)
    agg.rounds[3]["metrics"] = {"hr@10": 0.9}  # round 4 evaluated, round 5 closed
    agg.close(1)
    copy.refresh(agg.read)
    changed, full = copy.since(token)
    assert not full and [r["round_id"] for r in changed] == [4, 5]
    assert changed[0]["metrics"] == {"hr@10": 0.9}
    for foreign in ("", "x", "nope:1", token.split(":")[0] + ":99", token + "x"):
        assert copy.since(foreign)[1] is True  # not a token of this copy: everything
    agg.run_id, agg.rounds = 2, []  # another run: a token of the old one gets everything
    agg.close(1)
    copy.refresh(agg.read)
    assert copy.since(token) == (copy.rounds, True) and len(copy.rounds) == 1


def test_the_dashboard_reads_the_aggregators_history_incrementally(tmp_path: Any) -> None:
    """Polled again, the dashboard asks only for the rounds after the newest it holds."""
    from fastapi.testclient import TestClient

    from fedrecgel.model import ModelConfig
    from services.aggregator.app import create_app as create_aggregator
    from tests.dashboard.test_dashboard_app import READER, Routed, dashboard
    from tests.support.aggregator import (
        bearer,
        make_settings,
        post_run,
        post_updates,
        random_update,
        register,
        report_sums,
        sqlite_url,
    )

    app = create_aggregator(make_settings(sqlite_url(tmp_path), reader_token=READER))
    with TestClient(app) as agg:
        token = register(agg, [0, 1])
        post_run(agg, {"n_items": 30, "factor": 4, "layers": 1, "rounds": 5, "fraction": 1.0})
        model, rng = ModelConfig(n_items=30, factor=4, layers=1), np.random.default_rng(0)
        updates = [random_update(model, c, rng) for c in (0, 1)]
        assert post_updates(agg, token, 1, updates).status_code == 200
        report = {"model_version": 1, "sums": report_sums(1.0), "count": 2, "client_ids": [0, 1]}
        assert agg.post("/v1/evaluations", json=report, headers=bearer(token)).status_code == 202
        asked: list[str | None] = []

        class Recording(Routed):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                if request.url.path == "/v1/runs/current/history":
                    asked.append(request.url.params.get("after"))
                return await super().handle_async_request(request)

        with dashboard(agg, Recording(agg)) as dash:
            first = dash.get("/ui/api/state").json()
            second = dash.get("/ui/api/state").json()
            since = dash.get(
                "/ui/api/state", params={"history_since": second["history_token"]}
            ).json()
            bad = dash.get("/ui/api/state", params={"history_since": "x" * 65})
    assert (
        [r["round_id"] for r in first["history"]]
        == [1]
        == [r["round_id"] for r in second["history"]]
    )
    assert second["history"][0]["metrics"]["hr@10"] == 0.5
    assert first["history_full"] is True and asked == ["0", "1", "1"]
    # a page that holds the rounds of the token is sent none of them again
    assert since["history"] == [] and since["history_full"] is False
    assert since["history_token"] == second["history_token"]
    assert bad.status_code == 422


def test_a_run_the_aggregator_lost_rounds_of_is_read_again_from_its_start() -> None:
    """The aggregator's storage replaced under a running dashboard (the same run id, fewer
    rounds): the copy is not kept past the run's current round but read from its start."""
    from fastapi.testclient import TestClient

    from harness.dashboard import FakeAggregator
    from services.dashboard.app import create_app
    from services.dashboard.settings import DashboardSettings

    agg = FakeAggregator(5)
    settings = DashboardSettings(
        environment="test",
        aggregator_url="http://aggregator",
        recommend_url=None,
        poll_interval_s=0.001,  # every call reads the services
    )
    app = create_app(settings, transport=agg)
    with TestClient(app, base_url="http://127.0.0.1:8704") as dash:
        first = dash.get("/ui/api/state").json()
        assert [r["round_id"] for r in first["history"]] == [1, 2, 3, 4, 5]
        agg.rounds = agg.rounds[:2]  # run 1 again, in another database: 2 rounds closed
        token = first["history_token"]
        again = dash.get("/ui/api/state", params={"history_since": token}).json()
        later = dash.get("/ui/api/state", params={"history_since": again["history_token"]})
    assert again["run"]["round_id"] == 3
    assert again["history_full"] is True
    assert [r["round_id"] for r in again["history"]] == [1, 2]
    assert later.json()["history"] == [] and later.json()["history_full"] is False
