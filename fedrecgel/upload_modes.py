"""Upload modes: what a run's clients send for a round and how the server turns the round's
uploads into the step it takes, one object per mode chosen by the run's settings
(:func:`mode_of`). The simulator, the Ray driver, the client worker and the aggregator's ingest
and round closer call it instead of branching on the settings.

* :class:`PerClient` (``upload_grouping=client``): each client's update, aggregated by the
  server strategy (screened first on the aggregator).
* :class:`PerWorker` (``upload_grouping=worker``): one partial sum per worker (or simulator
  shard), added in first-client order (:func:`fedrecgel.strategy.combine_partials`).
* :class:`SecureDense` (``secure_aggregation=dense``): masked per-client updates whose mean
  alone the server learns: in process here, over HTTP in the aggregator's phases
  (``services/aggregator/secagg.py``, which yield the same :class:`Aggregate`).
* :class:`SecureSparse` (``secure_aggregation=sparse``): the same over only the item rows of
  the cohort's items and the round's negative pool, after a masked count of those items: in
  process here, over HTTP in the aggregator's six phases (the Ray backend refuses it).

An upload covers one client (an update) or several (a partial sum); the aggregator stores a
row per covered client, the body under the first.
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
from fedrecgel.prior import RoundCounts
from fedrecgel.robust import screen
from fedrecgel.sam import PrivateState, StepResult
from fedrecgel.secagg.aggregate import (
    counting_ring,
    secure_mean,
    secure_sparse_mean,
    sparse_fixed_point,
)
from fedrecgel.strategy import Strategy, combine_partials, partial_loss, partial_rows
from fedrecgel.uploads import PartialSum, Update
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
Shapes = dict[str, tuple[int, ...]]
_U = TypeVar("_U", Update, PartialSum)


@dataclass(frozen=True)
class Decoded:
    """An upload body: its round, its uploads, their digests and what is stored of each (a
    body of that upload alone)."""

    round_id: int
    uploads: list[Upload]
    digests: list[str]
    blobs: list[bytes]


@dataclass(frozen=True)
class RoundUploads:
    """A round's uploads in first-client order, and the public cohort size a DP mean divides
    by (None: the uploads')."""

    round_id: int
    uploads: Sequence[Upload]
    cohort_size: float | None = None


@dataclass(frozen=True)
class Aggregate:
    """What the server strategy applies for a round: the gradient, per item table the rows a
    lazy step takes (None: those with a nonzero gradient), the mean client loss, the clients
    it covers and those screening bounded."""

    grads: dict[str, Tensor]
    loss: float
    n: int
    rows: dict[str, Tensor] | None = None
    bounded: list[int] = field(default_factory=list)
    #: a sparse secure round's unmasked item counts (the popularity prior's input)
    counts: RoundCounts | None = None

    def apply(self, strategy: Strategy, params: dict[str, Tensor]) -> None:
        """The server's step on ``params`` (in place)."""
        strategy.apply(params, self.grads, self.rows)


@dataclass(frozen=True)
class UploadMode(ABC):
    """How a run (``params``, model ``model``) uploads; ``screen_factor``: the aggregator
    screens per-client uploads (:func:`fedrecgel.robust.screen`)."""

    params: RunParams
    model: ModelConfig
    screen_factor: float | None = None
    #: the setting this mode answers to, and what its clients send (in refusals)
    grouping: ClassVar[UploadGrouping] = "client"
    what: ClassVar[str] = "per-client updates"
    #: the wire format of a plain upload body; None: the mode takes none
    format: ClassVar[str | None] = UPDATES_FORMAT
    #: the simulator may sum the clients' gradients inside the backward instead of building
    #: these uploads (when the strategy's aggregate is linear in them)
    summable: ClassVar[bool] = False

    @property
    def plain(self) -> bool:
        """Whether its clients send plain upload bodies (else the secure-aggregation phases)."""
        return self.format is not None

    @property
    def private(self) -> bool:
        """Whether the run is differentially private."""
        return self.params.dp_enabled

    def produce(
        self,
        clients: ClientRound,
        shared: dict[str, Tensor],
        round_id: int,
        users: np.ndarray,
        train_items: TrainItems,
        state: PrivateState,
    ) -> StepResult:
        """The round of ``users`` (ascending; ``state``: theirs): what they upload
        (:meth:`uploads`) and their new private state."""
        return clients.step(shared, round_id, users, train_items, state)

    def uploads(self, result: StepResult) -> list[Upload]:
        """What the clients of ``result`` upload."""
        return list(result.uploads)

    def bodies(self, round_id: int, result: StepResult, split: Callable[..., Bodies]) -> Bodies:
        """The upload bodies of ``result`` (``split(round_id, updates)``: updates into bodies
        of the client's size budget)."""
        return split(round_id, result.uploads)

    def decode(self, body: bytes) -> Decoded:
        """Parse and validate an upload body against the model (WireError otherwise)."""
        d = decode_updates(body, self.model)
        one = len(d.updates) == 1  # a one-update body is stored as sent
        blobs = [body] if one else [encode_updates(d.round_id, [u]) for u in d.updates]
        return Decoded(d.round_id, list(d.updates), d.digests, blobs)

    @abstractmethod
    def combine(self, strategy: Strategy, shapes: Shapes, got: RoundUploads) -> Aggregate | None:
        """The round's aggregate that ``strategy`` applies (None: nothing to apply)."""

    def check_cohorts(self, n_clients: int, largest: int) -> None:
        """ValueError when this mode cannot take the run's cohorts of ``n_clients`` clients,
        the largest one ``largest`` clients."""
        return None


@dataclass(frozen=True)
class PerClient(UploadMode):
    """``upload_grouping=client``: one update per client, aggregated by the strategy."""

    summable: ClassVar[bool] = True

    def combine(self, strategy: Strategy, shapes: Shapes, got: RoundUploads) -> Aggregate | None:
        if not got.uploads and not self.private:  # a DP round releases noise even if empty
            return None
        screened = screen(_only(Update, got.uploads), self.screen_factor)
        grads = strategy.aggregate(screened.updates, shapes, got.cohort_size)
        losses = [u.loss for u in screened.updates]
        loss = float(np.mean(losses)) if losses else math.nan
        return Aggregate(grads, loss, len(losses), bounded=screened.bounded)


@dataclass(frozen=True)
class PerWorker(UploadMode):
    """``upload_grouping=worker``: one partial sum per worker, added in first-client order."""

    grouping: ClassVar[UploadGrouping] = "worker"
    what: ClassVar[str] = "one partial sum per worker"
    format: ClassVar[str | None] = PARTIAL_FORMAT

    def produce(
        self,
        clients: ClientRound,
        shared: dict[str, Tensor],
        round_id: int,
        users: np.ndarray,
        train_items: TrainItems,
        state: PrivateState,
    ) -> StepResult:
        weighting = self.params.weighting
        return clients.partial_step(shared, round_id, users, train_items, state, weighting)

    def uploads(self, result: StepResult) -> list[Upload]:
        return [] if result.partial is None else [result.partial]

    def bodies(self, round_id: int, result: StepResult, split: Callable[..., Bodies]) -> Bodies:
        p = result.partial
        return [] if p is None else [(list(p.client_ids), encode_partial(round_id, p))]

    def decode(self, body: bytes) -> Decoded:
        d = decode_partial(body, self.model)
        return Decoded(d.round_id, [d.partial], [d.digest], [body])

    def combine(self, strategy: Strategy, shapes: Shapes, got: RoundUploads) -> Aggregate | None:
        partials = _only(PartialSum, got.uploads)
        if not partials:  # an empty Poisson cohort: no step
            return None
        grads = combine_partials(partials, shapes, self.params.weighting)
        lazy = self.params.server_update == "lazy"  # then only the rows the partials carry
        n = sum(len(p.client_ids) for p in partials)
        return Aggregate(grads, partial_loss(partials), n, partial_rows(partials) if lazy else None)


@dataclass(frozen=True)
class SecureDense(UploadMode):
    """``secure_aggregation=dense``: masked updates; the server learns only their mean."""

    what: ClassVar[str] = "masked inputs through the secure-aggregation phases"
    format: ClassVar[str | None] = None

    def combine(self, strategy: Strategy, shapes: Shapes, got: RoundUploads) -> Aggregate | None:
        mean = secure_mean(self.model, self.params, got.round_id, _only(Update, got.uploads))
        return Aggregate(mean.grads, mean.loss, len(mean.survivors))

    def check_cohorts(self, n_clients: int, largest: int) -> None:
        m = cohort_size(n_clients, self.params.fraction)
        if m < 2:
            raise ValueError(
                f"secure aggregation needs cohorts of at least 2 clients; fraction "
                f"{self.params.fraction:g} of {n_clients} clients gives {m}"
            )
        self.check_ring(largest)

    def check_ring(self, largest: int) -> None:
        """OverflowRefused when a cohort of ``largest`` could wrap the ring."""
        self.params.secagg_fixed_point().check_cohort(largest)


@dataclass(frozen=True)
class SecureSparse(SecureDense):
    """``secure_aggregation=sparse``: masked counts of the clients' items, then masked updates
    over those items' rows and the round's negative pool only
    (:func:`~fedrecgel.secagg.aggregate.secure_sparse_mean`); over HTTP, the aggregator's
    phases (``services/aggregator/secagg.py``) yield the same :class:`Aggregate`."""

    what: ClassVar[str] = "masked item counts, then masked rows of those items and the pool"

    def combine(self, strategy: Strategy, shapes: Shapes, got: RoundUploads) -> Aggregate | None:
        ups = _only(Update, got.uploads)
        sparse = secure_sparse_mean(self.model, self.params, got.round_id, ups)
        counts = RoundCounts(sparse.counts, sparse.pool, len(sparse.counted))
        mean = sparse.mean
        return Aggregate(mean.grads, mean.loss, len(mean.survivors), counts=counts)

    def check_ring(self, largest: int) -> None:
        counting_ring(largest)
        sparse_fixed_point(self.params, largest)


def mode_of(
    params: RunParams, model: ModelConfig, screen_factor: float | None = None
) -> UploadMode:
    """The upload mode of a run's settings (they allow at most one of them)."""
    if params.secure_aggregation == "sparse":
        return SecureSparse(params, model, screen_factor)
    if params.secure_aggregation != "off":
        return SecureDense(params, model, screen_factor)
    if params.upload_grouping == "worker":
        return PerWorker(params, model, screen_factor)
    return PerClient(params, model, screen_factor)


def _only(kind: type[_U], uploads: Sequence[Upload]) -> list[_U]:
    """``uploads``, each of ``kind`` (TypeError otherwise: another mode's upload)."""
    out = [u for u in uploads if isinstance(u, kind)]
    if len(out) != len(uploads):
        raise TypeError(f"a round of {kind.__name__} uploads holds another kind")
    return out
