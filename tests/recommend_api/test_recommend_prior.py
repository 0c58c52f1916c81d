"""Ranking with the popularity prior: served score = logit + w * log(1 + n), on the exact path
and through the candidate stages (faiss flat index, table scan), and when it does not apply."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedrecgel.model import ModelConfig
from services.recommend_api.prior import PriorBody, PublishedPrior, publish
from services.recommend_api.ranking import ModelHolder, RankingConfig
from services.recommend_api.shortlist import ProxyShortlist, ScanShortlist, faiss_available
from tests.recommend_api.test_recommend_ranking import _brute_force, _model, _user

#: the candidate stages, each with few candidates (50 of thousands of items)
STAGES = [
    pytest.param(
        "flat",
        marks=pytest.mark.skipif(not faiss_available(), reason="faiss-cpu is not installed"),
    ),
    "scan",
]


def _published(
    counts: np.ndarray | None,
    weight: float | None,
    complete: bool = True,
    previous: PublishedPrior | None = None,
) -> PublishedPrior:
    body = {
        "run_id": 7,
        "complete": complete,
        "counts": None if counts is None else [int(c) for c in counts],
        "weight": weight,
        "weight_version": 4,
    }
    return publish(PriorBody.model_validate(body), etag='"e"', previous=previous)


def _holder(
    cfg: ModelConfig,
    shared: dict[str, torch.Tensor],
    published: PublishedPrior | None = None,
    **kw: Any,
) -> ModelHolder:
    holder = ModelHolder(RankingConfig(**kw))
    holder.set_prior(published)  # no snapshot yet: new versions are built with it
    holder.swap(holder.build(cfg, shared, 3))
    return holder


def _served(
    cfg: ModelConfig, shared: dict[str, torch.Tensor], user: Any, counts: np.ndarray, w: float
) -> np.ndarray:
    """Served scores computed directly: the training forward pass plus w * log1p(n)."""
    return _brute_force(cfg, shared, user) + w * np.log1p(counts.astype(np.float64))


def _heavy_tailed_counts(n: int, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    counts = g.integers(0, 30, n)
    counts[g.choice(n, n // 100, replace=False)] = g.integers(10_000, 100_000, n // 100)
    return counts


def test_ranking_with_a_prior_is_ranking_by_logit_plus_weighted_log_count() -> None:
    cfg, shared = _model(300, scale=30.0)
    counts = _heavy_tailed_counts(300)
    holder = _holder(cfg, shared, _published(counts, 0.5))
    model_alone = _holder(cfg, shared)
    for seed in range(5):
        user = _user(cfg, seed, scale=0.3)
        ranked = holder.recommend(user["user_gmf"], user["user_mlp"], k=10)
        ref = _served(cfg, shared, user, counts, 0.5)
        want = np.argsort(-ref, kind="stable")[:10]
        assert [int(i) for i, _ in ranked.items] == want.tolist()
        # the scores returned are the served ones, not the logits
        np.testing.assert_allclose([s for _, s in ranked.items], ref[want], rtol=1e-4, atol=1e-5)
        assert ranked.prior_weight == 0.5
        alone = model_alone.recommend(user["user_gmf"], user["user_mlp"], k=10)
        assert alone.prior_weight is None and alone.items != ranked.items  # the prior mattered
        # excluded items stay excluded; the rest keep their served order
        top3 = [i for i, _ in ranked.items[:3]]
        again = holder.recommend(user["user_gmf"], user["user_mlp"], k=7, exclude=top3)
        assert [i for i, _ in again.items] == [i for i, _ in ranked.items[3:]]


@pytest.mark.parametrize("stage", ["exact", *STAGES])
def test_a_huge_weight_ranks_as_popularity_does(stage: str) -> None:
    n = 3_000 if stage != "exact" else 300
    cfg, shared = _model(n, scale=30.0)
    counts = np.random.default_rng(1).permutation(n) * 3  # distinct counts
    kw: dict[str, Any] = {"ann_threshold": 10**9} if stage == "exact" else {}
    if stage != "exact":
        kw = {"ann_threshold": 0, "ann_shortlist": 50, "ann_index": stage}
        kw["ann_scan_candidates"] = 50
    holder = _holder(cfg, shared, _published(counts, 1e6), **kw)
    assert holder.snapshot is not None
    assert (holder.snapshot.shortlist is None) == (stage == "exact")
    by_count = np.argsort(-counts, kind="stable")
    for seed in range(3):
        user = _user(cfg, seed, scale=0.3)
        ranked = holder.recommend(user["user_gmf"], user["user_mlp"], k=10)
        assert [int(i) for i, _ in ranked.items] == by_count[:10].tolist()
        first = str(by_count[0])
        again = holder.recommend(user["user_gmf"], user["user_mlp"], k=10, exclude=[first])
        assert [int(i) for i, _ in again.items] == by_count[1:11].tolist()


def _not_applying(n: int) -> dict[str, PublishedPrior | None]:
    counts = _heavy_tailed_counts(n)
    return {
        "none published (404)": None,
        "weight 0": _published(counts, 0.0),
        "weight null": _published(counts, None),
        "counts incomplete": _published(None, 2.0, complete=False),
        "counts of another length": _published(counts[:-1], 2.0),
    }


@pytest.mark.parametrize("stage", ["exact", *STAGES])
@pytest.mark.parametrize("case", list(_not_applying(1)))
def test_a_prior_that_does_not_apply_serves_the_model_alone(stage: str, case: str) -> None:
    n = 2_000
    cfg, shared = _model(n, scale=30.0)
    published = _not_applying(n)[case]
    kw: dict[str, Any] = {"ann_threshold": 10**9}
    if stage != "exact":
        kw = {"ann_threshold": 0, "ann_shortlist": 50, "ann_index": stage}
        kw["ann_scan_candidates"] = 50
    with_prior = _holder(cfg, shared, published, **kw)
    today = _holder(cfg, shared, **kw)
    snap = with_prior.snapshot
    assert snap is not None and snap.prior is None and with_prior.prior_weight is None
    assert with_prior.prior_note is not None and "model alone" in with_prior.prior_note
    for seed in range(3):
        user = _user(cfg, seed, scale=0.3)
        got = with_prior.recommend(user["user_gmf"], user["user_mlp"], k=10, exclude=["3"])
        want = today.recommend(user["user_gmf"], user["user_mlp"], k=10, exclude=["3"])
        assert got.prior_weight is None
        assert [i for i, _ in got.items] == [i for i, _ in want.items]
        np.testing.assert_allclose([s for _, s in got.items], [s for _, s in want.items])
    # usable counts put the column into the index even at weight 0 / null (a weight chosen
    # later rebuilds nothing); unusable ones do not
    if snap.shortlist is not None:
        usable = case in ("weight 0", "weight null")
        assert (snap.shortlist.log_prior is not None) == usable


@pytest.mark.parametrize("stage", STAGES)
def test_the_candidate_stage_recalls_what_the_prior_ranks_first(stage: str) -> None:
    """30 of 3,000 items are popular enough that the prior decides the top 10 (which 10 of the
    30, and their order, is still the model's): the two-stage answer equals the exact one,
    while the model's own candidates (the proxy without the prior's term) miss most of them."""
    cfg, shared = _model(3_000, scale=30.0)
    counts = _heavy_tailed_counts(3_000, seed=2)
    popular = set(np.flatnonzero(counts >= 10_000).tolist())
    published = _published(counts, 2.0)
    kw = {"ann_shortlist": 50, "ann_index": stage, "ann_scan_candidates": 50}
    two_stage = _holder(cfg, shared, published, ann_threshold=0, **kw)
    exact = _holder(cfg, shared, published, ann_threshold=10**9)
    snap = two_stage.snapshot
    assert snap is not None and snap.shortlist is not None and snap.prior is not None
    missed = 0
    for seed in range(5):
        user = _user(cfg, seed, scale=0.3)
        got = two_stage.recommend(user["user_gmf"], user["user_mlp"], k=10)
        want = exact.recommend(user["user_gmf"], user["user_mlp"], k=10)
        assert [i for i, _ in got.items] == [i for i, _ in want.items]
        np.testing.assert_allclose([s for _, s in got.items], [s for _, s in want.items])
        top = {int(i) for i, _ in want.items}
        assert top <= popular  # the prior decided the top 10
        private = {k: torch.tensor(v)[None, :] for k, v in user.items()}
        alone = set(snap.shortlist.search(private, 50).tolist())  # the query's weight 0
        missed += len(top - alone)
    assert missed >= 25, missed  # without the prior's term the candidates would miss them


@pytest.mark.parametrize("stage", STAGES)
def test_a_new_weight_reuses_the_index_and_new_counts_rebuild_it(stage: str) -> None:
    cfg, shared = _model(2_000, scale=30.0)
    counts = _heavy_tailed_counts(2_000)
    first = _published(counts, 0.5)
    holder = _holder(cfg, shared, first, ann_threshold=0, ann_index=stage, ann_scan_candidates=50)
    before = holder.snapshot
    assert before is not None and before.prior is not None and before.shortlist is not None
    reweighted = _published(counts, 4.0, previous=first)
    assert reweighted.log_prior is first.log_prior  # the same counts: the same tensor
    assert holder.set_prior(reweighted) and not holder.set_prior(reweighted)
    after = holder.snapshot
    assert after is not None and after.prior is not None and after.prior.weight == 4.0
    assert after.scorer is before.scorer and after.shortlist is before.shortlist
    assert after.version == before.version and holder.prior_swaps == 1
    recounted = _published(counts + 1, 4.0, previous=reweighted)
    assert recounted.log_prior is not first.log_prior
    assert holder.set_prior(recounted)
    rebuilt = holder.snapshot
    assert rebuilt is not None and rebuilt.scorer is before.scorer
    assert rebuilt.shortlist is not None and rebuilt.shortlist.log_prior is recounted.log_prior
    if stage == "flat":
        assert isinstance(rebuilt.shortlist, ProxyShortlist)
        assert isinstance(before.shortlist, ProxyShortlist)
        assert rebuilt.shortlist.index is not before.shortlist.index
        assert (
            rebuilt.shortlist.index.ntotal == 2_000
            and rebuilt.shortlist.dim == before.shortlist.dim
        )
    else:
        assert isinstance(rebuilt.shortlist, ScanShortlist)
    user = _user(cfg, 0, scale=0.3)
    ranked = holder.recommend(user["user_gmf"], user["user_mlp"], k=5)
    ref = _served(cfg, shared, user, counts + 1, 4.0)
    assert [int(i) for i, _ in ranked.items] == np.argsort(-ref, kind="stable")[:5].tolist()
    # and back to none (a 404): the model alone, the index without its column
    assert holder.set_prior(None) and holder.prior_weight is None
    alone = holder.snapshot
    assert alone is not None and alone.shortlist is not None and alone.shortlist.log_prior is None


@pytest.mark.parametrize(
    "change",
    [
        {"counts": [1, -1, 2]},
        {"counts": [1, 1.0, 2]},
        {"counts": [1, True, 2]},
        {"counts": [1, "2", 2]},
        {"counts": [1, 2**70, 2]},
        {"weight": -0.5},
        {"weight": float("nan")},
        {"weight": float("inf")},
        {"weight": "1"},
        {"complete": "yes"},
        {"run_id": None},
    ],
)
def test_a_malformed_prior_body_is_refused(change: dict[str, object]) -> None:
    body = {"run_id": 1, "complete": True, "counts": [1, 2, 3], "weight": 1.0, **change}
    with pytest.raises(ValidationError):
        PriorBody.model_validate(body)
    ok = {"run_id": 1, "complete": True, "counts": [0, 2], "weight": 1, "extra": "ignored"}
    assert PriorBody.model_validate(ok).weight == 1.0


def test_a_weight_that_overflows_float32_is_not_served() -> None:
    cfg, shared = _model(50)
    holder = _holder(cfg, shared, _published(_heavy_tailed_counts(50), 1e300))
    assert holder.prior_weight is None and holder.prior_note is not None
    assert "overflows" in holder.prior_note
    user = _user(cfg, 0)
    ranked = holder.recommend(user["user_gmf"], user["user_mlp"], k=3)
    assert all(np.isfinite(s) for _, s in ranked.items)
