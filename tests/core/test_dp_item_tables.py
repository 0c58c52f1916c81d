"""Spectral item tables in a DP run (``dp_item_share``): one release of the item co-occurrence
under a share of the budget, composed with the rounds (and the prior's release) by the
accountant; the tables built from its top eigenvectors; kept fixed, left out of the uploads and
of the noise; refused over HTTP."""

from __future__ import annotations

from typing import Any

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from fedrecgel.accountant import _event, _release_event, plan_privacy, release_epsilon
from fedrecgel.config import RunParams
from fedrecgel.item_spectrum import (
    SPECTRAL_STD,
    co_occurrence,
    history,
    spectral_tables,
    spike_strength,
    top_eigen,
)
from fedrecgel.model import ITEM_TABLES, ModelConfig
from fedrecgel.privacy import ClientPrivacy, GaussianMean, privatize
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.strategy import make_strategy, update_norm
from fedrecgel.synthetic import synthetic_split
from fedrecgel.uploads import Update

SPLIT = synthetic_split(
    n_users=300, n_items=40, seed=0, n_test_negatives=20, validation=True, groups=4, affinity=0.8
)


def test_both_releases_and_the_rounds_compose_within_the_target() -> None:
    base: dict[str, Any] = {"target_epsilon": 3.0, "sampling": "poisson", "fraction": 0.1}
    params = RunParams(**base, rounds=20, dp_prior_share=0.25, dp_item_share=0.4)
    plan = plan_privacy(params, 1500)
    assert plan is not None and plan.prior_noise > 0 and plan.item_noise > 0
    assert release_epsilon(plan.item_noise, plan.delta) == pytest.approx(1.2, rel=1e-3)
    assert plan.releases == (plan.prior_noise, plan.item_noise)
    acc = RdpAccountant()
    acc.compose(
        dp_accounting.ComposedDpEvent(
            [
                _release_event(plan.prior_noise, "poisson"),
                _release_event(plan.item_noise, "poisson"),
                _event(plan.noise, "poisson", 1500, 0, 0.1, 20),
            ]
        )
    )
    assert plan.epsilon(20) == pytest.approx(acc.get_epsilon(plan.delta), rel=1e-9)
    assert 2.99 < plan.epsilon(20) <= 3.0
    alone = plan_privacy(RunParams(**base, rounds=20, dp_prior_share=0.25), 1500)
    assert alone is not None and alone.item_noise == 0 and plan.noise > alone.noise


def test_the_shares_must_leave_room_for_the_rounds() -> None:
    with pytest.raises(ValueError, match="below 1"):
        RunParams(target_epsilon=3.0, dp_prior_share=0.5, dp_item_share=0.5)
    assert RunParams(target_epsilon=3.0, dp_item_share=0.5).dp_item_release
    assert not RunParams(dp_item_share=0.5).dp_item_release  # not a DP run
    assert not RunParams(dp_noise=1.0, dp_item_share=0.5).dp_item_release  # no target
    assert plan_privacy(RunParams(dp_noise=1.0, dp_item_share=0.5), 100).item_noise == 0  # type: ignore[union-attr]


def test_spectral_tables_span_the_top_directions_above_the_noise() -> None:
    shapes = ModelConfig(n_items=SPLIT.n_items, kind="ncf", factor=4, layers=2).shared_shapes()
    tables = spectral_tables(SPLIT, 1e-6, 0, shapes)  # almost no noise: G's own spectrum
    assert set(tables) == set(ITEM_TABLES)
    gmf, mlp = tables["item_gmf"], tables["item_mlp"]
    assert gmf.shape == shapes["item_gmf"] and mlp.shape == shapes["item_mlp"]
    assert torch.equal(gmf, mlp[:, : gmf.shape[1]])
    assert float(mlp.double().numpy().std()) == pytest.approx(SPECTRAL_STD, rel=1e-4)
    lam, vec = top_eigen(co_occurrence(history(SPLIT)), mlp.shape[1])
    for j in range(mlp.shape[1]):  # column j: the j-th eigenvector times sqrt(lambda_j), scaled
        col = mlp[:, j].double().numpy()
        assert abs(col @ vec[:, j]) == pytest.approx(np.linalg.norm(col), rel=1e-3)
    ratio = np.linalg.norm(mlp.numpy(), axis=0) ** 2 / spike_strength(lam, 1e-6, SPLIT.n_items)
    assert np.allclose(ratio, ratio[0], rtol=1e-3)
    # noise far above every eigenvalue: no direction is kept
    assert all(float(t.abs().max()) == 0 for t in spectral_tables(SPLIT, 1e3, 0, shapes).values())


