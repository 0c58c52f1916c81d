"""Ranking of the recommendation API: exactness, exclusions, validation, shortlist recall."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedrecgel.model import ModelConfig, Scorer, forward_batched, init_shared
from fedrecgel.wire import encode_model
from services.recommend_api.errors import InvalidRequest, InvalidUserVector, NoModel, UnknownItems
from services.recommend_api.prior import ServedPrior
from services.recommend_api.ranking import ModelHolder, RankingConfig, Snapshot, read_labels_file
from services.recommend_api.shortlist import (
    ProxyShortlist,
    ScanShortlist,
    Shortlist,
    ShortlistConfig,
    build_shortlist,
    faiss_available,
)


def _model(
    n_items: int, seed: int = 0, scale: float = 1.0
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    cfg = ModelConfig(n_items=n_items, factor=8, layers=3)
    shared = init_shared(cfg, seed)
    shared["item_gmf"] *= scale
    shared["item_mlp"] *= scale
    return cfg, shared


def _user(cfg: ModelConfig, seed: int, scale: float = 1.0) -> dict[str, list[float]]:
    g = torch.Generator().manual_seed(seed)
    return {
        n: (torch.randn(d, generator=g) * scale).tolist() for n, d in cfg.private_dims().items()
    }


def _brute_force(
    cfg: ModelConfig, shared: dict[str, torch.Tensor], user: dict[str, list[float]]
) -> np.ndarray:
    """Logits of every item with the training forward pass (no precomputation)."""
    private = {n: torch.tensor(v)[None, :] for n, v in user.items()}
    rows = {t: shared[t][None, :, :] for t in cfg.item_tables()}
    dense = {n: shared[n] for n in cfg.dense_names()}
    with torch.no_grad():
        return forward_batched(cfg, private, rows, dense, per_client_dense=False)[0].numpy()


def _holder(
    cfg: ModelConfig, shared: dict[str, torch.Tensor], version: int = 3, **kw: Any
) -> ModelHolder:
    holder = ModelHolder(RankingConfig(**kw), labels=kw.pop("labels", None))
    holder.swap(holder.build(cfg, shared, version))
    return holder


def test_top_k_matches_brute_force_scoring_of_every_item() -> None:
    cfg, shared = _model(300, scale=30.0)
    holder = _holder(cfg, shared)
    for seed in range(5):
        user = _user(cfg, seed, scale=0.3)
        ranked = holder.recommend(user["user_gmf"], user["user_mlp"], k=10)
        ref = _brute_force(cfg, shared, user)
        want = np.argsort(-ref, kind="stable")[:10]
        assert [int(i) for i, _ in ranked.items] == want.tolist()
        np.testing.assert_allclose([s for _, s in ranked.items], ref[want], rtol=1e-4, atol=1e-6)
        assert ranked.version == 3


def test_hand_built_mf_model_ranks_by_dot_product() -> None:
    cfg = ModelConfig(n_items=4, kind="mf", factor=2)
    shared = {"item_gmf": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])}
    holder = ModelHolder(labels=["a", "b", "c", "d"])
    holder.swap(holder.build(cfg, shared, 1))
    ranked = holder.recommend([2.0, 1.0], None, k=3)
    assert ranked.items == [("c", 3.0), ("a", 2.0), ("b", 1.0)]
    ranked = holder.recommend([2.0, 1.0], None, k=2, exclude=["c"])
    assert ranked.items == [("a", 2.0), ("b", 1.0)]


def test_exclusions_are_never_returned() -> None:
    cfg, shared = _model(50, scale=30.0)
    holder = _holder(cfg, shared)
    user = _user(cfg, 1, scale=0.3)
    top = holder.recommend(user["user_gmf"], user["user_mlp"], k=5)
    excluded = [i for i, _ in top.items[:3]]
    again = holder.recommend(user["user_gmf"], user["user_mlp"], k=5, exclude=excluded)
    assert not set(excluded) & {i for i, _ in again.items}
    assert [i for i, _ in again.items[:2]] == [i for i, _ in top.items[3:]]


def test_k_larger_than_catalogue_returns_all_remaining_items() -> None:
    cfg, shared = _model(7)
    holder = _holder(cfg, shared)
    user = _user(cfg, 0)
    ranked = holder.recommend(user["user_gmf"], user["user_mlp"], k=100, exclude=["2", "5"])
    assert sorted(int(i) for i, _ in ranked.items) == [0, 1, 3, 4, 6]
    scores = [s for _, s in ranked.items]
    assert scores == sorted(scores, reverse=True)


def test_bad_vectors_and_k_are_refused() -> None:
    cfg, shared = _model(20)
    holder = _holder(cfg, shared)
    user = _user(cfg, 0)
    with pytest.raises(InvalidUserVector, match="user_gmf has length 7"):
        holder.recommend(user["user_gmf"][:-1], user["user_mlp"], k=3)
    with pytest.raises(InvalidUserVector, match="NaN or Inf"):
        holder.recommend(user["user_gmf"], [float("nan"), *user["user_mlp"][1:]], k=3)
    with pytest.raises(InvalidUserVector, match="NaN or Inf"):
        holder.recommend([float("inf"), *user["user_gmf"][1:]], user["user_mlp"], k=3)
    with pytest.raises(InvalidUserVector, match="user_mlp is required"):
        holder.recommend(user["user_gmf"], None, k=3)
    with pytest.raises(InvalidRequest, match="k must be positive"):
        holder.recommend(user["user_gmf"], user["user_mlp"], k=0)


def test_unknown_exclude_ids_are_named() -> None:
    cfg, shared = _model(5)
    holder = ModelHolder(labels=["m1", "m2", "m3", "m4", "m5"])
    holder.swap(holder.build(cfg, shared, 1))
    user = _user(cfg, 0)
    with pytest.raises(UnknownItems) as err:
        holder.recommend(user["user_gmf"], user["user_mlp"], k=3, exclude=["m2", "zz", "7"])
    assert "'zz'" in err.value.detail and "'7'" in err.value.detail and "m2" not in err.value.detail


def test_no_model_yet_is_reported() -> None:
    with pytest.raises(NoModel):
        ModelHolder().recommend([0.0] * 8, [0.0] * 32, k=1)


def test_failed_load_keeps_the_old_model_and_counts() -> None:
    cfg, shared = _model(10)
    holder = _holder(cfg, shared, version=1)
    assert not holder.load_bytes(b"not a model")
    bad = dict(shared)
    bad["tower.1.weight"] = bad["tower.1.weight"].clone()
    bad["tower.1.weight"][0, 0] = float("nan")
    assert not holder.load_bytes(encode_model(cfg, bad, 2))
    other = ModelConfig(n_items=11, factor=8, layers=3)
    labelled = ModelHolder(labels=[str(i) for i in range(10)])
    labelled.swap(labelled.build(cfg, shared, 1))
    assert not labelled.load_bytes(encode_model(other, init_shared(other, 0), 2))
    assert holder.version == 1 and holder.swap_failures == 2 and holder.swaps == 1
    assert labelled.version == 1 and labelled.swap_failures == 1
    assert holder.load_bytes(encode_model(cfg, shared, 2)) and holder.version == 2


def test_labels_file_is_read_in_index_order(tmp_path: Path) -> None:
    path = tmp_path / "items.txt"
    path.write_text("x9\ny7\nz5\n", encoding="utf-8")
    assert read_labels_file(path) == ["x9", "y7", "z5"]


def _tower_dominated_model() -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """30,000 items, item embeddings at std 0.1 (the tower, which a candidate stage only
    approximates, dominates the score) and small random tower biases."""
    cfg = ModelConfig(n_items=30_000, factor=32, layers=3)
    shared = init_shared(cfg, 7)
    g = torch.Generator().manual_seed(1)
    for t in ("item_gmf", "item_mlp"):
        shared[t] = torch.randn(shared[t].shape, generator=g) * 0.1
    for k in range(cfg.layers):
        shared[f"tower.{k}.bias"] = torch.randn(shared[f"tower.{k}.bias"].shape, generator=g) * 0.01
    return cfg, shared


@pytest.mark.skipif(not faiss_available(), reason="faiss-cpu is not installed")
def test_shortlist_then_rerank_recalls_exact_top_10() -> None:
    """Recall@10 of index shortlist + exact re-rank vs exact ranking, on a random NCF model.

    Catalogue 30,000, shortlist 1,000 (3.3%). Embeddings at std 0.1 make the tower, which the
    index only approximates, dominate the score (the GMF half is an exact inner product), so
    this is the hard case; 0.9 means at most one of the true top 10 missed per user on
    average, with the miss ranked just below by the exact model. Measured ~0.97 here and
    ~0.9-0.99 at 1,000,000 items with a 5,000 shortlist (bench/recommend_load.py).
    """
    cfg, shared = _tower_dominated_model()
    approx = ModelHolder(RankingConfig(ann_threshold=0, ann_shortlist=1_000))
    approx.swap(approx.build(cfg, shared, 1))
    exact = ModelHolder(RankingConfig(ann_threshold=10**9))
    exact.swap(exact.build(cfg, shared, 1))
    assert approx.snapshot is not None and approx.snapshot.shortlist is not None
    recalls = []
    for seed in range(30):
        user = _user(cfg, 100 + seed, scale=0.1)
        a = {i for i, _ in approx.recommend(user["user_gmf"], user["user_mlp"], k=10).items}
        e = {i for i, _ in exact.recommend(user["user_gmf"], user["user_mlp"], k=10).items}
        recalls.append(len(a & e) / 10)
    assert float(np.mean(recalls)) >= 0.9, recalls


@pytest.mark.parametrize("index", ["flat", "scan"])
def test_exact_option_ranks_the_whole_catalogue_past_the_index(
    monkeypatch: pytest.MonkeyPatch, index: str
) -> None:
    if index == "flat" and not faiss_available():
        pytest.skip("faiss-cpu is not installed")
    cfg, shared = _model(3_000, scale=30.0)
    holder = _holder(
        cfg, shared, ann_threshold=0, ann_shortlist=50, ann_index=index, ann_scan_candidates=50
    )
    snap = holder.snapshot
    assert snap is not None and snap.shortlist is not None
    searches: list[int] = []
    real_search = snap.shortlist.search

    def counted_search(
        p: dict[str, torch.Tensor], n: int, prior: ServedPrior | None = None
    ) -> torch.Tensor:
        searches.append(n)
        return real_search(p, n, prior)

    monkeypatch.setattr(snap.shortlist, "search", counted_search)
    for seed in range(3):
        user = _user(cfg, seed, scale=0.3)
        ref = _brute_force(cfg, shared, user)
        want = np.argsort(-ref, kind="stable")[:10].tolist()
        exact = holder.recommend(user["user_gmf"], user["user_mlp"], k=10, exact=True)
        assert [int(i) for i, _ in exact.items] == want
        assert not searches  # the exact request never asked the index
        two_stage = holder.recommend(user["user_gmf"], user["user_mlp"], k=10)
        assert searches == [50]  # ... and a default request did, for 50 candidates
        searches.clear()
        # the re-rank is exact: every returned score is the model's own logit of that item
        np.testing.assert_allclose(
            [s for _, s in two_stage.items], ref[[int(i) for i, _ in two_stage.items]], rtol=1e-4
        )


@pytest.mark.parametrize("index", ["flat", "scan"])
def test_a_new_version_swaps_in_with_its_index_complete(
    monkeypatch: pytest.MonkeyPatch, index: str
) -> None:
    """While a new version's index is being built (held half-way here), every request is
    answered by the old version with its complete index; then the new one serves, whole."""
    import threading

    from services.recommend_api import ranking

    if index == "flat" and not faiss_available():
        pytest.skip("faiss-cpu is not installed")
    cfg, shared = _model(2_000, scale=30.0)
    holder = _holder(
        cfg,
        shared,
        version=1,
        ann_threshold=0,
        ann_shortlist=100,
        ann_index=index,
        ann_scan_candidates=100,
    )
    seen: list[tuple[int, int]] = []  # (version, items in that snapshot's index) per request
    real_top_k = ranking.top_k

    def spy_top_k(snap: Snapshot, *args: Any, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
        assert snap.shortlist is not None
        assert snap.shortlist.kind == index
        shortlist = snap.shortlist
        assert isinstance(shortlist, ProxyShortlist | ScanShortlist)  # flat or scan
        # the items the candidate stage covers: a flat index's vectors, a scan's tables
        if isinstance(shortlist, ProxyShortlist):
            covered = shortlist.index.ntotal
        else:
            assert shortlist.scorer.item_first is not None  # NCF
            covered = len(shortlist.scorer.item_first)
        seen.append((snap.version, covered))
        return real_top_k(snap, *args, **kw)

    monkeypatch.setattr(ranking, "top_k", spy_top_k)
    building, release = threading.Event(), threading.Event()
    real_build = build_shortlist

    def slow_build(
        scorer: Scorer, config: ShortlistConfig | None, log_prior: torch.Tensor | None = None
    ) -> Shortlist | None:
        index = real_build(scorer, config, log_prior)
        building.set()
        assert release.wait(30)
        return index

    monkeypatch.setattr(ranking, "build_shortlist", slow_build)
    _, new_shared = _model(2_000, seed=5, scale=30.0)
    loaded: list[bool] = []
    loader = threading.Thread(
        target=lambda: loaded.append(holder.load_bytes(encode_model(cfg, new_shared, 2)))
    )
    loader.start()
    assert building.wait(60)
    user = _user(cfg, 0, scale=0.3)
    for _ in range(20):  # the new index is built but not swapped in: version 1 answers
        assert holder.recommend(user["user_gmf"], user["user_mlp"], k=5).version == 1
    release.set()
    loader.join(60)
    assert loaded == [True] and holder.version == 2
    after = holder.recommend(user["user_gmf"], user["user_mlp"], k=5)
    ref = _brute_force(cfg, new_shared, user)
    assert after.version == 2
    assert [int(i) for i, _ in after.items] == np.argsort(-ref, kind="stable")[:5].tolist()
    assert seen[:20] == [(1, 2_000)] * 20 and seen[20:] == [(2, 2_000)]


def test_candidate_stage_follows_catalogue_size_and_setting() -> None:
    """auto: a faiss flat index up to ``flat_up_to`` items, the table scan above; an explicit
    setting wins at any size."""
    auto = ShortlistConfig(flat_up_to=1_000)
    assert auto.kind_for(1_000) == "flat" and auto.kind_for(1_001) == "scan"
    assert ShortlistConfig().kind_for(200_000) == "flat"
    assert ShortlistConfig().kind_for(1_000_000) == "scan"
    for kind in ("flat", "ivf", "scan"):
        assert ShortlistConfig(index=kind, flat_up_to=1_000).kind_for(10) == kind
        assert ShortlistConfig(index=kind).kind_for(10**7) == kind
    cfg, shared = _model(3_000, scale=30.0)
    from fedrecgel.model import Scorer

    scorer = Scorer(cfg, shared)
    big = build_shortlist(scorer, ShortlistConfig(flat_up_to=1_000, scan_candidates=77))
    assert isinstance(big, ScanShortlist) and big.min_candidates == 77
    if faiss_available():
        small = build_shortlist(scorer, ShortlistConfig(flat_up_to=3_000))
        assert isinstance(small, ProxyShortlist) and small.kind == "flat"
        assert small.min_candidates == 0
        ivf = build_shortlist(scorer, ShortlistConfig(index="ivf", ivf_candidates=64))
        assert isinstance(ivf, ProxyShortlist) and ivf.kind == "ivf"
        assert ivf.min_candidates == 64
    # the holder passes its settings through
    holder = _holder(cfg, shared, ann_threshold=0, ann_index="scan", ann_scan_candidates=123)
    assert holder.snapshot is not None
    assert isinstance(holder.snapshot.shortlist, ScanShortlist)
    assert holder.snapshot.shortlist.min_candidates == 123


def test_scan_asks_for_its_candidates_and_re_ranks_them_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg, shared = _model(3_000, scale=30.0)
    holder = _holder(
        cfg, shared, ann_threshold=0, ann_shortlist=100, ann_index="scan", ann_scan_candidates=200
    )
    snap = holder.snapshot
    assert snap is not None and isinstance(snap.shortlist, ScanShortlist)
    asked: list[int] = []
    real_search = snap.shortlist.search

    def counted_search(
        p: dict[str, torch.Tensor], n: int, prior: ServedPrior | None = None
    ) -> torch.Tensor:
        asked.append(n)
        return real_search(p, n, prior)

    monkeypatch.setattr(snap.shortlist, "search", counted_search)
    user = _user(cfg, 4, scale=0.3)
    ranked = holder.recommend(user["user_gmf"], user["user_mlp"], k=10, exclude=["5", "9"])
    assert asked == [202]  # the scan's candidates plus the excluded items
    ref = _brute_force(cfg, shared, user)
    got = [int(i) for i, _ in ranked.items]
    assert not {5, 9} & set(got)
    np.testing.assert_allclose([s for _, s in ranked.items], ref[got], rtol=1e-4, atol=1e-6)
    assert got == sorted(got, key=lambda i: -ref[i])


def test_scan_of_an_mf_model_is_the_exact_ranking() -> None:
    cfg = ModelConfig(n_items=5_000, kind="mf", factor=8)
    shared = init_shared(cfg, 3)
    holder = _holder(cfg, shared, ann_threshold=0, ann_index="scan", ann_scan_candidates=20)
    for seed in range(3):
        user = {"user_gmf": torch.randn(8, generator=torch.Generator().manual_seed(seed)).tolist()}
        ranked = holder.recommend(user["user_gmf"], None, k=10)
        ref = _brute_force(cfg, shared, user)
        assert [int(i) for i, _ in ranked.items] == np.argsort(-ref, kind="stable")[:10].tolist()


def test_scan_recalls_exact_top_10_on_a_tower_dominated_model() -> None:
    """The hard case of ``test_shortlist_then_rerank_recalls_exact_top_10`` (std 0.1: the
    tower, which the candidate stage only approximates, dominates), with the table scan and
    1,000 candidates of 30,000 (measured 0.95 here, the flat index ~0.97: on this untrained
    model the deeper layers, which the scan linearises, matter more than on a trained one)."""
    cfg, shared = _tower_dominated_model()
    approx = _holder(cfg, shared, ann_threshold=0, ann_index="scan", ann_scan_candidates=1_000)
    exact = _holder(cfg, shared, ann_threshold=10**9)
    recalls = []
    for seed in range(30):
        user = _user(cfg, 100 + seed, scale=0.1)
        a = {i for i, _ in approx.recommend(user["user_gmf"], user["user_mlp"], k=10).items}
        e = {i for i, _ in exact.recommend(user["user_gmf"], user["user_mlp"], k=10).items}
        recalls.append(len(a & e) / 10)
    assert float(np.mean(recalls)) >= 0.9, recalls


def test_a_decoded_model_is_ranked_exactly_and_a_caller_model_is_left_alone() -> None:
    """A blob's item MLP table becomes its first-layer half in place (no second copy of a
    large model while loading); a model handed to ``build`` by the caller is not written."""
    cfg, shared = _model(70_000, scale=30.0)  # more rows than one load-time chunk
    before = shared["item_mlp"].clone()
    holder = ModelHolder(RankingConfig(ann_threshold=10**9))
    holder.swap(holder.build(cfg, shared, 1))
    assert torch.equal(shared["item_mlp"], before)
    from_blob = ModelHolder(RankingConfig(ann_threshold=10**9))
    assert from_blob.load_bytes(encode_model(cfg, shared, 2))
    snap, ref_snap = from_blob.snapshot, holder.snapshot
    assert snap is not None and ref_snap is not None
    assert "item_mlp" not in snap.scorer.shared
    assert snap.scorer.item_first is not None and ref_snap.scorer.item_first is not None
    torch.testing.assert_close(snap.scorer.item_first, ref_snap.scorer.item_first)
    for seed in range(3):
        user = _user(cfg, seed, scale=0.3)
        ranked = from_blob.recommend(user["user_gmf"], user["user_mlp"], k=10)
        ref = _brute_force(cfg, shared, user)
        assert [int(i) for i, _ in ranked.items] == np.argsort(-ref, kind="stable")[:10].tolist()
