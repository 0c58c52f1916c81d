"""The popularity prior of a sparse secure run: estimated from the item counts its rounds'
instance A unmasks anyway, fixed once they have counted the clients ROUND_COVER times over."""

import numpy as np

from fedrecgel.config import RunParams
from fedrecgel.prior import ROUND_COVER, RoundCounts, RoundPrior, item_counts, log_prior
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.synthetic import synthetic_split
from harness.union_attack import observe

SPLIT = synthetic_split(
    n_users=80, n_items=120, interactions_per_user=12.0, seed=3, validation=True
)
SPARSE = TrainConfig(
    rounds=8,
    fraction=0.25,
    factor=8,
    layers=2,
    eval_every=1,
    secure_aggregation="sparse",
    negative_pool=16,
    secagg_neighbours=3,
)


def test_counts_of_every_client_outside_the_pools_estimate_the_exact_counts() -> None:
    exact = np.array([5, 0, 3, 8])
    rp = RoundPrior(4)
    rp.add(RoundCounts(np.array([0, 0, 3, 8]), np.array([0, 1]), counted=10))  # 0, 1 pooled
    assert not rp.covers(10)
    rp.add(RoundCounts(np.array([5, 0, 0, 0]), np.array([2, 3]), counted=10))
    assert rp.covers(10) and ROUND_COVER == 2
    assert np.array_equal(rp.estimate(10), exact)
    assert np.array_equal(rp.estimate(20), 2 * exact)  # a rate, scaled to the clients


def test_a_sparse_secure_run_ranks_with_the_prior_of_its_rounds_counts_once_they_cover() -> None:
    assert SPARSE.prior_enabled and SPARSE.prior_from_rounds
    sim = Simulator(SPLIT, SPARSE)
    assert sim.prior is None  # nothing counted yet: the model alone
    want = RoundPrior(SPLIT.n_items)
    held = [SPLIT.user_train(u) for u in range(SPLIT.n_users)]
    fixed_at = None
    for obs in observe(held, SPLIT.n_items, SPARSE, SPARSE.rounds):
        rec = sim.step()
        if fixed_at is None:
            want.add(RoundCounts(obs.counts, obs.pool, len(obs.cohort)))
            if want.covers(SPLIT.n_users):
                fixed_at = obs.round_id
        if fixed_at is None:
            assert sim.prior is None and rec.prior_weight is None
        else:  # fixed to the estimate of the rounds up to fixed_at, and then kept
            assert sim.prior is not None
            assert np.array_equal(sim.prior.numpy(), log_prior(want.estimate(80)).numpy())
            assert rec.prior_weight is not None  # every weight ranked, one chosen
    assert fixed_at == int(np.ceil(ROUND_COVER * 80 / 20))  # cohorts of 20 clients
    exact = item_counts(SPLIT.train_items, SPLIT.n_items)
    assert np.corrcoef(want.estimate(80), exact)[0, 1] > 0.9


def test_dense_secure_aggregation_and_plain_runs_take_no_round_counts() -> None:
    dense = RunParams(secure_aggregation="dense")
    assert not dense.prior_enabled and not dense.prior_from_rounds
    assert RunParams().prior_enabled and not RunParams().prior_from_rounds
    sim = Simulator(SPLIT, SPARSE.replace(popularity_prior=False))
    assert sim.round_prior is None and not sim.config.prior_from_rounds
