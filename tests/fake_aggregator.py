"""An in-memory stand-in for the aggregator (docs/API.md), served through httpx.MockTransport.

For the worker's tests only: it keeps everything in dicts, runs the same core pieces the real
aggregator is specified to run (``select_cohort``, ``decode_updates``, the strategy applied to
the updates sorted by client id), records every request, and can inject failures. It is not
the aggregator and does not try to be complete (no deadlines, quorum, pause or metrics).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np

from fedrecgel.cohort import select_cohort
from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.strategy import Strategy, make_strategy
from fedrecgel.uploads import Update
from fedrecgel.wire import WireError, decode_updates, encode_model
from services.client_sim.settings import WorkerSettings
from services.contract import (
    MODEL_VERSION_HEADER,
    CurrentRound,
    ErrorBody,
    RegisterResponse,
    RoundState,
    RunConfig,
    UploadResponse,
    UploadResult,
)
from services.enrolment import enrolment_token, verify_enrolment_token

#: the fake's enrolment secret: :func:`enrolment_for` issues the tokens it accepts
ENROLMENT_SECRET = "fake-aggregator-enrolment-secret"


def enrolment_for(shard: int, shards: int) -> str:
    """The enrolment token of shard ``shard`` of ``shards`` that the fake accepts."""
    return enrolment_token(ENROLMENT_SECRET, shard, shards)


def worker_settings(store_dir: Path, *, enrol: bool = True, **fields: Any) -> WorkerSettings:
    """Settings of a worker of the synthetic dataset with its store in ``store_dir``: shard 0
    of 2 unless ``fields`` say otherwise, holding its shard's enrolment token unless ``enrol``
    is false or ``fields`` name one."""
    values: dict[str, Any] = {
        "shard": 0,
        "shards": 2,
        "dataset": "synthetic",
        "store": str(store_dir / "w.db"),
        **fields,
    }
    if enrol:
        values.setdefault("enrolment_token", enrolment_for(values["shard"], values["shards"]))
    return WorkerSettings(**values)


_UPDATES = re.compile(r"^/v1/rounds/(\d+)/updates$")
_MODEL = re.compile(r"^/v1/models/(latest|\d+)$")


@dataclass
class Recorded:
    """One request the fake answered."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int


