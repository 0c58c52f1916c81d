"""The dashboard page over a long run (100k closed rounds) in a real browser (the system's
Chromium, headless): the dashboard service, on a loopback port, reads a fake aggregator's
paged history; the page draws a bounded part of it (the newest versions in the table, older
ones on request; the charts at most a few thousand points, the newest rounds exactly), and an
update that brings one new round, or the metrics of one shown round, changes only that
round's row and points: the other rows stay the same DOM nodes. Accessible with the table's
buttons shown (axe-core, WCAG 2.1 A/AA)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from harness.browser import LAPTOP, chromium
from harness.dashboard import ROUNDS, FakeAggregator, round_row, served
from tests.dashboard.test_dashboard_browser import AXE, WCAG

pytestmark = pytest.mark.browser

#: what the page draws at most (dashboard.js: VERSIONS_PAGE, MAX_POINTS, TAIL_POINTS)
PAGE_ROWS, MAX_POINTS, TAIL_POINTS = 50, 2000, 500


# counts the rows added to and removed from the versions table from now on
WATCH = """() => {
    const tb = document.querySelector('#versions-table tbody');
    window.rowChanges = {added: [], removed: 0};
    new MutationObserver((records) => {
        for (const m of records) {
            for (const n of m.addedNodes) window.rowChanges.added.push(n.cells[1].textContent);
            window.rowChanges.removed += m.removedNodes.length;
        }
    }).observe(tb, {childList: true});
    window.keptRows = [...tb.rows];
}"""


def _rows(page: Any) -> list[str]:
    found: list[str] = page.eval_on_selector_all(
        "#versions-table tbody tr", "rows => rows.map(r => r.cells[1].textContent)"
    )
    return found


def _chart(page: Any, canvas: str) -> dict[str, Any]:
    """A chart's labels and its first series, as Chart.js holds them."""
    found: dict[str, Any] = page.evaluate(
        """(id) => { const c = Chart.getChart(document.getElementById(id));
            return {labels: c.data.labels, first: c.data.datasets[0].data}; }""",
        canvas,
    )
    return found


def _wait_rounds(page: Any, n: int) -> None:
    page.wait_for_selector(f"#chart-metrics[data-rounds='{n}']", timeout=120_000)


def test_a_long_history_is_drawn_bounded_and_updated_in_place() -> None:
    agg = FakeAggregator(ROUNDS)
    with served(agg) as url, chromium() as browser:
        context = browser.new_context(viewport=LAPTOP, bypass_csp=True, locale="en-US")
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(url)
        _wait_rounds(page, ROUNDS)
        # bounded: the newest rows, newest first; the charts' points
        assert _rows(page) == [str(r) for r in range(ROUNDS, ROUNDS - PAGE_ROWS, -1)]
        note = page.text_content("#versions-note") or ""
        assert f"newest {PAGE_ROWS} of 100,000 versions" in note
        metrics = _chart(page, "chart-metrics")
        labels = metrics["labels"]
        assert TAIL_POINTS < len(labels) <= MAX_POINTS
        assert page.get_attribute("#chart-metrics", "data-points") == str(len(labels))
        # the newest rounds exactly, older ones evenly, from the first; in round order
        assert labels[-TAIL_POINTS:] == list(range(ROUNDS - TAIL_POINTS + 1, ROUNDS + 1))
        assert labels[0] == 1 and labels == sorted(labels)
        older = labels[:-TAIL_POINTS]
        assert len({b - a for a, b in itertools.pairwise(older)}) == 1  # one stride
        assert metrics["first"][-1] is None and metrics["first"][-2] == 0.5  # not evaluated yet

        # one round more, and the metrics of the round before come: that round's row and the
        # new one are the only rows touched; the oldest shown row leaves
        page.evaluate(WATCH)
        agg.rounds[-1] = round_row(ROUNDS)
        agg.rounds.append(round_row(ROUNDS + 1, evaluated=False))
        _wait_rounds(page, ROUNDS + 1)
        changes = page.evaluate("window.rowChanges")
        assert sorted(changes["added"]) == sorted([str(ROUNDS + 1), str(ROUNDS)])
        assert changes["removed"] == 2  # the old row of round ROUNDS, and the oldest shown
        assert _rows(page) == [str(r) for r in range(ROUNDS + 1, ROUNDS + 1 - PAGE_ROWS, -1)]
        kept = page.evaluate(
            """() => { const rows = [...document.querySelectorAll('#versions-table tbody tr')];
                return window.keptRows.filter((r) => rows.includes(r)).length; }"""
        )
        assert kept == PAGE_ROWS - 2  # every other row is the node it was
        metrics = _chart(page, "chart-metrics")
        assert metrics["labels"][-TAIL_POINTS:] == list(range(ROUNDS + 2 - TAIL_POINTS, ROUNDS + 2))
        assert metrics["first"][-2:] == [0.5, None] and len(metrics["labels"]) <= MAX_POINTS

        # older versions on request, and back
        page.click("#versions-more")
        assert len(_rows(page)) == 2 * PAGE_ROWS and _rows(page)[-1] == str(
            ROUNDS + 2 - 2 * PAGE_ROWS
        )
        page.click("#versions-newest")
        assert len(_rows(page)) == PAGE_ROWS
        page.click("#versions-more")
        # accessible with both buttons shown
        page.add_script_tag(path=str(AXE))
        found = page.evaluate(
            """async (tags) => (await axe.run(document, {runOnly: tags})).violations.map(
                v => ({id: v.id, nodes: v.nodes.map(n => n.target.join(' '))}))""",
            WCAG,
        )
        assert found == []
        assert errors == [], json.dumps(errors)[:2000]
        context.close()


@pytest.mark.parametrize("n", [0, 3])
def test_a_short_history_shows_every_row_and_no_buttons(n: int) -> None:
    agg = FakeAggregator(n)
    with served(agg) as url, chromium() as browser:
        page = browser.new_page()
        page.goto(url)
        page.wait_for_selector("#conn:has-text('Live')")
        _wait_rounds(page, n)
        assert _rows(page) == [str(r) for r in range(n, 0, -1)]
        assert page.is_hidden("#versions-more") and page.is_hidden("#versions-newest")
        assert page.text_content("#versions-note") == ""


def test_a_long_run_that_evaluates_every_10th_round_keeps_evaluated_rounds_in_the_chart() -> None:
    """Before the newest rounds the chart keeps every k-th round (k a power of two): in a run
    that evaluates every 10th round those must include evaluated ones, or the older part of
    the metrics chart is empty."""
    agg = FakeAggregator(ROUNDS, eval_every=10)
    with served(agg) as url, chromium() as browser:
        page = browser.new_context(viewport=LAPTOP, locale="en-US").new_page()
        page.goto(url)
        _wait_rounds(page, ROUNDS)
        metrics = _chart(page, "chart-metrics")
        labels, first = metrics["labels"], metrics["first"]
        assert TAIL_POINTS < len(labels) <= MAX_POINTS
        assert labels[-TAIL_POINTS:] == list(range(ROUNDS - TAIL_POINTS + 1, ROUNDS + 1))
        older = [(r, v) for r, v in zip(labels[:-TAIL_POINTS], first[:-TAIL_POINTS], strict=True)]
        evaluated = [r for r, v in older if v is not None]
        assert len(evaluated) >= len(older) // 10, (len(evaluated), len(older))
        assert all(r % 10 == 0 for r in evaluated)
        assert len({b - a for a, b in itertools.pairwise(r for r, _ in older)}) == 1
