"""Leave-one-out ranking metrics: HR@K and NDCG@K over 1 test item + N sampled negatives."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedrecgel.model import Scorer
from fedrecgel.prior import GUARD_NAMES, PRIOR_WEIGHTS, guard_k
from fedrecgel.prior import key as prior_key

KS = (5, 10, 15, 20)
#: the metrics a federated evaluation reports, every one of them in every report
METRIC_NAMES = tuple(f"{m}@{k}" for k in KS for m in ("hr", "ndcg"))
#: the same on the validation items, reported (all of them, or none) by a worker whose split
#: holds a validation item per user
VAL_METRIC_NAMES = tuple(f"val/{name}" for name in METRIC_NAMES)
#: what :func:`metric_sums` adds with an item prior: every metric and the sign test's counts
#: under :func:`fedrecgel.prior.key` at every weight but 0
PRIOR_METRIC_NAMES = tuple(
    prior_key(w, n) for w in PRIOR_WEIGHTS if w for n in (*METRIC_NAMES, *GUARD_NAMES)
)


def rank_of_positive(pos: Tensor, neg: Tensor) -> Tensor:
    """0-based rank of the test item among its candidates: pos (U,), neg (U, N) -> (U,).

    A negative that ties the test item counts as ranked above it, so ties never favour the
    test item.
    """
    return (neg >= pos[:, None]).sum(1)


def per_user_metrics(ranks: Tensor, ks: tuple[int, ...] = KS) -> dict[str, Tensor]:
    """HR@K (rank < K) and NDCG@K (1 / log2(rank + 2) when hit) per user: name -> (U,)."""
    r = ranks.to(torch.float64)
    out: dict[str, Tensor] = {}
    for k in ks:
        hit = ranks < k
        out[f"hr@{k}"] = hit.to(torch.float64)
        out[f"ndcg@{k}"] = torch.where(hit, 1.0 / torch.log2(r + 2.0), torch.zeros_like(r))
    return out


# A chunk of about this many (user, candidate) pairs goes through the score network at a
# time: its buffers (about 2 MB at the default widths) stay in cache between the gather, the
# ReLUs and the matrix products, and the first hidden layer's product runs at nearly the full
# matmul rate at this shape (measured on this project's 2-core machine: about half that rate
# at 12,800 pairs, when its input no longer fits); smaller chunks pay Python and dispatch per
# op more often (800 to 6,400 pairs all time about the same in bench/evaluation.py's model).
CHUNK_PAIRS = 2048


def _gather(table: Tensor, rows: Tensor, bags: Tensor) -> Tensor:
    """``table[rows]`` (R, d), as an embedding bag of one row each (``bags``: arange(R)).

    The bag's sum is that row: 0 + x is x for every float x but -0.0, which becomes +0.0, and
    the sign of a zero changes no non-zero value downstream here (sums, products, ReLU) and no
    comparison of the ranking. torch's bag kernel (FBGEMM) gathers the (user, candidate) rows
    about twice as fast as ``index_select``, which copies row by row through a generic copy.
    """
    return torch.nn.functional.embedding_bag(rows, table, bags, mode="sum")


@torch.no_grad()
def candidate_logits(
    scorer: Scorer, private: dict[str, Tensor], items: Tensor, out: Tensor | None = None
) -> Tensor:
    """Logits of U users for their own candidates: private (U, d), items (U, C) -> (U, C).

    The same arithmetic as :meth:`Scorer.score`, op for op, arranged for evaluation, where
    most of the time not spent in the tower's matrix products is moving memory: users go in
    chunks of about :data:`CHUNK_PAIRS` pairs, each chunk's item rows are gathered by
    :func:`_gather` from the flattened candidates (advanced indexing with a 2-D index is
    several times slower), the first-layer sum and its ReLU run in place on the gathered rows,
    and every later layer writes into a buffer allocated once (the last one straight into the
    second half of the predict layer's input, next to the GMF product). ``out`` (U, C), when
    given, receives the logits.

    Users whose pairs fit in one chunk (U x C <= :data:`CHUNK_PAIRS`, or one user) get
    :meth:`Scorer.score`'s logits bit for bit (but for the sign of a zero, see :func:`_gather`)
    at any thread count: every matrix product is the one it runs, over the same rows. Over
    several chunks, only to the last bit or so: :meth:`Scorer.score` multiplies all U x C
    pairs at once, this a chunk at a time, and a BLAS product (MKL here) sums a row's dot
    products in another order where the row falls past the last whole block of its row tiling
    or at the edge of a thread's share of the rows; those places differ between the two, and
    move with the thread count and the CPU's code path. A test item's rank changes with them
    only where a negative's logit is that close to its own. tests/core/test_metrics.py holds
    both.
    """
    s, cfg = scorer.shared, scorer.cfg
    n, c = items.shape
    if out is None:
        out = torch.empty(n, c)
    chunk = max(1, min(n, CHUNK_PAIRS // max(c, 1)))
    f = cfg.factor
    pairs = chunk * c
    user_gmf = private["user_gmf"]
    if cfg.kind == "mf":
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            u = end - start
            g = torch.index_select(s["item_gmf"], 0, items[start:end].reshape(-1))
            g3 = g.view(u, c, f).mul_(user_gmf[start:end, None, :])
            torch.sum(g3, -1, out=out[start:end])
        return out
    assert scorer.item_first is not None
    h_width = scorer.item_first.shape[1]
    user_half = torch.nn.functional.linear(private["user_mlp"], scorer.user_w0, s["tower.0.bias"])
    # (weight^T, bias) of the tower's layers after the first: F.linear(x, w, b) on a 2-D x is
    # addmm(b, x, w^T), the product every other path runs
    layers = [(s[f"tower.{k}.weight"].t(), s[f"tower.{k}.bias"]) for k in range(1, cfg.layers)]
    ones = torch.arange(pairs)  # one row per bag: the gathers' bag offsets
    hidden = [torch.empty(pairs, w.shape[1]) for w, _ in layers[:-1]]
    z_buf = torch.empty(pairs, 2 * f)  # concat(GMF, tower output): the predict layer's input
    wp, bp = s["predict.weight"].t(), s["predict.bias"]

    def views(u: int) -> tuple[Tensor, ...]:
        # every view a chunk of u users needs, made once per chunk size (not per chunk)
        p = u * c
        z = z_buf[:p]
        outs = [buf[:p] for buf in hidden] + [z[:, f:]]
        return (ones[:p], z[:, :f].view(u, c, f), z, *outs)

    flat = items.reshape(-1)
    user_gmf3, user_half3 = user_gmf[:, None, :], user_half[:, None, :]
    out_col = out.view(-1, 1)
    full = views(chunk)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        u = end - start
        bags, z_gmf, z, *layer_outs = full if u == chunk else views(u)
        pairs_of = flat[start * c : end * c]
        g = _gather(s["item_gmf"], pairs_of, bags)
        torch.mul(g.view(u, c, f), user_gmf3[start:end], out=z_gmf)
        h = _gather(scorer.item_first, pairs_of, bags)
        h.view(u, c, h_width).add_(user_half3[start:end]).relu_()
        for (w, b), nxt in zip(layers, layer_outs[: len(layers)], strict=True):
            h = torch.addmm(b, h, w, out=nxt).relu_()
        if not layers:  # a one-layer tower: its first layer's output is the tower's
            layer_outs[0].copy_(h)
        torch.addmm(bp, z, wp, out=out_col[start * c : end * c])
    return out


@torch.no_grad()
def metric_sums(
    scorer: Scorer,
    private: dict[str, Tensor],
    test_items: np.ndarray,
    negatives: np.ndarray,
    ks: tuple[int, ...] = KS,
    batch: int = 4096,
    prior: Tensor | None = None,
) -> dict[str, float]:
    """Sums of HR@K / NDCG@K over the given users (private rows align with test_items).

    Returned as sums plus ``count`` so shards (e.g. client workers) can be added up exactly.
    The logits are :func:`candidate_logits`' (:meth:`Scorer.score`'s to the last bit or so),
    for ``batch`` users at a time (which bounds the memory held: batch x candidates floats);
    the ranks of all users are kept and the metrics summed once, so no summation depends on
    ``batch``. The logits can, in their last bits: ``batch`` and the torch thread count place
    the rows of the matrix products, and a rank moves with them only at a near tie. The same
    users, ``batch`` and thread count on the same machine give the same sums bit for bit (a
    worker's evaluation and the simulator's of that worker's shard: at the same thread count).
    With an item ``prior`` (:func:`fedrecgel.prior.log_prior`) the candidates are also ranked
    by logit + w * prior for every weight of :data:`fedrecgel.prior.PRIOR_WEIGHTS`, summed
    under :func:`fedrecgel.prior.key`'s names (the plain names stay the model's own), with
    the users each weight moves into (``gain``) and out of (``loss``) the top
    :func:`fedrecgel.prior.guard_k` of the candidates (the served top 10's share of them).
    """
    n = len(test_items)
    c = 1 + (negatives.shape[1] if n else 0)
    weights = [w for w in PRIOR_WEIGHTS if w] if prior is not None else []
    ranks = torch.empty(1 + len(weights), n, dtype=torch.int64)
    logits = torch.empty(min(batch, n), c)
    for start in range(0, n, batch):
        end = min(start + batch, n)
        cand = np.empty((end - start, c), dtype=np.int64)
        cand[:, 0] = test_items[start:end]
        cand[:, 1:] = negatives[start:end]
        cand_t = torch.from_numpy(cand)
        out = candidate_logits(
            scorer,
            {k: v[start:end] for k, v in private.items()},
            cand_t,
            out=logits[: end - start],
        )
        ranks[0, start:end] = rank_of_positive(out[:, 0], out[:, 1:])
        if prior is not None:
            bias = prior[cand_t]
            for j, w in enumerate(weights, 1):
                served = out + w * bias
                ranks[j, start:end] = rank_of_positive(served[:, 0], served[:, 1:])
    totals: dict[str, float] = {}
    cut = guard_k(scorer.cfg.n_items, c)
    model_hit = ranks[0] < cut
    for w, r in zip((0.0, *weights), ranks, strict=True):
        for name, vals in per_user_metrics(r, ks).items():
            totals[prior_key(w, name)] = float(vals.sum())
        if w:  # the users the prior moves into and out of the top `cut` (its sign test)
            hit = r < cut
            totals[prior_key(w, "gain")] = float((hit & ~model_hit).sum())
            totals[prior_key(w, "loss")] = float((model_hit & ~hit).sum())
    totals["count"] = float(n)
    return totals


def means(sums: dict[str, float]) -> dict[str, float]:
    """Turn metric sums (with ``count``) into means."""
    n = sums.get("count", 0.0)
    return {k: (v / n if n else 0.0) for k, v in sums.items() if k != "count"}
