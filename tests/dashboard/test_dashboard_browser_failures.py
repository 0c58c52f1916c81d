"""The dashboard page in a real browser (the system's Chromium, headless) when an answer is not
the happy one: the aggregator stops answering (the run is unknown, not absent, and the page
says its figures are the last known), a wrong or empty operator token (said where the token
is), a run configuration refused on several fields (each input marked with its own message), a
stop (asked for first: it cannot be undone), the dashboard itself not reachable (every panel
says its request got no answer, no uncaught error), and numbers the form accepts written
otherwise (``1e3``, ``5.0``). The dashboard service runs on a loopback port over a fake
aggregator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from harness.browser import LAPTOP, chromium
from harness.dashboard import FakeAggregator
from services.dashboard.app import create_app
from services.dashboard.settings import DashboardSettings
from tests.support.loopback import serve_app

pytestmark = pytest.mark.browser

TOKEN = "the-operator-token-3b8e1f"
#: the aggregator's answer to a configuration with two fields out of bounds
TWO_FIELDS = (
    "body.rounds: Input should be greater than or equal to 1; "
    "body.dp_noise: Input should be greater than or equal to 0"
)

#: the aggregator's counters: 5 rounds retried over the runs since it started
METRICS = "# TYPE fedrec_agg_rounds_retried_total counter\nfedrec_agg_rounds_retried_total 5.0\n"
OPEN_ROUND = {
    "round_id": 4,
    "attempt": 1,
    "state": "open",
    "cohort_size": 2,
    "updates_received": 1,
    "deadline": None,
}
#: the run's state after each operator action
STATES = {"pause": "paused", "resume": "running", "stop": "stopped"}


class Aggregator(FakeAggregator):
    """Three closed rounds; operator calls checked against :data:`TOKEN` (every start is
    refused on two fields); ``down`` refuses every connection."""

    def __init__(self) -> None:
        super().__init__(3)
        self.down = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/metrics":  # the counters since the aggregator started
            return httpx.Response(200, text=METRICS)
        if request.url.path == "/v1/rounds/4":  # the open round: its second attempt
            return httpx.Response(200, json=OPEN_ROUND)
        if request.method != "POST":
            return await super().handle_async_request(request)
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return httpx.Response(
                401, json={"error": "unauthorized", "detail": "operator token required"}
            )
        if request.url.path == "/v1/runs":
            return httpx.Response(422, json={"error": "validation_error", "detail": TWO_FIELDS})
        state = STATES[request.url.path.rsplit("/", 1)[-1]]
        return httpx.Response(200, json={"run_id": 1, "state": state, "round_id": 4})


@contextmanager
def page_over(agg: Aggregator) -> Iterator[tuple[Any, list[str]]]:
    """The dashboard page over ``agg``, live, and the page's uncaught errors."""
    settings = DashboardSettings(
        environment="test",
        aggregator_url="http://aggregator",
        recommend_url="http://recommend",  # refuses to connect; shows the pasted-vector panel
        worker_urls="http://worker",
        poll_interval_s=0.3,
    )
    with (
        serve_app(create_app(settings, transport=agg), timeout_s=30) as url,
        chromium() as browser,
    ):
        context = browser.new_context(viewport=LAPTOP, locale="en-US")
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/ui/")
        page.wait_for_selector("#conn:has-text('Live')")
        page.wait_for_selector("#ov-run:text-is('#1')")
        yield page, errors
        context.close()


def _use_token(page: Any, token: str) -> None:
    page.fill("#op-token", token)
    page.click("#token-form button[type=submit]")


def test_an_aggregator_that_stops_answering_leaves_the_run_unknown_not_absent() -> None:
    agg = Aggregator()
    with page_over(agg) as (page, errors):
        agg.down = True
        page.wait_for_selector("#ov-state:has-text('aggregator: 502 upstream_unavailable')")
        assert page.text_content("#ov-run") == "unknown (no run state from the aggregator)"
        conn = page.text_content("#conn") or ""
        assert "no run state from the aggregator (502" in conn and "last known" in conn
        # the rounds read before stay shown
        assert page.eval_on_selector_all("#versions-table tbody tr", "rs => rs.length") == 3
        agg.down = False
        page.wait_for_selector("#ov-run:text-is('#1')")
        page.wait_for_selector("#conn:not(:has-text('no run state'))")
        assert errors == []


def test_a_wrong_operator_token_is_said_where_the_token_is() -> None:
    with page_over(Aggregator()) as (page, errors):
        _use_token(page, "not-the-operator-token")
        page.click("#op-actions button[data-action=pause]")
        page.wait_for_selector("#op-result:has-text('Refused: 401 unauthorized')")
        assert "refused this tab's operator token" in (page.text_content("#op-state") or "")
        _use_token(page, TOKEN)
        assert page.text_content("#op-state") == "Operator token set for this tab."
        page.click("#op-actions button[data-action=pause]")
        page.wait_for_selector("#op-result:has-text('Done: run #1 is paused')")
        assert page.text_content("#op-state") == "Operator token set for this tab."
        assert errors == []


def test_use_token_with_nothing_typed_says_so() -> None:
    with page_over(Aggregator()) as (page, errors):
        page.click("#token-form button[type=submit]")
        assert page.text_content("#op-state") == (
            "No token typed: type the operator token, then Use token."
        )
        assert page.is_disabled("#op-actions button[data-action=pause]")
        _use_token(page, TOKEN)
        page.fill("#op-token", "   ")
        page.keyboard.press("Enter")
        assert "keeps the operator token it has" in (page.text_content("#op-state") or "")
        assert page.evaluate("sessionStorage.getItem('fedrec-operator-token')") == TOKEN
        assert not page.is_disabled("#op-actions button[data-action=pause]")
        assert errors == []


