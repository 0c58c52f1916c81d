"""Negatives from a public per-round pool (``negative_pool``): the pool is keyed by (seed,
round), every client draws its negatives from it by the usual rejection rules, on the cohort
path and one client at a time alike; without a pool the draws are today's."""

from __future__ import annotations

import numpy as np
import pytest

from fedrecgel.config import ConfigError, RunParams, check
from fedrecgel.run_config import RunConfig
from fedrecgel.sam import client_rng, client_samples, negative_pool
from fedrecgel.sampling import cohort_samples
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.synthetic import synthetic_split

SPLIT = synthetic_split(n_users=60, n_items=150, interactions_per_user=10.0, seed=5)
CONFIG = TrainConfig(rounds=2, fraction=0.2, factor=8, layers=2, eval_every=2)


def test_the_pool_is_public_distinct_sorted_and_new_each_round() -> None:
    a = negative_pool(7, 3, 500, 64)
    assert np.array_equal(a, negative_pool(7, 3, 500, 64))
    assert len(np.unique(a)) == 64 and np.array_equal(a, np.sort(a))
    assert a.min() >= 0 and a.max() < 500
    assert not np.array_equal(a, negative_pool(7, 4, 500, 64))
    assert not np.array_equal(a, negative_pool(8, 3, 500, 64))
    with pytest.raises(ValueError, match="catalogue"):
        negative_pool(0, 1, 10, 11)


def test_pool_negatives_come_from_the_pool_and_follow_the_rejection_rules() -> None:
    pool = negative_pool(0, 1, 200, 20)
    pos = np.array([3, 8, 15, int(pool[0]), int(pool[5])])
    items, labels = client_samples(pos, 200, 4, client_rng(0, 1, 2), pool)
    rows = items.reshape(len(pos), 5)
    negs = rows[:, 1:]
    assert np.isin(negs, pool).all() and not np.isin(negs, pos).any()
    assert all(len(set(r)) == 4 for r in negs.tolist())
    assert sorted(rows[:, 0].tolist()) == sorted(pos.tolist())
    assert labels.reshape(len(pos), 5)[:, 0].tolist() == [1.0] * len(pos)


def test_the_cohort_draws_what_each_client_draws_alone_with_a_pool() -> None:
    rng = np.random.default_rng(0)
    pool = negative_pool(1, 2, 60, 12)
    pos = [rng.choice(60, size=int(rng.integers(0, 9)), replace=False) for _ in range(12)]
    got = cohort_samples(pos, 60, 3, [client_rng(1, 2, u) for u in range(12)], pool)
    for u, (items, labels) in enumerate(got):
        want = client_samples(pos[u], 60, 3, client_rng(1, 2, u), pool)
        assert np.array_equal(items, want[0]) and np.array_equal(labels, want[1])


def test_a_client_that_owns_too_much_of_the_pool_is_a_clear_error() -> None:
    pool = negative_pool(0, 1, 50, 6)
    pos = pool[:3]  # three of the six are its own: three left, four needed
    with pytest.raises(ValueError, match="negative pool of 6"):
        client_samples(pos, 50, 4, client_rng(0, 1, 0), pool)
    with pytest.raises(ValueError, match="negative pool of 6"):
        cohort_samples([pos], 50, 4, [client_rng(0, 1, 0)], pool)


def test_the_simulator_draws_from_the_rounds_pool_and_none_keeps_todays_draws() -> None:
    sim = Simulator(SPLIT, CONFIG.replace(negative_pool=30))
    users = np.arange(10)
    pool = sim.clients.pool(2)
    assert pool is not None and np.array_equal(pool, negative_pool(CONFIG.seed, 2, 150, 30))
    for u, (items, labels) in zip(users, sim.samples_for(users, 2), strict=True):
        negs = items[labels == 0]
        assert np.isin(negs, pool).all()
        assert not np.isin(negs, SPLIT.user_train(int(u))).any()
    plain = Simulator(SPLIT, CONFIG)
    assert plain.clients.pool(2) is None
    for u, (items, _) in zip(users, plain.samples_for(users, 2), strict=True):
        want, _ = client_samples(SPLIT.user_train(int(u)), 150, 4, client_rng(0, 2, int(u)))
        assert np.array_equal(items, want)


def test_pool_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="smaller than n_negatives"):
        RunParams(negative_pool=3, n_negatives=4)
    with pytest.raises(ValueError, match="needs negative_pool"):
        RunParams(secure_aggregation="sparse")
    with pytest.raises(ConfigError, match="negative_pool"):
        check({"negative_pool": 0}, RunParams)
    with pytest.raises(ValueError, match="exceeds the catalogue"):
        RunConfig(n_items=50, negative_pool=51)
    with pytest.raises(ValueError, match="exceeds the catalogue"):
        Simulator(SPLIT, CONFIG.replace(negative_pool=151))
    RunParams(secure_aggregation="sparse", negative_pool=64)
