"""The popularity prior in a DP run: its item counts released once with Gaussian noise under a
share of the run's target epsilon, composed with the rounds by the same accountant; the
settings that turn it on; the release the simulator ranks with."""

from __future__ import annotations

from typing import Any

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from fedrecgel.accountant import (
    _event,
    _release_event,
    calibrate,
    epsilon,
    plan_privacy,
    release_epsilon,
)
from fedrecgel.config import RunParams, Sampling
from fedrecgel.prior import bounded_counts, log_prior, run_prior, user_draw
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.synthetic import synthetic_split


@pytest.mark.parametrize(
    ("sampling", "n", "m", "q"), [("poisson", 1500, 0, 0.1), ("fixed", 1500, 150, 0.1)]
)
def test_the_composed_epsilon_agrees_with_the_accountants_own(
    sampling: Sampling, n: int, m: int, q: float
) -> None:
    rel = dp_accounting.NeighboringRelation
    for rounds in (0, 1, 40):
        acc = RdpAccountant(
            neighboring_relation=rel.ADD_OR_REMOVE_ONE if sampling == "poisson" else rel.REPLACE_ONE
        )
        events = [_release_event(2.0, sampling)]
        if rounds:
            events.append(_event(1.3, sampling, n, m, q, rounds))
        acc.compose(dp_accounting.ComposedDpEvent(events))
        fast = epsilon(1.3, sampling, n, m, q, rounds, 1 / n, (2.0,))
        assert fast == pytest.approx(acc.get_epsilon(1 / n), rel=1e-9)
    # the release adds to the rounds' cost, and without one nothing changes
    assert epsilon(1.3, sampling, n, m, q, 40, 1 / n, (2.0,)) > epsilon(
        1.3, sampling, n, m, q, 40, 1 / n
    )
    assert epsilon(1.3, sampling, n, m, q, 0, 1 / n) == 0.0


def test_a_share_buys_the_release_its_part_and_the_rounds_the_rest() -> None:
    base: dict[str, Any] = {"target_epsilon": 3.0, "sampling": "poisson", "fraction": 0.1}
    base["rounds"] = 30
    plain = plan_privacy(RunParams(**base), 1500)
    shared = plan_privacy(RunParams(**base, dp_prior_share=0.5, dp_prior_items=7), 1500)
    assert plain is not None and shared is not None
    assert plain.prior_noise == 0 and plain.prior_items == 0 and plain.prior_std == 0
    # the release alone spends the share; everything together the target, no more
    assert release_epsilon(shared.prior_noise, shared.delta) == pytest.approx(1.5, rel=1e-3)
    assert shared.epsilon(0) == pytest.approx(1.5, rel=1e-3)
    assert 2.99 < shared.epsilon(30) <= 3.0
    assert shared.noise == pytest.approx(
        calibrate(3.0, "poisson", 1500, 0, 0.1, 30, 1 / 1500, (shared.prior_noise,))
    )
    # the rounds get less than the whole target (more noise), but more than half of it
    assert shared.noise > plain.noise
    assert shared.noise < calibrate(1.5, "poisson", 1500, 0, 0.1, 30, 1 / 1500)
    assert shared.prior_items == 7
    assert shared.prior_std == pytest.approx(shared.prior_noise * 7**0.5)


def test_under_fixed_cohorts_a_user_moves_the_counts_by_sqrt_2k() -> None:
    """Replace-one neighbouring: the release's noise is sqrt(2) times that of add-or-remove."""
    base: dict[str, Any] = {"target_epsilon": 3.0, "dp_prior_share": 0.5, "rounds": 10}
    poisson = plan_privacy(RunParams(**base, sampling="poisson"), 1500)
    fixed = plan_privacy(RunParams(**base, sampling="fixed"), 1500)
    assert poisson is not None and fixed is not None
    assert fixed.prior_noise == pytest.approx(poisson.prior_noise * 2**0.5)
    assert fixed.epsilon(0) == pytest.approx(1.5, rel=1e-3)


