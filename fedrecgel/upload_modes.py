"""Upload modes: what a run's clients send for a round and how the server turns a round's
uploads into the step it takes. One object per mode, chosen by the run's settings
(:func:`mode_of`); the simulator (:mod:`fedrecgel.simulate`, :mod:`fedrecgel.ray_backend`), the
client worker and the aggregator's ingest and round closer all call it, so that no side keeps
a decision tree of its own.

* :class:`PerClient` (``upload_grouping=client``): each client's :class:`~fedrecgel.sam.Update`;
  the server strategy aggregates them (the aggregator screens them first).
* :class:`PerWorker` (``upload_grouping=worker``): one :class:`~fedrecgel.sam.PartialSum` per
  worker (or simulator shard) of its cohort members, summed inside the batched backward; the
  server adds them in first-client order (:func:`fedrecgel.strategy.combine_partials`).
* :class:`SecureDense` (``secure_aggregation=dense``): per-client updates the server sees only
  masked, learning just their mean: the simulator runs the protocol in process
  (:func:`fedrecgel.secagg.aggregate.secure_mean`), the aggregator over HTTP in phases
  (``services/aggregator/secagg.py``); no plain upload body is taken.

Every upload of a round is a :data:`Upload` covering one client (an update) or several (a
partial sum); the aggregator stores one row per covered client, the body under the first.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

import numpy as np
from torch import Tensor

from fedrecgel.client_round import ClientRound, TrainItems
from fedrecgel.cohort import cohort_size
from fedrecgel.config import RunParams, UploadGrouping
from fedrecgel.model import ModelConfig
from fedrecgel.robust import screen
from fedrecgel.sam import PartialSum, PrivateState, StepResult, Update
from fedrecgel.secagg.aggregate import secure_mean
from fedrecgel.strategy import Strategy, combine_partials, partial_loss, partial_rows
from fedrecgel.wire import (
    PARTIAL_FORMAT,
    UPDATES_FORMAT,
    decode_partial,
    decode_updates,
    encode_partial,
    encode_updates,
)

#: one upload: a client's update, or a worker's partial sum of several clients
Upload = Update | PartialSum
#: the (client ids, body) of each body a round's uploads are sent in
Bodies = list[tuple[list[int], bytes]]
_U = TypeVar("_U", Update, PartialSum)


@dataclass(frozen=True)
class Decoded:
    """A decoded upload body: its round, its uploads with their content digests, and what is
    stored of each (a body that decodes to that upload alone)."""

    round_id: int
    uploads: list[Upload]
    digests: list[str]
    blobs: list[bytes]


@dataclass(frozen=True)
class Aggregate:
    """A round's aggregate, what the server strategy applies: the gradient, per item table the
    rows a lazy step takes (None: those with a nonzero gradient), the round's mean client loss,
    the clients it covers and those screening bounded."""

    grads: dict[str, Tensor]
    loss: float
    n: int
    rows: dict[str, Tensor] | None = None
    bounded: list[int] = field(default_factory=list)

    def apply(self, strategy: Strategy, params: dict[str, Tensor]) -> None:
        """The server's step on ``params`` (in place)."""
        strategy.apply(params, self.grads, self.rows)


@dataclass(frozen=True)
class UploadMode(ABC):
    """How a run's clients upload (``params``: the run's settings; ``model``: its shape)."""

    params: RunParams
    model: ModelConfig
    #: the run setting's value this mode answers to (in refusals)
    grouping: ClassVar[UploadGrouping] = "client"
    #: the wire format of a plain upload body; None: the mode takes no plain body
    format: ClassVar[str | None] = UPDATES_FORMAT
    #: what its clients send (in refusals)
    what: ClassVar[str] = "per-client updates"
    #: the simulator may sum the clients' gradients inside the backward instead of building
    #: these uploads, when the strategy's aggregate is a linear combination of them
    summable: ClassVar[bool] = False

    @property
    def plain(self) -> bool:
        """Whether its clients send plain upload bodies (else the secure-aggregation phases)."""
        return self.format is not None

    @property
    def private(self) -> bool:
        """Whether the run is differentially private (a round then releases noise even when
        no client uploaded)."""
        return self.params.dp_noise is not None or self.params.target_epsilon is not None

    def produce(
        self,
        clients: ClientRound,
        shared: dict[str, Tensor],
        round_id: int,
        users: np.ndarray,
        train_items: TrainItems,
        state: PrivateState,
    ) -> StepResult:
        """The round of ``users`` (ascending; ``state``: theirs) from the round's shared
        parameters: what they upload (:meth:`uploads`) and their new private state."""
        return clients.step(shared, round_id, users, train_items, state)

    def uploads(self, result: StepResult) -> list[Upload]:
        """What the clients of ``result`` upload."""
        return list(result.uploads)

    def bodies(
        self,
        round_id: int,
        result: StepResult,
        split: Callable[[int, Sequence[Update]], Bodies],
    ) -> Bodies:
        """The upload bodies of ``result`` (``split``: per-client updates into bodies of the
        client's size budget)."""
        return split(round_id, result.uploads)

    def decode(self, body: bytes, model: ModelConfig) -> Decoded:
        """Parse and validate an upload body against ``model`` (WireError otherwise)."""
        d = decode_updates(body, model)
        one = len(d.updates) == 1  # a one-update body is stored as sent
        blobs = [body] if one else [encode_updates(d.round_id, [u]) for u in d.updates]
        return Decoded(d.round_id, list(d.updates), d.digests, blobs)

    @abstractmethod
    def combine(
        self,
        strategy: Strategy,
        shapes: dict[str, tuple[int, ...]],
        uploads: Sequence[Upload],
        round_id: int,
        cohort_size: float | None = None,
        screen_factor: float | None = None,
    ) -> Aggregate | None:
        """The aggregate of a round's uploads (in first-client order) that ``strategy``
        applies; None when there is nothing to apply (no upload). ``cohort_size``: the public
        cohort size a DP mean divides by; ``screen_factor``: screen per-client uploads
        (:func:`fedrecgel.robust.screen`)."""

    def check_simulation(self, n_users: int) -> None:
        """ValueError when the simulator cannot run this mode over ``n_users`` clients."""
        return None


