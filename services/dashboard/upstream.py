"""What the dashboard reads from the deployment, on the server side: one snapshot of the run
(aggregator: current round, round detail, history, registered clients, counters of
``/metrics``; each worker's health; recommend_api's model), and the pass-through calls of the
recommendation panels and the operator actions.

A part that does not answer is reported as such in the snapshot (``"error"``), never as a
failure of the whole page. Nothing here logs a request body or a header: the operator token
and a pasted user vector go through untouched and unrecorded.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fedrecgel.run_config import RunConfig
from services.dashboard.settings import DashboardSettings
from services.history import HistoryCopy

#: aggregator counters shown on the page (name in /metrics -> key in the snapshot)
COUNTERS = {
    "fedrec_agg_rounds_closed": "rounds_closed",
    "fedrec_agg_rounds_retried": "rounds_retried",
    "fedrec_agg_updates_accepted": "updates_accepted",
    "fedrec_agg_updates_duplicate": "updates_duplicate",
    "fedrec_agg_updates_refused": "updates_refused",
}
HISTORY_PATH = "/v1/runs/current/history"
#: the operator actions the page may forward (path under /v1/runs)
OPERATOR_ACTIONS = ("pause", "resume", "stop")


@dataclass
class Answer:
    """An upstream answer passed on: status and JSON body."""

    status: int
    body: Any


def _unavailable(what: str, err: Exception) -> Answer:
    return Answer(502, {"error": "upstream_unavailable", "detail": f"{what}: {type(err).__name__}"})


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return {"error": "upstream_error", "detail": f"answered {resp.status_code}, not JSON"}


def model_size(config: dict[str, Any]) -> dict[str, int] | None:
    """Shared parameters of a run's model and their float32 bytes (every version of a run
    has the same size), from its configuration."""
    try:
        cfg = RunConfig.model_validate(config)
    except ValueError:
        return None
    n = sum(math.prod(shape) for shape in cfg.model().shared_shapes().values())
    return {"parameters": n, "bytes": 4 * n}


def counters(text: str) -> dict[str, float]:
    """The aggregator counters of a Prometheus text exposition, summed over labels."""
    out = dict.fromkeys(COUNTERS.values(), 0.0)
    for family in text_string_to_metric_families(text):
        key = COUNTERS.get(family.name)
        if key is None:
            continue
        out[key] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return out


class Upstream:
    """HTTP clients of the aggregator, the workers and recommend_api."""

    def __init__(
        self, settings: DashboardSettings, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.settings = settings
        # one snapshot serves every viewer polling within half a poll period of it
        self._cached: tuple[float, dict[str, Any]] | None = None
        self.history = HistoryCopy()  # refreshed under the lock, by one snapshot at a time
        self._lock = asyncio.Lock()
        timeout = settings.timeout_s
        reader = {}
        if settings.aggregator_token is not None:
            reader = {"Authorization": f"Bearer {settings.aggregator_token.get_secret_value()}"}
        self.agg = httpx.AsyncClient(
            base_url=settings.aggregator_url, timeout=timeout, transport=transport
        )
        self.reader_headers = reader
        device = {}
        if settings.worker_token is not None:
            device = {"Authorization": f"Bearer {settings.worker_token.get_secret_value()}"}
        self.workers = [
            httpx.AsyncClient(base_url=u, timeout=timeout, headers=device, transport=transport)
            for u in settings.workers
        ]
        self.rec = (
            None
            if settings.recommend_url is None
            else httpx.AsyncClient(
                base_url=settings.recommend_url, timeout=timeout, transport=transport
            )
        )

    async def aclose(self) -> None:
        """Close every client."""
        for c in [self.agg, *self.workers, *([self.rec] if self.rec else [])]:
            await c.aclose()

    # ------------------------------------------------------------------ the snapshot

    async def snapshot(self) -> dict[str, Any]:
        """The latest snapshot, read again when older than half a poll period: however many
        pages are open, the services are asked about once per half period."""
        max_age = self.settings.poll_interval_s / 2
        async with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] >= max_age:
                self._cached = (time.monotonic(), await self.read_snapshot())
            return self._cached[1]

    async def read_snapshot(self) -> dict[str, Any]:
        """Everything the page shows, read concurrently."""
        run, history, registered, metrics, workers, rec = await asyncio.gather(
            self._get_json(self.agg, "/v1/rounds/current", self.reader_headers),
            self._read_history(),
            self._get_json(self.agg, "/v1/clients/count"),
            self._metrics(),
            asyncio.gather(*(self._get_json(w, "/healthz") for w in self.workers)),
            self._get_json(self.rec, "/livez") if self.rec else _none(),
        )
        if self._held_past(run):
            # the aggregator's run is short of the rounds held: another database under the
            # same run id (the aggregator's storage was replaced); read it from its start
            self.history.forget()
            history = await self._read_history()
        current = None
        if run.status == 200 and run.body.get("round_id") is not None:
            detail = await self._get_json(self.agg, f"/v1/rounds/{run.body['round_id']}")
            current = detail.body if detail.status == 200 else None
        return {
            "aggregator": {"status": run.status, "ok": run.status == 200, "error": _err(run)},
            "run": _run(run.body) if run.status == 200 else None,
            "round": current,
            "history": history.body.get("rounds", []) if history.status == 200 else [],
            "privacy": _privacy(history) if run.status == 200 else None,
            "registered": registered.body.get("registered") if registered.status == 200 else None,
            "counters": metrics,
            "workers": [
                {"shard": i, "url": str(c.base_url), "ok": w.status == 200, **_worker(w)}
                for i, (c, w) in enumerate(zip(self.workers, workers, strict=True))
            ],
            "recommend": None if rec is None else {"ok": rec.status == 200, **_rec(rec)},
        }

    def _held_past(self, run: Answer) -> bool:
        """Whether the history copy holds rounds after the current round of the same run
        (a round closes after it is current: never, unless the aggregator lost them)."""
        if run.status != 200 or not isinstance(run.body, dict):
            return False
        current = run.body.get("round_id")
        same = run.body.get("run_id") == self.history.run_id
        return same and current is not None and self.history.newest > int(current)

    async def _read_history(self) -> Answer:
        """The run's history: the copy held, brought up to date with the rounds closed or
        evaluated since the last poll (a page or two, not the whole history again)."""
        failed: list[Answer] = []

        async def page(after: int) -> dict[str, Any] | None:
            a = await self._get_json(self.agg, HISTORY_PATH, params={"after": str(after)})
            if a.status == 200 and isinstance(a.body, dict):
                return a.body
            failed.append(a)
            return None

        if not await self.history.arefresh(page):
            return failed[-1]
        return Answer(200, self.history.body())

    async def _get_json(
        self,
        client: httpx.AsyncClient,
        path: str,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> Answer:
        try:
            resp = await client.get(path, headers=headers, params=params)
        except httpx.HTTPError as err:
            return _unavailable(path, err)
        return Answer(resp.status_code, _json(resp))

    async def _metrics(self) -> dict[str, float] | None:
        try:
            resp = await self.agg.get("/metrics")
            return counters(resp.text) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    # ------------------------------------------------------------------ pass-through calls

    async def user_recommendations(self, user: int, k: int, include_training: bool) -> Answer:
        """A user's top-k from the worker of its shard, as the user's device asks for it."""
        params = {"k": str(k), "include_training": "true" if include_training else "false"}
        return await self._device_get(user, f"/v1/users/{user}/recommendations", params)

    async def training_items(self, user: int) -> Answer:
        """A user's own training items, from the worker of its shard (the device's side)."""
        return await self._device_get(user, f"/v1/users/{user}/training-items", None)

    async def _device_get(self, user: int, path: str, params: dict[str, str] | None) -> Answer:
        if not self.workers:
            return Answer(503, {"error": "no_workers", "detail": "no worker URL is configured"})
        worker = self.workers[user % len(self.workers)]
        try:
            resp = await worker.get(path, params=params)
        except httpx.HTTPError as err:
            return _unavailable(f"worker {user % len(self.workers)}", err)
        return Answer(resp.status_code, _json(resp))

    async def recommend(self, body: bytes) -> Answer:
        """recommend_api's answer to a pasted request body (a user vector)."""
        if self.rec is None:
            return Answer(503, {"error": "no_recommend_api", "detail": "not configured"})
        try:
            resp = await self.rec.post(
                "/v1/recommendations", content=body, headers={"Content-Type": "application/json"}
            )
        except httpx.HTTPError as err:
            return _unavailable("recommend_api", err)
        return Answer(resp.status_code, _json(resp))

    async def operator(self, path: str, authorization: str | None, body: bytes | None) -> Answer:
        """An operator action, sent with the caller's own Authorization header (the
        aggregator refuses it without the operator token)."""
        headers = {"Content-Type": "application/json"}
        if authorization and not authorization.isascii():  # no token is; httpx cannot send it
            return Answer(401, {"error": "unauthorized", "detail": "unknown token"})
        if authorization:
            headers["Authorization"] = authorization
        try:
            resp = await self.agg.post(path, content=body or b"", headers=headers)
        except httpx.HTTPError as err:
            return _unavailable("aggregator", err)
        if resp.is_success:
            # the next page poll shows the action's effect (a refused action changed nothing:
            # a caller without the token cannot make the services be read again)
            self._cached = None
        return Answer(resp.status_code, _json(resp))


