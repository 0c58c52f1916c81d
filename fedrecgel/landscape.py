"""The training loss around trained shared parameters: slices along random directions, sharpness.

Directions follow Li et al., *Visualizing the Loss Landscape of Neural Nets* (NeurIPS 2018):
a Gaussian direction is **filter-normalised**, each row (a filter / output neuron of a weight
matrix, one item of an embedding table) rescaled to the norm of the same row of the parameter, so
that a step of 1 along it moves every row by its own size and two models with differently scaled
weights can be compared. One-dimensional parameters (biases) get a zero direction, as in the paper.

The loss is the clients' training objective evaluated centrally: the mean binary cross-entropy
with logits over every user's training positives, each with ``n_negatives`` negatives drawn once
(seeded) the way a client draws them, with every user's private embeddings held at their trained
values (or a fixed uniform subset of those samples, to bound the cost). Only the shared
parameters move.

* :func:`filter_normalise`, :func:`random_direction`, :func:`moved`: directions and steps;
* :class:`TrainingLoss`: the loss (in chunks, no graph) and Hessian-vector products (autograd);
* :func:`slice_1d`, :func:`slice_2d`: loss values on a line / a plane through the parameters;
* :func:`sharpness`: mean loss increase at a fixed filter-normalised radius;
* :func:`top_hessian_eigenvalue`: power iteration with Hessian-vector products.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from fedrecgel.data import Split
from fedrecgel.model import ModelConfig, forward_batched
from fedrecgel.sam import client_samples

Params = dict[str, Tensor]


def filter_normalise(direction: Params, params: Params, eps: float = 1e-10) -> Params:
    """``direction`` with each row rescaled to the norm of the same row of ``params``.

    Rows are taken along the first dimension (one output neuron of a weight matrix, one item of
    an embedding table); parameters with one dimension (biases) get a zero direction.
    """
    out: Params = {}
    for name, p in params.items():
        d = direction[name]
        if d.shape != p.shape:
            raise ValueError(f"{name}: direction shape {tuple(d.shape)} != {tuple(p.shape)}")
        if p.dim() <= 1:
            out[name] = torch.zeros_like(p)
            continue
        d_rows = d.reshape(d.shape[0], -1)
        p_norm = p.reshape(p.shape[0], -1).norm(dim=1, keepdim=True)
        d_norm = d_rows.norm(dim=1, keepdim=True)
        out[name] = (d_rows * (p_norm / (d_norm + eps))).reshape(p.shape)
    return out


def random_direction(params: Params, generator: torch.Generator) -> Params:
    """A filter-normalised Gaussian direction for ``params`` (drawn in the order of the dict)."""
    raw = {k: torch.randn(v.shape, generator=generator, dtype=v.dtype) for k, v in params.items()}
    return filter_normalise(raw, params)


def moved(params: Params, directions: Sequence[Params], coeffs: Sequence[float]) -> Params:
    """``params + sum_i coeffs[i] * directions[i]``."""
    if len(directions) != len(coeffs):
        raise ValueError(f"{len(directions)} directions but {len(coeffs)} coefficients")
    out = {k: v.clone() for k, v in params.items()}
    for d, c in zip(directions, coeffs, strict=True):
        if c:
            for k in out:
                out[k].add_(d[k], alpha=float(c))
    return out


class TrainingLoss:
    """The mean BCE-with-logits of all users' training samples, as a function of the shared
    parameters (private parameters fixed)."""

    def __init__(
        self,
        cfg: ModelConfig,
        split: Split,
        private: Params,
        n_negatives: int,
        seed: int = 0,
        chunk: int = 32768,
        max_samples: int | None = None,
    ) -> None:
        users, items, labels = [], [], []
        for u in range(split.n_users):
            rng = np.random.default_rng([int(seed), 0x1A5D, u])
            it, lab = client_samples(split.user_train(u), split.n_items, n_negatives, rng)
            users.append(np.full(len(it), u, dtype=np.int64))
            items.append(it)
            labels.append(lab)
        keep = np.arange(sum(len(x) for x in items))
        if max_samples is not None and max_samples < len(keep):
            # a fixed uniform subset of the samples: the same loss, estimated for less compute
            keep = np.sort(
                np.random.default_rng([int(seed), 0x5AB5]).permutation(keep)[:max_samples]
            )
        self.cfg = cfg
        self.private = {k: v.detach() for k, v in private.items()}
        self.users = torch.from_numpy(np.concatenate(users)[keep])
        self.items = torch.from_numpy(np.concatenate(items)[keep])
        self.labels = torch.from_numpy(np.concatenate(labels)[keep])
        self.chunk = chunk

    @property
    def n_samples(self) -> int:
        """Number of (user, item, label) samples the loss averages over."""
        return len(self.labels)

    def _chunk_sum(self, shared: Params, sl: slice) -> Tensor:
        """Sum of the BCE of samples ``sl`` (differentiable in ``shared``)."""
        cfg = self.cfg
        u, it, y = self.users[sl], self.items[sl], self.labels[sl]
        rows = {"item_gmf": shared["item_gmf"][it][:, None, :]}
        dense = {n: shared[n] for n in cfg.dense_names()}
        item_first = None
        if cfg.kind == "ncf":
            # the item half of the first tower layer, once per catalogue (see model.Scorer)
            w0 = shared["tower.0.weight"]
            item_first = (shared["item_mlp"] @ w0[:, cfg.mlp_dim :].T)[it][:, None, :]
        private = {k: v[u] for k, v in self.private.items()}
        logits = forward_batched(cfg, private, rows, dense, False, item_first).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="sum")

    def _slices(self) -> list[slice]:
        return [slice(s, s + self.chunk) for s in range(0, self.n_samples, self.chunk)]

    @torch.no_grad()
    def __call__(self, shared: Params) -> float:
        """The loss at ``shared``."""
        total = sum(float(self._chunk_sum(shared, sl)) for sl in self._slices())
        return total / self.n_samples

    def hvp(self, shared: Params, v: Params) -> Params:
        """Hessian (w.r.t. the shared parameters) times ``v``, summed chunk by chunk."""
        out = {k: torch.zeros_like(t) for k, t in shared.items()}
        names = list(shared)
        with torch.enable_grad():
            for sl in self._slices():
                params = {k: t.detach().requires_grad_(True) for k, t in shared.items()}
                loss = self._chunk_sum(params, sl) / self.n_samples
                grads = torch.autograd.grad(loss, [params[k] for k in names], create_graph=True)
                dot = torch.stack(
                    [(g * v[k]).sum() for g, k in zip(grads, names, strict=True)]
                ).sum()
                hv = torch.autograd.grad(dot, [params[k] for k in names], allow_unused=True)
                for k, h in zip(names, hv, strict=True):
                    if h is not None:
                        out[k] += h
        return out


LossFn = Callable[[Params], float]


def slice_1d(
    loss: LossFn, params: Params, direction: Params, alphas: Sequence[float]
) -> np.ndarray:
    """``loss(params + a * direction)`` for each ``a`` of ``alphas``."""
    return np.array([loss(moved(params, [direction], [a])) for a in alphas])


def slice_2d(
    loss: LossFn,
    params: Params,
    d1: Params,
    d2: Params,
    alphas: Sequence[float],
    betas: Sequence[float],
) -> np.ndarray:
    """``loss(params + a * d1 + b * d2)``: an array (len(alphas), len(betas))."""
    return np.array([[loss(moved(params, [d1, d2], [a, b])) for b in betas] for a in alphas])


def sharpness(
    loss: LossFn, params: Params, directions: Sequence[Params], radius: float
) -> dict[str, float | list[float]]:
    """Mean loss increase over ``params + radius * d`` and ``params - radius * d`` for every
    direction ``d``: ``{"base", "mean_increase", "max_increase", "increases"}``."""
    base = loss(params)
    inc = [loss(moved(params, [d], [s * radius])) - base for d in directions for s in (1, -1)]
    return {
        "base": base,
        "mean_increase": float(np.mean(inc)),
        "max_increase": float(np.max(inc)),
        "increases": [float(x) for x in inc],
    }


def _dot(a: Params, b: Params) -> float:
    return float(sum((a[k] * b[k]).sum() for k in a))


def top_hessian_eigenvalue(
    hvp: Callable[[Params], Params],
    like: Params,
    generator: torch.Generator,
    iters: int = 20,
    tol: float = 1e-3,
) -> tuple[float, list[float]]:
    """The Hessian eigenvalue of largest magnitude by power iteration: (estimate, history).

    ``hvp(v)`` returns the Hessian times ``v``; ``like`` gives the shapes. Stops when the
    Rayleigh quotient changes by less than ``tol`` (relative) or after ``iters`` products.
    """
    v = {k: torch.randn(t.shape, generator=generator, dtype=t.dtype) for k, t in like.items()}
    norm = _dot(v, v) ** 0.5
    v = {k: t / norm for k, t in v.items()}
    history: list[float] = []
    for _ in range(iters):
        hv = hvp(v)
        lam = _dot(v, hv)
        history.append(lam)
        norm = _dot(hv, hv) ** 0.5
        if norm == 0:
            break
        v = {k: t / norm for k, t in hv.items()}
        if len(history) > 1 and abs(history[-1] - history[-2]) <= tol * abs(history[-1]):
            break
    return history[-1], history
