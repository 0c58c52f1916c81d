"""The wire contract between the services (docs/API.md).

One definition of every body both sides of an endpoint read or write: the aggregator and
recommend_api answer with these types, the client workers (and recommend_api, for the model
download) send and parse them.
Type names follow the endpoints:

* ``POST /v1/clients``: :class:`RegisterRequest` -> :class:`RegisterResponse`
* ``GET /v1/rounds/current``: :class:`CurrentRound` (the run's config read as an
  :class:`AnnouncedRunConfig`)
* ``GET /v1/rounds/{round_id}``: :class:`RoundInfo`
* ``GET /v1/models/{version|latest}``: a :class:`ModelBlob` (safetensors bytes of
  :func:`fedrecgel.wire.encode_model`, ``ETag`` and :data:`MODEL_VERSION_HEADER` headers)
* ``POST /v1/rounds/{round_id}/updates``: a :func:`fedrecgel.wire.encode_updates` body ->
  :class:`UploadResponse`
* ``GET /v1/rounds/{round_id}/secagg``: :class:`SecAggRound`; ``POST
  /v1/rounds/{round_id}/secagg/{step}``: :mod:`fedrecgel.secagg.messages` bodies ->
  :class:`UploadResponse`
* ``POST /v1/evaluations``: :class:`EvaluationRequest` -> :class:`EvaluationAck`
* ``POST /v1/runs/{run_id}/item-counts``: :class:`ItemCountsRequest` -> :class:`ItemCountsAck`;
  ``GET /v1/runs/{run_id|current}/prior``: :class:`PriorInfo` (the popularity prior)
* ``POST /v1/runs``: :class:`RunConfig`
* ``POST /v1/recommendations`` (recommend_api, called by devices and by the worker's device
  API): :class:`RecommendationRequest` -> :class:`RecommendationResponse`
* every refusal, of every service: :class:`ErrorBody`, raised as a :class:`ServiceError`.

The aggregator validates a run's configuration strictly when an operator starts it; workers
read it back tolerating fields added later (:class:`AnnouncedRunConfig`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

import httpx
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from fedrecgel.run_config import RunConfig as RunConfig  # re-exported: body of POST /v1/runs

RoundState = Literal["open", "closed", "paused", "finished", "idle"]
#: response header of a model download: the version in the body
MODEL_VERSION_HEADER = "X-Model-Version"
#: the longest list a device asks its worker for: one user's recommendations, as the dashboard
#: shows them (recommend_api's own bound, FEDREC_REC_MAX_K, default 10000, is for its other
#: callers' deeper lists; set below this, a k between the two is its 422 k_too_large, passed on)
DEVICE_MAX_K = 1000


# ----------------------------------------------------------------------------- errors


class ErrorBody(BaseModel):
    """Every 4xx/5xx body of every service."""

    error: str
    detail: str


def read_error(resp: httpx.Response) -> ErrorBody:
    """The :class:`ErrorBody` of a refusal; for any other body, ``http_error`` and the reason
    phrase (or the start of a body that is not JSON)."""
    error, detail = "http_error", resp.reason_phrase or ""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = str(body.get("error", error))
        raw = body.get("detail", detail)
        detail = raw if isinstance(raw, str) else str(raw)
    elif resp.content:
        detail = resp.text[:500]
    return ErrorBody(error=error, detail=detail)


class ServiceError(Exception):
    """A refusal answered as :class:`ErrorBody` ``{"error": code, "detail": detail}``.

    Subclasses fix ``status_code`` and ``code``; an instance may override either.
    """

    status_code: int = 400
    code: str = "bad_request"

    def __init__(self, detail: str, code: str | None = None, status_code: int | None = None):
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        if status_code is not None:
            self.status_code = status_code

    def body(self) -> ErrorBody:
        """The answer's body."""
        return ErrorBody(error=self.code, detail=self.detail)


# ----------------------------------------------------------------------------- runs

