"""Client-level differential privacy: the accountant against published values, the clipping
bound, the noise's standard deviation, the cohort draw the accountant assumes, and a DP run
that stops at its target epsilon."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from fedrecgel.accountant import (
    PrivacyPlan,
    calibrate,
    epsilon,
    epsilon_slow,
    plan_privacy,
    rounds_within,
)
from fedrecgel.cohort import cohort_size, select_cohort
from fedrecgel.config import ConfigError, RunParams, Sampling
from fedrecgel.privacy import (
    NORM_TOLERANCE,
    add_local_noise,
    noisy_mean,
    norm_bound,
    sum_updates,
    with_privacy,
)
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.strategy import clip_update, make_strategy, update_norm
from fedrecgel.synthetic import synthetic_split
from fedrecgel.uploads import Update

SHAPES = {"item_gmf": (300, 8), "tower.0.weight": (16, 8), "tower.0.bias": (16,)}


def _update(client: int, rows: list[int], scale: float, gen: torch.Generator) -> Update:
    idx = torch.tensor(sorted(rows), dtype=torch.int64)
    return Update(
        client_id=client,
        n_samples=10,
        rows={"item_gmf": (idx, scale * torch.randn(len(rows), 8, generator=gen))},
        dense={
            "tower.0.weight": scale * torch.randn(16, 8, generator=gen),
            "tower.0.bias": scale * torch.randn(16, generator=gen),
        },
    )


# ----------------------------------------------------------------------------- the accountant


def test_a_gaussian_release_matches_the_librarys_documented_epsilon() -> None:
    """dp-accounting documents noise multiplier 4.530877117 as exactly (1, 1e-6)-DP for one
    Gaussian release (its RDP accountant tests); one round with q = 1 is that release."""
    eps = epsilon(4.530877117, "poisson", 1000, 0, 1.0, 1, 1e-6)
    assert eps == pytest.approx(1.0, abs=1e-4)
    # and it is an upper bound of the exact privacy loss (Balle & Wang 2018, Theorem 8):
    # the exact delta of the Gaussian mechanism at that epsilon is below 1e-6
    s = 4.530877117
    exact_delta = norm.cdf(1 / (2 * s) - eps * s) - math.exp(eps) * norm.cdf(-1 / (2 * s) - eps * s)
    assert exact_delta <= 1e-6


def test_abadi_et_al_moments_accountant_example() -> None:
    """Abadi et al. (2016), section 3.1: q = 0.01, sigma = 4, delta = 1e-5, T = 10000 steps
    give epsilon about 1.26 with the moments accountant (9.34 with strong composition). RDP
    with the library's tighter conversion must land at or a little under that figure."""
    eps = epsilon(4.0, "poisson", 60000, 0, 0.01, 10_000, 1e-5)
    assert 0.9 <= eps <= 1.26


def test_the_fast_composition_agrees_with_the_accountants_own() -> None:
    cases: list[tuple[Sampling, int, int, float]] = [
        ("poisson", 1500, 0, 0.1),
        ("fixed", 1500, 150, 0.1),
    ]
    for sampling, n, m, q in cases:
        for rounds in (1, 40):
            fast = epsilon(1.3, sampling, n, m, q, rounds, 1 / n)
            slow = epsilon_slow(1.3, sampling, n, m, q, rounds, 1 / n)
            assert fast == pytest.approx(slow, rel=1e-9)


def test_fixed_size_sampling_costs_more_than_poisson_at_the_same_noise() -> None:
    """Replace-one neighbouring doubles the sum's sensitivity (noise multiplier z/2)."""
    poisson = epsilon(1.0, "poisson", 1500, 0, 0.1, 20, 1e-4)
    fixed = epsilon(1.0, "fixed", 1500, 150, 0.1, 20, 1e-4)
    assert fixed > poisson


def test_calibration_finds_the_smallest_noise_within_the_target() -> None:
    z = calibrate(3.0, "poisson", 1500, 0, 0.1, 30, 1 / 1500)
    assert epsilon(z, "poisson", 1500, 0, 0.1, 30, 1 / 1500) <= 3.0
    assert epsilon(z * 0.99, "poisson", 1500, 0, 0.1, 30, 1 / 1500) > 3.0


def test_a_target_with_a_given_noise_stops_before_the_round_that_would_exceed_it() -> None:
    params = RunParams(dp_noise=1.0, target_epsilon=2.0, rounds=500, sampling="poisson")
    plan = plan_privacy(params, 1500)
    assert plan is not None and 1 <= plan.rounds < 500
    assert plan.epsilon(plan.rounds) <= 2.0 < plan.epsilon(plan.rounds + 1)
    assert rounds_within(plan, 2.0, 500) == plan.rounds
    assert plan.delta == pytest.approx(1 / 1500)


def test_an_unreachable_target_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        plan_privacy(RunParams(dp_noise=0.05, target_epsilon=0.01), 1500)
    assert err.value.field == "target_epsilon"


def test_no_dp_settings_no_plan_and_dp_needs_the_plain_mean() -> None:
    assert plan_privacy(RunParams(), 100) is None
    with pytest.raises(ValueError, match="weighting"):
        RunParams(dp_noise=1.0, weighting="samples")


# ----------------------------------------------------------------------------- clip and noise


