"""``GET /v1/runs/current/history`` in pages: ``?after=<round>&limit=<n>``, bounded, with
``next_after`` where the next page starts (what the dashboard reads on every poll)."""

from __future__ import annotations

from typing import Any

import pytest

from services.aggregator.schemas import DEFAULT_HISTORY_LIMIT, MAX_HISTORY_LIMIT
from tests.aggregator.started_run import Ctx, make_updates
from tests.support.aggregator import bearer, current_cohort, report_sums


def _close_rounds(ctx: Ctx, n: int) -> None:
    for round_id in range(1, n + 1):
        cohort = current_cohort(ctx.client)
        for c in cohort:
            assert ctx.upload(round_id, make_updates([c], seed=round_id)).status_code == 200
        assert ctx.client.get(f"/v1/rounds/{round_id}").json()["state"] == "closed"


def _evaluate(ctx: Ctx, version: int, hr: float) -> None:
    for token, ids in ((ctx.token, list(range(10))), (ctx.other, list(range(10, 20)))):
        report = {"model_version": version, "sums": report_sums(hr * 10), "count": 10}
        r = ctx.client.post(
            "/v1/evaluations", json={**report, "client_ids": ids}, headers=bearer(token)
        )
        assert r.status_code == 202, r.text


def _page(ctx: Ctx, query: str) -> tuple[list[int], int | None, dict[str, Any]]:
    r = ctx.client.get(f"/v1/runs/current/history{query}")
    assert r.status_code == 200, r.text
    body = r.json()
    return [h["round_id"] for h in body["rounds"]], body["next_after"], body


def test_the_history_comes_in_pages(ctx: Ctx) -> None:
    _close_rounds(ctx, 3)
    _evaluate(ctx, 3, 0.5)
    whole = _page(ctx, "")
    assert whole[:2] == ([1, 2, 3], None)  # a reader that never pages sees it all, as before
    assert whole[2]["planned_rounds"] == 3
    assert _page(ctx, "?limit=2")[:2] == ([1, 2], 2)
    rounds, next_after, body = _page(ctx, "?after=2&limit=2")
    assert (rounds, next_after) == ([3], None)
    assert body["rounds"][0]["metrics"]["hr@10"] == 0.5  # its version's metrics come along
    assert body["planned_rounds"] == 3
    assert _page(ctx, "?after=3")[:2] == ([], None)
    assert _page(ctx, "?after=1&limit=1")[:2] == ([2], 2)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("?limit=0", "limit"),
        (f"?limit={MAX_HISTORY_LIMIT + 1}", "limit"),
        ("?limit=1.5", "limit"),
        ("?after=-1", "after"),
        ("?after=x", "after"),
        (f"?after={2**31}", "after"),
        (f"?after={2**70}", "after"),
    ],
)
def test_a_page_out_of_bounds_is_422(ctx: Ctx, query: str, named: str) -> None:
    r = ctx.client.get(f"/v1/runs/current/history{query}")
    assert r.status_code == 422 and r.json()["error"] == "validation_error", r.text
    assert r.json()["detail"].startswith(f"query.{named}:")


def test_an_unpaged_read_is_one_bounded_page(ctx: Ctx, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = ctx.client.app.state.service.reads  # type: ignore[attr-defined]
    asked: list[tuple[int, int]] = []
    real = reads.history

    def counted(a: int, n: int) -> Any:
        asked.append((a, n))
        return real(a, n)

    monkeypatch.setattr(reads, "history", counted)
    assert ctx.client.get("/v1/runs/current/history").status_code == 200
    assert asked == [(0, DEFAULT_HISTORY_LIMIT)] and DEFAULT_HISTORY_LIMIT <= MAX_HISTORY_LIMIT


def test_the_history_says_the_newest_evaluated_version(ctx: Ctx) -> None:
    """``evaluated_through``: a reader re-reads only rounds after it (metrics complete in
    version order), on every page, whatever rounds the page holds."""
    assert _page(ctx, "")[2]["evaluated_through"] is None  # no round closed yet
    _close_rounds(ctx, 3)
    assert _page(ctx, "")[2]["evaluated_through"] is None
    _evaluate(ctx, 2, 0.5)
    assert _page(ctx, "?after=2")[2]["evaluated_through"] == 2
    _evaluate(ctx, 3, 0.25)
    rounds, _, body = _page(ctx, "?limit=1")
    assert rounds == [1] and body["evaluated_through"] == 3
    assert [r["metrics"] for r in _page(ctx, "")[2]["rounds"]] == [
        None,
        report_sums(0.5),
        report_sums(0.25),
    ]
