"""A round's mean gradient through secure aggregation, for the in-process simulator.

Each client's upload is clipped when the run clips (on the client: the server cannot clip what
it cannot see), laid out densely (:mod:`.layout`), fixed-point encoded and masked; the server
unmasks only the sum of the survivors and divides by their count. The result equals plain
aggregation (:func:`fedrecgel.strategy.aggregate_gradients`, ``mean`` weighting) to within the
fixed-point step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from fedrecgel.config import RunParams
from fedrecgel.model import ModelConfig
from fedrecgel.secagg.layout import flatten, unflatten, vector_length
from fedrecgel.secagg.local import Faults, secure_sum
from fedrecgel.secagg.protocol import RoundSpec
from fedrecgel.strategy import clip_update
from fedrecgel.uploads import Update


@dataclass(frozen=True)
class SecureMean:
    """The unmasked mean of a round, who it is over, and how many values were clipped."""

    grads: dict[str, Tensor]
    loss: float
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    clipped: int


def round_spec(
    cfg: ModelConfig, params: RunParams, round_id: int, cohort: Sequence[int]
) -> RoundSpec:
    """The public parameters of round ``round_id`` of a run (the ring is keyed by its seed)."""
    return RoundSpec(
        round_id=round_id,
        cohort=tuple(sorted(int(c) for c in cohort)),
        length=vector_length(cfg),
        fixed=params.secagg_fixed_point(),
        neighbours=params.secagg_neighbours,
        dropout=params.secagg_dropout,
        graph_seed=params.seed,
    )


def secure_mean(
    cfg: ModelConfig,
    params: RunParams,
    round_id: int,
    updates: Sequence[Update],
    faults: Faults | None = None,
) -> SecureMean:
    """The mean of ``updates`` as the server of a secure-aggregation round computes it."""
    by_id = {u.client_id: u for u in updates}
    spec = round_spec(cfg, params, round_id, list(by_id))

    def x(cid: int) -> np.ndarray:
        u = by_id[cid]
        return flatten(cfg, clip_update(u, params.clip) if params.clip is not None else u)

    r = secure_sum(spec, x, faults)
    out = r.outcome
    grads, loss = unflatten(cfg, out.total / len(out.survivors))
    return SecureMean(grads, loss, out.survivors, out.dropped, r.clipped)