@pytest.mark.parametrize(
    ("settings", "enabled"),
    [
        ({}, True),
        ({"popularity_prior": False}, False),
        ({"target_epsilon": 3.0}, False),
        ({"target_epsilon": 3.0, "dp_prior_share": 0.5}, True),
        ({"target_epsilon": 3.0, "dp_prior_share": 0.5, "popularity_prior": False}, False),
        ({"dp_noise": 1.0, "dp_prior_share": 0.5}, False),  # no target to take a share of
        ({"dp_noise": 1.0, "target_epsilon": 3.0, "dp_prior_share": 0.5}, True),
        ({"dp_noise": 1.0, "dp_prior_share": 0.5, "dp_mode": "distributed"}, False),
        ({"secure_aggregation": "dense"}, False),
    ],
)
def test_which_runs_rank_with_the_prior(settings: dict[str, object], enabled: bool) -> None:
    params = RunParams.model_validate(settings)
    assert params.prior_enabled is enabled
    assert params.dp_prior_release is (enabled and params.dp_enabled)


def test_a_dp_plan_without_a_share_releases_nothing_and_ranks_without_the_prior() -> None:
    split = synthetic_split(n_users=40, n_items=30, seed=0, n_test_negatives=10, validation=True)
    plan = plan_privacy(RunParams(target_epsilon=3.0), split.n_users)
    assert run_prior(split, True, plan, 0) is None
    assert run_prior(split, False, None, 0) is None
    assert run_prior(split, True, None, 0) is not None  # no DP: the plain counts


def test_the_released_counts_are_the_users_bounded_counts_plus_seeded_noise() -> None:
    split = synthetic_split(n_users=200, n_items=50, seed=1, n_test_negatives=10, validation=True)
    users = range(split.n_users)
    held = [split.user_train(u) for u in users]
    k = 3
    counts = bounded_counts(held, users, k, 5, split.n_items)
    assert counts.sum() == sum(min(k, len(np.unique(h))) for h in held)
    assert all(len(user_draw(h, k, 5, u)) <= k for u, h in enumerate(held))
    # a budget so large that the noise rounds away: exactly the bounded counts
    loose = plan_privacy(
        RunParams(target_epsilon=1000.0, dp_prior_share=0.9, dp_prior_items=k), 200
    )
    assert loose is not None and loose.prior_std < 0.1  # 0.5 is > 5 std away
    assert run_prior(split, True, loose, 5) == pytest.approx(log_prior(counts))
    # a small one: whole counts >= 0, the same for the same seed, not for another
    tight = plan_privacy(RunParams(target_epsilon=1.0, dp_prior_share=0.5, dp_prior_items=k), 200)
    assert tight is not None and tight.prior_std > 3
    first, same, other = (run_prior(split, True, tight, s) for s in (5, 5, 6))
    assert first is not None and same is not None and other is not None
    assert first.equal(same) and not first.equal(other)
    noisy = np.expm1(first.double().numpy())
    assert np.allclose(noisy, np.rint(noisy), atol=1e-3) and noisy.min() >= 0
    assert not np.array_equal(np.rint(noisy), counts)


def test_a_simulated_dp_run_with_a_share_ranks_with_the_released_prior() -> None:
    split = synthetic_split(n_users=80, n_items=40, seed=0, n_test_negatives=20, validation=True)
    common: dict[str, Any] = {"rounds": 6, "factor": 4, "layers": 1, "fraction": 0.3}
    common["sampling"] = "poisson"
    dp: dict[str, Any] = {"target_epsilon": 4.0, "dp_clip": 0.5, "eval_every": 3}
    without = Simulator(split, TrainConfig(**common, **dp))
    assert without.prior is None
    sim = Simulator(split, TrainConfig(**common, **dp, dp_prior_share=0.4))
    assert sim.privacy is not None and sim.prior is not None
    res = sim.run()
    selected = res.selected()
    assert selected is not None and selected["prior_weight"] is not None
    eps = [r.epsilon for r in res.rounds if r.epsilon is not None]
    # the first round's epsilon already holds the release's; the last stays within the target
    assert eps[0] > sim.privacy.epsilon(0) > 0 and eps[-1] <= 4.0
    assert res.to_json()["privacy"]["prior_noise"] == sim.privacy.prior_noise > 0
