"""One federated round on the client side, the same wherever the clients run.

The in-process simulator, a client worker owning a shard of the users, and the test drivers
all call :class:`ClientRound`: each client draws its samples from its own keyed random stream
(``client_rng(seed, round, user)``), then the whole group takes the batched hierarchical SAM
step (:func:`fedrecgel.sam.cohort_step`), which yields the uploads and the new private state;
in a DP run each upload is then clipped (and noised) on the client (:mod:`fedrecgel.privacy`).
Committing that state is the caller's: the simulator does it at once (:meth:`ClientRound.step_in`),
a worker only after the aggregator acknowledged the upload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from fedrecgel.model import ModelConfig
from fedrecgel.privacy import ClientPrivacy, privatize, secret_generator, seeded_generator
from fedrecgel.private_store import PrivateStore
from fedrecgel.sam import (
    PrivateState,
    SAMConfig,
    StepResult,
    client_rng,
    client_samples,
    cohort_step,
)

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
        """Each client's samples for ``round_id`` (keyed by seed, round and user)."""
        return [
            client_samples(
                train_items(int(u)),
                self.model.n_items,
                self.hp.n_negatives,
                client_rng(self.seed, round_id, int(u)),
            )
            for u in user_ids
        ]

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
            result.uploads = privatize(result.uploads, self.dp, shapes, gens)
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
