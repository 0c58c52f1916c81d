"""The popularity prior as served: the aggregator's ``GET /v1/runs/current/prior`` body, checked,
and the per-item bias a snapshot adds to the model's logits.

The served score of item i is ``logit_i + w * log(1 + n_i)`` (:mod:`fedrecgel.prior`): ``n_i``
the item's training count over all users, ``w`` the weight the aggregator chose on validation
data. Three stages, each computed once:

* :class:`PriorBody`: the JSON body, validated (counts non-negative integers, the weight finite
  and non-negative); a malformed body never gets further.
* :class:`PublishedPrior`: what the aggregator publishes now, with ``log(1 + n)`` computed once
  per set of counts (a body that changes only the weight reuses the previous tensor, so the
  candidate index, which holds that tensor as a column, is not rebuilt).
* :class:`ServedPrior`: the prior one snapshot ranks with, only when it applies (counts
  complete and of the model's length, weight > 0): the bias ``w * log(1 + n)`` as a float32
  tensor, so a request costs one add over the rows it scores.

:func:`fit_prior` decides, for a catalogue size, what applies and why not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from fedrecgel.prior import log_prior

#: the largest count accepted (an int64 holds it; log1p of it is about 43.7)
MAX_COUNT = 2**62

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class PriorBody(BaseModel):
    """``GET /v1/runs/current/prior`` of the aggregator (200). Strict: a count is a JSON integer
    (``1.0``, ``"1"`` and ``true`` are refused), the weight a finite number >= 0."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    run_id: int
    complete: bool
    counts: list[Count] | None = None
    weight: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None
    weight_version: int | None = None


@dataclass(frozen=True, eq=False)
class PublishedPrior:
    """The prior the aggregator publishes now (one per body; compared by identity).

    ``counts`` and ``log_prior`` are None until the run's counts are complete."""

    run_id: int
    complete: bool
    counts: np.ndarray | None  # (n,) int64
    log_prior: Tensor | None  # log(1 + counts), float32 (n,)
    weight: float | None
    weight_version: int | None
    etag: str | None = None


def publish(
    body: PriorBody, etag: str | None = None, previous: PublishedPrior | None = None
) -> PublishedPrior:
    """A :class:`PublishedPrior` of a validated body; the log-prior tensor of ``previous`` is
    kept when the counts are the same (a new weight alone rebuilds nothing)."""
    counts: np.ndarray | None = None
    logp: Tensor | None = None
    if body.complete and body.counts is not None:
        counts = np.asarray(body.counts, dtype=np.int64)
        if (
            previous is not None
            and previous.counts is not None
            and previous.log_prior is not None
            and np.array_equal(previous.counts, counts)
        ):
            counts, logp = previous.counts, previous.log_prior
        else:
            logp = log_prior(counts)
    return PublishedPrior(
        body.run_id, body.complete, counts, logp, body.weight, body.weight_version, etag
    )


@dataclass(frozen=True, eq=False)
class ServedPrior:
    """The prior one snapshot ranks with: ``bias = weight * log_prior`` (float32, (n_items,))."""

    weight: float
    log_prior: Tensor
    bias: Tensor
    run_id: int
    weight_version: int | None


@dataclass(frozen=True)
class PriorFit:
    """What a published prior gives a catalogue: the log-prior column for the candidate index
    (counts usable, whatever the weight), the served prior (also weight > 0), and a note
    saying what is served and why."""

    log_prior: Tensor | None
    served: ServedPrior | None
    note: str


def fit_prior(published: PublishedPrior | None, n_items: int) -> PriorFit:
    """What of ``published`` applies to a catalogue of ``n_items`` (see :class:`PriorFit`)."""
    if published is None:
        return PriorFit(None, None, "the aggregator publishes no prior: serving the model alone")
    run = f"run {published.run_id}"
    logp = published.log_prior
    if not published.complete or logp is None:
        return PriorFit(None, None, f"{run}: item counts not complete yet: serving the model alone")
    if len(logp) != n_items:
        return PriorFit(
            None,
            None,
            f"{run}: the prior counts {len(logp)} items but the model has {n_items}: "
            "serving the model alone",
        )
    w = published.weight
    if w is None:
        return PriorFit(logp, None, f"{run}: no prior weight chosen yet: serving the model alone")
    if w == 0:
        return PriorFit(logp, None, f"{run}: weight 0 chosen (the model alone)")
    bias = logp * w  # float32, as the evaluation computes it
    if not bool(torch.isfinite(bias).all()) or not math.isfinite(w):
        return PriorFit(logp, None, f"{run}: prior weight {w:g} overflows: serving the model alone")
    served = ServedPrior(w, logp, bias, published.run_id, published.weight_version)
    at = (
        ""
        if published.weight_version is None
        else f" (chosen at version {published.weight_version})"
    )
    return PriorFit(logp, served, f"{run}: popularity prior weight {w:g}{at}")
