"""The attainable floor of a simulator round on this machine: its matrix products at their
actual shapes, and the memory traffic no fusion of the elementwise work removes.

Used by ``bench/roofline.py``. :func:`product_floor` replays, on random tensors of the same
shapes, every matrix product the aggregate client step (:mod:`fedrecgel.passes`) computes for a
round's cohort: the same groups of clients (at most ``max_batch_samples`` samples), one product
over all of a group's samples where the score network is shared (passes 1 and 3, pass 2's
weight gradients), one per client where each client has its own (pass 1's weight gradients,
pass 2's forward and input gradients). Each product is timed alone (best of a few), so the sum
is what torch's kernels need for the round's arithmetic at these shapes, with nothing else
running between them. :func:`floor_bytes` counts the bytes the round must move outside those
products even if every bias, ReLU, mask and loss term were fused into them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from fedrecgel.model import ModelConfig


def bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Memory bandwidth (bytes/s, best of ``repeats``) of a large float32 copy: read + write."""
    n = mib * (1 << 20) // 4
    src, dst = torch.randn(n), torch.empty(n)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * 4 * n / best


def groups(sizes: np.ndarray, max_batch: int) -> list[list[int]]:
    """Consecutive clients in groups of at most ``max_batch`` samples, as the aggregate client
    step forms them (a client larger than ``max_batch`` alone)."""
    out: list[list[int]] = []
    cur: list[int] = []
    n = 0
    for s in (int(x) for x in sizes):
        if cur and n + s > max_batch:
            out.append(cur)
            cur, n = [], 0
        cur.append(s)
        n += s
    if cur:
        out.append(cur)
    return out


