"""A plain per-client loop implementation of the same client step, used as the reference.

It is deliberately written the straightforward way (an ``nn.Module`` over the full shared
parameters, one client at a time, dense gradients, in-place perturb / restore, one
``torch.optim.Adam`` per client), independent of the batched code in :mod:`fedrecgel.sam`.
Tests compare the two; ``bench/speed.py`` measures the batched code against it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from fedrecgel.model import ModelConfig
from fedrecgel.sam import PrivateState, SAMConfig
from fedrecgel.uploads import Update


class NCFModule(nn.Module):
    """NeuMF for a single user: the shared parameters plus that user's private embeddings."""

    def __init__(self, cfg: ModelConfig, shared: dict[str, Tensor], private: dict[str, Tensor]):
        super().__init__()
        self.cfg = cfg
        self.shared = nn.ParameterDict(
            {k.replace(".", "_"): nn.Parameter(v.clone()) for k, v in shared.items()}
        )
        self.private = nn.ParameterDict({k: nn.Parameter(v.clone()) for k, v in private.items()})

    def sh(self, name: str) -> nn.Parameter:
        """Shared parameter by its canonical name."""
        p: nn.Parameter = self.shared[name.replace(".", "_")]
        return p

    def forward(self, items: Tensor) -> Tensor:
        """Logits of this user for ``items`` (S,) -> (S,)."""
        gmf = self.private["user_gmf"] * self.sh("item_gmf")[items]
        if self.cfg.kind == "mf":
            score: Tensor = gmf.sum(-1)
            return score
        umlp = self.private["user_mlp"].expand(len(items), -1)
        h = torch.cat([umlp, self.sh("item_mlp")[items]], dim=-1)
        for k in range(self.cfg.layers):
            h = torch.relu(
                nn.functional.linear(h, self.sh(f"tower.{k}.weight"), self.sh(f"tower.{k}.bias"))
            )
        z = torch.cat([gmf, h], dim=-1)
        return nn.functional.linear(z, self.sh("predict.weight"), self.sh("predict.bias"))[:, 0]


def _chunked_loss(model: NCFModule, items: Tensor, labels: Tensor, chunk: int) -> Tensor:
    """Sum over consecutive chunks of the mean BCE in the chunk (the reference's loss)."""
    total = torch.zeros(())
    for start in range(0, len(items), chunk):
        logits = model(items[start : start + chunk])
        total = total + nn.functional.binary_cross_entropy_with_logits(
            logits, labels[start : start + chunk]
        )
    return total


def _grads(params: list[nn.Parameter]) -> list[Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]


def reference_client_step(
    cfg: ModelConfig,
    shared: dict[str, Tensor],
    user_id: int,
    state: PrivateState,
    items_np: np.ndarray,
    labels_np: np.ndarray,
    hp: SAMConfig,
) -> tuple[Update, PrivateState]:
    """One client's hierarchical SAM step, the plain way. ``state`` holds this one user (C=1)."""
    private = {k: v[0] for k, v in state.params.items()}
    model = NCFModule(cfg, shared, private)
    items = torch.from_numpy(items_np)
    labels = torch.from_numpy(labels_np)
    sh_params = [model.sh(n) for n in shared]
    ns_params = list(model.private.values())

    # Persistent per-client Adam: rebuild the optimizer around the stored moments.
    opt: torch.optim.Optimizer
    if hp.weight_decay:
        opt = torch.optim.AdamW(
            ns_params, lr=hp.client_lr, betas=hp.betas, eps=hp.eps, weight_decay=hp.weight_decay
        )
    else:
        opt = torch.optim.Adam(ns_params, lr=hp.client_lr, betas=hp.betas, eps=hp.eps)
    step = int(state.step[0])
    if step > 0:
        for name, p in model.private.items():
            opt.state[p] = {
                "step": torch.tensor(float(step)),
                "exp_avg": state.exp_avg[name][0].clone(),
                "exp_avg_sq": state.exp_avg_sq[name][0].clone(),
            }
    # local steps: the private embeddings fitted to this round's shared parameters first
    for _ in range(hp.local_steps):
        model.zero_grad()
        torch.autograd.backward(_chunked_loss(model, items, labels, hp.chunk_size))
        for p, g in zip(ns_params, _grads(ns_params), strict=True):
            p.grad = g
        opt.step()
    step += hp.local_steps

    model.zero_grad()
    loss = _chunked_loss(model, items, labels, hp.chunk_size)
    torch.autograd.backward(loss)
    g_sh, g_ns = _grads(sh_params), _grads(ns_params)

    def sam_gradient(params: list[nn.Parameter], grads: list[Tensor], rho: float) -> list[Tensor]:
        """Perturb ``params`` by rho * g / ||g||, take the gradient there, restore them."""
        if rho <= 0:
            return grads
        norm = torch.sqrt(torch.stack([(g**2).sum() for g in grads]).sum())
        eps = [rho * g / (norm + 1e-12) for g in grads]
        with torch.no_grad():
            for p, e in zip(params, eps, strict=True):
                p.add_(e)
        model.zero_grad()
        torch.autograd.backward(_chunked_loss(model, items, labels, hp.chunk_size))
        at_perturbed = _grads(params)
        with torch.no_grad():
            for p, e in zip(params, eps, strict=True):
                p.sub_(e)
        return at_perturbed

    upload = sam_gradient(sh_params, g_sh, hp.rho_sh)
    g_priv = sam_gradient(ns_params, g_ns, hp.rho_ns)

    for p, g in zip(ns_params, g_priv, strict=True):
        p.grad = g
    opt.step()
    new_state = PrivateState(
        params={k: p.detach()[None].clone() for k, p in model.private.items()},
        exp_avg={k: opt.state[p]["exp_avg"][None].clone() for k, p in model.private.items()},
        exp_avg_sq={k: opt.state[p]["exp_avg_sq"][None].clone() for k, p in model.private.items()},
        step=torch.tensor([step + 1]),
    )
    dense_grads = dict(zip(shared, upload, strict=True))
    rows = {}
    for t in cfg.item_tables():
        idx = torch.from_numpy(np.unique(items_np))
        rows[t] = (idx, dense_grads[t][idx])
    update = Update(
        client_id=int(user_id),
        n_samples=len(items_np),
        rows=rows,
        dense={n: dense_grads[n] for n in cfg.dense_names()},
        loss=float(loss.detach()),
    )
    return update, new_state
