"""HR@K and NDCG@K, hand-computed, including ties."""

import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from fedrecgel.metrics import (
    CHUNK_PAIRS,
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


@pytest.fixture(params=[1, 2, 3], ids=lambda t: f"{t}-threads")
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """torch's intra-op threads for the test (a BLAS product splits its rows between them),
    set back after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    try:
        yield request.param
    finally:
        torch.set_num_threads(before)


def _case(
    kind: ModelKind, layers: int, n_users: int, c: int
) -> tuple[Scorer, dict[str, torch.Tensor], np.ndarray]:
    """A scorer, n_users' private rows and their c candidates each (the test item first)."""
    cfg = ModelConfig(n_items=500, kind=kind, factor=8, layers=layers)
    shared = init_shared(cfg, 3)
    g = torch.Generator().manual_seed(4)
    for name in cfg.item_tables():
        shared[name] = torch.randn(shared[name].shape, generator=g)
        shared[name][::7] = -0.0  # gathered as embedding bags, these rows come back as +0.0
    users = np.arange(n_users)
    private = {k: v * 100 for k, v in init_private(cfg, 5, users).items()}
    rng = np.random.default_rng(6)
    cand = np.stack([rng.choice(cfg.n_items, c, replace=False) for _ in users])
    cand[:5, 3] = cand[:5, 0]  # ties with the test item count against it
    return Scorer(cfg, shared), private, cand


@pytest.mark.parametrize(
    ("kind", "layers", "c"),
    [("ncf", 3, 100), ("ncf", 3, 21), ("ncf", 2, 13), ("ncf", 1, 21), ("mf", 3, 21)],
)
def test_within_one_chunk_the_logits_are_scorer_scores_bit_for_bit(
    kind: ModelKind, layers: int, c: int, threads: int
) -> None:
    """As many users as one chunk holds: every matrix product of :func:`candidate_logits`
    is :meth:`Scorer.score`'s over the same rows, so every logit is the same at any thread
    count, rows at the edges of the products' row tiling and of the threads' shares (2,037
    pairs for 21 candidates) included."""
    scorer, private, cand = _case(kind, layers, CHUNK_PAIRS // c, c)
    items = torch.from_numpy(cand)
    assert torch.equal(candidate_logits(scorer, private, items), scorer.score(private, items))


@pytest.mark.parametrize(
    ("kind", "n_users", "batch", "layers", "c"),
    [
        ("ncf", 700, 64, 3, 100),
        ("mf", 700, 64, 3, 100),
        ("ncf", 7, 4096, 3, 100),
        ("ncf", 45, 30, 3, 100),
        ("ncf", 45, 30, 1, 100),
        ("ncf", 45, 30, 2, 100),
        ("ncf", 700, 64, 3, 21),
        ("ncf", 300, 70, 2, 21),
    ],
)
def test_fast_evaluation_gives_the_reference_logits_and_metrics(
    kind: ModelKind, n_users: int, batch: int, layers: int, c: int, threads: int
) -> None:
    """The evaluation path (:func:`candidate_logits` in chunks of users, metric_sums in
    batches) against the reference: :meth:`Scorer.score` over all users at once, ranks and
    HR/NDCG computed from those. Fewer users than a chunk, batches that end inside a chunk,
    towers of one to three layers (with one, the first layer's output is the tower's).

    Over several chunks a logit can differ from the reference's in its last bit: the BLAS
    product rounds a row by where it falls in the product (past the last whole block of the
    row tiling, at the edge of a thread's share), which differs between one product over all
    pairs and one per chunk. Seen on this project's 2-core machine (AMD EPYC, MKL 2024.2):
    with 21 candidates (2,037 pairs a chunk) at one thread; with 45 users x 100 candidates at
    two threads under MKL_CBWR=COMPATIBLE (pairs 2,248-2,249 at the reference's split between
    its threads, 4,248-4,249 at the last chunk's), while MKL's default path there gave those
    bit for bit at 1 to 8 threads. So the logits are held to a few units in the last place of
    the largest one (seen: under one), and the metric sums to the reference's but for users
    with a negative that close to the test item.
    """
    scorer, private, cand = _case(kind, layers, n_users, c)
    ref_logits = scorer.score(private, torch.from_numpy(cand))
    got_logits = candidate_logits(scorer, private, torch.from_numpy(cand))
    tol = 8 * torch.finfo(torch.float32).eps * float(ref_logits.abs().max())
    torch.testing.assert_close(got_logits, ref_logits, rtol=0.0, atol=tol)
    ref = {
        k: float(v.sum())
        for k, v in per_user_metrics(
            rank_of_positive(ref_logits[:, 0], ref_logits[:, 1:]), KS
        ).items()
    }
    assert 0 < ref["hr@10"] < n_users
    got = metric_sums(scorer, private, cand[:, 0], cand[:, 1:], KS, batch=batch)
    assert got.pop("count") == n_users
    # the same ranks, summed over all users at once whatever the batches: the same sums, but
    # for a user whose test item is within rounding of a negative (a duplicate ties exactly)
    gap = (ref_logits[:, 1:] - ref_logits[:, :1]).abs()
    close = int(((gap > 0) & (gap <= 2 * tol)).any(1).sum())
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert abs(got[k] - v) <= close, (k, got[k], v, close)
