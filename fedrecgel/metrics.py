"""Leave-one-out ranking metrics: HR@K and NDCG@K over 1 test item + N sampled negatives."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedrecgel.model import Scorer

KS = (5, 10, 15, 20)


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


@torch.no_grad()
def candidate_logits(scorer: Scorer, private: dict[str, Tensor], items: Tensor) -> Tensor:
    """Logits of U users for their own candidates: private (U, d), items (U, C) -> (U, C).

    The same arithmetic as :meth:`Scorer.score` (every logit is bit for bit the same, a test
    holds them to it), arranged for evaluation, where the work is mostly moving memory: the
    item rows are gathered with one ``index_select`` of the flattened candidates (much faster
    than advanced indexing with a 2-D index), and the first-layer sum and every ReLU run in
    place on that one buffer instead of allocating a new (U, C, H) tensor each.
    """
    s, cfg = scorer.shared, scorer.cfg
    u, c = items.shape
    flat = items.reshape(-1)
    gmf = torch.index_select(s["item_gmf"], 0, flat).view(u, c, -1)
    gmf.mul_(private["user_gmf"][:, None, :])
    if cfg.kind == "mf":
        return gmf.sum(-1)
    assert scorer.item_first is not None
    user_half = torch.nn.functional.linear(private["user_mlp"], scorer.user_w0, s["tower.0.bias"])
    h = torch.index_select(scorer.item_first, 0, flat).view(u, c, -1)
    h.add_(user_half[:, None, :]).relu_()
    for k in range(1, cfg.layers):
        h = torch.nn.functional.linear(h, s[f"tower.{k}.weight"], s[f"tower.{k}.bias"]).relu_()
    z = torch.cat([gmf, h], dim=-1)
    return torch.nn.functional.linear(z, s["predict.weight"], s["predict.bias"]).squeeze(-1)


@torch.no_grad()
def metric_sums(
    scorer: Scorer,
    private: dict[str, Tensor],
    test_items: np.ndarray,
    negatives: np.ndarray,
    ks: tuple[int, ...] = KS,
    batch: int = 512,
) -> dict[str, float]:
    """Sums of HR@K / NDCG@K over the given users (private rows align with test_items).

    Returned as sums plus ``count`` so shards (e.g. client workers) can be added up exactly.
    Users go in batches of ``batch`` so that the (batch, candidates, H) activations stay in
    cache; the logits are :meth:`Scorer.score`'s, bit for bit (:func:`candidate_logits`).
    """
    totals = {f"{m}@{k}": 0.0 for k in ks for m in ("hr", "ndcg")}
    n = len(test_items)
    for start in range(0, n, batch):
        sl = slice(start, min(start + batch, n))
        cand = np.concatenate(
            [np.asarray(test_items[sl], dtype=np.int64)[:, None], negatives[sl].astype(np.int64)],
            axis=1,
        )
        logits = candidate_logits(
            scorer, {k: v[sl] for k, v in private.items()}, torch.from_numpy(cand)
        )
        ranks = rank_of_positive(logits[:, 0], logits[:, 1:])
        for name, vals in per_user_metrics(ranks, ks).items():
            totals[name] += float(vals.sum())
    totals["count"] = float(n)
    return totals


def means(sums: dict[str, float]) -> dict[str, float]:
    """Turn metric sums (with ``count``) into means."""
    n = sums.get("count", 0.0)
    return {k: (v / n if n else 0.0) for k, v in sums.items() if k != "count"}
