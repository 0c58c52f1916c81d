"""Adaptive clipping (Andrew et al. 2021): the clip norm follows a quantile of the upload norms,
estimated with noise inside the run's budget."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedrecgel.accountant import PrivacyPlan, plan_privacy
from fedrecgel.config import RunParams
from fedrecgel.privacy import AdaptiveClip, norm_bound, with_privacy
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.strategy import make_strategy
from fedrecgel.synthetic import synthetic_split
from fedrecgel.uploads import Update

SHAPES = {"item_gmf": (200, 8), "tower.0.bias": (16,)}


def _plan(z: float, denominator: int, quantile: float | None, clip: float = 1.0) -> PrivacyPlan:
    n = 10 * denominator
    return PrivacyPlan(clip, z, "central", "fixed", n, denominator, 0.1, 1 / n, 10, None, quantile)


def test_the_sum_and_the_count_share_one_gaussian_budget() -> None:
    """1/z^2 = 1/z_s^2 + 1/(2s)^2: the pair is one release of multiplier z (sensitivities C
    and 1/2); without adaptive clipping the sum keeps z."""
    for z, m in ((1.18, 122), (0.7, 1000), (2.0, 10)):
        p = _plan(z, m, 0.5)
        assert p.count_sigma == pytest.approx(max(m / 20, z))
        assert p.sum_noise > z
        assert p.sum_noise**-2 + (2 * p.count_sigma) ** -2 == pytest.approx(z**-2)
        assert _plan(z, m, None).sum_noise == z
    # the count's share is small at the paper's s = m/20: 0.5% more noise on the sum at m=122
    assert _plan(1.18, 122, 0.5).sum_noise == pytest.approx(1.18 * 1.0048, rel=1e-3)


def test_the_clip_norm_shrinks_when_most_fit_and_grows_when_few_do() -> None:
    # the noisy share's std is s/m = 50/1000 = 0.05, so C moves by exp(-0.2 (1 +- 0.25) + 0.1)
    # within 5 standard deviations
    ad = AdaptiveClip(_plan(1.0, 1000, 0.5), torch.Generator().manual_seed(0))
    assert ad.update(within=1000, reports=1000) == pytest.approx(math.exp(-0.1), rel=0.051)
    assert ad.share is not None and abs(ad.share - 1) < 0.25
    ad.clip = 1.0
    assert ad.update(within=0, reports=1000) == pytest.approx(math.exp(0.1), rel=0.051)
    assert abs(ad.share) < 0.25


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.8])
def test_the_clip_norm_settles_at_the_quantile_of_the_norms(quantile: float) -> None:
    """Norms uniform on [0, 2]: C settles near 2 * quantile from far above and far below."""
    rng = np.random.default_rng(3)
    for start in (0.01, 50.0):
        ad = AdaptiveClip(_plan(1.0, 500, quantile, start), torch.Generator().manual_seed(1))
        tail = []
        for t in range(400):
            norms = rng.uniform(0, 2, size=500)
            c = ad.update(int((norms <= ad.clip).sum()), len(norms))
            if t >= 300:
                tail.append(c)
        assert np.mean(tail) == pytest.approx(2 * quantile, abs=0.1)


def test_the_noise_and_the_norm_check_follow_the_current_clip_norm() -> None:
    plan = _plan(2.0, 10, 0.5)
    s = with_privacy(make_strategy(), plan, SHAPES, torch.Generator().manual_seed(0))
    assert s.adaptive is not None
    s.adaptive.clip = 3.0
    zeros = Update(0, 1, {}, {"tower.0.bias": torch.zeros(16)})
    out = s.aggregate([zeros], SHAPES, cohort_size=10)
    values = torch.cat([v.flatten() for v in out.values()])
    assert float(values.std()) == pytest.approx(plan.sum_noise * 3.0 / 10, rel=0.06)
    two = Update(1, 1, {}, {"tower.0.bias": torch.full((16,), 0.5)})  # norm 2
    s.aggregate([two], SHAPES, cohort_size=10)  # within C = 3
    s.adaptive.clip = 1.0
    assert norm_bound(1.0, 0.0, SHAPES) < 2
    with pytest.raises(ValueError, match="norm"):
        s.aggregate([two], SHAPES, cohort_size=10)


def test_adaptive_clipping_is_a_central_dp_setting_with_a_quantile_in_0_1() -> None:
    RunParams(dp_clip_quantile=0.5, target_epsilon=3.0)
    with pytest.raises(ValidationError, match="dp_mode central"):
        RunParams(dp_clip_quantile=0.5, dp_noise=1.0, dp_mode="distributed")
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ValidationError, match="dp_clip_quantile"):
            RunParams(dp_clip_quantile=bad)
    plan = plan_privacy(RunParams(dp_clip_quantile=0.3, dp_noise=1.0), 100)
    assert plan is not None and plan.clip_quantile == 0.3


def test_a_simulated_run_moves_its_clip_norm_and_records_it_each_round() -> None:
    """From a clip norm far below every upload's norm, C grows round after round (every client
    reports it was beyond C); each round's record carries the C its uploads were clipped to."""
    split = synthetic_split(n_users=80, n_items=40, seed=0, n_test_negatives=20)
    common: dict[str, Any] = {
        "rounds": 12,
        "factor": 4,
        "layers": 1,
        "fraction": 0.5,
        "eval_every": 0,
    }
    cfg = TrainConfig(**common, dp_noise=0.5, dp_clip=1e-4, dp_clip_quantile=0.5)
    res = Simulator(split, cfg).run()
    clips = [r.dp_clip for r in res.rounds]
    assert clips[0] == 1e-4
    assert all(b is not None and a is not None and b > a for a, b in itertools.pairwise(clips))
    assert res.to_json()["rounds"][3]["dp_clip"] == clips[3]
    fixed = Simulator(split, TrainConfig(**common, dp_noise=0.5, dp_clip=1e-4)).run()
    assert {r.dp_clip for r in fixed.rounds} == {1e-4}
