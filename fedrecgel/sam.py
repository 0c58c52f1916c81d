"""The hierarchical SAM client step, computed for a whole cohort of clients at once.

For one client c with private parameters u_c and the round's shared parameters w
(ALGORITHM.md, "One round"):

1. pass 1: g_sh = dL/dw, g_ns = dL/du_c at (w, u_c)
2. pass 2: e_sh = rho_sh g_sh / (||g_sh|| + 1e-12); upload = dL/dw at (w + e_sh, u_c)
3. pass 3: e_ns = rho_ns g_ns / (||g_ns|| + 1e-12); g_ns^SAM = dL/du_c at (w, u_c + e_ns)
4. one Adam step on u_c with g_ns^SAM (per-client Adam state, private)

Clients of one round share w, so they are independent: here C clients are stacked on a
leading axis. Each client gets its own *view* of the shared part it touches: the rows of the
item tables for the items in its samples (a local table, (C, U, d)) and, where it is perturbed
per client, its own copy of the small dense score network (C, *shape). Gradients with respect
to the local tables are exactly the sparse item-row upload. Nothing of size clients x items is
built, and the full item tables are never copied.

Clients are grouped by padded sample count; the padding of a client depends only on its own
sample count, so its arithmetic does not depend on which other clients share its batch (the
in-process simulator and a worker owning a shard of the users compute the same uploads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from fedrecgel.config import DEFAULTS
from fedrecgel.model import ModelConfig, forward_batched, init_private


@dataclass(frozen=True)
class SAMConfig:
    """Client-side hyperparameters (defaults: what the reference code actually does)."""

    rho_sh: float = DEFAULTS.rho_sh
    rho_ns: float = DEFAULTS.rho_ns
    client_lr: float = DEFAULTS.client_lr
    n_negatives: int = DEFAULTS.n_negatives
    chunk_size: int = DEFAULTS.chunk_size
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    # Cap on padded samples per batched group (memory knob; does not change results).
    max_batch_samples: int = 1 << 16


@dataclass
class Update:
    """One client's upload: SAM gradients of the shared part, item tables as sparse rows.

    rows:  table name -> (indices (U,) int64 sorted, values (U, d) float32)
    dense: parameter name -> gradient with the parameter's shape
    """

    client_id: int
    n_samples: int
    rows: dict[str, tuple[Tensor, Tensor]]
    dense: dict[str, Tensor]
    loss: float = 0.0

    def densify(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
        """The full dense gradient (tests and the reference comparison only)."""
        out: dict[str, Tensor] = {}
        for name, shape in shapes.items():
            if name in self.rows:
                idx, vals = self.rows[name]
                t = torch.zeros(shape)
                t.index_add_(0, idx, vals)
                out[name] = t
            else:
                out[name] = self.dense[name].clone()
        return out


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

    def select(self, rows: Tensor | np.ndarray | slice) -> PrivateState:
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


def client_rng(seed: int, round_id: int, user_id: int) -> np.random.Generator:
    """The random stream of one client in one round, the same wherever it is computed."""
    return np.random.default_rng([int(seed), int(round_id), int(user_id)])


def client_samples(
    positives: np.ndarray, n_items: int, n_negatives: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One round's training samples of a client: its positives shuffled, each followed by
    ``n_negatives`` distinct items it never interacted with (uniform).

    Returns (items (P*(1+n),) int64, labels (P*(1+n),) float32).
    """
    pos = rng.permutation(np.asarray(positives, dtype=np.int64))
    p = len(pos)
    seen = np.unique(pos)
    if n_items - len(seen) < n_negatives:
        raise ValueError(
            f"a client with {len(seen)} items cannot draw {n_negatives} negatives "
            f"from a catalogue of {n_items}"
        )
    negs = rng.integers(0, n_items, size=(p, n_negatives))
    while True:
        bad = np.isin(negs, seen)
        for j in range(1, n_negatives):
            bad[:, j] |= (negs[:, :j] == negs[:, j : j + 1]).any(axis=1)
        n_bad = int(bad.sum())
        if n_bad == 0:
            break
        negs[bad] = rng.integers(0, n_items, size=n_bad)
    items = np.concatenate([pos[:, None], negs], axis=1).reshape(-1)
    labels = np.zeros((p, 1 + n_negatives), dtype=np.float32)
    labels[:, 0] = 1.0
    return items, labels.reshape(-1)


