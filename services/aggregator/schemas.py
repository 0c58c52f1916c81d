"""Pydantic request and response bodies of the aggregator API (see docs/API.md)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.contract import RunConfig

__all__ = ["RunConfig"]  # re-exported: the run contract shared with the workers

RoundState = Literal["open", "closed", "paused", "finished", "idle"]
RunState = Literal["running", "paused", "finished", "stopped"]


class ErrorBody(BaseModel):
    """Every 4xx/5xx body."""

    error: str
    detail: str


class RegisterRequest(BaseModel):
    """Clients (user indices) to register under one new credential."""

    model_config = ConfigDict(extra="forbid")

    client_ids: list[int] = Field(min_length=1)

    @field_validator("client_ids")
    @classmethod
    def _distinct_non_negative(cls, ids: list[int]) -> list[int]:
        if any(i < 0 for i in ids):
            raise ValueError("client ids must be >= 0")
        if len(set(ids)) != len(ids):
            raise ValueError("client ids must be distinct")
        return sorted(ids)


class RegisterResponse(BaseModel):
    """The credential (shown once) and the clients it holds."""

    token: str
    client_ids: list[int]


class CurrentRound(BaseModel):
    """What a client needs to take part in the current round."""

    run_id: int | None
    round_id: int | None
    attempt: int | None
    state: RoundState
    deadline: datetime | None
    model_version: int | None
    cohort: list[int]
    cohort_size: int
    config: RunConfig | None


class UploadResult(BaseModel):
    """Outcome of one update of an upload body."""

    client_id: int
    status: Literal["accepted", "duplicate"]


class UploadResponse(BaseModel):
    """Outcome of every update of an accepted upload body."""

    results: list[UploadResult]


class EvaluationRequest(BaseModel):
    """Federated evaluation: metric sums over the listed clients, for one model version."""

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


class RoundInfo(BaseModel):
    """Public state of one round (its latest attempt)."""

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


class HistoryRound(BaseModel):
    """One closed round of a run."""

    round_id: int
    model_version: int
    n_updates: int
    loss: float | None
    metrics: dict[str, float] | None
    closed_at: datetime
    seconds: float


class History(BaseModel):
    """Every closed round of the current run."""

    run_id: int | None
    rounds: list[HistoryRound]


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

    status: Literal["ok", "error"]
    database: str
    redis: str
