"""The worker's outbound side: a synchronous client of the aggregator's HTTP API (docs/API.md).

Bodies are the wire contract's types (:mod:`services.contract`). Every call goes through
:meth:`AggregatorClient._request`, which retries connection errors, timeouts, 429 and 5xx by the
services' retry policy (:mod:`services.retry`: exponential backoff with jitter, the server's
``Retry-After`` honoured, a total deadline) and maps any other non-2xx answer to :class:`AggregatorCallError` carrying
the server's :class:`~services.contract.ErrorBody`. An upload retry re-sends exactly the same
bytes, so the server's idempotency (same (round, client) digest -> ``"duplicate"``) makes it
safe. The transport is swappable (``transport=``), so tests can run a whole round in one
process against a mock or the real app.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import numpy as np
from torch import Tensor

from fedrecgel import wire
from fedrecgel.model import ModelConfig
from fedrecgel.uploads import Update
from fedrecgel.wire import decode_model, encode_updates
from services.contract import (
    MODEL_VERSION_HEADER,
    CurrentRound,
    EvaluationRequest,
    ItemCountsAck,
    ItemCountsRequest,
    PriorInfo,
    RegisterRequest,
    RegisterResponse,
    RoundInfo,
    SecAggRound,
    ServiceError,
    UploadResponse,
    read_error,
)
from services.retry import RetryPolicy, retry_after_seconds

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class AggregatorCallError(ServiceError):
    """A refused or failed call to the aggregator: HTTP ``status_code`` (0 when no answer
    came) and the server's :class:`~services.contract.ErrorBody` ``code`` and ``detail``."""

    def __init__(
        self, status_code: int, code: str, detail: str, method: str = "", url: str = ""
    ) -> None:
        super().__init__(detail, code, status_code)
        call = f"{method} {url}".strip()
        if status_code == 0:  # no answer came: no status to show
            text = f"{call + ': ' if call else ''}aggregator unreachable ({detail})"
        else:
            text = f"{call} -> {status_code} {code}: {detail}".strip()
        self.args = (text,)
        self.method = method
        self.url = url
        #: for a split upload: client id -> status of the bodies accepted before the refusal
        self.partial: dict[int, str] = {}
        #: seconds the server asked to wait before trying again (its Retry-After), if it did
        self.retry_after_s: float | None = None

    @property
    def retryable(self) -> bool:
        """Whether waiting and trying again may help (no answer, 429 or 5xx)."""
        return self.status_code == 0 or self.status_code in RETRY_STATUS


@dataclass(frozen=True)
class DownloadedModel:
    """A downloaded model version, decoded: its shape, shared parameters, version and ETag."""

    cfg: ModelConfig
    shared: dict[str, Tensor]
    version: int
    etag: str | None


def _error_from(resp: httpx.Response) -> AggregatorCallError:
    """Map a non-2xx answer to an AggregatorCallError with the server's code and detail."""
    body = read_error(resp)
    err = AggregatorCallError(
        resp.status_code, body.error, body.detail, resp.request.method, str(resp.url)
    )
    err.retry_after_s = retry_after_seconds(resp.headers.get("Retry-After"))
    return err


