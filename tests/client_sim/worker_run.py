"""The small run the worker tests train (against the fake or the real aggregator) and the
simulator config that must reproduce it."""

from __future__ import annotations

from typing import Any

from fedrecgel.simulate import TrainConfig

FACTOR, LAYERS, FRACTION, CHUNK_SIZE = 8, 2, 0.3, 16


def run_body(n_items: int, seed: int, rounds: int = 3, **extra: Any) -> dict[str, Any]:
    """The body of ``POST /v1/runs`` (with ``extra`` fields) for a synthetic dataset."""
    return {
        "n_items": n_items,
        "factor": FACTOR,
        "layers": LAYERS,
        "seed": seed,
        "rounds": rounds,
        "fraction": FRACTION,
        "chunk_size": CHUNK_SIZE,
        "dataset": "synthetic",
        **extra,
    }


def train_config(seed: int, rounds: int = 3, **extra: Any) -> TrainConfig:
    """The simulator's config of :func:`run_body` (per-client uploads, as workers compute;
    ``extra``: the same run settings as given to :func:`run_body`)."""
    return TrainConfig(
        **extra,
        rounds=rounds,
        fraction=FRACTION,
        factor=FACTOR,
        layers=LAYERS,
        seed=seed,
        chunk_size=CHUNK_SIZE,
        per_client_uploads=True,
    )
