"""The dashboard in a real browser (the system's Chromium, headless) against a live loopback
deployment started by the test (``fedrec up``): the page loads without a console error, the
chart gains points as rounds close, both recommendation panels show what the services' JSON
endpoints answer (the user's training items marked as the worker's device API lists them), a
run without DP says so, operator actions are refused without the operator token and work with
it (a DP run started from the form shows the epsilon of the aggregator's history, a refused
configuration names its field), the token never leaving the tab's session storage.

Screenshots of the main views go to ``$FEDREC_DASHBOARD_SCREENSHOTS`` when set (the README's
come from ``FEDREC_DASHBOARD_SCREENSHOTS=docs/img``), else to the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.browser import LAPTOP, PHONE, chromium
from harness.loopback import free_port
from harness.procs import fedrec_up, spawned, wait_for_text
from services.client_sim.store import WorkerStore

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ROUNDS = 8
#: the DP run started from the form: noise multiplier and target epsilon (about 19 rounds)
DP_NOISE, TARGET_EPS = "1.0", "20"
#: axe-core (MPL-2.0), the accessibility rules engine, vendored for the tests only
AXE = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"
WCAG = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]


def _until(what: str, cond: Callable[[], Any], timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout_s:.0f}s: {what}")


def _screenshot_dir(tmp_path: Path) -> Path:
    out = Path(os.environ.get("FEDREC_DASHBOARD_SCREENSHOTS") or tmp_path / "img")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _accessibility_violations(browser: Any, url: str, viewport: dict[str, int]) -> list[Any]:
    """axe-core's WCAG 2.1 A/AA violations of the page with every panel open (operator
    controls enabled by a token that is never sent, the start form unfolded). The page's
    policy admits no injected script, so this context alone bypasses it."""
    context = browser.new_context(viewport=viewport, bypass_csp=True)
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#conn:has-text('Live')")
    page.fill("#op-token", "only-to-enable-the-controls")
    page.click("#token-form button[type=submit]")
    page.click("#start-details summary")
    page.add_script_tag(path=str(AXE))
    found: list[Any] = page.evaluate(
        """async (tags) => (await axe.run(document, {runOnly: tags})).violations.map(
            v => ({id: v.id, impact: v.impact, nodes: v.nodes.map(n => n.target.join(' '))}))""",
        WCAG,
    )
    context.close()
    return found


def _cells(page: Any, selector: str) -> list[str]:
    found: list[str] = page.eval_on_selector_all(selector, "cs => cs.map(c => c.textContent)")
    return found


def _shown_epsilon(page: Any) -> float | None:
    """The epsilon the overview shows (its text, 4 significant digits), None without one."""
    m = re.match(r"ε = (\S+) at δ = ", page.text_content("#ov-eps") or "")
    return None if m is None else float(m.group(1))


def test_dashboard_in_a_browser(tmp_path: Path) -> None:
    agg, rec, http0, dash = free_port(), free_port(), free_port(2), free_port()
    workdir, log_path = tmp_path / "up", tmp_path / "up.log"
    shots = _screenshot_dir(tmp_path)
    args = fedrec_up(
        "--rounds", str(ROUNDS), "--workdir", str(workdir), "--aggregator-port", str(agg),
        "--recommend-port", str(rec), "--worker-http-port", str(http0),
        "--dashboard-port", str(dash), "--keep-running",
    )  # fmt: skip
    url = f"http://127.0.0.1:{dash}/ui/"
    with (
        chromium() as browser,
        log_path.open("w") as log,
        spawned(args, log, env={**os.environ, "COLUMNS": "200"}) as proc,
    ):
        wait_for_text(log_path, f"dashboard: {url}", proc, timeout_s=300)
        context = browser.new_context(viewport=LAPTOP)
        page = context.new_page()
        load_errors: list[str] = []
        script_errors: list[str] = []
        page.on("console", lambda m: load_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: script_errors.append(str(e)))
        page.goto(url)
        page.wait_for_selector("#conn:has-text('Live')")
        assert load_errors == [] and script_errors == []

        # the chart gains points as rounds close, without reloading the page
        def points() -> int:
            return int(page.get_attribute("#chart-metrics", "data-points") or 0)

        first = _until("a first closed round on the chart", points, timeout_s=400)
        _until("another closed round on the chart", lambda: points() > first, timeout_s=300)
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
        _until("half the run on the chart", lambda: points() >= ROUNDS // 2, timeout_s=400)
        page.screenshot(path=str(shots / "dashboard-live.png"), full_page=True)
        phone = context.new_page()
        phone.set_viewport_size(PHONE)
        phone.goto(url)
        phone.wait_for_selector("#conn:has-text('Live')")
        # readable at phone width: nothing wider than the screen but the scrolling tables
        assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        phone.screenshot(path=str(shots / "dashboard-phone.png"), full_page=True)
        phone.close()
        # accessible at both widths (labels, contrast, names, roles, focusable scroll regions)
        for viewport in (LAPTOP, PHONE):
            assert _accessibility_violations(browser, url, viewport) == [], viewport
        # keyboard: the first Tab reaches the skip link
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.className") == "skip"

        text = wait_for_text(log_path, "Services are running", proc, timeout_s=600)
        assert f"top-10 from recommend_api, model v{ROUNDS}" in text
        _until("every round on the chart", lambda: points() == ROUNDS)
        # a run without DP says so, and its epsilon chart stays empty
        assert page.text_content("#ov-eps") == "no differential privacy"
        assert "no differential privacy" in (page.text_content("#ov-privacy") or "")
        assert page.get_attribute("#chart-eps", "data-points") == str(ROUNDS)
        assert "no differential privacy" in (page.text_content("#chart-eps-caption") or "")

        # the user panel shows what the user's worker answers (its JSON endpoint)
        user = 3  # shard 1
        device = f"http://127.0.0.1:{http0 + 1}/v1/users/{user}"
        worker = httpx.get(f"{device}/recommendations?k=10", timeout=30).json()
        train = httpx.get(f"{device}/training-items", timeout=30).json()["items"]
        assert train
        page.fill("#rec-user", str(user))
        page.fill("#rec-k", "10")
        page.keyboard.press("Enter")  # from the k input: the form is used by keyboard
        page.wait_for_selector(f"#rec-status:has-text('model v{worker['model_version']}')")
        shown = _cells(page, "#rec-table tbody tr td:nth-child(2)")
        assert shown == [it["item"] for it in worker["items"]] and len(shown) == 10
        # the worker left the training items out: none marked, the panel says so and lists
        # them as the worker's device API does
        assert _cells(page, "#rec-table tbody tr.train td:nth-child(2)") == []
        assert "left out by the worker" in page.text_content("#rec-status")
        assert page.text_content("#rec-train-items") == ", ".join(train)
        # ranked with the training items: the marked rows are exactly the training items shown
        k = 100
        worker = httpx.get(
            f"{device}/recommendations?k={k}&include_training=true", timeout=30
        ).json()
        page.fill("#rec-k", str(k))
        page.check("#rec-train")
        page.click("#rec-form button[type=submit]")
        page.wait_for_selector("#rec-status:has-text('among them (marked)')")
        shown = _cells(page, "#rec-table tbody tr td:nth-child(2)")
        assert shown == [it["item"] for it in worker["items"]] and len(shown) == k
        marked = _cells(page, "#rec-table tbody tr.train td:nth-child(2)")
        assert marked == [item for item in shown if item in set(train)]
        assert marked, "a trained model ranks some of the user's training items in its top 100"
        assert f"{len(marked)} training item" in page.text_content("#rec-status")
        page.uncheck("#rec-train")
        page.fill("#rec-k", "10")
        page.click("#rec-form button[type=submit]")
        page.wait_for_selector("#rec-status:has-text('top 10, model')")

        # the pasted-vector panel shows what recommend_api answers for that vector
        store = WorkerStore(workdir / "worker-1.db")
        params = store.load_states([user]).params
        store.close()
        body = {"user": {k: v[0].tolist() for k, v in params.items()}, "k": 5, "exclude": []}
        direct = httpx.post(f"http://127.0.0.1:{rec}/v1/recommendations", json=body).json()
        page.fill("#recapi-body", json.dumps(body))
        page.click("#recapi-form button[type=submit]")
        page.wait_for_selector("#recapi-status:has-text('Top 5')")
        shown = page.eval_on_selector_all(
            "#recapi-table tbody tr td:nth-child(2)", "cells => cells.map(c => c.textContent)"
        )
        assert shown == [it["item"] for it in direct["items"]]

        # without the operator token: the buttons are off, and the API refuses the calls
        assert page.is_disabled("#op-actions button[data-action=pause]")
        for path in ("/ui/api/runs/current/stop", "/ui/api/runs"):
            status = page.evaluate(f"window.fedrecDashboard.operator('{path}', {{}})")
            assert status == 401
        page.wait_for_selector("#op-result:has-text('Refused: 401')")
        # a wrong token is refused by the aggregator too
        page.fill("#op-token", "not-the-operator-token-123")
        page.click("#token-form button[type=submit]")
        page.click("#op-actions button[data-action=pause]")
        page.wait_for_selector("#op-result:has-text('Refused: 401 unauthorized')")

        # with it: start a run from the form, pause, resume, stop
        token = (workdir / "operator.token").read_text().strip()
        page.focus("#op-token")
        page.keyboard.type(token)
        page.keyboard.press("Enter")
        page.click("#start-details summary")
        _until("the catalogue size taken from the run", lambda: page.input_value("#cfg-n_items"))
        page.fill("#cfg-rounds", "500")
        # a refused DP configuration: the answer names the field, which is marked
        page.fill("#cfg-dp_noise", "-1")
        page.click("#start-form button[type=submit]")
        page.wait_for_selector("#op-result:has-text('Refused: 422 validation_error: dp_noise:')")
        assert page.get_attribute("#cfg-dp_noise", "aria-invalid") == "true"
        assert "greater than or equal to 0" in page.text_content("#cfg-dp_noise-error")
        # a DP run: noise multiplier and target epsilon typed into the form
        page.fill("#cfg-dp_noise", DP_NOISE)
        page.fill("#cfg-target_epsilon", TARGET_EPS)
        page.click("#start-form button[type=submit]")
        page.wait_for_selector("#op-result:has-text('Done: run #2 is running')")
        assert page.get_attribute("#cfg-dp_noise", "aria-invalid") is None
        page.wait_for_selector("#ov-run:has-text('#2')")
        history_url = f"http://127.0.0.1:{agg}/v1/runs/current/history"

        def history() -> dict[str, Any]:
            body: dict[str, Any] = httpx.get(history_url, timeout=30).json()
            return body

        _until("a closed round of the DP run", lambda: history()["rounds"], timeout_s=300)
        page.focus("#op-actions button[data-action=pause]")
        page.keyboard.press("Enter")
        page.wait_for_selector("#op-result:has-text('run #2 is paused')")

        # the overview shows the epsilon of the aggregator's history, at its delta
        def same_epsilon() -> dict[str, Any] | None:
            h = history()
            eps = h["rounds"][-1]["epsilon"]
            shown = page.get_attribute("#ov-eps", "data-epsilon")
            return h if shown is not None and float(shown) == eps else None

        h = _until("the history's epsilon on the page", same_epsilon, timeout_s=60)
        assert h["run_id"] == 2 and h["noise_multiplier"] == float(DP_NOISE)
        eps = h["rounds"][-1]["epsilon"]
        assert _shown_epsilon(page) == pytest.approx(eps, rel=1e-3) and eps > 0
        assert f"δ = {h['delta']:.4g}" in page.text_content("#ov-eps")
        planned = h["planned_rounds"]
        assert 1 < planned < 500
        target = page.text_content("#ov-eps-target") or ""
        assert f"ε ≤ {TARGET_EPS}" in target and f"after round {planned} of 500" in target
        privacy = page.text_content("#ov-privacy") or ""
        assert "central DP" in privacy and f"z = {DP_NOISE.rstrip('0').rstrip('.')}" in privacy
        assert f"of {planned}" in (page.text_content("#ov-round") or "")
        _until(
            "the epsilon chart of the DP run",
            lambda: page.get_attribute("#chart-eps", "data-points") == str(len(h["rounds"])),
            timeout_s=60,
        )
        # the overview and the charts: the top of the page
        top = {"x": 0, "y": 0, "width": LAPTOP["width"], "height": LAPTOP["height"]}
        page.screenshot(path=str(shots / "dashboard-privacy.png"), full_page=True, clip=top)
        page.on("dialog", lambda d: d.accept())  # stop asks first: yes
        for action, state, shown_state in (
            ("resume", "running", "open"),
            ("stop", "stopped", "finished"),
        ):
            page.focus(f"#op-actions button[data-action={action}]")
            page.keyboard.press("Enter")
            page.wait_for_selector(f"#op-result:has-text('run #2 is {state}')")
            page.wait_for_selector(f"#ov-state:text-is('{shown_state}')")
        page.screenshot(path=str(shots / "dashboard-operator.png"), full_page=True)

        # the token stayed in the tab: not in a URL, a cookie, local storage or any log
        assert token not in page.url and context.cookies() == []
        assert page.evaluate("JSON.stringify(localStorage)") == "{}"
        assert page.evaluate("sessionStorage.getItem('fedrec-operator-token')") == token
        for logfile in [log_path, *workdir.glob("*.log")]:
            assert token not in logfile.read_text(errors="replace"), logfile
        assert script_errors == []
        context.close()
