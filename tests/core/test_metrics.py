"""HR@K and NDCG@K, hand-computed, including ties."""

import math

import numpy as np
import pytest
import torch

from fedrecgel.metrics import means, metric_sums, per_user_metrics, rank_of_positive
from fedrecgel.model import ModelConfig, Scorer


def test_rank_counts_negatives_scored_at_least_as_high():
    pos = torch.tensor([0.9, 0.5, 0.1])
    neg = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.6, 0.1], [0.2, 0.3, 0.4]])
    assert rank_of_positive(pos, neg).tolist() == [0, 2, 3]


def test_ties_never_favour_the_test_item():
    pos = torch.tensor([1.0])
    neg = torch.ones(1, 99)  # every candidate scores the same
    assert rank_of_positive(pos, neg).tolist() == [99]


def test_hr_and_ndcg_by_hand():
    m = per_user_metrics(torch.tensor([0, 4, 5, 12]), ks=(5, 10))
    assert m["hr@5"].tolist() == [1, 1, 0, 0]
    assert m["hr@10"].tolist() == [1, 1, 1, 0]
    assert m["ndcg@5"].tolist() == pytest.approx([1.0, 1 / math.log2(6), 0, 0])
    assert m["ndcg@10"].tolist() == pytest.approx([1.0, 1 / math.log2(6), 1 / math.log2(7), 0])


def test_metric_sums_over_a_tiny_mf_model():
    cfg = ModelConfig(n_items=4, kind="mf", factor=1)
    shared = {"item_gmf": torch.tensor([[1.0], [2.0], [3.0], [4.0]])}
    private = {"user_gmf": torch.tensor([[1.0], [-1.0]])}
    # user 0 prefers high ids: test item 3 beats 0,1 -> rank 0; user 1: test item 3 is last
    sums = metric_sums(
        Scorer(cfg, shared), private, np.array([3, 3]), np.array([[0, 1], [0, 1]]), ks=(1,)
    )
    assert sums["hr@1"] == 1.0 and sums["count"] == 2.0
    assert means(sums)["hr@1"] == 0.5