@dataclass(frozen=True)
class PerClient(UploadMode):
    """``upload_grouping=client``: one update per client, aggregated by the strategy."""

    summable: ClassVar[bool] = True

    def combine(
        self,
        strategy: Strategy,
        shapes: dict[str, tuple[int, ...]],
        uploads: Sequence[Upload],
        round_id: int,
        cohort_size: float | None = None,
        screen_factor: float | None = None,
    ) -> Aggregate | None:
        if not uploads and not self.private:  # a DP round releases noise even if empty
            return None
        screened = screen(_only(Update, uploads), screen_factor)
        grads = strategy.aggregate(screened.updates, shapes, cohort_size)
        losses = [u.loss for u in screened.updates]
        loss = float(np.mean(losses)) if losses else math.nan
        return Aggregate(grads, loss, len(losses), bounded=screened.bounded)


@dataclass(frozen=True)
class PerWorker(UploadMode):
    """``upload_grouping=worker``: one partial sum per worker, added in first-client order."""

    grouping: ClassVar[UploadGrouping] = "worker"
    format: ClassVar[str | None] = PARTIAL_FORMAT
    what: ClassVar[str] = "one partial sum per worker"

    def produce(
        self,
        clients: ClientRound,
        shared: dict[str, Tensor],
        round_id: int,
        users: np.ndarray,
        train_items: TrainItems,
        state: PrivateState,
    ) -> StepResult:
        return clients.partial_step(
            shared, round_id, users, train_items, state, self.params.weighting
        )

    def uploads(self, result: StepResult) -> list[Upload]:
        return [] if result.partial is None else [result.partial]

    def bodies(
        self,
        round_id: int,
        result: StepResult,
        split: Callable[[int, Sequence[Update]], Bodies],
    ) -> Bodies:
        p = result.partial
        return [] if p is None else [(list(p.client_ids), encode_partial(round_id, p))]

    def decode(self, body: bytes, model: ModelConfig) -> Decoded:
        d = decode_partial(body, model)
        return Decoded(d.round_id, [d.partial], [d.digest], [body])

    def combine(
        self,
        strategy: Strategy,
        shapes: dict[str, tuple[int, ...]],
        uploads: Sequence[Upload],
        round_id: int,
        cohort_size: float | None = None,
        screen_factor: float | None = None,
    ) -> Aggregate | None:
        partials = _only(PartialSum, uploads)
        if not partials:  # an empty Poisson cohort: no step
            return None
        grads = combine_partials(partials, shapes, self.params.weighting)
        lazy = self.params.server_update == "lazy"  # then only the rows the partials carry
        n = sum(len(p.client_ids) for p in partials)
        return Aggregate(grads, partial_loss(partials), n, partial_rows(partials) if lazy else None)


@dataclass(frozen=True)
class SecureDense(UploadMode):
    """``secure_aggregation=dense``: masked per-client updates; the server learns their mean
    (over HTTP through the aggregator's secure-aggregation phases, not a plain body)."""

    format: ClassVar[str | None] = None
    what: ClassVar[str] = "masked inputs through the secure-aggregation phases"

    def combine(
        self,
        strategy: Strategy,
        shapes: dict[str, tuple[int, ...]],
        uploads: Sequence[Upload],
        round_id: int,
        cohort_size: float | None = None,
        screen_factor: float | None = None,
    ) -> Aggregate | None:
        # the server sees masked vectors only: it unmasks the mean (the protocol in process)
        mean = secure_mean(self.model, self.params, round_id, _only(Update, uploads))
        return Aggregate(mean.grads, mean.loss, len(mean.survivors))

    def check_simulation(self, n_users: int) -> None:
        m = cohort_size(n_users, self.params.fraction)
        if m < 2:
            raise ValueError(
                f"secure aggregation needs cohorts of at least 2 clients; --fraction "
                f"{self.params.fraction:g} of {n_users} users gives {m}"
            )
        self.params.secagg_fixed_point().check_cohort(m)
        if self.private:
            raise ValueError(
                "differential privacy together with secure aggregation is not wired into the "
                "simulator yet: choose one"
            )


def mode_of(params: RunParams, model: ModelConfig) -> UploadMode:
    """The upload mode of a run's settings (the settings allow at most one of them)."""
    if params.secure_aggregation != "off":
        return SecureDense(params, model)
    if params.upload_grouping == "worker":
        return PerWorker(params, model)
    return PerClient(params, model)


def _only(kind: type[_U], uploads: Sequence[Upload]) -> list[_U]:
    """``uploads``, each of ``kind`` (TypeError otherwise: another mode's upload)."""
    out = [u for u in uploads if isinstance(u, kind)]
    if len(out) != len(uploads):
        raise TypeError(f"a round of {kind.__name__} uploads holds another kind")
    return out
