"""Reference points: popularity, random and the centralized model, on exactly the split's
candidates."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from fedrecgel.baselines import (
    CentralConfig,
    central,
    item_popularity,
    popularity,
    random_ranking,
)
from fedrecgel.data import Interactions, Split, apply_protocol
from fedrecgel.model import ModelConfig, Scorer
from fedrecgel.simulate import RoundRecord


def _popular_split(validation: bool = True) -> Split:
    """Users who all like items 0..9 (in a per-user order) plus a few of their own."""
    rng = np.random.default_rng(0)
    users, items, times = [], [], []
    for u in range(60):
        own = rng.choice(np.arange(10, 200), size=4, replace=False)
        seq = [*rng.permutation(10)[:6], *own]
        for t, i in enumerate(seq):
            users.append(u)
            items.append(int(i))
            times.append(t if i >= 10 else 100 + t)  # a popular item is the latest
    raw = Interactions("pop", np.array(users), np.array(items), np.array(times))
    return apply_protocol(raw, n_test_negatives=20, validation=validation)


def test_popularity_counts_training_users_and_finds_popular_test_items() -> None:
    split = _popular_split()
    pop = item_popularity(split)
    assert pop.sum() == split.n_train
    for u in range(split.n_users):
        for i in split.user_train(u):
            assert pop[i] >= 1
    res = popularity(split)
    # every held-out item is one of the ten popular items; the negatives are long-tail
    best = res.best_test()
    assert best is not None and best["hr@10"] == pytest.approx(1.0)


def test_random_ranking_is_seeded_and_near_chance() -> None:
    split = _popular_split()
    a, b = random_ranking(split, seed=3), random_ranking(split, seed=3)
    assert a.best_test() == b.best_test()
    hr = a.best_test()["hr@10"]  # type: ignore[index]
    assert 0.2 < hr < 0.8  # 10 of 21 candidates: about 0.48


def test_central_learns_beyond_chance_and_reports_epochs() -> None:
    split = _popular_split()
    cfg = CentralConfig(ModelConfig(n_items=split.n_items, factor=8), epochs=6, lr=0.01)
    seen: list[RoundRecord] = []
    res = central(split, cfg, on_epoch=seen.append)
    assert [r.round for r in res.rounds] == list(range(1, 7)) and seen == res.rounds
    assert res.rounds[-1].loss < res.rounds[0].loss
    selected = res.selected()
    assert selected is not None and selected["hr@10"] > 0.9
    again = central(split, cfg)
    assert [r.test for r in again.rounds] == [r.test for r in res.rounds]
    with pytest.raises(ValueError, match="epochs"):
        central(split, CentralConfig(ModelConfig(n_items=split.n_items), epochs=0))
    with pytest.raises(ValueError, match="items"):
        central(split, CentralConfig(ModelConfig(n_items=split.n_items + 1)))


def test_a_fixed_ranking_scored_in_chunks_of_users_gives_the_same_means(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More users than a chunk: the means over the chunks (weighted by their users) are the
    means over every user at once."""
    import fedrecgel.baselines as baselines
    from fedrecgel.synthetic import synthetic_split

    split = synthetic_split(300, 200, interactions_per_user=8.0, seed=3, validation=True)
    whole = baselines.popularity(split).rounds[0]
    monkeypatch.setattr(baselines, "USER_CHUNK", 64)  # 300 users: 5 chunks, the last of 44
    chunked = baselines.popularity(split).rounds[0]
    assert chunked.test == pytest.approx(whole.test, abs=1e-12)
    assert chunked.val == pytest.approx(whole.val, abs=1e-12)
    assert 0.0 < whole.test["hr@10"] < 1.0


def test_central_shows_each_evaluated_model_that_gave_its_figures() -> None:
    from fedrecgel.metrics import KS, means, metric_sums

    split = _popular_split()
    cfg = CentralConfig(ModelConfig(n_items=split.n_items, factor=8), epochs=4, lr=0.01)
    seen: list[tuple[int, float]] = []

    def rescore(rec: RoundRecord, scorer: Scorer, private: dict[str, torch.Tensor]) -> None:
        sums = metric_sums(scorer, private, split.test_items, split.test_negatives, KS)
        seen.append((rec.round, means(sums)["ndcg@10"]))

    res = central(split, replace(cfg, eval_every=2), on_model=rescore)
    assert seen == [(r.round, r.model_test["ndcg@10"]) for r in res.rounds if r.model_test]
    assert [r for r, _ in seen] == [2, 4]
