"""Every GET route of every service answers HEAD (services/head_requests.py).

HTTP asks a server that answers GET to answer HEAD with that GET's status and headers and no
body. Each GET operation of each document (and ``/docs``, ``/openapi.json``, the vendored
files) is asked both ways through the apps of tests/test_openapi_errors.py; the guards around
the routes (the device token, the operator token, the Host check) refuse a HEAD as they refuse
the GET; the documents list no HEAD operation; and over a real socket a HEAD leaves the
connection fit for the next request (no body sent after the headers).
"""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from services.web_assets import SWAGGER_CSS
from tests.support.loopback import serve_app
from tests.test_openapi_errors import SERVICE_NAMES, Operation, Service, _services

#: headers that may differ between two answers of the same request
VARYING = {"date"}
#: answers whose body (and so length) changes from one request to the next
CHANGING = {"/metrics"}


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Service]:
    return _services(tmp_path_factory.mktemp("head"))


def get_urls(service: Service) -> list[str]:
    """A URL of each GET operation of the document, and the pages the documents leave out."""
    spec = service.app.openapi()
    urls = [
        Operation("get", path, ops["get"]).url()
        for path, ops in spec["paths"].items()
        if "get" in ops
    ]
    return [*urls, "/docs", "/openapi.json", SWAGGER_CSS]


def _same_head(path: str, got: httpx.Response, head: httpx.Response) -> list[str]:
    """How the HEAD answer differs from the GET's (nothing: an empty list)."""
    wrong = []
    if head.status_code != got.status_code:
        wrong.append(f"status {head.status_code}, GET {got.status_code}")
    skip = VARYING | ({"content-length"} if path in CHANGING else set())
    for name in {k.lower() for k in [*got.headers, *head.headers]} - skip:
        if head.headers.get_list(name) != got.headers.get_list(name):
            wrong.append(f"{name}: {head.headers.get(name)!r}, GET {got.headers.get(name)!r}")
    if head.content:
        wrong.append(f"a body of {len(head.content)} bytes")
    return wrong


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_head_answers_as_get_without_the_body(services: dict[str, Service], name: str) -> None:
    service = services[name]
    differ: dict[str, list[str]] = {}
    with TestClient(service.app, base_url="http://127.0.0.1") as client:
        for url in get_urls(service):
            got = client.get(url, headers=service.headers)
            head = client.head(url, headers=service.headers)
            if wrong := _same_head(urlsplit(url).path, got, head):
                differ[url] = wrong
    assert not differ, f"{name}: {differ}"


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_documents_list_no_head_operation(services: dict[str, Service], name: str) -> None:
    spec = services[name].app.openapi()
    heads = [path for path, ops in spec["paths"].items() if "head" in ops]
    assert not heads, heads
    ids = [op["operationId"] for ops in spec["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("name", "path", "headers", "status"),
    [
        ("worker+token", "/v1/users/0/recommendations", {}, 401),
        ("aggregator", "/v1/rounds/current", {}, 401),
        ("aggregator", "/v1/rounds/current", {"Authorization": "Bearer nobody"}, 401),
        ("worker", "/v1/users/0/recommendations", {"Host": "evil.example"}, 403),
        ("dashboard", "/", {"Host": "evil.example"}, 403),
    ],
)
def test_head_is_refused_where_get_is(
    services: dict[str, Service], name: str, path: str, headers: dict[str, str], status: int
) -> None:
    with TestClient(services[name].app, base_url="http://127.0.0.1") as client:
        got = client.get(path, headers=headers)
        head = client.head(path, headers=headers)
    assert got.status_code == head.status_code == status, (got.status_code, head.status_code)
    assert head.headers.get("www-authenticate") == got.headers.get("www-authenticate")
    assert head.content == b""


def test_a_405_names_head_where_it_names_get(services: dict[str, Service]) -> None:
    service = services["recommend_api"]
    with TestClient(service.app, base_url="http://127.0.0.1") as client:
        post_only = next(
            path for path, ops in service.app.openapi()["paths"].items() if set(ops) == {"post"}
        )
        get_only = next(
            path
            for path, ops in service.app.openapi()["paths"].items()
            if set(ops) == {"get"} and "{" not in path
        )
        allowed = client.delete(get_only).headers["allow"]
        assert set(allowed.split(", ")) == {"GET", "HEAD"}, allowed
        # a POST route does not answer HEAD: it is refused as its GET is, naming POST alone
        refused = client.head(post_only)
        assert refused.status_code == 405 and refused.headers["allow"] == "POST"


def test_a_head_over_a_socket_sends_no_body_and_keeps_the_connection(
    services: dict[str, Service],
) -> None:
    with serve_app(services["recommend_api"].app) as base:
        url = urlsplit(base)
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
        try:
            conn.request("GET", "/healthz")
            got = conn.getresponse()
            body = got.read()
            conn.request("HEAD", "/healthz")
            head = conn.getresponse()
            assert head.status == got.status and head.read() == b""
            assert head.getheader("content-length") == str(len(body))
            # were a body sent after the HEAD's headers, this answer would be read from it
            conn.request("GET", "/openapi.json")
            after = conn.getresponse()
            assert after.status == 200 and after.read().startswith(b"{")
        finally:
            conn.close()
