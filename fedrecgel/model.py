"""The NCF (NeuMF) and MF models, split into private user parameters and shared parameters.

Everything here is functional: parameters live in plain ``dict[str, Tensor]`` so that the
simulator can hold one shared copy for a whole cohort, the services can ship them as
safetensors, and the per-client SAM step can batch many clients without copying modules.

Shared parameters (the server's):
    ``item_gmf``  (I, F)          item GMF embeddings  (NCF and MF)
    ``item_mlp``  (I, F * 2^(L-1)) item MLP embeddings  (NCF only)
    ``tower.{k}.weight/bias``     MLP tower, Linear 2E -> E -> ... -> F, ReLU after each
    ``predict.weight`` (1, 2F), ``predict.bias`` (1,)
Private parameters (one row per user, never leave the client):
    ``user_gmf`` (F), ``user_mlp`` (E)   for NCF;   ``user_gmf`` (F) for MF.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedrecgel.config import DEFAULTS
from fedrecgel.config import ModelKind as ModelKind  # re-exported

ITEM_TABLES = ("item_gmf", "item_mlp")


@dataclass(frozen=True)
class ModelConfig:
    """Model shape: kind, catalogue size, GMF factor and number of MLP layers."""

    n_items: int
    kind: ModelKind = DEFAULTS.kind
    factor: int = DEFAULTS.factor
    layers: int = DEFAULTS.layers

    @property
    def mlp_dim(self) -> int:
        """Width of the MLP embeddings: factor * 2^(layers-1)."""
        dim: int = self.factor * 2 ** (self.layers - 1)
        return dim

    def tower_sizes(self) -> list[tuple[int, int]]:
        """(in, out) of each tower layer: 2E -> E -> E/2 ... -> F."""
        sizes = []
        width = 2 * self.mlp_dim
        for _ in range(self.layers):
            sizes.append((width, width // 2))
            width //= 2
        return sizes

    def item_tables(self) -> tuple[str, ...]:
        """Names of the shared parameters that are row-indexed by item."""
        return ("item_gmf", "item_mlp") if self.kind == "ncf" else ("item_gmf",)

    def private_dims(self) -> dict[str, int]:
        """Name -> width of each private (per-user) parameter."""
        if self.kind == "ncf":
            return {"user_gmf": self.factor, "user_mlp": self.mlp_dim}
        return {"user_gmf": self.factor}

    def shared_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every shared parameter, in canonical order."""
        shapes: dict[str, tuple[int, ...]] = {"item_gmf": (self.n_items, self.factor)}
        if self.kind == "ncf":
            shapes["item_mlp"] = (self.n_items, self.mlp_dim)
            for k, (fan_in, fan_out) in enumerate(self.tower_sizes()):
                shapes[f"tower.{k}.weight"] = (fan_out, fan_in)
                shapes[f"tower.{k}.bias"] = (fan_out,)
            shapes["predict.weight"] = (1, 2 * self.factor)
            shapes["predict.bias"] = (1,)
        return shapes

    def n_shared(self) -> int:
        """How many shared parameters the model has (nothing is allocated to count them)."""
        return sum(math.prod(shape) for shape in self.shared_shapes().values())

    def dense_names(self) -> tuple[str, ...]:
        """Names of the shared parameters that are not item tables (the score network)."""
        tables = set(self.item_tables())
        return tuple(n for n in self.shared_shapes() if n not in tables)


def init_shared(cfg: ModelConfig, seed: int) -> dict[str, Tensor]:
    """Initial shared parameters: N(0, 0.01^2) embeddings, Xavier tower, Kaiming predict, 0 bias."""
    gen = torch.Generator().manual_seed(int(seed))
    out: dict[str, Tensor] = {}
    for name, shape in cfg.shared_shapes().items():
        t = torch.empty(shape)
        if name in ITEM_TABLES:
            t.normal_(0.0, 0.01, generator=gen)
        elif name.startswith("tower.") and name.endswith("weight"):
            fan_out, fan_in = shape
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            t.uniform_(-bound, bound, generator=gen)
        elif name == "predict.weight":
            # kaiming_uniform(a=1, nonlinearity='sigmoid'): gain 1, bound = sqrt(3 / fan_in)
            bound = math.sqrt(3.0 / shape[1])
            t.uniform_(-bound, bound, generator=gen)
        else:
            t.zero_()
        out[name] = t
    return out


def init_private(cfg: ModelConfig, seed: int, user_ids: np.ndarray) -> dict[str, Tensor]:
    """Initial private embeddings for ``user_ids``: N(0, 0.01^2), each user's draw keyed by
    (seed, user id) so that any shard of users gets the same values as the whole population.

    Returns name -> (U, d).
    """
    dims = cfg.private_dims()
    total = sum(dims.values())
    rows = np.empty((len(user_ids), total), dtype=np.float32)
    for r, uid in enumerate(np.asarray(user_ids, dtype=np.int64)):
        rng = np.random.default_rng([int(seed), 0x5EED, int(uid)])
        rows[r] = rng.normal(0.0, 0.01, size=total)
    flat = torch.from_numpy(rows)
    out: dict[str, Tensor] = {}
    start = 0
    for name, d in dims.items():
        out[name] = flat[:, start : start + d].clone()
        start += d
    return out


