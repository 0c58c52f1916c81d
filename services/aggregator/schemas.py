"""Pydantic request and response bodies of the aggregator API (see docs/API.md)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedrecgel.model import ModelConfig
from fedrecgel.sam import SAMConfig
from fedrecgel.strategy import OptimizerName, Weighting

RoundState = Literal["open", "closed", "paused", "finished", "idle"]
RunState = Literal["running", "paused", "finished", "stopped"]


class RunConfig(BaseModel):
    """Everything that defines a federated run; workers read it from ``/v1/rounds/current``."""

    model_config = ConfigDict(extra="forbid")

    n_items: int = Field(ge=1)
    kind: Literal["ncf", "mf"] = "ncf"
    factor: int = Field(default=32, ge=1)
    layers: int = Field(default=3, ge=1)
    rounds: int = Field(ge=1)
    fraction: float = Field(default=0.1, gt=0.0, le=1.0)
    seed: int = 0
    optimizer: OptimizerName = "adam"
    server_lr: float = Field(default=0.001, gt=0.0)
    weighting: Weighting = "mean"
    clip: float | None = Field(default=None, gt=0.0)
    rho_sh: float = Field(default=0.02, ge=0.0)
    rho_ns: float = Field(default=0.02, ge=0.0)
    client_lr: float = Field(default=0.1, gt=0.0)
    n_negatives: int = Field(default=4, ge=1)
    chunk_size: int = Field(default=128, ge=1)
    deadline_s: float = Field(default=60.0, gt=0.0)
    quorum: float = Field(default=1.0, ge=0.0, le=1.0)
    dataset: str = "filmtrust"

    def model(self) -> ModelConfig:
        """The model shape of this run."""
        return ModelConfig(
            n_items=self.n_items, kind=self.kind, factor=self.factor, layers=self.layers
        )

    def sam(self) -> SAMConfig:
        """The client hyperparameters of this run."""
        return SAMConfig(
            rho_sh=self.rho_sh,
            rho_ns=self.rho_ns,
            client_lr=self.client_lr,
            n_negatives=self.n_negatives,
            chunk_size=self.chunk_size,
        )

    def quorum_count(self, cohort_size: int) -> int:
        """Updates needed to close at the deadline: ceil(quorum * cohort), at least 1."""
        return max(1, math.ceil(self.quorum * cohort_size - 1e-9))


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