class AggregatorClient:
    """The aggregator's API for one worker (one credential for many client ids)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        retry: RetryPolicy | None = None,
        max_body_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.token = token
        self.retry = retry or RetryPolicy()
        self.max_body_bytes = max_body_bytes
        self._models: dict[str, DownloadedModel] = {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> AggregatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        ok: Sequence[int] = (),
    ) -> httpx.Response:
        """Send one request with retries; return a 2xx (or an ``ok``) answer, else raise."""
        hdrs = dict(headers or {})
        if self.token is not None and "Authorization" not in hdrs:
            hdrs["Authorization"] = f"Bearer {self.token}"

        def attempt() -> httpx.Response:
            try:
                resp = self._http.request(method, path, json=json, content=content, headers=hdrs)
            except httpx.TransportError as err:
                raise AggregatorCallError(
                    0, "unreachable", f"{type(err).__name__}: {err}", method, path
                ) from err
            if resp.is_success or resp.status_code in ok:
                return resp
            raise _error_from(resp)

        return self.retry.call(attempt)

    # ------------------------------------------------------------------ endpoints

    def register(
        self, client_ids: Sequence[int], enrolment_token: str, token: str | None = None
    ) -> str:
        """Register ``client_ids`` with a shard enrolment token (services/enrolment.py) under
        one credential: ``token``, chosen by the caller (asking again is then the same
        registration), else one the aggregator makes; remember and return the client token."""
        # built unchecked: the aggregator is the one that refuses a bad list (422)
        body = RegisterRequest.model_construct(client_ids=[int(c) for c in client_ids])
        payload = body.model_dump(exclude={"token"})
        if token is not None:
            payload["token"] = token
        auth = {"Authorization": f"Bearer {enrolment_token}"}
        resp = self._request("POST", "/v1/clients", json=payload, headers=auth)
        answered = RegisterResponse.model_validate(resp.json()).token
        if token is not None and answered != token:
            raise AggregatorCallError(
                resp.status_code,
                "token_mismatch",
                "the aggregator answered with another client token than the one chosen",
                "POST",
                "/v1/clients",
            )
        self.token = answered
        return answered

    def current_round(self) -> CurrentRound:
        """The current round (state ``idle`` when no run exists)."""
        return CurrentRound.model_validate(self._request("GET", "/v1/rounds/current").json())

    def round_info(self, round_id: int) -> RoundInfo:
        """Public state of one round."""
        return RoundInfo.model_validate(self._request("GET", f"/v1/rounds/{int(round_id)}").json())

    def download_model(self, version: int | Literal["latest"] = "latest") -> DownloadedModel:
        """A model version; an unchanged one (304 on ``If-None-Match``) comes from the cache."""
        path = f"/v1/models/{version if version == 'latest' else int(version)}"
        cached = self._models.get(path)
        headers = {"If-None-Match": cached.etag} if cached and cached.etag else {}
        resp = self._request("GET", path, headers=headers, ok=(304,))
        if resp.status_code == 304:
            if cached is None:
                raise AggregatorCallError(
                    304, "not_modified", "304 without a cached model", "GET", path
                )
            return cached
        cfg, shared, blob_version = decode_model(resp.content)
        header_version = resp.headers.get(MODEL_VERSION_HEADER)
        if header_version is not None and int(header_version) != blob_version:
            raise AggregatorCallError(
                resp.status_code,
                "version_mismatch",
                f"header says {header_version}, body says {blob_version}",
                "GET",
                path,
            )
        if version != "latest" and blob_version != int(version):
            raise AggregatorCallError(
                resp.status_code,
                "version_mismatch",
                f"asked for {version}, got {blob_version}",
                "GET",
                path,
            )
        model = DownloadedModel(cfg, shared, blob_version, resp.headers.get("ETag"))
        # keep only the newest few paths: a worker needs the current version and "latest"
        self._models[path] = model
        while len(self._models) > 4:
            self._models.pop(next(iter(self._models)))
        return model

    def split_bodies(
        self, round_id: int, updates: Sequence[Update]
    ) -> list[tuple[list[int], bytes]]:
        """Encode ``updates`` into bodies of at most ``max_body_bytes`` (a single update that
        alone is larger still goes in a body of its own); each with its client ids."""
        if not updates:
            return []
        if len(updates) > 1:
            # packed by estimated size first, so that each update is encoded about once
            chunks = _pack(updates, self.max_body_bytes)
            if len(chunks) > 1:
                return [b for chunk in chunks for b in self.split_bodies(round_id, chunk)]
        body = encode_updates(round_id, list(updates))
        # the aggregator also bounds the header (names, shapes, the updates' metadata): many
        # updates of a small model make a body that is mostly header
        header = int.from_bytes(body[:8], "little")
        fits = len(body) <= self.max_body_bytes and header <= wire.MAX_HEADER_BYTES
        if fits or len(updates) == 1:
            if len(body) > self.max_body_bytes:
                log.warning(
                    "update of client %d is %d bytes, over the %d budget",
                    updates[0].client_id,
                    len(body),
                    self.max_body_bytes,
                )
            return [([u.client_id for u in updates], body)]
        half = len(updates) // 2
        return self.split_bodies(round_id, updates[:half]) + self.split_bodies(
            round_id, updates[half:]
        )

    def upload(self, round_id: int, updates: Sequence[Update]) -> dict[int, str]:
        """Upload updates of one round (split to the byte budget): client id -> status
        (``accepted`` or ``duplicate``). Raises AggregatorCallError on the first refused body, with
        the statuses of the bodies accepted before it in ``err.partial``."""
        return self.upload_bodies(round_id, self.split_bodies(round_id, updates))

    def upload_bodies(
        self, round_id: int, bodies: Sequence[tuple[list[int], bytes]]
    ) -> dict[int, str]:
        """:meth:`upload` of bodies already encoded by :meth:`split_bodies`."""
        return self.upload_bodies_closing(round_id, bodies)[0]

    def upload_bodies_closing(
        self, round_id: int, bodies: Sequence[tuple[list[int], bytes]]
    ) -> tuple[dict[int, str], CurrentRound | None]:
        """:meth:`upload_bodies`, and the current round the aggregator answered a body with
        when that body closed the round (None: none closed it)."""
        results: dict[int, str] = {}
        current: CurrentRound | None = None
        for _, body in bodies:
            try:
                resp = self._request(
                    "POST",
                    f"/v1/rounds/{int(round_id)}/updates",
                    content=body,
                    headers={"Content-Type": "application/octet-stream"},
                )
            except AggregatorCallError as err:
                err.partial = dict(results)
                raise
            answer = UploadResponse.model_validate(resp.json())
            for entry in answer.results:
                results[entry.client_id] = entry.status
            current = answer.current or current
        return results, current

    def secagg_round(self, round_id: int) -> SecAggRound:
        """Secure aggregation: the round's phase and what this worker's clients need now."""
        resp = self._request("GET", f"/v1/rounds/{int(round_id)}/secagg")
        return SecAggRound.model_validate(resp.json())

    def secagg_send(self, round_id: int, step: str, body: bytes) -> dict[int, str]:
        """Secure aggregation: one body of ``step`` (masked inputs as one ``encode_masked`` or a
        batch of them, the other steps' JSON lists): client id -> ``accepted``, ``duplicate``
        or ``refused`` (a client of a batch of masked inputs refused on its own)."""
        masked = step in ("masked", "masked_b")
        media = "application/octet-stream" if masked else "application/json"
        resp = self._request(
            "POST",
            f"/v1/rounds/{int(round_id)}/secagg/{step}",
            content=body,
            headers={"Content-Type": media},
        )
        return {e.client_id: e.status for e in UploadResponse.model_validate(resp.json()).results}

    def report_evaluation(
        self, version: int, sums: Mapping[str, float], count: int, client_ids: Sequence[int]
    ) -> None:
        """Report metric sums of ``client_ids`` on model ``version`` (federated evaluation)."""
        # built unchecked: the aggregator is the one that refuses a bad report (422)
        body = EvaluationRequest.model_construct(
            model_version=int(version),
            sums={k: float(v) for k, v in sums.items() if k != "count"},
            count=int(count),
            client_ids=[int(c) for c in client_ids],
        )
        self._request("POST", "/v1/evaluations", json=body.model_dump())

    def report_item_counts(
        self, run_id: int, client_ids: Sequence[int], counts: np.ndarray
    ) -> ItemCountsAck:
        """Report how many of ``client_ids`` hold each item (``counts``: one per item) for the
        popularity prior of run ``run_id``; only the items some client holds are sent."""
        items = np.flatnonzero(counts)
        body = ItemCountsRequest.model_construct(
            client_ids=[int(c) for c in client_ids],
            items=items.tolist(),
            counts=counts[items].tolist(),
        )
        path = f"/v1/runs/{int(run_id)}/item-counts"
        return ItemCountsAck.model_validate(
            self._request("POST", path, json=body.model_dump()).json()
        )

    def prior(self, run_id: int) -> PriorInfo:
        """Run ``run_id``'s popularity prior as the aggregator holds it now."""
        resp = self._request("GET", f"/v1/runs/{int(run_id)}/prior")
        return PriorInfo.model_validate(resp.json())


def _estimate(u: Update) -> int:
    """About the bytes of one update in a body: its tensors and their header entries."""
    size = 160  # its entry in the metadata
    for idx, vals in u.rows.values():
        size += idx.numel() * 8 + vals.numel() * 4 + 2 * 96
    for g in u.dense.values():
        size += g.numel() * 4 + 96
    return size


def _pack(updates: Sequence[Update], budget: int) -> list[list[Update]]:
    """Consecutive runs of ``updates`` whose estimated size fits ``budget`` (at least one
    update each)."""
    chunks: list[list[Update]] = [[]]
    used = 0
    for u in updates:
        size = _estimate(u)
        if chunks[-1] and used + size > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(u)
        used += size
    return chunks