# ``POST /v1/runs``: :class:`RunConfig`, the run configuration defined (fields, defaults and
# bounds) once in the core, :mod:`fedrecgel.config`.


class AnnouncedRunConfig(RunConfig):
    """The run configuration as ``/v1/rounds/current`` announces it: fields unknown to this
    version are ignored (a worker keeps working with an aggregator that added some)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


# ----------------------------------------------------------------------------- clients


#: a client token a registrant chooses itself (``RegisterRequest.token``): URL-safe base64
#: characters, at least 32 of them (``secrets.token_urlsafe(32)`` gives 43)
CLIENT_TOKEN_PATTERN = r"^[A-Za-z0-9_-]{32,128}$"


def _held_ids(ids: list[int]) -> list[int]:
    """The ids sorted; ValueError for a negative or a repeated one."""
    if any(i < 0 for i in ids):
        raise ValueError("client ids must be >= 0")
    if len(set(ids)) != len(ids):
        raise ValueError("client ids must be distinct")
    return sorted(ids)


#: the clients a credential is to hold (or to hold no more): ids >= 0, at least one, none twice;
#: read sorted
HeldIds = Annotated[list[int], Field(min_length=1), AfterValidator(_held_ids)]


class RegisterRequest(BaseModel):
    """``POST /v1/clients``: clients (user indices) to register under one credential.

    ``token``, optional: the client token the registrant chose (and kept) before asking, so
    that asking again after a lost answer or a crash is the same registration: ids that
    credential holds already are accepted again, never moved (docs/API.md, "Enrolment")."""

    model_config = ConfigDict(extra="forbid")

    client_ids: HeldIds
    token: str | None = Field(default=None, pattern=CLIENT_TOKEN_PATTERN)


class RegisterResponse(BaseModel):
    """The credential (shown once) and the clients it holds."""

    token: str
    client_ids: list[int]


# ----------------------------------------------------------------------------- rounds


class CurrentRound(BaseModel):
    """``GET /v1/rounds/current``: what a client needs to take part in the current round
    (``state`` ``idle`` and nulls when no run exists)."""

    # the defaults are the idle answer's: a reader takes a body without them as idle
    run_id: int | None = None
    round_id: int | None = None
    attempt: int | None = None
    state: RoundState
    deadline: datetime | None = None
    model_version: int | None = None
    cohort: list[int] = Field(default_factory=list)
    cohort_size: int = 0
    config: RunConfig | None = None

    @field_validator("config", mode="before")
    @classmethod
    def _tolerant_config(cls, v: object) -> object:
        # read from JSON: an AnnouncedRunConfig, which ignores fields added later
        return AnnouncedRunConfig.model_validate(v) if isinstance(v, dict) else v


class RoundInfo(BaseModel):
    """``GET /v1/rounds/{round_id}``: public state of one round (its latest attempt)."""

    round_id: int
    attempt: int
    state: Literal["open", "closed", "paused", "failed", "aborted"]
    cohort_size: int
    updates_received: int
    metrics: dict[str, float] | None
    model_version: int | None
    base_version: int
    deadline: datetime
    loss: float | None
    #: the attempt's cohort members without an accepted update, counted by the shard that
    #: enrolled them (``"1/2"``: shard 1 of 2; ``"none"``: registered without a shard
    #: credential); for an open attempt, who has not uploaded yet, for a closed one, whose
    #: clients the round closed without. Empty for a failed or aborted attempt and in a
    #: secure-aggregation run (the uploads are masked, not counted per client)
    missing_by_shard: dict[str, int] = Field(default_factory=dict)


@dataclass(frozen=True)
class ModelBlob:
    """``GET /v1/models/{version}``: one model version of a run as served, the safetensors
    bytes of :func:`fedrecgel.wire.encode_model` and their ETag (the bytes' sha256)."""

    run_id: int
    version: int
    blob: bytes
    etag: str


class UploadResult(BaseModel):
    """Outcome of one update of an upload body. ``refused`` (with the refusal's ``reason``
    code and ``detail``) only in a secure-aggregation batch of masked inputs, whose other
    clients' inputs were taken; a refused plain upload body is refused as a whole."""

    client_id: int
    status: Literal["accepted", "duplicate", "refused"]
    reason: str | None = None
    detail: str | None = None

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        """An accepted or duplicate result answers ``{"client_id", "status"}`` alone (left
        unannotated: the answer's schema stays the model's)."""
        out = handler(self)
        if isinstance(out, dict):
            for key in ("reason", "detail"):
                if out.get(key) is None:
                    out.pop(key, None)
        return out


class UploadResponse(BaseModel):
    """``POST /v1/rounds/{round_id}/updates``: outcome of every update of an accepted body.

    ``current``: when this body was the round's last and the aggregator closed the round while
    answering it, the current round after the close as the caller sees it (what ``GET
    /v1/rounds/current`` answers then), so that the uploader need not poll for the next round;
    null otherwise (and in every secure-aggregation answer).
    """

    results: list[UploadResult]
    current: CurrentRound | None = None


# ----------------------------------------------------------------------------- secure aggregation

#: the phases of a secure-aggregation round attempt, in order (a dense run's first four)
SecAggPhase = Literal["keys", "shares", "masked", "unmask", "masked_b", "unmask_b"]
#: what a client sends in each phase (``POST /v1/rounds/{round_id}/secagg/{step}``)
SecAggStep = Literal["keys", "shares", "masked", "reveal", "masked_b", "reveal_b"]
#: the step a client takes in each phase, and the phase in which each step's message is
#: accepted
STEP_OF_PHASE = {
    "keys": "keys",
    "shares": "shares",
    "masked": "masked",
    "unmask": "reveal",
    "masked_b": "masked_b",
    "unmask_b": "reveal_b",
}
PHASE_OF_STEP = {v: k for k, v in STEP_OF_PHASE.items()}


class SecAggRound(BaseModel):
    """``GET /v1/rounds/{round_id}/secagg``: the phase of a secure-aggregation round attempt
    and what the caller's clients need to take it (:mod:`fedrecgel.secagg.messages` JSON
    documents), with the attempt's whole cohort (the neighbour graph is public): in
    ``shares``, the public keys of their neighbours; in ``masked``, the neighbours' share
    messages addressed to them; in ``unmask``, who survived and who dropped.

    A sparse run (``secure_aggregation=sparse``) runs two protocol instances: A counts the
    clients' items, B masks their updates on the rows of the union U. Its keys and shares
    phases carry both instances' documents (B's tagged ``"instance": "b"``); ``masked`` and
    ``unmask`` are A's; then ``masked_b`` forwards B's shares with U (``union``, sorted item
    ids) and B's public encoding (``length`` values of ``word_bits``-bit words at step
    2^-``scale_bits``), and ``unmask_b`` names B's survivors (those of A's survivors whose
    masked input arrived) and B's dropped."""

    round_id: int
    attempt: int
    phase: SecAggPhase
    deadline: datetime
    cohort: list[int] = Field(default_factory=list)
    messages: list[dict[str, object]] = Field(default_factory=list)
    survivors: list[int] = Field(default_factory=list)
    dropped: list[int] = Field(default_factory=list)
    union: list[int] | None = None
    length: int | None = None
    word_bits: int | None = None
    scale_bits: int | None = None


# ----------------------------------------------------------------------------- evaluation


class EvaluationRequest(BaseModel):
    """``POST /v1/evaluations``: metric sums over the listed clients, for one model version."""

    model_config = ConfigDict(extra="forbid")

    model_version: int = Field(ge=0)
    sums: dict[str, float]
    count: int = Field(ge=1)
    client_ids: list[int] = Field(min_length=1)

    @field_validator("sums")
    @classmethod
    def _finite(cls, sums: dict[str, float]) -> dict[str, float]:
        if not all(math.isfinite(v) for v in sums.values()):
            raise ValueError("metric sums must be finite")
        return sums

    @field_validator("client_ids")
    @classmethod
    def _distinct(cls, ids: list[int]) -> list[int]:
        if len(set(ids)) != len(ids):
            raise ValueError("client ids must be distinct")
        return ids


class EvaluationAck(BaseModel):
    """What an evaluation report did: newly covered clients, repeats ignored, completeness."""

    model_version: int
    accepted: int
    ignored: int
    complete: bool


# ----------------------------------------------------------------------------- popularity prior


class ItemCountsRequest(BaseModel):
    """``POST /v1/runs/{run_id}/item-counts``: how many of the listed clients hold each item in
    their training data (items with a count of 0 left out), once per run and client."""

    model_config = ConfigDict(extra="forbid")

    client_ids: list[int] = Field(min_length=1)
    items: list[int]
    counts: list[int]

    @field_validator("client_ids", "items")
    @classmethod
    def _distinct(cls, ids: list[int]) -> list[int]:
        if len(set(ids)) != len(ids):
            raise ValueError("ids must be distinct")
        return ids


class ItemCountsAck(BaseModel):
    """What a count report did: newly counted clients, repeats ignored, whether the counts now
    cover every registered client (the run's prior is then fixed)."""

    accepted: int
    ignored: int
    complete: bool


class PriorInfo(BaseModel):
    """``GET /v1/runs/{run_id|current}/prior``: the run's popularity prior, the clients'
    summed item counts once they cover every registered client (null before), and the weight
    chosen at the newest evaluated version (null: none chosen; 0: the model alone)."""

    run_id: int
    enabled: bool
    complete: bool
    counted: int
    registered: int
    counts: list[int] | None = None
    weight: float | None = None
    weight_version: int | None = None


# ----------------------------------------------------------------------------- recommendations


class UserVector(BaseModel):
    """The device's own user embedding; used for one answer, never stored or logged.

    Strict: numbers only (a string or a boolean is refused, not converted)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    user_gmf: list[float]
    user_mlp: list[float] | None = None


#: recommend_api's error code for a ``k`` above its bound (``FEDREC_REC_MAX_K``), 422; a
#: worker's device API passes it on as its own 422 (its own bound, 1..1000, may be the higher)
K_TOO_LARGE = "k_too_large"


class RecommendationRequest(BaseModel):
    """``POST /v1/recommendations`` (recommend_api): top-``k`` items for ``user``, leaving out
    the item ids in ``exclude``; ``exact`` skips the candidate index. Strict: ``k`` is a JSON integer (``"10"``, ``true`` and
    ``10.0`` are refused), item ids are strings."""

    model_config = ConfigDict(extra="forbid", strict=True)

    user: UserVector
    k: int = 10
    exclude: list[str] = Field(default_factory=list)
    # rank the whole catalogue with the model instead of re-ranking an index's candidates
    # (the same answer for catalogues small enough to be ranked exactly anyway)
    exact: bool = False


class ScoredItem(BaseModel):
    """One recommended item: its id as recommend_api names it, and its served score (the
    model's logit, plus the popularity prior's term when one is served)."""

    item: str
    score: float


class RecommendationResponse(BaseModel):
    """The ranking, the model version that produced it, and the popularity prior's weight in
    its scores: each score is the model's logit plus ``prior_weight * log(1 + n_item)`` (the
    item's training count over all clients); ``prior_weight`` null: the model's logits alone."""

    model_version: int
    items: list[ScoredItem]
    prior_weight: float | None = None


class TrainingItems(BaseModel):
    """A user's own training items, as recommend_api names items (catalogue order); answered
    by the worker's device API only (the device's side), never sent to the aggregator."""

    user_id: int
    items: list[str]


class UserLookup(BaseModel):
    """A user of a worker's shard found by its id in the data (``GET /v1/users?id=``):
    ``user_id`` is its number in the split, the one the device API's other routes take; ``id``
    is the data's own id (the number in decimal when the worker names items by index)."""

    user_id: int
    id: str
