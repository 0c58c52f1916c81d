"""One federated round on the client side, the same wherever the clients run.

The in-process simulator, a client worker owning a shard of the users, and the test drivers
all call :class:`ClientRound`: each client draws its samples from its own keyed random stream
(``client_rng(seed, round, user)``), then the whole group takes the batched hierarchical SAM
step (:func:`fedrecgel.sam.cohort_step`), which yields the uploads and the new private state;
in a DP run each upload is then clipped (and noised) on the client (:mod:`fedrecgel.privacy`).
Which step a round takes (:meth:`ClientRound.step` or :meth:`ClientRound.partial_step`) is the
run's upload mode's (:mod:`fedrecgel.upload_modes`). Committing that state is the caller's: the
simulator does it at once, a worker only after the aggregator acknowledged the upload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedrecgel.config import Weighting
from fedrecgel.model import ModelConfig
from fedrecgel.privacy import ClientPrivacy, privatize, secret_generator, seeded_generator
from fedrecgel.private_store import PrivateStore
from fedrecgel.sam import (
    PrivateState,
    SAMConfig,
    StepResult,
    client_rng,
    cohort_step,
    negative_pool,
)
from fedrecgel.sampling import cohort_samples
from fedrecgel.strategy import partial_weights
from fedrecgel.uploads import PartialSum

#: a client's training item indices, by user id
TrainItems = Callable[[int], np.ndarray]


@dataclass(frozen=True)
class ClientRound:
    """The client side of a run: model shape, client hyperparameters and the run's seed."""

    model: ModelConfig
    hp: SAMConfig
    seed: int
    #: client-level DP: each upload is clipped (and, distributed, noised) before it leaves
    dp: ClientPrivacy | None = None
    #: local DP noise from secret randomness (a worker) or keyed by the run seed (simulator)
    secret_noise: bool = False

    def samples(
        self, round_id: int, user_ids: Sequence[int] | np.ndarray, train_items: TrainItems
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each client's samples for ``round_id`` (keyed by seed, round and user; drawn
        together, the same draws as :func:`fedrecgel.sam.client_samples` one by one; the
        negatives from the round's public pool when the run has one)."""
        return cohort_samples(
            [train_items(int(u)) for u in user_ids],
            self.model.n_items,
            self.hp.n_negatives,
            [client_rng(self.seed, round_id, int(u)) for u in user_ids],
            self.pool(round_id),
        )

    def pool(self, round_id: int) -> np.ndarray | None:
        """The round's public pool of negatives (sorted items; None: the whole catalogue)."""
        size = self.hp.negative_pool
        return (
            None if size is None else negative_pool(self.seed, round_id, self.model.n_items, size)
        )

    def step(
        self,
        shared: dict[str, Tensor],
        round_id: int,
        user_ids: Sequence[int] | np.ndarray,
        train_items: TrainItems,
        state: PrivateState,
    ) -> StepResult:
        """The round of ``user_ids`` (``state``: theirs, in that order) from the round's shared
        parameters: their uploads and new private state (not committed anywhere)."""
        users = np.asarray(user_ids, dtype=np.int64)
        samples = self.samples(round_id, users, train_items)
        result = cohort_step(self.model, shared, users, state, samples, self.hp)
        if self.dp is not None:
            gens = [
                secret_generator()
                if self.secret_noise
                else seeded_generator(self.seed, round_id, u)
                for u in users
            ]
            shapes = {k: tuple(v.shape) for k, v in shared.items()}
            result.uploads, within = privatize(result.uploads, self.dp, shapes, gens)
            if self.dp.report_within:
                result.within = within
        return result

    def partial_step(
        self,
        shared: dict[str, Tensor],
        round_id: int,
        user_ids: Sequence[int] | np.ndarray,
        train_items: TrainItems,
        state: PrivateState,
        weighting: Weighting,
    ) -> StepResult:
        """:meth:`step` of ``user_ids`` (ascending) as one partial sum (``upload_grouping=
        worker``): the result's ``partial`` is ``sum_c w_c upload_c`` summed inside the batched
        backward (:func:`fedrecgel.strategy.partial_weights`), its item rows over the items the
        clients' samples touch; no per-client uploads are built."""
        users = np.asarray(user_ids, dtype=np.int64)
        if self.dp is not None:
            raise ValueError("a DP run clips each client's upload: no partial sums")
        if len(users) == 0 or (len(users) > 1 and not bool((np.diff(users) > 0).all())):
            raise ValueError("a partial sum covers at least one client, in ascending id order")
        samples = self.samples(round_id, users, train_items)
        sizes = np.fromiter((len(s[0]) for s in samples), dtype=np.int64, count=len(samples))
        weights = partial_weights(sizes, weighting)
        result = cohort_step(self.model, shared, users, state, samples, self.hp, weights)
        total = result.aggregate
        assert total is not None
        touched = np.unique(np.concatenate([np.asarray(s[0], dtype=np.int64) for s in samples]))
        idx = torch.from_numpy(touched)
        result.partial = PartialSum(
            client_ids=tuple(int(u) for u in users),
            n_samples=tuple(int(n) for n in sizes),
            rows={t: (idx, total[t][idx]) for t in self.model.item_tables()},
            dense={n: total[n] for n in self.model.dense_names()},
            loss=float(result.losses.sum()),
        )
        result.aggregate = None
        return result

    def step_in(
        self,
        store: PrivateStore,
        shared: dict[str, Tensor],
        round_id: int,
        user_ids: Sequence[int] | np.ndarray,
        train_items: TrainItems,
    ) -> StepResult:
        """:meth:`step` for users whose state lives in ``store``, committing their new state."""
        users = np.asarray(user_ids, dtype=np.int64)
        result = self.step(shared, round_id, users, train_items, store.get(users))
        store.put(users, result.state)
        return result