def chunk_weights(n: int, chunk_size: int) -> np.ndarray:
    """Per-sample loss weights so that sum(w * bce) = sum over chunks of the chunk's mean BCE."""
    w = np.full(n, 1.0 / chunk_size, dtype=np.float32)
    tail = n % chunk_size
    if tail:
        w[n - tail :] = 1.0 / tail
    return w


def padded_length(n: int) -> int:
    """Bucketed sample count: a client's padding depends on its own size only."""
    if n <= 32:
        return 32
    return int(32 * 1.25 ** math.ceil(math.log(n / 32, 1.25)) + 7) // 8 * 8


@dataclass
class StepResult:
    """What a cohort's client step produces: uploads (in input order) and the new private state."""

    uploads: list[Update]
    state: PrivateState
    losses: np.ndarray = field(default_factory=lambda: np.zeros(0))


def _adam_(
    state: PrivateState, grads: dict[str, Tensor], lr: float, betas: tuple[float, float], eps: float
) -> None:
    """One Adam step per row (each user its own step count), as torch.optim.Adam computes it."""
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


def _per_client_norm(tensors: Sequence[Tensor]) -> Tensor:
    """L2 norm over several (C, ...) tensors together, one value per client: (C,)."""
    total = torch.zeros(tensors[0].shape[0], dtype=torch.float32)
    for t in tensors:
        total = total + t.reshape(t.shape[0], -1).pow(2).sum(1)
    return total.sqrt()


def _scale(t: Tensor, factor: Tensor) -> Tensor:
    """Multiply a (C, ...) tensor by a per-client factor (C,)."""
    return t * factor.reshape(-1, *([1] * (t.dim() - 1)))


def _group_step(
    cfg: ModelConfig,
    shared: dict[str, Tensor],
    private: dict[str, Tensor],
    samples: list[tuple[np.ndarray, np.ndarray]],
    s_pad: int,
    hp: SAMConfig,
) -> tuple[
    list[tuple[np.ndarray, dict[str, Tensor]]], dict[str, Tensor], dict[str, Tensor], Tensor
]:
    """The three passes for C clients padded to ``s_pad`` samples.

    Returns per client (unique items, row grads), dense upload grads name -> (C, *shape),
    the private SAM gradient name -> (C, d), and the pass-1 loss (C,).
    """
    c = len(samples)
    tables = cfg.item_tables()
    dense_names = cfg.dense_names()
    uniq_list, local_idx = [], np.zeros((c, s_pad), dtype=np.int64)
    labels = np.zeros((c, s_pad), dtype=np.float32)
    weights = np.zeros((c, s_pad), dtype=np.float32)
    for i, (items, lab) in enumerate(samples):
        uniq, inv = np.unique(items, return_inverse=True)
        uniq_list.append(uniq)
        n = len(items)
        local_idx[i, :n] = inv
        labels[i, :n] = lab
        weights[i, :n] = chunk_weights(n, hp.chunk_size)
    u_pad = max(len(u) for u in uniq_list)
    uniq_pad = np.zeros((c, u_pad), dtype=np.int64)
    for i, u in enumerate(uniq_list):
        uniq_pad[i, : len(u)] = u
    uniq_t = torch.from_numpy(uniq_pad)
    idx_t = torch.from_numpy(local_idx)
    lab_t = torch.from_numpy(labels)
    w_t = torch.from_numpy(weights)

    def gather(local: Tensor) -> Tensor:
        return local.gather(1, idx_t[:, :, None].expand(-1, -1, local.shape[-1]))

    def loss_fn(
        priv: dict[str, Tensor],
        local: dict[str, Tensor],
        dense: dict[str, Tensor],
        per_client: bool,
    ) -> Tensor:
        rows = {t: gather(local[t]) for t in tables}
        logits = forward_batched(cfg, priv, rows, dense, per_client_dense=per_client)
        bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, lab_t, reduction="none")
        return (bce * w_t).sum(1)  # (C,)

    local0 = {t: shared[t][uniq_t] for t in tables}  # (C, U, d)
    dense0 = {n: shared[n].expand(c, *shared[n].shape) for n in dense_names}

    # pass 1: gradients at the unperturbed point
    priv1 = {k: v.detach().clone().requires_grad_() for k, v in private.items()}
    local1 = {t: v.clone().requires_grad_() for t, v in local0.items()}
    dense1 = {n: v.clone().requires_grad_() for n, v in dense0.items()}
    loss1 = loss_fn(priv1, local1, dense1, True)
    leaves = [*priv1.values(), *local1.values(), *dense1.values()]
    g = torch.autograd.grad(loss1.sum(), leaves)
    g_ns = dict(zip(priv1, g[: len(priv1)], strict=True))
    g_sh = dict(zip([*local1, *dense1], g[len(priv1) :], strict=True))

    # pass 2: shared SAM gradient (the upload)
    if hp.rho_sh > 0:
        factor = hp.rho_sh / (_per_client_norm(list(g_sh.values())) + 1e-12)
        local2 = {t: (local0[t] + _scale(g_sh[t], factor)).requires_grad_() for t in tables}
        dense2 = {n: (dense0[n] + _scale(g_sh[n], factor)).requires_grad_() for n in dense_names}
        priv2 = {k: v.detach() for k, v in private.items()}
        loss2 = loss_fn(priv2, local2, dense2, True)
        g2 = torch.autograd.grad(loss2.sum(), [*local2.values(), *dense2.values()])
        g_up = dict(zip([*local2, *dense2], g2, strict=True))
    else:
        g_up = g_sh

    # pass 3: private SAM gradient, shared part unperturbed and common to all clients
    if hp.rho_ns > 0:
        factor = hp.rho_ns / (_per_client_norm(list(g_ns.values())) + 1e-12)
        priv3 = {
            k: (v.detach() + _scale(g_ns[k], factor)).requires_grad_() for k, v in private.items()
        }
        loss3 = loss_fn(priv3, local0, {n: shared[n] for n in dense_names}, False)
        g3 = torch.autograd.grad(loss3.sum(), list(priv3.values()))
        g_priv = dict(zip(priv3, g3, strict=True))
    else:
        g_priv = g_ns

    per_client = []
    for i, uniq in enumerate(uniq_list):
        per_client.append((uniq, {t: g_up[t][i, : len(uniq)] for t in tables}))
    dense_up = {n: g_up[n] for n in dense_names}
    return per_client, dense_up, g_priv, loss1.detach()