def forward_batched(
    cfg: ModelConfig,
    private: dict[str, Tensor],
    item_rows: dict[str, Tensor],
    dense: dict[str, Tensor],
    per_client_dense: bool,
    item_first: Tensor | None = None,
) -> Tensor:
    """Logits for C clients x S samples each: the one forward pass of the model (training,
    evaluation and :meth:`Scorer.score` all run it).

    private:    name -> (C, d)           one row per client
    item_rows:  name -> (C, S, d)        the item embedding of every sample; ``item_mlp`` may
                be left out when ``item_first`` is given
    dense:      name -> (C, *shape) when ``per_client_dense`` (each client its own copy,
                e.g. a SAM-perturbed tower), else name -> shape (one tower for all).
    item_first: (C, S, H) the item half of the first tower layer of every sample, when it was
                computed beforehand (:class:`Scorer` does it once per catalogue); shared dense
                parameters only
    returns     (C, S) logits
    """
    ugmf = private["user_gmf"][:, None, :]
    gmf = ugmf * item_rows["item_gmf"]
    if cfg.kind == "mf":
        return gmf.sum(-1)
    # The first layer is linear over concat(user, item): its user half is one (H,) vector per
    # client, added to every sample, instead of being recomputed for each sample.
    e = cfg.mlp_dim
    w0, b0 = dense["tower.0.weight"], dense["tower.0.bias"]
    umlp = private["user_mlp"]
    if per_client_dense:
        user_half = torch.bmm(w0[:, :, :e], umlp[:, :, None]).squeeze(-1) + b0  # (C, H)
        h = torch.bmm(item_rows["item_mlp"], w0[:, :, e:].transpose(1, 2))  # (C, S, H)
    else:
        user_half = torch.nn.functional.linear(umlp, w0[:, :e], b0)
        if item_first is None:
            item_first = torch.nn.functional.linear(item_rows["item_mlp"], w0[:, e:])
        h = item_first
    h = _hidden_layers(cfg, torch.relu(h + user_half[:, None, :]), dense, per_client_dense)
    z = torch.cat([gmf, h], dim=-1)
    wp, bp = dense["predict.weight"], dense["predict.bias"]
    if per_client_dense:
        return torch.baddbmm(bp[:, None, :], z, wp.transpose(1, 2)).squeeze(-1)
    return torch.nn.functional.linear(z, wp, bp).squeeze(-1)


def _hidden_layers(
    cfg: ModelConfig, h: Tensor, dense: dict[str, Tensor], per_client_dense: bool
) -> Tensor:
    """The tower after its first layer: (C, S, H) activations -> (C, S, F)."""
    for k in range(1, cfg.layers):
        w, b = dense[f"tower.{k}.weight"], dense[f"tower.{k}.bias"]
        if per_client_dense:
            h = torch.relu(torch.baddbmm(b[:, None, :], h, w.transpose(1, 2)))
        else:
            h = torch.relu(torch.nn.functional.linear(h, w, b))
    return h


class Scorer:
    """Scores users against items with the shared parameters of one model version.

    The first tower layer is linear over concat(user, item), so its item half is computed
    once here for the whole catalogue: scoring a user against I items then costs one small
    matmul per remaining layer instead of the full tower.
    """

    def __init__(
        self, cfg: ModelConfig, shared: dict[str, Tensor], item_first: Tensor | None = None
    ) -> None:
        """``item_first``: the item half ``item_mlp @ W0_item^T`` computed by the caller (then
        ``shared`` need not hold ``item_mlp``); computed here when None."""
        self.cfg = cfg
        self.shared = {k: v.detach() for k, v in shared.items()}
        self.item_first: Tensor | None = None
        if cfg.kind == "ncf":
            w0 = self.shared["tower.0.weight"]
            e = cfg.mlp_dim
            self.user_w0 = w0[:, :e]  # (H, E)
            if item_first is None:
                item_first = self.shared["item_mlp"] @ w0[:, e:].T
            self.item_first = item_first  # (I, H)

    @torch.no_grad()
    def score(self, private: dict[str, Tensor], items: Tensor) -> Tensor:
        """Logits of U users for their own candidates: private (U, d), items (U, K) -> (U, K)."""
        s = self.shared
        item_first = None if self.item_first is None else self.item_first[items]
        rows = {"item_gmf": s["item_gmf"][items]}
        return forward_batched(self.cfg, private, rows, s, False, item_first)

    @torch.no_grad()
    def score_all(self, private: dict[str, Tensor]) -> Tensor:
        """Logits of U users against the whole catalogue: private (U, d) -> (U, I).

        The same model as :func:`forward_batched`, arranged for a whole catalogue: the GMF
        half of the predict layer is folded into the item table (one (U, F) x (F, I) matmul
        instead of an (U, I, F) product and a concatenation), and items go in chunks so that
        the (U, chunk, H) activations stay small. That is what keeps a full ranking of a large
        catalogue fast, so this arrangement stays next to the general one; a test holds the
        two to the same logits.
        """
        s = self.shared
        if self.cfg.kind == "mf":
            return private["user_gmf"] @ s["item_gmf"].T
        assert self.item_first is not None
        u = private["user_gmf"].shape[0]
        out = torch.empty(u, self.cfg.n_items)
        user_first = private["user_mlp"] @ self.user_w0.T
        wp = s["predict.weight"][0]
        f = self.cfg.factor
        for start in range(0, self.cfg.n_items, 8192):
            sl = slice(start, min(start + 8192, self.cfg.n_items))
            h = torch.relu(user_first[:, None, :] + self.item_first[sl] + s["tower.0.bias"])
            h = _hidden_layers(self.cfg, h, s, False)
            gmf_part = private["user_gmf"] @ (s["item_gmf"][sl] * wp[:f]).T
            out[:, sl] = gmf_part + h @ wp[f:] + s["predict.bias"]
        return out