def test_stop_asks_first_and_sends_nothing_when_declined() -> None:
    with page_over(Aggregator()) as (page, errors):
        _use_token(page, TOKEN)
        sent: list[str] = []
        page.on("request", lambda r: sent.append(r.url) if r.method == "POST" else None)
        asked: list[str] = []

        def answer(accept: bool) -> Any:
            def on(dialog: Any) -> None:
                asked.append(dialog.message)
                dialog.accept() if accept else dialog.dismiss()

            return on

        page.once("dialog", answer(False))
        page.click("#op-actions button[data-action=stop]")
        page.wait_for_selector("#op-result:text-is('Not stopped: run #1 goes on.')")
        assert sent == [] and "Stop run #1 for good?" in asked[0]
        page.once("dialog", answer(True))
        page.click("#op-actions button[data-action=stop]")
        page.wait_for_selector("#op-result:has-text('Done: run #1 is stopped')")
        assert [u.split("/ui/api/")[1] for u in sent] == ["runs/current/stop"]
        # pause and resume are asked for nothing
        page.click("#op-actions button[data-action=pause]")
        page.wait_for_selector("#op-result:has-text('Done: run #1 is paused')")
        assert len(asked) == 2 and errors == []


def test_one_operator_call_at_a_time() -> None:
    with page_over(Aggregator()) as (page, errors):
        _use_token(page, TOKEN)
        held: list[Any] = []
        page.route("**/ui/api/runs/current/pause", lambda r: held.append(r))  # held back
        sent: list[str] = []
        page.on("request", lambda r: sent.append(r.url) if r.method == "POST" else None)
        page.click("#op-actions button[data-action=pause]")
        page.click("#op-actions button[data-action=pause]")
        page.wait_for_selector("#op-result:has-text('Waiting for the answer to pause')")
        page.click("#start-details summary")
        page.click("#start-form button[type=submit]")
        assert [u.split("/ui/api/")[1] for u in sent] == ["runs/current/pause"]
        assert page.get_attribute("#op-actions", "aria-busy") == "true"
        held[0].continue_()
        page.wait_for_selector("#op-result:has-text('Done: run #1 is paused')")
        assert page.get_attribute("#op-actions", "aria-busy") is None
        assert len(sent) == 1 and errors == []


def test_a_configuration_refused_on_two_fields_marks_both() -> None:
    with page_over(Aggregator()) as (page, errors):
        _use_token(page, TOKEN)
        page.click("#start-details summary")
        page.click("#start-form button[type=submit]")
        page.wait_for_selector("#op-result:has-text('Refused: 422 validation_error')")
        for field, message in (
            ("rounds", "Input should be greater than or equal to 1"),
            ("dp_noise", "Input should be greater than or equal to 0"),
        ):
            assert page.get_attribute(f"#cfg-{field}", "aria-invalid") == "true", field
            assert page.text_content(f"#cfg-{field}-error") == message
        result = page.text_content("#op-result") or ""
        assert "rounds: Input" in result and "; dp_noise: Input" in result
        assert "body." not in result
        assert errors == []


def test_requests_the_dashboard_does_not_answer_are_said_in_their_panels() -> None:
    with page_over(Aggregator()) as (page, errors):
        _use_token(page, TOKEN)
        page.route("**/ui/api/**", lambda route: route.abort("connectionrefused"))
        no_answer = "No answer from the dashboard"
        page.once("dialog", lambda d: d.accept())  # stop for good: yes
        page.click("#op-actions button[data-action=stop]")
        page.wait_for_selector(f"#op-result:has-text('{no_answer}')")
        page.click("#rec-form button[type=submit]")
        page.wait_for_selector(f"#rec-status:has-text('{no_answer}')")
        assert page.is_hidden("#rec-table")
        body = {"user": {"user_gmf": [0.0], "user_mlp": [0.0]}, "k": 5}
        page.fill("#recapi-body", json.dumps(body))
        page.click("#recapi-form button[type=submit]")
        page.wait_for_selector(f"#recapi-status:has-text('{no_answer}')")
        page.wait_for_selector("#conn:has-text('Dashboard not reachable')")
        assert errors == []


def test_a_user_id_and_k_the_form_accepts_are_sent_in_plain_digits() -> None:
    with page_over(Aggregator()) as (page, errors):
        asked: list[str] = []

        def worker(route: Any) -> None:
            asked.append(route.request.url.split("/ui/api/", 1)[1])
            items = [{"item": "7", "score": 1.0}] if "recommendations" in asked[-1] else ["3"]
            route.fulfill(json={"model_version": 3, "items": items})

        page.route("**/ui/api/users/**", worker)
        # valid numbers for the form's inputs (integers, step 1), written otherwise
        page.fill("#rec-user", "1e3")
        page.fill("#rec-k", "5.0")
        page.click("#rec-form button[type=submit]")
        page.wait_for_selector("#rec-status:has-text('User 1000: top 1, model v3')")
        assert sorted(asked) == [
            "users/1000/recommendations?k=5&include_training=false",
            "users/1000/training-items",
        ]
        assert errors == []


def test_the_retry_counter_is_said_to_be_the_aggregators_not_the_runs() -> None:
    with page_over(Aggregator()) as (page, errors):
        page.wait_for_selector("#rd-retries:has-text('attempt 1')")
        assert page.text_content("#rd-retries") == (
            "1 retry (attempt 1, counting from 0); 5 retries since the aggregator started"
        )
        assert "since the aggregator started" in page.text_content("dt:has(+ #ov-counters)")
        assert errors == []
