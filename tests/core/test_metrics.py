"""HR@K and NDCG@K, hand-computed, including ties."""

import math

import numpy as np
import pytest
import torch

from fedrecgel.metrics import (
    KS,
    candidate_logits,
    means,
    metric_sums,
    per_user_metrics,
    rank_of_positive,
)
from fedrecgel.model import ModelConfig, ModelKind, Scorer, init_private, init_shared


def test_rank_counts_negatives_scored_at_least_as_high() -> None:
    pos = torch.tensor([0.9, 0.5, 0.1])
    neg = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.6, 0.1], [0.2, 0.3, 0.4]])
    assert rank_of_positive(pos, neg).tolist() == [0, 2, 3]


def test_ties_never_favour_the_test_item() -> None:
    pos = torch.tensor([1.0])
    neg = torch.ones(1, 99)  # every candidate scores the same
    assert rank_of_positive(pos, neg).tolist() == [99]


def test_hr_and_ndcg_by_hand() -> None:
    m = per_user_metrics(torch.tensor([0, 4, 5, 12]), ks=(5, 10))
    assert m["hr@5"].tolist() == [1, 1, 0, 0]
    assert m["hr@10"].tolist() == [1, 1, 1, 0]
    assert m["ndcg@5"].tolist() == pytest.approx([1.0, 1 / math.log2(6), 0, 0])
    assert m["ndcg@10"].tolist() == pytest.approx([1.0, 1 / math.log2(6), 1 / math.log2(7), 0])


def test_metric_sums_over_a_tiny_mf_model() -> None:
    cfg = ModelConfig(n_items=4, kind="mf", factor=1)
    shared = {"item_gmf": torch.tensor([[1.0], [2.0], [3.0], [4.0]])}
    private = {"user_gmf": torch.tensor([[1.0], [-1.0]])}
    # user 0 prefers high ids: test item 3 beats 0,1 -> rank 0; user 1: test item 3 is last
    sums = metric_sums(
        Scorer(cfg, shared), private, np.array([3, 3]), np.array([[0, 1], [0, 1]]), ks=(1,)
    )
    assert sums["hr@1"] == 1.0 and sums["count"] == 2.0
    assert means(sums)["hr@1"] == 0.5


@pytest.mark.parametrize(
    ("kind", "n_users", "batch", "layers"),
    [
        ("ncf", 700, 64, 3),
        ("mf", 700, 64, 3),
        ("ncf", 7, 4096, 3),
        ("ncf", 45, 30, 3),
        ("ncf", 45, 30, 1),
        ("ncf", 45, 30, 2),
    ],
)
def test_fast_evaluation_gives_the_reference_logits_and_metrics(
    kind: ModelKind, n_users: int, batch: int, layers: int
) -> None:
    """The evaluation path (:func:`candidate_logits` in chunks of users, metric_sums in
    batches) against the reference: :meth:`Scorer.score` over all users at once, ranks and
    HR/NDCG computed from those. Fewer users than a chunk, batches that end inside a chunk,
    towers of one to three layers (with one, the first layer's output is the tower's)."""
    cfg = ModelConfig(n_items=500, kind=kind, factor=8, layers=layers)
    shared = init_shared(cfg, 3)
    g = torch.Generator().manual_seed(4)
    for name in cfg.item_tables():
        shared[name] = torch.randn(shared[name].shape, generator=g)
        shared[name][::7] = -0.0  # gathered as embedding bags, these rows come back as +0.0
    users = np.arange(n_users)
    private = {k: v * 100 for k, v in init_private(cfg, 5, users).items()}
    rng = np.random.default_rng(6)
    cand = np.stack([rng.choice(cfg.n_items, 100, replace=False) for _ in users])
    cand[:5, 3] = cand[:5, 0]  # ties with the test item count against it
    scorer = Scorer(cfg, shared)
    ref_logits = scorer.score(private, torch.from_numpy(cand))
    assert torch.equal(candidate_logits(scorer, private, torch.from_numpy(cand)), ref_logits)
    ref = {
        k: float(v.sum())
        for k, v in per_user_metrics(
            rank_of_positive(ref_logits[:, 0], ref_logits[:, 1:]), KS
        ).items()
    }
    assert 0 < ref["hr@10"] < len(users)
    got = metric_sums(scorer, private, cand[:, 0], cand[:, 1:], KS, batch=batch)
    assert got.pop("count") == len(users)
    # the same ranks, summed over all users at once whatever the batches: the same sums
    assert got == ref