def _products(cfg: ModelConfig, sizes: list[int]) -> list[tuple[str, float, Callable[[], object]]]:
    """(kind, FLOP, run) for every matrix product of one group's three passes."""
    e, f = cfg.mlp_dim, cfg.factor
    (_, h0), (_, h1), (_, h2) = cfg.tower_sizes()
    n, c = sum(sizes), len(sizes)
    r = torch.randn
    im, u = r(n, e), r(c, e)
    w0i, w0u, w1, w2 = r(h0, e), r(h0, e), r(h1, h0), r(h2, h1)
    a0, a1, a2, dl, ag = r(n, h0), r(n, h1), r(n, h2), r(n), r(n, f)
    pw0, pw1, pw2 = r(c, h0, e), r(c, h1, h0), r(c, h2, h1)
    o0, o1, o2, oe = torch.empty(n, h0), torch.empty(n, h1), torch.empty(n, h2), torch.empty(n, e)
    g0, g1, g2 = torch.empty(c, h0, e), torch.empty(c, h1, h0), torch.empty(c, h2, h1)

    def sp(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.split(t, sizes)

    out: list[tuple[str, float, Callable[[], object]]] = []

    def batched(name: str, m: int, k: int, nn: int, fn: Callable[[], object]) -> None:
        out.append(("batched " + name, 2.0 * m * k * nn, fn))

    def per_client(name: str, k: int, nn: int, fn: Callable[[], None]) -> None:
        out.append(("per-client " + name, 2.0 * n * k * nn, fn))

    def pc_fwd(o: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            for oc, xc, wc in zip(sp(o), sp(x), w.transpose(1, 2).unbind(0), strict=True):
                torch.mm(xc, wc, out=oc)

        return run

    def pc_dx(o: torch.Tensor, d: torch.Tensor, w: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            for oc, dc, wc in zip(sp(o), sp(d), w.unbind(0), strict=True):
                torch.mm(dc, wc, out=oc)

        return run

    def pc_wgrad(g: torch.Tensor, d: torch.Tensor, x: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            for gc, dc, xc in zip(g.unbind(0), sp(d), sp(x), strict=True):
                torch.mm(dc.T, xc, out=gc)

        return run

    for p in (1, 3):  # forward with the shared score network (pass 3 reuses the item half)
        if p == 1:
            batched("fwd item half", n, e, h0, lambda: torch.mm(im, w0i.T, out=o0))
        batched("fwd user half", c, e, h0, lambda: u @ w0u.T)
        batched("fwd L1", n, h0, h1, lambda: torch.mm(a0, w1.T, out=o1))
        batched("fwd L2", n, h1, h2, lambda: torch.mm(a1, w2.T, out=o2))
        batched("fwd predict", n, 2 * f, 1, lambda: (ag @ ag[0], a2 @ ag[0]))
        batched("dx L2", n, h2, h1, lambda: torch.mm(a2, w2, out=o1))
        batched("dx L1", n, h1, h0, lambda: torch.mm(a1, w1, out=o0))
        batched("user grad", c, h0, e, lambda: a0[:c] @ w0u)
    batched("d item half", n, h0, e, lambda: torch.mm(a0, w0i, out=oe))  # pass 1
    per_client("wgrad L2", h2, h1, pc_wgrad(g2, a2, a1))
    per_client("wgrad L1", h1, h0, pc_wgrad(g1, a1, a0))
    per_client("wgrad item half", h0, e, pc_wgrad(g0, a0, im))
    # pass 2: each client's perturbed network; weight gradients summed over all samples
    out.append(
        ("per-client fwd user half", 2.0 * c * e * h0, lambda: torch.bmm(pw0, u[:, :, None]))
    )
    per_client("fwd item half", e, h0, pc_fwd(o0, im, pw0))
    per_client("fwd L1", h0, h1, pc_fwd(o1, a0, pw1))
    per_client("fwd L2", h1, h2, pc_fwd(o2, a1, pw2))
    batched("fwd predict", n, 2 * f, 1, lambda: (ag @ ag[0], a2 @ ag[0]))
    batched("predict wgrad", n, 2 * f, 1, lambda: (dl @ ag, dl @ a2))
    batched("wgrad L2", h2, n, h1, lambda: a2.T @ a1)
    batched("wgrad L1", h1, n, h0, lambda: a1.T @ a0)
    batched("wgrad item half", h0, n, e, lambda: a0.T @ im)
    batched("wgrad user half", h0, c, e, lambda: a0[:c].T @ u)
    per_client("dx L2", h2, h1, pc_dx(o1, a2, pw2))
    per_client("dx L1", h1, h0, pc_dx(o0, a1, pw1))
    per_client("d item half", h0, e, pc_dx(oe, a0, pw0))
    return out


def product_floor(
    cfg: ModelConfig, sizes: np.ndarray, max_batch: int, repeats: int = 3
) -> dict[str, float]:
    """Seconds and FLOP of a round's matrix products at their shapes (each product the best of
    ``repeats``), split into those over all of a group's samples and those per client."""
    if cfg.kind != "ncf":
        raise ValueError("the product replay covers the NCF model")
    secs = {"batched": 0.0, "per-client": 0.0}
    flop = {"batched": 0.0, "per-client": 0.0}
    for g in groups(sizes, max_batch):
        for kind, fl, run in _products(cfg, g):
            run()
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - t0)
            key = kind.split(" ")[0]
            secs[key] += best
            flop[key] += fl
    return {
        "s": secs["batched"] + secs["per-client"],
        "gflop": (flop["batched"] + flop["per-client"]) / 1e9,
        "batched_s": secs["batched"],
        "batched_gflop": flop["batched"] / 1e9,
        "per_client_s": secs["per-client"],
        "per_client_gflop": flop["per-client"] / 1e9,
    }


def floor_bytes(
    cfg: ModelConfig, samples: int, pairs: int, items: int, clients: int
) -> dict[str, float]:
    """Bytes a round moves outside its matrix products even with every elementwise op fused
    into them (float32): the item rows gathered for passes 1 and 2; pass 1's per-(client,
    item) row gradients scattered (per-sample rows read, pair rows written); the perturbed
    pair rows (shared rows and gradients read, result written); pass 2's row gradients added
    into the item tables (per-sample rows read, touched table rows read and written); each
    client's dense score-network gradient read for its norm and read and written for its
    perturbed copy (the products that make and use it count it already)."""
    width = cfg.factor + (cfg.mlp_dim if cfg.kind == "ncf" else 0)
    dense = sum(int(np.prod(s)) for n, s in cfg.shared_shapes().items() if n in cfg.dense_names())
    parts = {
        "gathers": 2.0 * samples * width,
        "pass1_row_scatter": (samples + pairs) * width,
        "perturbed_rows": 3.0 * pairs * width,
        "pass2_row_add": (samples + 2.0 * items) * width,
        "dense_norm_and_perturbation": 3.0 * clients * dense,
    }
    out = {k: 4.0 * v for k, v in parts.items()}
    out["total"] = sum(out.values())
    return out