def test_clipping_bounds_the_whole_uploads_norm() -> None:
    gen = torch.Generator().manual_seed(1)
    for k in range(20):
        u = _update(k, list(range(k, 300, 7)), scale=float(k + 1), gen=gen)
        before = update_norm(u)
        c = clip_update(u, 1.5)
        assert update_norm(c) <= 1.5 * (1 + NORM_TOLERANCE)
        if before > 1.5:  # scaled, not truncated: same direction
            assert update_norm(c) == pytest.approx(1.5, rel=1e-5)
            ratio = c.dense["tower.0.bias"] / u.dense["tower.0.bias"]
            assert torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-5)
        else:
            assert c is u


def test_central_noise_has_std_z_c_on_every_coordinate_rows_no_client_touched_included() -> None:
    """The released mean of zero uploads is pure noise: std z*C/m everywhere (fixed seed; the
    sample std of ~2,500 coordinates is within 5% of the truth with overwhelming probability)."""
    zeros = {k: torch.zeros(s) for k, s in SHAPES.items()}
    out = noisy_mean(zeros, 10.0, 2.0, torch.Generator().manual_seed(7))
    values = torch.cat([v.flatten() for v in out.values()])
    assert values.numel() == sum(math.prod(s) for s in SHAPES.values())
    assert float(values.std()) == pytest.approx(0.2, rel=0.05)
    assert abs(float(values.mean())) < 0.02
    untouched = out["item_gmf"][250:]  # rows no upload carries
    assert float(untouched.std()) == pytest.approx(0.2, rel=0.15)


def test_distributed_shares_sum_to_the_central_noise() -> None:
    """m clients each adding N(0, (zC)^2/m) on every coordinate sum to N(0, (zC)^2)."""
    m, z, c = 16, 1.5, 2.0
    gen = torch.Generator().manual_seed(3)
    zero = Update(
        1,
        1,
        {"item_gmf": (torch.tensor([4]), torch.zeros(1, 8))},
        {"tower.0.weight": torch.zeros(16, 8), "tower.0.bias": torch.zeros(16)},
    )
    noised = [add_local_noise(zero, z * c / math.sqrt(m), SHAPES, gen) for _ in range(m)]
    assert all(len(u.rows["item_gmf"][0]) == 300 for u in noised)  # every row carries noise
    total = sum_updates(noised, SHAPES)
    values = torch.cat([v.flatten() for v in total.values()])
    assert float(values.std()) == pytest.approx(z * c, rel=0.05)
    # a wrong share (e.g. z*C per client) would be 4x off and fail the same bound
    assert float(values.std()) != pytest.approx(z * c * math.sqrt(m), rel=0.05)


def test_the_dp_strategy_divides_by_the_public_cohort_and_refuses_an_unclipped_upload() -> None:
    plan = PrivacyPlan(1.0, 0.0, "central", "fixed", 100, 10, 0.1, 0.01, 5, None)
    s = with_privacy(make_strategy(), plan, SHAPES, torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(2)
    ups = [clip_update(_update(k, [k, k + 1], 1.0, gen), 1.0) for k in range(4)]  # 4 of 10
    got = s.aggregate(ups, SHAPES, cohort_size=10)
    want = sum_updates(ups, SHAPES)
    assert torch.allclose(got["tower.0.bias"], want["tower.0.bias"] / 10)
    big = _update(9, [3], 10.0, gen)
    assert update_norm(big) > norm_bound(1.0, 0.0, SHAPES)
    with pytest.raises(ValueError, match="norm"):
        s.aggregate([big], SHAPES, cohort_size=10)


# ----------------------------------------------------------------------------- sampling


def test_poisson_sampling_draws_each_client_with_probability_q() -> None:
    ids = np.arange(2000)
    sizes = [len(select_cohort(ids, 0.1, 5, r, sampling="poisson")) for r in range(1, 41)]
    # mean of 40 Binomial(2000, 0.1) draws: std 13.4/sqrt(40) ~ 2.1 around 200
    assert 190 <= np.mean(sizes) <= 210
    assert len(set(sizes)) > 5  # not a fixed size
    assert len(select_cohort(ids, 0.1, 5, 1)) == cohort_size(2000, 0.1)


# ----------------------------------------------------------------------------- a DP run


def test_a_simulated_dp_run_reports_epsilon_per_round_and_stops_at_its_target() -> None:
    split = synthetic_split(n_users=60, n_items=40, seed=0, n_test_negatives=20)
    cfg = TrainConfig(
        rounds=50,
        factor=4,
        layers=1,
        fraction=0.3,
        sampling="poisson",
        dp_noise=0.8,
        target_epsilon=4.0,
        dp_clip=0.5,
        eval_every=0,
    )
    sim = Simulator(split, cfg)
    res = sim.run()
    assert sim.privacy is not None and len(res.rounds) == sim.privacy.rounds < 50
    eps = [r.epsilon for r in res.rounds if r.epsilon is not None]
    assert len(eps) == len(res.rounds) and eps == sorted(eps)
    assert eps[-1] <= 4.0 < sim.privacy.epsilon(len(eps) + 1)
    assert res.to_json()["privacy"]["noise"] == 0.8
    assert res.to_json()["privacy"]["epsilon_spent"] == eps[-1] == res.epsilon_spent()
