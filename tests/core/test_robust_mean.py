"""The optional coordinate-wise robust mean (run setting ``server_mean``, fedrecgel/robust.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedrecgel.config import RunParams
from fedrecgel.model import ModelConfig
from fedrecgel.robust import RobustMean, robust_mean
from fedrecgel.server_strategy import strategy_of
from fedrecgel.strategy import ClipUpdates, FedAvgGradients, aggregate_gradients
from fedrecgel.uploads import Update
from tests.support.aggregator import random_update

CFG = ModelConfig(n_items=40, factor=4, layers=2)
SHAPES = {k: tuple(v) for k, v in CFG.shared_shapes().items()}


def _dense(u: Update) -> dict[str, torch.Tensor]:
    """The update densified (an item row it did not upload is zero)."""
    return aggregate_gradients([u], SHAPES, "mean")


def _hostile(client_id: int, value: float) -> Update:
    """An upload writing ``value`` into every item row and every dense value."""
    rows = {
        t: (torch.arange(CFG.n_items), torch.full((CFG.n_items, SHAPES[t][1]), value))
        for t in CFG.item_tables()
    }
    dense = {n: torch.full(SHAPES[n], value) for n in CFG.dense_names()}
    return Update(client_id, 10, rows, dense, 1.0)


def _honest(n: int, seed: int = 0) -> list[Update]:
    rng = np.random.default_rng(seed)
    return [random_update(CFG, c, rng, n_rows=12) for c in range(n)]


@pytest.mark.parametrize(("kind", "trim"), [("trimmed", 0.1), ("trimmed", 0.25), ("median", 0.0)])
def test_a_hostile_upload_stays_within_the_honest_range(kind: str, trim: float) -> None:
    honest = _honest(9)
    dense = [_dense(u) for u in honest]
    for value in (1e6, -1e6):
        got = robust_mean([*honest, _hostile(99, value)], SHAPES, kind, trim)  # type: ignore[arg-type]
        mean = aggregate_gradients([*honest, _hostile(99, value)], SHAPES, "mean")
        for name in SHAPES:
            stack = torch.stack([d[name] for d in dense])
            low, high = stack.min(dim=0).values, stack.max(dim=0).values
            assert bool(((got[name] >= low - 1e-7) & (got[name] <= high + 1e-7)).all()), name
            # the plain mean is dragged out of that range (else this test shows nothing)
            assert not bool(((mean[name] >= low) & (mean[name] <= high)).all()), name


def test_trimmed_mean_and_median_values() -> None:
    """Per coordinate: drop floor(trim * m) values at each end, average the rest; the median
    of an even count is the mean of the two middle values; an untouched row is zero."""
    rows = CFG.item_tables()[0]
    width = SHAPES[rows][1]

    def up(c: int, v: float) -> Update:
        return Update(c, 1, {rows: (torch.tensor([3]), torch.full((1, width), v))}, {}, 0.0)

    ups = [up(c, v) for c, v in enumerate([1.0, 2.0, 3.0, 100.0])]
    trimmed = robust_mean(ups, SHAPES, "trimmed", 0.25)[rows]
    median = robust_mean(ups, SHAPES, "median")[rows]
    assert torch.equal(trimmed[3], torch.full((width,), 2.5))
    assert torch.equal(median[3], torch.full((width,), 2.5))
    assert not trimmed[[0, 1, 2, 4]].any() and not median[:3].any()
    # a client that did not upload row 3 counts as a zero there
    five = [*ups, Update(7, 1, {}, {}, 0.0)]
    assert torch.equal(robust_mean(five, SHAPES, "median")[rows][3], torch.full((width,), 2.0))


def test_the_default_strategy_is_the_mean_as_before() -> None:
    assert type(strategy_of(RunParams())) is FedAvgGradients
    clipped = strategy_of(RunParams(clip=1.0))
    assert type(clipped) is ClipUpdates and type(clipped.inner) is FedAvgGradients
    robust = strategy_of(RunParams(server_mean="trimmed", trim_fraction=0.2, clip=1.0))
    assert type(robust) is ClipUpdates and isinstance(robust.inner, RobustMean)
    assert robust.inner.kind == "trimmed" and robust.inner.trim_fraction == 0.2
    # the robust strategy is not a linear combination: the simulator builds every upload
    assert strategy_of(RunParams(server_mean="median")).linear_weights(np.ones(3)) is None


def test_a_robust_round_steps_the_model() -> None:
    params = {k: torch.zeros(v) for k, v in SHAPES.items()}
    strategy = strategy_of(RunParams(server_mean="median"))
    strategy.round(params, [*_honest(5), _hostile(99, 3e4)])
    assert all(bool(torch.isfinite(t).all()) for t in params.values())
    assert any(bool(t.any()) for t in params.values())
    # the hostile client alone moved nothing: Adam's first step is at most lr per coordinate
    assert max(float(t.abs().max()) for t in params.values()) <= 1e-3 + 1e-9


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"upload_grouping": "worker"}, "a partial sum cannot be trimmed"),
        ({"weighting": "samples"}, "weighting=samples"),
        ({"dp_noise": 1.0}, "differential privacy"),
        ({"secure_aggregation": "dense"}, "secure aggregation"),
    ],
)
def test_combinations_a_robust_mean_cannot_serve_are_refused(
    settings: dict[str, object], says: str
) -> None:
    with pytest.raises(ValidationError, match=says):
        RunParams(server_mean="trimmed", **settings)  # type: ignore[arg-type]
    RunParams(**settings)  # type: ignore[arg-type]  # the same run with the mean is fine
