"""Bodies of the aggregator's operator endpoints (docs/API.md); the bodies its clients exchange
with it are the wire contract of :mod:`services.contract`, re-exported here."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from services.contract import (
    CurrentRound,
    ErrorBody,
    EvaluationAck,
    EvaluationRequest,
    HeldIds,
    RegisterRequest,
    RegisterResponse,
    RoundInfo,
    RoundState,
    RunConfig,
    UploadResponse,
    UploadResult,
)

# every body of the aggregator API; those its clients exchange with it are services.contract's
__all__ = [
    "CurrentRound",
    "ErrorBody",
    "EvaluationAck",
    "EvaluationRequest",
    "Health",
    "HealthStatus",
    "History",
    "HistoryRound",
    "RegisterRequest",
    "RegisterResponse",
    "ReleaseRequest",
    "ReleaseResponse",
    "RoundInfo",
    "RoundState",
    "RunConfig",
    "RunStarted",
    "RunState",
    "RunStatus",
    "UploadResponse",
    "UploadResult",
]

RunState = Literal["running", "paused", "finished", "stopped"]
HealthStatus = Literal["ok", "degraded", "error"]


class HistoryRound(BaseModel):
    """One closed round of a run."""

    round_id: int
    model_version: int
    n_updates: int
    loss: float | None
    metrics: dict[str, float] | None
    closed_at: datetime
    seconds: float
    epsilon: float | None = None  # DP runs: privacy spent once this round was released
    #: uploads the robust screen scaled down or capped (norm, sample count or loss above its
    #: multiple of the round's median; docs/API.md); the clients are in the round's row
    n_bounded: int = 0


#: closed rounds in one history answer unless the reader asks for fewer (or more, up to
#: MAX_HISTORY_LIMIT): a page stays well under a megabyte (about 400 bytes a round)
DEFAULT_HISTORY_LIMIT = 1000
MAX_HISTORY_LIMIT = 10_000


class History(BaseModel):
    """The closed rounds of the current run, one page of them (in round order)."""

    run_id: int | None
    rounds: list[HistoryRound]
    #: rounds the run takes: its configured rounds, or fewer when a target epsilon stops it
    planned_rounds: int | None = None
    #: DP runs: the delta every ``epsilon`` is reported at, and the noise multiplier z (the
    #: configured dp_noise, or the one calibrated from target_epsilon); null otherwise
    delta: float | None = None
    noise_multiplier: float | None = None
    #: more closed rounds follow this page: ask again with ``?after=<next_after>``; null when
    #: the page ends at the newest closed round
    next_after: int | None = None
    #: the run's newest model version with metrics; null when none has any yet. Versions
    #: complete their evaluation in version order (each client's reports come in version
    #: order), so a round whose ``model_version`` is at most this and has no ``metrics`` never
    #: gets any: a reader re-reads only rounds after it, once this has moved past them
    evaluated_through: int | None = None


class RunStarted(BaseModel):
    """A freshly started run."""

    run_id: int
    state: RunState
    round_id: int
    model_version: int
    cohort_size: int
    config: RunConfig


class RunStatus(BaseModel):
    """A run's state after an operator action."""

    run_id: int
    state: RunState
    round_id: int | None


class Health(BaseModel):
    """Health of the service and its dependencies."""

    # ok; degraded: Redis (configured) does not answer, rounds still close and models are
    # still published (version events stop: followers poll); error: the database does not answer
    status: HealthStatus
    database: str
    redis: str


class ReleaseRequest(BaseModel):
    """``POST /v1/clients/release`` (operator): clients no credential is to hold any more."""

    model_config = ConfigDict(extra="forbid")

    client_ids: HeldIds


class ReleaseResponse(BaseModel):
    """The released clients: registered still, held by no credential until registered again."""

    released: list[int]