def test_a_released_eigenvalue_is_kept_only_above_the_noise_edge() -> None:
    """A rank-one direction of strength theta in symmetric noise of std z per entry shows as
    lambda = theta + z^2 n / theta once theta > z sqrt(n); pure noise stays below 2 z sqrt(n)."""
    n, z = 400, 1.0
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((n, n))
    noise = (noise + noise.T) / np.sqrt(2.0)
    v = rng.standard_normal(n)
    v /= np.linalg.norm(v)
    for theta in (3.0 * np.sqrt(n), 6.0 * np.sqrt(n)):
        lam = np.linalg.eigvalsh(theta * np.outer(v, v) + z * noise)[::-1]
        got = spike_strength(lam[:3], z, n)
        assert got[0] == pytest.approx(theta, rel=0.05)
        assert np.all(got[1:] == 0)  # the next eigenvalues are the noise's bulk
    assert np.all(spike_strength(np.linalg.eigvalsh(z * noise), z, n) == 0)


def test_a_dp_run_keeps_its_spectral_item_tables_fixed_and_trains_the_network() -> None:
    cfg = TrainConfig(
        rounds=4,
        factor=4,
        layers=2,
        fraction=0.3,
        sampling="poisson",
        target_epsilon=8.0,
        dp_item_share=0.3,
        dp_clip=0.5,
        eval_every=0,
    )
    sim = Simulator(SPLIT, cfg)
    assert sim.privacy is not None and sim.privacy.item_noise > 0
    shapes = {k: tuple(v.shape) for k, v in sim.shared.items()}
    start = {k: v.clone() for k, v in sim.shared.items()}
    expected = spectral_tables(SPLIT, sim.privacy.item_noise, cfg.seed, shapes)
    for name in ITEM_TABLES:
        assert torch.equal(start[name], expected[name])
    res = sim.run()
    assert len(res.rounds) == 4 and res.rounds[-1].epsilon is not None
    assert res.rounds[-1].epsilon <= 8.0
    for name, t in sim.shared.items():
        assert torch.equal(t, start[name]) == (name in ITEM_TABLES), name


def test_fixed_tables_are_left_out_of_the_uploads_and_of_the_noise() -> None:
    plan = plan_privacy(RunParams(target_epsilon=3.0, dp_item_share=0.3, dp_clip=1.0), 100)
    assert plan is not None
    dp = ClientPrivacy.of(plan)
    assert dp.frozen == ITEM_TABLES
    shapes: dict[str, tuple[int, ...]] = {"item_gmf": (5, 2), "item_mlp": (5, 2)}
    shapes["predict.weight"] = (1, 4)
    u = Update(
        client_id=1,
        n_samples=3,
        rows={"item_gmf": (torch.tensor([0, 2]), torch.full((2, 2), 10.0))},
        dense={"predict.weight": torch.full((1, 4), 0.1)},
    )
    (clipped,), _ = privatize([u], dp, shapes, [torch.Generator().manual_seed(0)])
    assert clipped.rows == {} and set(clipped.dense) == {"predict.weight"}
    assert update_norm(clipped) == pytest.approx(0.2)  # within C: the network alone, unscaled
    mean = GaussianMean(
        make_strategy("sgd", 1.0), 1.0, 5.0, 1.0, torch.Generator().manual_seed(0), frozen=dp.frozen
    )
    out = mean.aggregate([clipped], shapes)
    assert torch.equal(out["item_gmf"], torch.zeros(5, 2))  # no step, no noise
    assert torch.equal(out["item_mlp"], torch.zeros(5, 2))
    assert not torch.equal(out["predict.weight"], clipped.dense["predict.weight"])  # noised
    small = Update(1, 3, {"item_gmf": (torch.tensor([0]), torch.full((1, 2), 0.01))}, {})
    with pytest.raises(ValueError, match="fixed parameter"):  # within C, but a fixed table's
        mean.aggregate([small], shapes)
