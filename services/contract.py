"""The run contract shared by the aggregator and the client workers.

The aggregator validates a run's configuration strictly when an operator starts it; workers
read the same model back from ``GET /v1/rounds/current`` (tolerating fields added later).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedrecgel.model import ModelConfig
from fedrecgel.sam import SAMConfig
from fedrecgel.strategy import OptimizerName, Weighting


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
