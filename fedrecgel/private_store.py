"""The private state of every user of one process, kept in memory (the simulator's store)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedrecgel.model import ModelConfig
from fedrecgel.sam import PrivateState


class PrivateStore:
    """Private state of every user in one process, allocated lazily on first use.

    Nothing of size users x anything is allocated up front, so a 1e6-user population costs
    memory only for the users that have taken part.
    """

    def __init__(self, cfg: ModelConfig, seed: int, n_users: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.slot = np.full(n_users, -1, dtype=np.int64)
        self.size = 0
        self.data = PrivateState.fresh(cfg, seed, np.zeros(0, dtype=np.int64))

    def _ensure(self, user_ids: np.ndarray) -> np.ndarray:
        new = np.unique(user_ids[self.slot[user_ids] < 0])
        if len(new):
            fresh = PrivateState.fresh(self.cfg, self.seed, new)
            need = self.size + len(new)
            cap = self.data.step.shape[0]
            if need > cap:
                grow = max(need, 2 * cap, 1024)
                self.data = _grow(self.data, grow)
            rows = np.arange(self.size, need)
            self.data.assign(rows, fresh)
            self.slot[new] = rows
            self.size = need
        rows_of: np.ndarray = self.slot[user_ids]
        return rows_of

    def get(self, user_ids: np.ndarray) -> PrivateState:
        """The state of ``user_ids`` (copies), initialising users seen for the first time."""
        rows = self._ensure(np.asarray(user_ids, dtype=np.int64))
        return self.data.select(rows)

    def put(self, user_ids: np.ndarray, state: PrivateState) -> None:
        """Store the new state of ``user_ids``."""
        rows = self._ensure(np.asarray(user_ids, dtype=np.int64))
        self.data.assign(rows, state)

    def params(self, user_ids: np.ndarray) -> dict[str, Tensor]:
        """Current private parameters of ``user_ids``: name -> (U, d)."""
        rows = torch.from_numpy(self._ensure(np.asarray(user_ids, dtype=np.int64)))
        return {k: v[rows] for k, v in self.data.params.items()}


def _grow(state: PrivateState, capacity: int) -> PrivateState:
    n = state.step.shape[0]

    def pad(t: Tensor) -> Tensor:
        out = torch.zeros((capacity, *t.shape[1:]), dtype=t.dtype)
        out[:n] = t
        return out

    return PrivateState(
        params={k: pad(v) for k, v in state.params.items()},
        exp_avg={k: pad(v) for k, v in state.exp_avg.items()},
        exp_avg_sq={k: pad(v) for k, v in state.exp_avg_sq.items()},
        step=pad(state.step),
    )
