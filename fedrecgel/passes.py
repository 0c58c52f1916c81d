"""The three SAM passes of a group of clients, forward and backward written out by hand.

A group's samples lie back to back in one flat layout, client after client, with no padding
(:class:`Layout`). Where the score network is the same for every client (passes 1 and 3) a
layer is one matrix product over all the group's samples; where each client has its own
perturbed copy (pass 2) it is one product per client over that client's rows. Each pass
computes only the gradients it needs: pass 1 everything (the perturbations need them), pass 2
the shared part, pass 3 the private part, and pass 3 reuses pass 1's item half of the first
tower layer (same items, same weights).

The shared gradients come in one of two forms:

* **per client** (:class:`SharedGrads` with ``per_client``): every client's item-row
  gradient (its (client, item) pairs, sorted by item) and its own dense score-network
  gradient, which is what a client uploads;
* **aggregate**: ``sum_c a_c g_c`` for given client weights ``a_c``, summed inside the
  backward (the loss of client c is scaled by ``a_c``, so each layer's weight gradient is one
  product over all samples and no per-client copy of the score network is held). Float
  rounding differs from summing the per-client uploads one by one.

The model is :func:`fedrecgel.model.forward_batched`'s (NCF or MF); a test holds the two to
the same logits and gradients.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedrecgel.model import ModelConfig


@dataclass
class Layout:
    """C clients' samples back to back (N in all), and their distinct (client, item) pairs.

    offsets: (C+1,) sample offsets; pair_offsets: (C+1,) pair offsets (pairs are sorted by
    client, then item); client: (N,) client index of each sample; sample_pair: (N,) pair index
    of each sample; items (N,), labels (N,), weights (N,) (the chunked-loss weights)."""

    offsets: np.ndarray
    pair_offsets: np.ndarray
    client: Tensor
    items: Tensor
    labels: Tensor
    weights: Tensor
    pair_items: Tensor
    pair_client: Tensor
    sample_pair: Tensor

    @property
    def n_clients(self) -> int:
        """C."""
        return len(self.offsets) - 1

    @property
    def sizes(self) -> Tensor:
        """Samples per client (C,)."""
        return torch.from_numpy(np.diff(self.offsets))

    def spans(self) -> list[tuple[int, int]]:
        """Each client's sample range [a, b)."""
        o = self.offsets.tolist()
        return list(itertools.pairwise(o))

    def split(self, x: Tensor) -> tuple[Tensor, ...]:
        """Each client's rows of a per-sample (N, ...) tensor (views, made in one call)."""
        return torch.split(x, np.diff(self.offsets).tolist())


