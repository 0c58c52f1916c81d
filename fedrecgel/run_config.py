"""A federated run over a catalogue: :class:`RunConfig`, the body of ``POST /v1/runs``.

Its settings, defaults and bounds are :class:`fedrecgel.config.RunParams`; this adds the
catalogue size and the model shape and client hyperparameters the run implies.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from fedrecgel.config import MAX_ITEMS, RunParams
from fedrecgel.model import ModelConfig
from fedrecgel.rank_fit import RankFit
from fedrecgel.sam import SAMConfig


class RunConfig(RunParams):
    """A run over a catalogue of ``n_items``: the body of ``POST /v1/runs``."""

    n_items: int = Field(ge=1, le=MAX_ITEMS, description="Items in the catalogue.")

    @model_validator(mode="after")
    def _pool_in_catalogue(self) -> RunConfig:
        if self.negative_pool is not None and self.negative_pool > self.n_items:
            raise ValueError(
                f"negative_pool {self.negative_pool} exceeds the catalogue of {self.n_items}"
            )
        return self

    def model(self) -> ModelConfig:
        """The model shape of this run."""
        return model_shape(self, self.n_items)

    def sam(self) -> SAMConfig:
        """The client hyperparameters of this run."""
        return client_hyperparameters(self)

    def rank_fit(self) -> RankFit:
        """How users fit their embeddings to a model before ranking with it."""
        return rank_fit_of(self)


def model_shape(p: RunParams, n_items: int) -> ModelConfig:
    """The model shape of the run settings ``p`` over a catalogue of ``n_items``."""
    return ModelConfig(n_items=n_items, kind=p.kind, factor=p.factor, layers=p.layers)


def client_hyperparameters(p: RunParams) -> SAMConfig:
    """The client hyperparameters of the run settings ``p``."""
    return SAMConfig(
        rho_sh=p.rho_sh,
        rho_ns=p.rho_ns,
        client_lr=p.client_lr,
        n_negatives=p.n_negatives,
        negative_pool=p.negative_pool,
        chunk_size=p.chunk_size,
        local_steps=p.local_steps,
        weight_decay=p.client_weight_decay,
    )


def rank_fit_of(p: RunParams) -> RankFit:
    """How users fit their embeddings before ranking, by the run settings ``p``."""
    return RankFit(steps=p.rank_fit_steps, lr=p.rank_fit_lr)