async def _none() -> None:
    return None


def _err(a: Answer) -> str | None:
    if a.status == 200:
        return None
    if isinstance(a.body, dict):
        return f"{a.status} {a.body.get('error', '')}: {a.body.get('detail', '')}"
    return str(a.status)


def _run(body: dict[str, Any]) -> dict[str, Any] | None:
    if body.get("run_id") is None:
        return {"state": "idle"}
    config = body.get("config") or {}
    return {
        k: body.get(k)
        for k in (
            "run_id",
            "round_id",
            "attempt",
            "state",
            "deadline",
            "model_version",
            "cohort_size",
        )
    } | {"config": config, "size": model_size(config)}


def _privacy(history: Answer) -> dict[str, Any] | None:
    """What the history says of the run's privacy: the rounds it takes (fewer than configured
    when a target epsilon stops it), the delta of its epsilons and the noise multiplier."""
    b = history.body if history.status == 200 and isinstance(history.body, dict) else {}
    if b.get("run_id") is None:
        return None
    return {k: b.get(k) for k in ("planned_rounds", "delta", "noise_multiplier")}


def _worker(a: Answer) -> dict[str, Any]:
    b = a.body if isinstance(a.body, dict) else {}
    return {"users": b.get("users"), "registered": b.get("registered"), "error": _err(a)}


def _rec(a: Answer) -> dict[str, Any]:
    b = a.body if isinstance(a.body, dict) else {}
    return {"model_version": b.get("model_version"), "status": b.get("status") or b.get("error")}