def cohort_step(
    cfg: ModelConfig,
    shared: dict[str, Tensor],
    user_ids: np.ndarray,
    state: PrivateState,
    samples: list[tuple[np.ndarray, np.ndarray]],
    hp: SAMConfig,
) -> StepResult:
    """Run the hierarchical SAM client step for C clients together.

    shared:   the round's global parameters (not modified)
    user_ids: (C,) the clients; ``state`` holds their private state in the same order
    samples:  per client (items, labels) from :func:`client_samples`
    Returns the uploads (in input order), the new private state (a copy) and losses (C,).
    """
    c = len(user_ids)
    new_state = state.select(slice(None))
    uploads: list[Update | None] = [None] * c
    losses = np.zeros(c, dtype=np.float64)
    sizes = np.array([len(s[0]) for s in samples])
    pads = np.array([padded_length(int(n)) for n in sizes])
    priv_grads = {k: torch.zeros_like(v) for k, v in state.params.items()}
    with torch.no_grad():
        shared_d = {k: v.detach() for k, v in shared.items()}
    for s_pad in np.unique(pads):
        members = np.flatnonzero(pads == s_pad)
        per_batch = max(1, hp.max_batch_samples // int(s_pad))
        for start in range(0, len(members), per_batch):
            rows = members[start : start + per_batch]
            priv = {k: v[torch.from_numpy(rows)] for k, v in state.params.items()}
            with torch.enable_grad():
                per_client, dense_up, g_priv, loss = _group_step(
                    cfg, shared_d, priv, [samples[i] for i in rows], int(s_pad), hp
                )
            for j, i in enumerate(rows):
                uniq, row_grads = per_client[j]
                idx = torch.from_numpy(uniq)
                uploads[i] = Update(
                    client_id=int(user_ids[i]),
                    n_samples=int(sizes[i]),
                    rows={t: (idx, g.detach().clone()) for t, g in row_grads.items()},
                    dense={n: g[j].detach().clone() for n, g in dense_up.items()},
                    loss=float(loss[j]),
                )
                losses[i] = float(loss[j])
            for k, g in g_priv.items():
                priv_grads[k][torch.from_numpy(rows)] = g.detach()
    with torch.no_grad():
        _adam_(new_state, priv_grads, hp.client_lr, hp.betas, hp.eps)
    return StepResult(uploads=[u for u in uploads if u is not None], state=new_state, losses=losses)