@dataclass
class FakeAggregator:
    """A minimal, deterministic aggregator; ``transport()`` gives the httpx transport."""

    run_id: int = 1
    registered: dict[int, str] = field(default_factory=dict)  # client id -> token
    population: int | None = 1_000_000  # client ids are 0 .. population - 1
    config: dict[str, Any] | None = None
    round_id: int | None = None
    attempt: int = 0
    state: RoundState = "idle"
    version: int = 0
    cohort: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    accepted: dict[tuple[int, int], tuple[str, Update]] = field(default_factory=dict)
    uploads: list[tuple[int, list[int], bytes]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)  # statuses to answer before serving
    fail_when: Callable[[httpx.Request], bool] = field(default=lambda r: True)
    models: dict[int, bytes] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    strategy: Strategy | None = None

    # ------------------------------------------------------------------ operator side

    def model_cfg(self) -> ModelConfig:
        """The running model shape."""
        assert self.config is not None
        c = self.config
        return ModelConfig(
            n_items=c["n_items"], kind=c["kind"], factor=c["factor"], layers=c["layers"]
        )

    def start_run(self, **config: Any) -> None:
        """Start a run: version 0 = init_shared, round 1 opens."""
        base = {
            "kind": "ncf",
            "factor": 32,
            "layers": 3,
            "rounds": 3,
            "fraction": 0.1,
            "seed": 0,
            "optimizer": "adam",
            "server_lr": 0.001,
            "weighting": "mean",
            "clip": None,
            "rho_sh": 0.02,
            "rho_ns": 0.02,
            "client_lr": 0.1,
            "n_negatives": 4,
            "chunk_size": 128,
            "deadline_s": 60.0,
            "quorum": 1.0,
            "dataset": "filmtrust",
        }
        self.config = {**base, **config}
        c = self.config
        self.shared = init_shared(self.model_cfg(), c["seed"])
        self.strategy = make_strategy(c["optimizer"], c["server_lr"], c["weighting"], c["clip"])
        self.version = 0
        self.models = {0: encode_model(self.model_cfg(), self.shared, 0)}
        self.accepted = {}
        self._open(1)

    def _open(self, round_id: int) -> None:
        assert self.config is not None
        self.round_id, self.attempt, self.state = round_id, 0, "open"
        ids = np.asarray(sorted(self.registered), dtype=np.int64)
        self.cohort = select_cohort(ids, self.config["fraction"], self.config["seed"], round_id)

    def _close(self) -> None:
        assert self.config is not None and self.strategy is not None
        r = self.round_id
        updates = sorted(
            (u for (rr, _), (_, u) in self.accepted.items() if rr == r), key=lambda u: u.client_id
        )
        self.strategy.round(self.shared, updates)
        self.version += 1
        self.models[self.version] = encode_model(self.model_cfg(), self.shared, self.version)
        assert r is not None
        if r >= self.config["rounds"]:
            self.state = "finished"
        else:
            self._open(r + 1)

    # ------------------------------------------------------------------ HTTP side

    def transport(self) -> httpx.MockTransport:
        """The transport to give an AggregatorClient."""
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one request (and record it)."""
        body = request.read()
        if self.failures and self.fail_when(request):
            resp = _error(self.failures.pop(0), "injected", "injected failure")
        else:
            resp = self._route(request, body)
        self.requests.append(
            Recorded(
                request.method, request.url.path, dict(request.headers), body, resp.status_code
            )
        )
        return resp

    def _owner(self, request: httpx.Request) -> set[int] | None:
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ")
        owned = {c for c, t in self.registered.items() if t == token}
        return owned or None

    def _route(self, request: httpx.Request, body: bytes) -> httpx.Response:
        path, method = request.url.path, request.method
        if method == "POST" and path == "/v1/clients":
            # as specified: a shard enrolment token; ids of its shard within the population,
            # held by no token or by the one the body chose (then it is that token's again)
            auth = request.headers.get("Authorization", "").removeprefix("Bearer ")
            shard = verify_enrolment_token(ENROLMENT_SECRET, auth)
            if shard is None:
                return _error(401, "unauthorized", "registration needs a shard enrolment token")
            if self.population is None:
                return _error(409, "no_population", "the aggregator declares no population")
            payload = json.loads(body)
            ids = [int(c) for c in payload["client_ids"]]
            bad = [c for c in ids if not (0 <= c < self.population and shard.owns(c))]
            if bad:
                return _error(403, "not_your_ids", f"client id {bad[0]} is not yours")
            token = payload.get("token") or secrets.token_hex(8)
            held = [c for c in ids if self.registered.get(c, token) != token]
            if held:
                return _error(409, "clients_held", f"held by another credential: {held}")
            self.registered.update(dict.fromkeys(ids, token))
            answer = RegisterResponse(token=token, client_ids=ids)
            return httpx.Response(201, json=answer.model_dump())
        owned = self._owner(request)
        if owned is None:
            return _error(401, "unauthorized", "no or bad token")
        if method == "GET" and path == "/v1/rounds/current":
            return httpx.Response(200, json=self._current(owned))
        if method == "GET" and (m := _MODEL.match(path)):
            v = self.version if m.group(1) == "latest" else int(m.group(1))
            if v not in self.models:
                return _error(404, "not_found", f"no model version {v}")
            blob = self.models[v]
            etag = f'"{hashlib.sha256(blob).hexdigest()}"'
            headers = {"ETag": etag, MODEL_VERSION_HEADER: str(v)}
            if request.headers.get("If-None-Match") == etag:
                return httpx.Response(304, headers=headers)
            return httpx.Response(200, content=blob, headers=headers)
        if method == "POST" and (m := _UPDATES.match(path)):
            return self._upload(int(m.group(1)), body, owned)
        if method == "POST" and path == "/v1/evaluations":
            self.evaluations.append(json.loads(body))
            return httpx.Response(202, json={"status": "accepted"})
        return _error(404, "not_found", f"{method} {path}")

    def _current(self, owned: set[int]) -> dict[str, Any]:
        if self.config is None:
            return CurrentRound(state="idle").model_dump(mode="json")
        mine = [int(c) for c in self.cohort if int(c) in owned] if self.state == "open" else []
        body = CurrentRound(
            run_id=self.run_id,
            round_id=self.round_id,
            attempt=self.attempt,
            state=self.state,
            model_version=self.version,
            cohort=mine,
            cohort_size=len(self.cohort),
            config=RunConfig.model_validate(self.config),
        )
        return body.model_dump(mode="json")

    def _upload(self, round_id: int, body: bytes, owned: set[int]) -> httpx.Response:
        try:
            decoded = decode_updates(body, self.model_cfg())
        except WireError as err:
            return _error(422, "malformed", str(err))
        if decoded.round_id != round_id:
            return _error(422, "malformed", "body round != path round")
        if self.state != "open" or round_id != self.round_id:
            # like the real aggregator: a lost answer retried after its round closed
            stored = [self.accepted.get((round_id, u.client_id)) for u in decoded.updates]
            if all(
                prev is not None and prev[0] == d
                for prev, d in zip(stored, decoded.digests, strict=True)
            ):
                dup = [
                    UploadResult(client_id=u.client_id, status="duplicate") for u in decoded.updates
                ]
                return httpx.Response(200, json=UploadResponse(results=dup).model_dump())
            return _error(409, "round_not_open", f"round {round_id} is not open")
        cohort = {int(c) for c in self.cohort}
        results = []
        for u, digest in zip(decoded.updates, decoded.digests, strict=True):
            if u.client_id not in owned or u.client_id not in cohort:
                return _error(403, "not_in_cohort", f"client {u.client_id}")
            prev = self.accepted.get((round_id, u.client_id))
            if prev is not None and prev[0] != digest:
                return _error(409, "conflict", f"client {u.client_id} sent another update")
        for u, digest in zip(decoded.updates, decoded.digests, strict=True):
            key = (round_id, u.client_id)
            status: Literal["accepted", "duplicate"] = (
                "duplicate" if key in self.accepted else "accepted"
            )
            self.accepted[key] = (digest, u)
            results.append(UploadResult(client_id=u.client_id, status=status))
        self.uploads.append((round_id, [u.client_id for u in decoded.updates], body))
        current = None
        if all((round_id, int(c)) in self.accepted for c in self.cohort):
            self._close()  # and, like the real aggregator, answer with the round after it
            current = CurrentRound.model_validate(self._current(owned))
        answer = UploadResponse(results=results, current=current)
        return httpx.Response(200, json=answer.model_dump(mode="json"))


def _error(status: int, error: str, detail: str) -> httpx.Response:
    return httpx.Response(status, json=ErrorBody(error=error, detail=detail).model_dump())
