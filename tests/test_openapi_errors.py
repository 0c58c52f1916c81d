"""Every service's OpenAPI document lists the refusals its error handlers and middleware give.

Two walks over each operation of each document (the aggregator, recommend_api, a worker's
device API with and without its device token, the dashboard):

* by shape: an operation with parameters or a body documents 422; one with a JSON body, 415
  (the body sent under another media type); one with a body, 413 (over the body bound); a
  service behind the Host check, 403; behind the device token, 401; every documented refusal
  is an ``ErrorBody`` (not FastAPI's own validation schema);
* by answer: requests built to reach those handlers (the right credential where the service
  has one, then a bad parameter, a JSON body as text/plain, a body over the bound, a foreign
  ``Host``) are answered with a status the operation documents.

A schema-driven fuzzer (tests/fuzz) reports an undocumented status as a conformance failure
only for the requests it happens to generate; this walk asks for each handler on purpose.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr

from services.aggregator.app import create_app as aggregator_app
from services.client_sim.server import create_app as device_app
from services.client_sim.settings import WorkerSettings
from services.client_sim.store import WorkerStore
from services.dashboard.app import create_app as dashboard_app
from services.dashboard.settings import DashboardSettings
from services.recommend_api.app import create_app as recommend_app
from services.recommend_api.ranking import ModelHolder, RankingConfig
from services.recommend_api.settings import Settings as RecommendSettings
from tests.support.aggregator import OPERATOR_TOKEN, make_settings, sqlite_url

BOUND = 4096  # every body bound of the apps below
DEVICE_TOKEN = "openapi-device-token-4c8e1f2a9b7d35"
ERROR_BODY = "#/components/schemas/ErrorBody"
#: answers that are not refusals, or that describe themselves (a health probe's 503)
NOT_CHECKED = {"/healthz"}


@dataclass(frozen=True)
class Service:
    """An app, the header of its credential, and what guards every operation but health."""

    app: FastAPI
    headers: dict[str, str]
    host_check: bool = False
    device_token: bool = False


def _services(tmp: Path) -> dict[str, Service]:
    store = str(tmp / "worker.db")

    def worker(token: SecretStr | None) -> FastAPI:
        settings = WorkerSettings(
            shard=0,
            shards=2,
            dataset="synthetic",
            store=store,
            device_token=token,
            http_max_body_bytes=BOUND,
        )
        return device_app(settings, WorkerStore(Path(store)), ["a", "b"])

    aggregator = make_settings(sqlite_url(tmp), max_body_bytes=BOUND, max_json_bytes=BOUND)
    holder = ModelHolder(RankingConfig(), labels=["a", "b"])
    return {
        "aggregator": Service(
            aggregator_app(aggregator), {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        ),
        "recommend_api": Service(
            recommend_app(RecommendSettings(aggregator_url=None, max_body_bytes=BOUND), holder),
            {},
        ),
        "worker": Service(worker(None), {}, host_check=True),
        "worker+token": Service(
            worker(SecretStr(DEVICE_TOKEN)),
            {"Authorization": f"Bearer {DEVICE_TOKEN}"},
            device_token=True,
        ),
        "dashboard": Service(
            dashboard_app(
                DashboardSettings(aggregator_url="http://127.0.0.1:9", max_body_bytes=BOUND)
            ),
            {},
            host_check=True,
        ),
    }


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Service]:
    return _services(tmp_path_factory.mktemp("openapi"))


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    spec: dict[str, Any]

    @property
    def documented(self) -> set[int]:
        return {int(code) for code in self.spec["responses"]}

    @property
    def params(self) -> list[dict[str, Any]]:
        return [p for p in self.spec.get("parameters", []) if p["in"] in ("path", "query")]

    @property
    def body_types(self) -> list[str]:
        return list((self.spec.get("requestBody") or {}).get("content", {}))

    def url(self, bad: str | None = None) -> str:
        """The path with valid path parameters (``bad``: this one not a number)."""
        path = self.path
        for p in self.params:
            if p["in"] == "path":
                value = "x" if p["name"] == bad else _valid(p["schema"])
                path = path.replace("{" + p["name"] + "}", value)
        query = [f"{p['name']}=x" for p in self.params if p["in"] == "query" and p["name"] == bad]
        return path + ("?" + "&".join(query) if query else "")

    def __str__(self) -> str:
        return f"{self.method.upper()} {self.path}"


def _valid(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return str(schema["enum"][0])
    return "1" if schema.get("type") == "integer" else "value"


def operations(app: FastAPI) -> list[Operation]:
    """The operations of the app's document, health probes aside."""
    return [
        Operation(method, path, spec)
        for path, ops in app.openapi()["paths"].items()
        if path not in NOT_CHECKED and path != "/metrics"
        for method, spec in ops.items()
    ]


