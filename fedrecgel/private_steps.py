"""The client's private optimizer: Adam steps on the users' own parameters, and the local steps
that fit them to the round's model before the SAM step (:attr:`SAMConfig.local_steps`).

Nothing here leaves the client: the gradients are those of the user's private parameters only,
the shared parameters held fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from fedrecgel import passes
from fedrecgel.model import ModelConfig, init_private
from fedrecgel.passes import make_layout


class PrivateHyper(Protocol):
    """The client settings the private steps read (:class:`fedrecgel.sam.SAMConfig` has them)."""

    @property
    def local_steps(self) -> int: ...
    @property
    def chunk_size(self) -> int: ...
    @property
    def client_lr(self) -> float: ...
    @property
    def betas(self) -> tuple[float, float]: ...
    @property
    def eps(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...


@dataclass
class PrivateState:
    """Private parameters and their Adam state for C users: name -> (C, d), step (C,)."""

    params: dict[str, Tensor]
    exp_avg: dict[str, Tensor]
    exp_avg_sq: dict[str, Tensor]
    step: Tensor  # int64 (C,)

    @staticmethod
    def fresh(cfg: ModelConfig, seed: int, user_ids: np.ndarray) -> PrivateState:
        """Initial state of ``user_ids`` (embeddings keyed by seed and user id, zero moments)."""
        params = init_private(cfg, seed, user_ids)
        return PrivateState(
            params=params,
            exp_avg={k: torch.zeros_like(v) for k, v in params.items()},
            exp_avg_sq={k: torch.zeros_like(v) for k, v in params.items()},
            step=torch.zeros(len(user_ids), dtype=torch.int64),
        )

    def select(self, rows: Tensor | np.ndarray | Sequence[int] | slice) -> PrivateState:
        """The state of a subset of the C users (copies)."""
        idx = torch.as_tensor(rows) if not isinstance(rows, slice) else rows
        return PrivateState(
            params={k: v[idx].clone() for k, v in self.params.items()},
            exp_avg={k: v[idx].clone() for k, v in self.exp_avg.items()},
            exp_avg_sq={k: v[idx].clone() for k, v in self.exp_avg_sq.items()},
            step=self.step[idx].clone(),
        )

    def assign(self, rows: Tensor | np.ndarray, other: PrivateState) -> None:
        """Write ``other`` into the given rows, in place."""
        idx = torch.as_tensor(rows)
        for k in self.params:
            self.params[k][idx] = other.params[k]
            self.exp_avg[k][idx] = other.exp_avg[k]
            self.exp_avg_sq[k][idx] = other.exp_avg_sq[k]
        self.step[idx] = other.step


def adam_(
    state: PrivateState,
    grads: dict[str, Tensor],
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float = 0.0,
) -> None:
    """One Adam step per row (each user its own step count), as torch.optim.Adam computes it
    (torch.optim.AdamW's with ``weight_decay``)."""
    if weight_decay:
        for p in state.params.values():
            p.mul_(1 - lr * weight_decay)
    b1, b2 = betas
    state.step += 1
    t = state.step.to(torch.float64)
    bc1 = (1 - b1**t).to(torch.float32)[:, None]
    bc2_sqrt = torch.sqrt(1 - b2**t).to(torch.float32)[:, None]
    for k, g in grads.items():
        m, v = state.exp_avg[k], state.exp_avg_sq[k]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = v.sqrt() / bc2_sqrt + eps
        state.params[k].sub_(lr / bc1 * m / denom)


def groups_of(sizes: np.ndarray, grouped: bool, cap: int) -> list[tuple[int, int]]:
    """Consecutive client ranges [start, stop) computed together: one client each, or (when
    ``grouped``) as many as fit in ``cap`` samples (one client may exceed it)."""
    out = []
    start, c = 0, len(sizes)
    while start < c:
        stop = start + 1
        n = int(sizes[start])
        while grouped and stop < c and n + sizes[stop] <= cap:
            n += int(sizes[stop])
            stop += 1
        out.append((start, stop))
        start = stop
    return out


def fit_private_(
    cfg: ModelConfig,
    shared: dict[str, Tensor],
    state: PrivateState,
    samples: list[tuple[np.ndarray, np.ndarray]],
    groups: list[tuple[int, int]],
    hp: PrivateHyper,
) -> None:
    """``hp.local_steps`` Adam steps on the clients' private parameters, in place: each the
    gradient of the client's loss on its round's samples with respect to its own embeddings
    only, the shared parameters fixed (nothing of it is uploaded)."""
    if hp.local_steps <= 0:
        return
    dense = {n: shared[n] for n in cfg.dense_names()}
    prepared = []
    for start, stop in groups:
        lay = make_layout(samples[start:stop], cfg.n_items, hp.chunk_size)
        ig = shared["item_gmf"].index_select(0, lay.items)
        im = shared["item_mlp"].index_select(0, lay.items) if cfg.kind == "ncf" else None
        first = None
        if im is not None:
            first = im @ dense["tower.0.weight"][:, cfg.mlp_dim :].T
        prepared.append((start, stop, lay, ig, im, first))
    grads = {k: torch.zeros_like(v) for k, v in state.params.items()}
    for _ in range(hp.local_steps):
        for start, stop, lay, ig, im, first in prepared:
            priv = {k: v[start:stop] for k, v in state.params.items()}
            fw = passes.forward(cfg, lay, priv, ig, im, dense, False, first)
            _, d = passes.loss_grad(lay, fw.logits)
            _, g = passes.backward(cfg, lay, fw, priv, dense, False, d, None, True)
            for k, v in g.items():
                grads[k][start:stop] = v
        adam_(state, grads, hp.client_lr, hp.betas, hp.eps, hp.weight_decay)
