"""The popularity prior: the ranking it serves, the weight chosen on validation, and where it is
off (no validation items, DP)."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from fedrecgel.baselines import CentralConfig, central, popularity
from fedrecgel.metrics import (
    KS,
    PRIOR_METRIC_NAMES,
    means,
    metric_sums,
    per_user_metrics,
    rank_of_positive,
)
from fedrecgel.model import ModelConfig, Scorer, init_private, init_shared
from fedrecgel.prior import (
    PRIOR_WEIGHTS,
    SERVED_K,
    choose,
    guard_k,
    item_counts,
    key,
    log_prior,
)
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.synthetic import synthetic_split

SPLIT = synthetic_split(
    n_users=80, n_items=120, interactions_per_user=12.0, seed=3, validation=True
)
SMALL = TrainConfig(rounds=3, fraction=0.2, factor=8, layers=2)


def _scorer_and_states() -> tuple[Scorer, dict[str, torch.Tensor]]:
    cfg = ModelConfig(n_items=SPLIT.n_items, factor=8, layers=2)
    return Scorer(cfg, init_shared(cfg, 0)), init_private(cfg, 0, np.arange(SPLIT.n_users))


def test_each_weight_ranks_by_logit_plus_weight_times_log_count() -> None:
    scorer, states = _scorer_and_states()
    prior = log_prior(item_counts(SPLIT.train_items, SPLIT.n_items))
    got = metric_sums(scorer, states, SPLIT.test_items, SPLIT.test_negatives, KS, prior=prior)
    cand = torch.from_numpy(np.concatenate([SPLIT.test_items[:, None], SPLIT.test_negatives], 1))
    logits = scorer.score(states, cand)
    for w in PRIOR_WEIGHTS:
        served = logits + w * prior[cand]
        want = per_user_metrics(rank_of_positive(served[:, 0], served[:, 1:]), KS)
        for name, vals in want.items():
            assert got[key(w, name)] == pytest.approx(float(vals.sum()), abs=1e-9), (w, name)
    # the plain names stay the model's own, as without a prior
    plain = metric_sums(scorer, states, SPLIT.test_items, SPLIT.test_negatives, KS)
    assert {k: got[k] for k in plain} == plain
    # and the rest are exactly the names the protocol fixes (the aggregator checks them)
    assert set(got) - set(plain) == set(PRIOR_METRIC_NAMES)


def test_a_large_weight_ranks_as_popularity_does() -> None:
    scorer, states = _scorer_and_states()
    prior = log_prior(item_counts(SPLIT.train_items, SPLIT.n_items))
    # logits of a fresh model are small; 1e4 times the log count orders by the count alone
    sums = metric_sums(
        scorer, states, SPLIT.test_items, SPLIT.test_negatives, KS, prior=prior * 1e4
    )
    pop = popularity(SPLIT).rounds[0].test
    assert means(sums)[key(1.0, "hr@10")] == pytest.approx(pop["hr@10"])


def test_choose_takes_the_weight_that_moves_most_users_in_and_clears_the_sign_test() -> None:
    test = {"hr@10": 0.5, key(0.5, "hr@10"): 0.7, key(2.0, "hr@10"): 0.9}
    # 100 validation users: weight 0.5 moves 20 into the served list and none out, weight 2
    # moves 32 in and 12 out (32 - 12 > 2 * sqrt(32 + 12) fails) though its validation HR@10,
    # the sampled figure that once chose, is higher
    val = {
        "hr@10": 0.6,
        key(0.5, "hr@10"): 0.8,
        key(0.5, "gain"): 0.2,
        key(0.5, "loss"): 0.0,
        key(2.0, "hr@10"): 0.9,
        key(2.0, "gain"): 0.32,
        key(2.0, "loss"): 0.12,
    }
    got = choose(test, val, n_val=100)
    assert got.weight == 0.5
    assert got.test == {"hr@10": 0.7} and got.val == {"hr@10": 0.8}
    assert got.model_test == {"hr@10": 0.5} and got.model_val == {"hr@10": 0.6}
    # the same shares of 10 users are no evidence: the model alone is served
    assert choose(test, val, n_val=10).weight == 0.0
    # a clear gain of weight 2 too: the larger net gain wins, the smaller weight on a tie
    assert choose(test, {**val, key(2.0, "loss"): 0.0}, n_val=100).weight == 2.0
    tie = {**val, key(2.0, "gain"): 0.2, key(2.0, "loss"): 0.0}
    assert choose(test, tie, n_val=100).weight == 0.5
    # without prior figures nothing is chosen
    plain = choose({"hr@10": 0.5}, {"hr@10": 0.6}, n_val=100)
    assert plain.weight is None and plain.test == plain.model_test == {"hr@10": 0.5}


def test_the_served_cut_off_is_the_top_tens_share_of_the_candidates() -> None:
    # 100 candidates: a top 10 of 11,830 items (Amazon-Video) or of 2,059 (FilmTrust) is the
    # first place among them, of 500 items the first two, of 100 or fewer all ten
    assert guard_k(11_830, 100) == guard_k(2_059, 100) == 1
    assert guard_k(500, 100) == 2 and guard_k(120, 100) == 8
    assert guard_k(100, 100) == guard_k(40, 100) == SERVED_K


def test_the_sign_test_counts_the_users_moved_across_the_served_cut_off() -> None:
    scorer, states = _scorer_and_states()
    prior = log_prior(item_counts(SPLIT.train_items, SPLIT.n_items))
    assert SPLIT.val_items is not None and SPLIT.val_negatives is not None
    cut = guard_k(SPLIT.n_items, 1 + SPLIT.val_negatives.shape[1])
    assert 1 < cut < SERVED_K  # a cut-off of its own on this small catalogue
    ks = (cut, *KS)
    got = metric_sums(scorer, states, SPLIT.val_items, SPLIT.val_negatives, ks, prior=prior)
    for w in PRIOR_WEIGHTS[1:]:
        # hits with the prior = model hits + moved in - moved out, at the cut-off
        moved = got[key(w, "gain")] - got[key(w, "loss")]
        assert got[key(w, f"hr@{cut}")] == pytest.approx(got[f"hr@{cut}"] + moved)


def test_the_simulator_serves_the_validation_chosen_ranking() -> None:
    res = Simulator(SPLIT, SMALL).run()
    for rec in res.rounds:
        assert rec.prior_weight in PRIOR_WEIGHTS
        assert set(rec.test) == set(rec.model_test)
        assert not any(k.startswith("prior@") for k in rec.test)
    sel = res.selected()
    assert sel is not None and "prior_weight" in sel and "model.hr@10" in sel
    # the model's own figures are those of a run without the prior, bit for bit
    off = Simulator(SPLIT, SMALL.replace(popularity_prior=False)).run()
    assert [r.model_test for r in res.rounds] == [r.test for r in off.rounds]
    assert all(r.prior_weight is None for r in off.rounds)


def test_no_prior_without_validation_items_or_under_dp() -> None:
    no_val = synthetic_split(n_users=80, n_items=120, interactions_per_user=12.0, seed=3)
    assert Simulator(no_val, SMALL).prior is None
    assert Simulator(SPLIT, SMALL.replace(dp_noise=0.5)).prior is None
    assert Simulator(SPLIT, SMALL).prior is not None


def test_central_training_chooses_its_weight_too() -> None:
    cfg = CentralConfig(ModelConfig(n_items=SPLIT.n_items, factor=8, layers=2), epochs=2)
    res = central(SPLIT, cfg)
    assert all(r.prior_weight in PRIOR_WEIGHTS for r in res.rounds)
    off = central(SPLIT, replace(cfg, popularity_prior=False))
    assert [r.model_test for r in res.rounds] == [r.test for r in off.rounds]