def _numeric(param: dict[str, Any]) -> bool:
    return param["schema"].get("type") in ("integer", "number")


def required_codes(op: Operation, service: Service) -> set[int]:
    """What the shared error handlers and middleware can answer for ``op``."""
    codes: set[int] = set()
    if op.params or op.body_types:
        codes.add(422)
    if op.body_types:
        codes.add(413)
    if "application/json" in op.body_types:
        codes.add(415)
    if service.host_check:
        codes.add(403)
    if service.device_token:
        codes.add(401)
    return codes


SERVICE_NAMES = ("aggregator", "recommend_api", "worker", "worker+token", "dashboard")


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_documents_list_the_handlers_refusals_as_error_bodies(
    services: dict[str, Service], name: str
) -> None:
    service = services[name]
    missing: dict[str, set[int]] = {}
    wrong_model: list[str] = []
    for op in operations(service.app):
        if gap := required_codes(op, service) - op.documented:
            missing[str(op)] = gap
        for code, answer in op.spec["responses"].items():
            if int(code) >= 400:
                schema = answer.get("content", {}).get("application/json", {}).get("schema", {})
                if schema.get("$ref") != ERROR_BODY:
                    wrong_model.append(f"{op} {code}: {schema}")
    assert not missing, f"{name}: undocumented refusals {missing}"
    assert not wrong_model, f"{name}: refusals not documented as ErrorBody: {wrong_model}"


def _probes(op: Operation, service: Service) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what, request arguments) of the requests that reach each refusal."""
    headers = dict(service.headers)
    yield "as is", {"url": op.url(), "headers": headers}
    for p in op.params:
        if _numeric(p):
            yield f"{p['name']}=x", {"url": op.url(bad=p["name"]), "headers": headers}
    if "application/json" in op.body_types:
        text = {**headers, "Content-Type": "text/plain"}
        yield "JSON as text/plain", {"url": op.url(), "headers": text, "content": b"{}"}
        yield (
            "no body",
            {"url": op.url(), "headers": {**headers, "Content-Type": "application/json"}},
        )
    if op.body_types:
        big = {**headers, "Content-Type": op.body_types[0]}
        yield (
            "body over the bound",
            {"url": op.url(), "headers": big, "content": b"0" * (BOUND + 1)},
        )
    if service.host_check:
        yield "foreign Host", {"url": op.url(), "headers": {**headers, "Host": "evil.example"}}
    if service.device_token:
        yield "no token", {"url": op.url(), "headers": {}}


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_refusals_given_are_documented(services: dict[str, Service], name: str) -> None:
    service = services[name]
    undocumented: list[str] = []
    seen: set[int] = set()
    with TestClient(service.app, base_url="http://127.0.0.1") as client:
        for op in operations(service.app):
            for what, request in _probes(op, service):
                answer = client.request(op.method.upper(), **request)
                seen.add(answer.status_code)
                if answer.status_code not in op.documented:
                    undocumented.append(f"{op} ({what}): {answer.status_code} {answer.text[:120]}")
    assert not undocumented, f"{name}:\n" + "\n".join(undocumented)
    # the probes reached every handler the first walk asks for (else this one checks little)
    wanted = set().union(*(required_codes(op, service) for op in operations(service.app)))
    assert wanted <= seen, f"{name}: no probe was answered {wanted - seen}"