def make_layout(
    samples: list[tuple[np.ndarray, np.ndarray]], n_items: int, chunk_size: int
) -> Layout:
    """The flat layout of ``samples`` (per client: items, labels)."""
    sizes = np.fromiter((len(s[0]) for s in samples), dtype=np.int64, count=len(samples))
    offsets = np.zeros(len(samples) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    items = np.concatenate([np.asarray(s[0], dtype=np.int64) for s in samples])
    labels = np.concatenate([np.asarray(s[1], dtype=np.float32) for s in samples])
    client = np.repeat(np.arange(len(samples), dtype=np.int64), sizes)
    # chunked loss: 1/chunk for full chunks, 1/tail for a client's last partial chunk
    pos = np.arange(len(items), dtype=np.int64) - offsets[client]
    n = sizes[client]
    tail = n % chunk_size
    in_tail = pos >= n - tail
    weights = np.where(in_tail, 1.0 / np.maximum(tail, 1), 1.0 / chunk_size).astype(np.float32)
    pairs, sample_pair = np.unique(client * n_items + items, return_inverse=True)
    pair_client = pairs // n_items
    pair_offsets = np.searchsorted(pair_client, np.arange(len(samples) + 1))
    return Layout(
        offsets=offsets,
        pair_offsets=pair_offsets,
        client=torch.from_numpy(client),
        items=torch.from_numpy(items),
        labels=torch.from_numpy(labels),
        weights=torch.from_numpy(weights),
        pair_items=torch.from_numpy(pairs - pair_client * n_items),
        pair_client=torch.from_numpy(pair_client),
        sample_pair=torch.from_numpy(sample_pair.reshape(-1)),
    )


def seg_sum(lay: Layout, x: Tensor) -> Tensor:
    """Per-client sums of per-sample rows: (N, ...) -> (C, ...)."""
    out = torch.zeros((lay.n_clients, *x.shape[1:]), dtype=x.dtype)
    return out.index_add_(0, lay.client, x)


def _per_client(t: Tensor, lay: Layout) -> Tensor:
    """A per-client (C, d) tensor repeated for each of its samples: (N, d) (one gather)."""
    return t.index_select(0, lay.client)


def relu_grad_(d: Tensor, x: Tensor) -> Tensor:
    """``d`` where the ReLU output ``x`` is positive, else 0, written over ``d`` (one fused
    pass that allocates nothing; the same as ``d * (x > 0)`` up to the sign of zeros)."""
    out: Tensor = torch.ops.aten.threshold_backward.grad_input(d, x, 0.0, grad_input=d)
    return out


@dataclass
class Forward:
    """What a pass's backward needs of its forward."""

    logits: Tensor  # (N,)
    ig: Tensor  # (N, F) item GMF rows of the samples
    a_gmf: Tensor  # (N, F) the GMF product
    im: Tensor | None  # (N, E) item MLP rows
    hidden: list[Tensor]  # post-ReLU activations of each tower layer, (N, width)
    item_first: Tensor | None  # (N, H) item half of the first layer (shared weights only)


@dataclass
class SharedGrads:
    """Shared gradients: per client (``rows`` per pair (P, d), ``dense`` (C, *shape)) or
    aggregated (``rows`` and ``dense`` with the parameters' own shapes)."""

    rows: dict[str, Tensor]
    dense: dict[str, Tensor]
    per_client: bool


def forward(
    cfg: ModelConfig,
    lay: Layout,
    priv: dict[str, Tensor],
    ig: Tensor,
    im: Tensor | None,
    dense: dict[str, Tensor],
    per_client: bool,
    item_first: Tensor | None = None,
) -> Forward:
    """Logits of every sample. ``priv``: (C, d); ``ig``/``im``: per-sample item rows;
    ``dense``: shapes of the model (shared) or (C, *shape) (``per_client``)."""
    a_gmf = _per_client(priv["user_gmf"], lay) * ig
    if cfg.kind == "mf":
        return Forward(a_gmf.sum(1), ig, a_gmf, None, [], None)
    assert im is not None
    e = cfg.mlp_dim
    w0, b0 = dense["tower.0.weight"], dense["tower.0.bias"]
    u = priv["user_mlp"]
    if per_client:  # the user half enters each client's products as their bias row
        user_half = torch.baddbmm(b0[:, :, None], w0[:, :, :e], u[:, :, None]).squeeze(-1)
        h = torch.empty(len(lay.client), w0.shape[1])
        wt = w0[:, :, e:].transpose(1, 2).unbind(0)
        for hc, xc, wc, bc in zip(
            lay.split(h), lay.split(im), wt, user_half.unbind(0), strict=True
        ):
            torch.addmm(bc, xc, wc, out=hc)
        item_first = None
    else:
        user_half = torch.nn.functional.linear(u, w0[:, :e], b0)
        if item_first is None:
            item_first = im @ w0[:, e:].T
        h = torch.add(item_first, _per_client(user_half, lay))
    h.relu_()
    hidden = [h]
    for k in range(1, cfg.layers):
        w, bias = dense[f"tower.{k}.weight"], dense[f"tower.{k}.bias"]
        if per_client:
            out = torch.empty(len(lay.client), w.shape[1])
            wt = w.transpose(1, 2).unbind(0)
            for oc, xc, wc, bc in zip(
                lay.split(out), lay.split(h), wt, bias.unbind(0), strict=True
            ):
                torch.addmm(bc, xc, wc, out=oc)
            h = out
        else:
            h = torch.addmm(bias, h, w.T)
        hidden.append(h.relu_())
    wp, bp = dense["predict.weight"], dense["predict.bias"]
    f = cfg.factor
    if per_client:
        wpn = _per_client(wp[:, 0, :], lay)
        logits = (a_gmf * wpn[:, :f]).sum(1) + (h * wpn[:, f:]).sum(1) + _per_client(bp, lay)[:, 0]
    else:
        logits = torch.addmv(bp.expand(len(lay.client)), a_gmf, wp[0, :f])
        logits.addmv_(h, wp[0, f:])
    return Forward(logits, ig, a_gmf, im, hidden, item_first)


def loss_grad(lay: Layout, logits: Tensor, scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-client loss (C,) (sum over chunks of the chunk's mean BCE) and d loss / d logit (N,)
    of ``sum_c scale_c loss_c`` (``scale``: (C,), default 1)."""
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, lay.labels, reduction="none")
    loss = seg_sum(lay, bce * lay.weights)
    w = lay.weights if scale is None else lay.weights * _per_client(scale[:, None], lay)[:, 0]
    return loss, (torch.sigmoid(logits) - lay.labels) * w


def backward(  # noqa: C901  # hand-written backward: a branch per model kind and output asked for
    cfg: ModelConfig,
    lay: Layout,
    fw: Forward,
    priv: dict[str, Tensor],
    dense: dict[str, Tensor],
    per_client: bool,
    dlogit: Tensor,
    shared: str | None,
    private: bool,
    rows_out: dict[str, Tensor] | None = None,
) -> tuple[SharedGrads | None, dict[str, Tensor]]:
    """Gradients of the pass whose forward is ``fw`` (``dense`` and ``per_client`` as given to
    :func:`forward`). ``shared``: None (not needed), "per_client" or "aggregate";
    ``private``: whether the private gradients (C, d) are needed; ``rows_out``: item tables
    (I, d) the aggregate item-row gradients are added to (new ones otherwise)."""
    out = rows_out or {}
    n_items = cfg.n_items
    f = cfg.factor
    rows: dict[str, Tensor] = {}
    dn: dict[str, Tensor] = {}
    g_priv: dict[str, Tensor] = {}
    pc_out = shared == "per_client"
    if cfg.kind == "mf":
        d_gmf = dlogit[:, None].expand(-1, f)
    else:
        wp = dense["predict.weight"]
        if per_client:
            wpn = _per_client(wp[:, 0, :], lay)
            d_gmf, d_h = dlogit[:, None] * wpn[:, :f], dlogit[:, None] * wpn[:, f:]
        else:
            d_gmf, d_h = dlogit[:, None] * wp[0, :f], dlogit[:, None] * wp[0, f:]
        hid = fw.hidden
        if shared is not None:
            if pc_out:
                z = torch.cat([fw.a_gmf, hid[-1]], 1).mul_(dlogit[:, None])
                dn["predict.weight"] = seg_sum(lay, z)[:, None, :]
                dn["predict.bias"] = seg_sum(lay, dlogit[:, None])
            else:
                dn["predict.weight"] = torch.cat([dlogit @ fw.a_gmf, dlogit @ hid[-1]])[None]
                dn["predict.bias"] = dlogit.sum().reshape(1)
        dpre = relu_grad_(d_h, hid[-1])
        for k in range(cfg.layers - 1, 0, -1):
            w = dense[f"tower.{k}.weight"]
            x = hid[k - 1]
            if shared is not None:
                if pc_out:
                    gw = torch.empty(lay.n_clients, *w.shape[-2:])
                    for gc, dc, xc in zip(gw.unbind(0), lay.split(dpre), lay.split(x), strict=True):
                        torch.mm(dc.T, xc, out=gc)
                    dn[f"tower.{k}.weight"] = gw
                    dn[f"tower.{k}.bias"] = seg_sum(lay, dpre)
                else:
                    dn[f"tower.{k}.weight"] = dpre.T @ x
                    dn[f"tower.{k}.bias"] = dpre.sum(0)
            if per_client:
                dx = torch.empty_like(x)
                for oc, dc, wc in zip(lay.split(dx), lay.split(dpre), w.unbind(0), strict=True):
                    torch.mm(dc, wc, out=oc)
            else:
                dx = dpre @ w
            dpre = relu_grad_(dx, x)
        # first layer: a user half (one row per client) and an item half (one per sample)
        e = cfg.mlp_dim
        w0 = dense["tower.0.weight"]
        s = seg_sum(lay, dpre)  # (C, H)
        u = priv["user_mlp"]
        im = fw.im
        assert im is not None
        if shared is not None:
            if pc_out:
                g0 = torch.empty(lay.n_clients, *w0.shape[-2:])
                torch.mul(s[:, :, None], u[:, None, :], out=g0[:, :, :e])
                for gc, dc, xc in zip(
                    g0[:, :, e:].unbind(0), lay.split(dpre), lay.split(im), strict=True
                ):
                    torch.mm(dc.T, xc, out=gc)
                dn["tower.0.weight"] = g0
                dn["tower.0.bias"] = s
            else:
                dn["tower.0.weight"] = torch.cat([s.T @ u, dpre.T @ im], 1)
                dn["tower.0.bias"] = s.sum(0)
            if per_client:
                d_im = torch.empty_like(im)
                wi = w0[:, :, e:].unbind(0)
                for oc, dc, wc in zip(lay.split(d_im), lay.split(dpre), wi, strict=True):
                    torch.mm(dc, wc, out=oc)
            else:
                d_im = dpre @ w0[:, e:]
            rows["item_mlp"] = _rows(lay, d_im, pc_out, n_items, out.get("item_mlp"))
        if private:
            if per_client:
                g_priv["user_mlp"] = torch.bmm(s[:, None, :], w0[:, :, :e]).squeeze(1)
            else:
                g_priv["user_mlp"] = s @ w0[:, :e]
    if shared is not None:
        d_ig = d_gmf * _per_client(priv["user_gmf"], lay)
        rows["item_gmf"] = _rows(lay, d_ig, pc_out, n_items, out.get("item_gmf"))
    if private:
        g_priv["user_gmf"] = seg_sum(lay, d_gmf * fw.ig)
    if shared is None:
        return None, g_priv
    return SharedGrads(rows, dn, pc_out), g_priv


def _rows(lay: Layout, d: Tensor, per_client: bool, n_items: int, out: Tensor | None) -> Tensor:
    """Item-row gradients: per (client, item) pair (P, d), or summed per item (I, d) (into
    ``out`` when given)."""
    if per_client:
        return torch.zeros(len(lay.pair_items), d.shape[1]).index_add_(0, lay.sample_pair, d)
    if out is None:
        out = torch.zeros(n_items, d.shape[1])
    return out.index_add_(0, lay.items, d)
