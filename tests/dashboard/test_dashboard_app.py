"""The dashboard service in process, reading a real in-process aggregator: the page and its
run form, the live state with ETag, operator actions refused without the operator token (by
the aggregator, whatever the page shows), and the local Swagger UI of every service."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from fedrecgel.config import SIMULATOR_ONLY
from fedrecgel.presets import FIXED_PRIVATE_CLIP, PRESETS_FILE, stored
from fedrecgel.run_config import RunConfig
from services.aggregator.app import create_app as create_aggregator
from services.dashboard.app import create_app
from services.dashboard.settings import DashboardSettings
from services.dashboard.upstream import counters
from tests.support.aggregator import make_settings, operator_headers, register, sqlite_url

READER = "test-reader-token-5f1c9a7e2b"
PRIVACY_SETTINGS = ("secure_aggregation", "sampling", "target_epsilon")


@pytest.fixture
def agg(tmp_path: Path) -> Iterator[TestClient]:
    """A started in-process aggregator with a reader token."""
    app = create_aggregator(make_settings(sqlite_url(tmp_path), reader_token=READER))
    with TestClient(app) as client:
        yield client


class Routed(httpx.AsyncBaseTransport):
    """Host ``aggregator`` is the in-process aggregator; every other host refuses to connect."""

    def __init__(self, agg: TestClient) -> None:
        self.agg = httpx.ASGITransport(app=agg.app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "aggregator":
            return await self.agg.handle_async_request(request)
        raise httpx.ConnectError("connection refused", request=request)


def dashboard(
    agg: TestClient, transport: httpx.AsyncBaseTransport | None = None, **overrides: Any
) -> TestClient:
    """The dashboard over ``agg`` (its ASGI app, reached through ``transport``, by default
    :class:`Routed`)."""
    values: dict[str, Any] = {
        "environment": "test",
        "aggregator_url": "http://aggregator",
        "aggregator_token": READER,
        "recommend_url": None,
        "poll_interval_s": 0.001,  # no snapshot is reused across the calls of a test
    }
    settings = DashboardSettings(**{**values, **overrides})
    app = create_app(settings, transport=transport or Routed(agg))
    return TestClient(app, base_url="http://127.0.0.1:8704")


def test_the_page_is_self_contained_and_has_every_run_setting(agg: TestClient) -> None:
    with dashboard(agg) as dash:
        r = dash.get("/ui/")
    assert r.status_code == 200
    policy = r.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    html = r.text
    # every script and style sheet comes from the dashboard itself (works offline)
    for url in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert not url.startswith(("http:", "https:", "//")), url
    assert 'src="/static/vendor/chartjs/chart.umd.min.js"' in html
    assert dash.get("/static/vendor/chartjs/chart.umd.min.js").status_code == 200
    # the start form has one input per run setting the aggregator runs, filled with the
    # default preset's value where it sets one, else the core config's default, which each
    # input carries too (adaptive clipping, which the aggregator refuses, has no input)
    for name in SIMULATOR_ONLY:
        assert f'id="cfg-{name}"' not in html, name
    preset = stored(PRESETS_FILE)["default"]["settings"]
    assert {"server_lr", "rounds"} <= set(preset)  # else the preset shows nothing here
    settings = {n: f for n, f in RunConfig.model_fields.items() if n not in SIMULATOR_ONLY}
    for name, field in settings.items():
        tag = re.search(rf'<(?:input|select)[^>]*id="cfg-{name}"[^>]*>', html)
        assert tag is not None, name
        if field.is_required() or field.default is None or isinstance(field.default, str):
            continue
        shown = preset.get(name, field.default)
        if isinstance(field.default, bool):  # a switch: its value's option is selected
            select = re.search(rf'<select[^>]*id="cfg-{name}".*?</select>', html, re.S)
            assert select is not None, name
            assert f'<option value="{str(shown).lower()}" selected>' in select.group(0), name
            continue
        assert f'value="{shown}"' in tag.group(0), name
        assert f'data-default="{field.default}"' in tag.group(0), name
    # the presets the form offers, each with the settings it fills in
    select = re.search(r'<select id="cfg-preset" data-presets="([^"]*)"', html)
    assert select is not None
    offered = json.loads(unescape(select.group(1)))
    assert list(offered)[:3] == ["default", "paper", "private"] and offered["paper"] == {}
    assert offered["default"] == preset and "tuned-amazon-video" in offered
    assert offered["private"]["dp_clip"] == FIXED_PRIVATE_CLIP
    assert "dp_clip_quantile" not in offered["private"]
    # the privacy settings have a group of their own, after the training settings
    privacy = html.index("<legend>Privacy: differential privacy and secure aggregation</legend>")
    for name in settings:
        after = html.index(f'id="cfg-{name}"') > privacy
        assert after == (name.startswith(("dp_", "secagg_")) or name in PRIVACY_SETTINGS), name
    # each input names its help and its error message (filled when a start is refused)
    assert 'aria-describedby="cfg-dp_noise-help cfg-dp_noise-error"' in html
    assert 'id="cfg-dp_noise-error"' in html
    # the overview has the privacy facts, and the chart of epsilon per round
    for element_id in ("ov-eps", "ov-eps-target", "ov-privacy", "chart-eps"):
        assert f'id="{element_id}"' in html, element_id
    # the operator token input has no name: a form submitted without the script sends nothing
    token_input = re.search(r'<input[^>]*id="op-token"[^>]*>', html)
    assert token_input is not None and "name=" not in token_input.group(0)


def test_state_has_an_etag_and_changes_when_the_run_does(agg: TestClient) -> None:
    with dashboard(agg) as dash:
        first = dash.get("/ui/api/state")
        assert first.status_code == 200
        body = first.json()
        assert body["aggregator"]["ok"] and body["run"] == {"state": "idle"}
        etag = first.headers["etag"]
        again = dash.get("/ui/api/state", headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
        register(agg, [0, 1, 2, 3])
        config = RunConfig(n_items=50, rounds=3).model_dump(mode="json")
        assert agg.post("/v1/runs", json=config, headers=operator_headers()).status_code == 201
        changed = dash.get("/ui/api/state", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    state = changed.json()
    assert state["registered"] == 4
    run = state["run"]
    assert run["state"] == "open" and run["round_id"] == 1 and run["config"]["rounds"] == 3
    assert run["size"]["parameters"] > 0 and run["size"]["bytes"] == 4 * run["size"]["parameters"]
    assert state["round"]["cohort_size"] == run["cohort_size"] > 0
    assert state["round"]["updates_received"] == 0
    assert state["counters"]["rounds_closed"] == 0
    # no DP: the run takes its configured rounds, no delta, no noise
    assert state["privacy"] == {"planned_rounds": 3, "delta": None, "noise_multiplier": None}


def test_state_carries_the_privacy_plan_of_a_dp_run(agg: TestClient) -> None:
    register(agg, list(range(8)))
    config = RunConfig(n_items=50, rounds=40, fraction=0.5, target_epsilon=2.0).model_dump(
        mode="json"
    )
    assert agg.post("/v1/runs", json=config, headers=operator_headers()).status_code == 201
    history = agg.get("/v1/runs/current/history").json()
    with dashboard(agg) as dash:
        state = dash.get("/ui/api/state").json()
    # calibrated from the target (no dp_noise): every configured round fits, delta 1/8
    assert state["privacy"] == {
        "planned_rounds": 40,
        "delta": 1 / 8,
        "noise_multiplier": history["noise_multiplier"],
    }
    assert history["noise_multiplier"] > 0 and history["delta"] == 1 / 8
    assert state["run"]["config"]["target_epsilon"] == 2.0


def test_a_refused_dp_configuration_is_passed_on_with_the_field_named(agg: TestClient) -> None:
    register(agg, list(range(8)))
    config = RunConfig(n_items=50, rounds=3).model_dump(mode="json")
    with dashboard(agg) as dash:
        for bad, field in (
            ({"dp_noise": -1.0}, "dp_noise"),
            ({"dp_delta": 1.5}, "dp_delta"),
            ({"dp_mode": "local"}, "dp_mode"),
            ({"dp_noise": 0.05, "target_epsilon": 0.01}, "target_epsilon"),
        ):
            r = dash.post("/ui/api/runs", json={**config, **bad}, headers=operator_headers())
            assert r.status_code == 422, r.text
            assert field in r.json()["detail"], r.text
        assert dash.get("/ui/api/state").json()["run"] == {"state": "idle"}


def test_viewers_polling_together_share_one_snapshot(agg: TestClient) -> None:
    with dashboard(agg, poll_interval_s=3600) as dash:
        assert dash.get("/ui/api/state").json()["registered"] == 0
        register(agg, [0, 1])
        # within half a poll period: the same snapshot, the services are not asked again
        assert dash.get("/ui/api/state").json()["registered"] == 0
        # a refused action changes nothing: whoever reaches the page cannot make the services
        # be read more often by sending them (a body the aggregator cannot parse was refused
        # before its token, and re-read the services)
        for headers in ({}, {"Authorization": "Bearer not-the-operator-token"}):
            assert dash.post("/ui/api/runs/current/pause", headers=headers).status_code == 401
            assert dash.get("/ui/api/state").json()["registered"] == 0
        bad = dash.post("/ui/api/runs", content=b"{{", headers={"Content-Type": "application/json"})
        assert bad.status_code == 422, bad.text
        assert (
            dash.post("/ui/api/runs/current/pause", headers=operator_headers()).status_code == 409
        )
        assert dash.get("/ui/api/state").json()["registered"] == 0
        # an action done makes the next poll read again
        config = RunConfig(n_items=50, rounds=3).model_dump(mode="json")
        assert dash.post("/ui/api/runs", json=config, headers=operator_headers()).status_code == 201
        assert dash.get("/ui/api/state").json()["registered"] == 2


def test_a_header_or_body_the_dashboard_cannot_pass_on_is_refused(agg: TestClient) -> None:
    """A non-ASCII Authorization header was a 500 (httpx cannot send it on), and a body under
    another media type was passed on as JSON (a cross-site form post needs no preflight)."""
    with dashboard(agg) as dash:
        for path in ("/ui/api/runs", "/ui/api/runs/current/stop"):
            r = dash.post(path, json={}, headers={"Authorization": "Bearer été".encode()})
            assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
        for path in ("/ui/api/runs", "/ui/api/recommendations"):
            for media in ("text/plain", "application/x-www-form-urlencoded", None):
                headers = {"Content-Type": media} if media else {}
                r = dash.post(path, content=b"{}", headers={**headers, **operator_headers()})
                assert r.status_code == 415, (path, media, r.text)
                assert r.json()["error"] == "unsupported_media_type"
        assert dash.get("/ui/api/state").json()["run"] == {"state": "idle"}


def test_without_the_reader_token_the_state_says_why(agg: TestClient) -> None:
    with dashboard(agg, aggregator_token=None) as dash:
        body = dash.get("/ui/api/state").json()
    assert body["run"] is None and body["aggregator"]["status"] == 401


def test_operator_actions_need_the_operator_token(agg: TestClient) -> None:
    register(agg, [0, 1, 2, 3])
    config = RunConfig(n_items=50, rounds=3).model_dump(mode="json")
    with dashboard(agg) as dash:
        for headers in ({}, {"Authorization": f"Bearer {READER}"}, {"Authorization": "Bearer x"}):
            r = dash.post("/ui/api/runs", json=config, headers=headers)
            assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
            r = dash.post("/ui/api/runs/current/pause", headers=headers)
            assert r.status_code == 401, r.text
        # nothing was started by the refused calls
        assert dash.get("/ui/api/state").json()["run"] == {"state": "idle"}
        r = dash.post("/ui/api/runs", json=config, headers=operator_headers())
        assert r.status_code == 201, r.text
        assert (
            dash.post("/ui/api/runs/current/pause", headers=operator_headers()).json()["state"]
            == "paused"
        )
        assert dash.get("/ui/api/state").json()["round"]["state"] == "paused"
        r = dash.post("/ui/api/runs/current/resume", headers=operator_headers())
        assert r.json()["state"] == "running"
        r = dash.post("/ui/api/runs/current/stop", headers=operator_headers())
        assert r.json()["state"] == "stopped"
        # a bad configuration is the aggregator's 422, passed on
        bad = dash.post("/ui/api/runs", json={**config, "rounds": 0}, headers=operator_headers())
        assert bad.status_code == 422
        assert dash.post("/ui/api/runs/current/delete").status_code == 404


def test_recommendation_panels_refuse_clearly(agg: TestClient) -> None:
    with dashboard(agg) as dash:
        assert dash.get("/ui/api/users/0/recommendations").json()["error"] == "no_workers"
        assert dash.get("/ui/api/users/-1/recommendations").status_code == 422
        assert dash.get("/ui/api/users/0/recommendations?k=0").status_code == 422
        assert dash.post("/ui/api/recommendations", json={}).status_code == 503
        assert dash.get("/ui/api/users/0/training-items").json()["error"] == "no_workers"
        assert dash.get("/ui/api/users/-1/training-items").status_code == 422
        r = dash.get("/ui/api/users/0/recommendations?include_training=maybe")
        assert r.status_code == 422
    with dashboard(agg, worker_urls="http://worker-0:8710") as dash:
        for path in ("recommendations?include_training=true", "training-items"):
            r = dash.get(f"/ui/api/users/0/{path}")
            assert r.status_code == 502 and r.json()["error"] == "upstream_unavailable"
        workers = dash.get("/ui/api/state").json()["workers"]
        assert [w["ok"] for w in workers] == [False]


def test_swagger_ui_is_served_locally(agg: TestClient) -> None:
    with dashboard(agg) as dash:
        for client in (agg, dash):
            html = client.get("/docs").text
            assert "cdn" not in html.lower()
            for url in re.findall(r"(?:src|href)=['\"]([^'\"]+)['\"]", html):
                assert url.startswith("/"), url
                assert client.get(url).status_code == 200, url
            assert client.get("/redoc").status_code == 404


def test_settings_refuse_weak_tokens_and_read_lists() -> None:
    with pytest.raises(ValueError, match="placeholder"):
        DashboardSettings(aggregator_token=SecretStr("changethis"))
    with pytest.raises(ValueError, match="shorter"):
        DashboardSettings(worker_token=SecretStr("short"))
    s = DashboardSettings(worker_urls=" http://a:1/ ,http://b:2", recommend_url="")
    assert s.workers == ["http://a:1", "http://b:2"] and s.recommend_url is None


@pytest.mark.parametrize("urls", ["http://a:1,,http://c:3", ",http://b:2", "http://a:1,"])
def test_an_empty_entry_in_the_shard_ordered_worker_list_is_refused(urls: str) -> None:
    """It was skipped: with 'a,,c' the dashboard took c for shard 1 of 2 and asked it for the
    users of shard 2 of 3."""
    with pytest.raises(ValueError, match="is empty: the list is in shard order"):
        DashboardSettings(worker_urls=urls)


def test_counters_are_read_from_the_exposition() -> None:
    text = (
        "# TYPE fedrec_agg_updates_refused_total counter\n"
        'fedrec_agg_updates_refused_total{reason="unauthorized"} 2.0\n'
        'fedrec_agg_updates_refused_total{reason="round_not_open"} 3.0\n'
        "# TYPE fedrec_agg_rounds_retried_total counter\n"
        "fedrec_agg_rounds_retried_total 1.0\n"
    )
    got = counters(text)
    assert got["updates_refused"] == 5 and got["rounds_retried"] == 1


def test_a_page_under_another_host_name_is_refused_unless_allowed(agg: TestClient) -> None:
    # DNS rebinding: a page elsewhere points its own name at 127.0.0.1 and reads the answers
    with dashboard(agg) as dash:
        for path in ("/ui/", "/ui/api/state", "/ui/api/users/0/training-items"):
            r = dash.get(path, headers={"Host": "rebound.example:8704"})
            assert (r.status_code, r.json()["error"]) == (403, "host_not_allowed"), path
            assert "FEDREC_DASH_ALLOWED_HOSTS" in r.json()["detail"]
        assert dash.get("/ui/api/state", headers={"Host": "localhost:8704"}).status_code == 200
        assert dash.get("/healthz", headers={"Host": "probe"}).status_code == 200
    with dashboard(agg, allowed_hosts="dash.internal") as dash:
        assert dash.get("/ui/api/state", headers={"Host": "dash.internal"}).status_code == 200
        assert dash.get("/ui/api/state", headers={"Host": "other.example"}).status_code == 403
