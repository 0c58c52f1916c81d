"""Bounds on what one client's upload can do to the aggregate, whatever it sends.

The aggregator cannot tell a hostile upload from an honest one, but it can bound it: no
value whose square overflows float32 is accepted (:func:`check_values`), and when a round
closes every per-client upload is scaled down to ``factor`` times the round's median upload
norm, its sample count (the weight of ``weighting=samples``) and its loss (the published
metric) capped at ``factor`` times theirs (:func:`screen`). An honest cohort is left alone
at the default factor (its largest norm was at most 42 times the median on FilmTrust, see
docs/API.md), so a screened run equals the simulator's; one hostile client moves the model
by at most ``factor`` honest-sized updates divided by the cohort, never freezes it. Last,
:func:`all_finite` checks the server's new params and optimizer state before they are kept.

The run setting ``server_mean`` replaces the mean itself by a coordinate-wise robust one
(:class:`RobustMean`): the trimmed mean or the median of each coordinate over the round's
uploads, an item row a client did not upload counting as its zero, as in the mean. A hostile
minority smaller than the trimmed share then cannot move a coordinate outside the range of
the honest values. Cost: the uploads are stacked, ``m x (rows any client touched + dense
score network)`` float32 values for a cohort of ``m`` (a FilmTrust round of 122 clients,
about 120 MB) and sorted along the clients, instead of summed in place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from fedrecgel.config import ServerMean
from fedrecgel.strategy import Strategy, Wrapped, scaled, update_norm
from fedrecgel.uploads import PartialSum, Update

#: the largest magnitude an uploaded value may have: its square (about 1e36) and the sum of
#: a cohort's squares stay far below float32's largest value (3.4e38)
MAX_ABS = 1e18
#: the default screening factor (times the round's median)
DEFAULT_FACTOR = 100.0


def _tensors(u: Update | PartialSum) -> Iterable[tuple[str, Tensor]]:
    for name, (_, values) in u.rows.items():
        yield name, values
    yield from u.dense.items()


def check_values(u: Update | PartialSum) -> None:
    """Raise ValueError naming the first tensor with a value beyond :data:`MAX_ABS` (or not
    finite)."""
    for name, t in _tensors(u):
        if t.numel() and not bool(torch.isfinite(t).all() and t.abs().max() <= MAX_ABS):
            raise ValueError(f"{name}: values must be finite and at most {MAX_ABS:g} in magnitude")


@dataclass(frozen=True)
class Screened:
    """A round's uploads after :func:`screen`, and the clients it bounded (ascending)."""

    updates: list[Update]
    bounded: list[int]


def screen(updates: Sequence[Update], factor: float | None) -> Screened:
    """Each upload's norm, sample count and loss capped at ``factor`` times the round's
    median of each (None: unchanged). An upload within all three is returned as it came."""
    if factor is None or not updates:
        return Screened(list(updates), [])
    norms = np.array([update_norm(u) for u in updates])
    samples = np.array([u.n_samples for u in updates], dtype=np.float64)
    losses = np.array([u.loss for u in updates], dtype=np.float64)
    top_norm = factor * float(np.median(norms))
    top_samples = max(1, math.floor(factor * float(np.median(samples))))
    top_loss = factor * float(np.median(losses))
    out: list[Update] = []
    bounded: list[int] = []
    for u, norm in zip(updates, norms, strict=True):
        if norm <= top_norm and u.n_samples <= top_samples and u.loss <= top_loss:
            out.append(u)
            continue
        bounded.append(u.client_id)
        v = scaled(u, top_norm / norm) if norm > top_norm else u
        out.append(replace(v, n_samples=min(u.n_samples, top_samples), loss=min(u.loss, top_loss)))
    return Screened(out, sorted(bounded))


def all_finite(*groups: dict[str, Tensor]) -> bool:
    """Whether every tensor of every group holds finite values only."""
    return all(bool(torch.isfinite(t).all()) for g in groups for t in g.values())


def _robust(stack: Tensor, kind: ServerMean, trim: int) -> Tensor:
    """The coordinate-wise trimmed mean (``trim`` values dropped at each end) or median of
    ``stack`` along its first dimension (the clients)."""
    ordered = torch.sort(stack, dim=0).values
    m = stack.shape[0]
    if kind == "median":  # the mean of the two middle values when m is even
        return (ordered[(m - 1) // 2] + ordered[m // 2]) / 2
    return ordered[trim : m - trim].mean(dim=0)


def robust_mean(
    updates: Sequence[Update],
    shapes: dict[str, tuple[int, ...]],
    kind: ServerMean,
    trim_fraction: float = 0.0,
) -> dict[str, Tensor]:
    """The coordinate-wise ``kind`` (``trimmed``: ``floor(trim_fraction * m)`` of the ``m``
    values dropped at each end; ``median``) of the uploads, densified: name -> tensor of
    ``shapes[name]``. A row no client uploaded is zero; one that some uploaded counts zero for
    the others. Unweighted, in client-id order."""
    if not updates:
        raise ValueError("cannot aggregate an empty round")
    ordered = sorted(updates, key=lambda u: u.client_id)
    m = len(ordered)
    trim = math.floor(trim_fraction * m + 1e-9) if kind == "trimmed" else 0
    out: dict[str, Tensor] = {}
    for name, shape in shapes.items():
        if any(name in u.rows for u in ordered):
            touched = torch.unique(torch.cat([u.rows[name][0] for u in ordered if name in u.rows]))
            stack = torch.zeros((m, len(touched), *shape[1:]))
            for i, u in enumerate(ordered):
                if name in u.rows:
                    idx, vals = u.rows[name]
                    stack[i].index_add_(0, torch.searchsorted(touched, idx), vals)
            out[name] = torch.zeros(shape)
            out[name][touched] = _robust(stack, kind, trim)
        elif any(name in u.dense for u in ordered):
            zero = torch.zeros(shape)
            stack = torch.stack([u.dense.get(name, zero) for u in ordered])
            out[name] = _robust(stack, kind, trim)
        else:
            out[name] = torch.zeros(shape)
    return out


class RobustMean(Wrapped):
    """Wraps a strategy: aggregates with :func:`robust_mean` instead of the mean, steps with
    the inner strategy's optimizer."""

    def __init__(self, inner: Strategy, kind: ServerMean, trim_fraction: float) -> None:
        if kind == "mean":
            raise ValueError("RobustMean is for a robust server_mean (trimmed or median)")
        if not 0.0 <= trim_fraction < 0.5:
            raise ValueError("trim_fraction must be in [0, 0.5)")
        self.inner = inner
        self.kind: ServerMean = kind
        self.trim_fraction = trim_fraction

    def aggregate(
        self,
        updates: Sequence[Update],
        shapes: dict[str, tuple[int, ...]],
        cohort_size: float | None = None,
    ) -> dict[str, Tensor]:
        """The coordinate-wise robust mean of the uploads."""
        return robust_mean(updates, shapes, self.kind, self.trim_fraction)
