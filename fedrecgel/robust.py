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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from fedrecgel.privacy import update_norm
from fedrecgel.sam import PartialSum, Update
from fedrecgel.strategy import scaled

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
