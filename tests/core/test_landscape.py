"""Loss-landscape maths: filter-normalised directions, slices, sharpness, Hessian power iteration."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrecgel.data import Split
from fedrecgel.landscape import (
    TrainingLoss,
    filter_normalise,
    moved,
    random_direction,
    sharpness,
    slice_1d,
    slice_2d,
    top_hessian_eigenvalue,
)
from fedrecgel.model import ModelConfig, ModelKind, forward_batched, init_private, init_shared
from fedrecgel.synthetic import synthetic_split


def _trained_like(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Shared parameters with rows of very different norms (as after training)."""
    shared = init_shared(cfg, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    return {
        k: v + torch.randn(v.shape, generator=gen) * (0.3 if v.dim() > 1 else 0.1)
        for k, v in shared.items()
    }


def test_filter_normalised_rows_have_the_parameters_norms() -> None:
    cfg = ModelConfig(n_items=50, factor=4, layers=2)
    params = _trained_like(cfg)
    params["item_gmf"][7] = 0.0  # a zero row gets a zero direction row
    d = random_direction(params, torch.Generator().manual_seed(3))
    for name, p in params.items():
        if p.dim() == 1:
            assert torch.count_nonzero(d[name]) == 0, name
            continue
        want = p.reshape(p.shape[0], -1).norm(dim=1)
        got = d[name].reshape(p.shape[0], -1).norm(dim=1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert float(d["item_gmf"][7].norm()) == 0.0
    # a direction is random, not the parameter itself
    assert not torch.allclose(d["item_mlp"], params["item_mlp"])


def test_filter_normalise_refuses_a_wrong_shape() -> None:
    p = {"w": torch.ones(3, 2)}
    with pytest.raises(ValueError, match="shape"):
        filter_normalise({"w": torch.ones(2, 3)}, p)


def test_moved_adds_the_scaled_directions_without_touching_the_input() -> None:
    p = {"w": torch.zeros(2, 2)}
    d1, d2 = {"w": torch.ones(2, 2)}, {"w": torch.eye(2)}
    out = moved(p, [d1, d2], [2.0, -1.0])
    torch.testing.assert_close(out["w"], torch.tensor([[1.0, 2.0], [2.0, 1.0]]))
    assert float(p["w"].abs().sum()) == 0.0


def _loss_setup(
    kind: ModelKind = "ncf",
) -> tuple[Split, ModelConfig, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    split = synthetic_split(40, 60, interactions_per_user=8.0, seed=1, n_test_negatives=20)
    cfg = ModelConfig(n_items=split.n_items, kind=kind, factor=4, layers=2)
    shared = _trained_like(cfg)
    private = init_private(cfg, 0, np.arange(split.n_users))
    private = {k: v * 30 for k, v in private.items()}
    return split, cfg, shared, private


@pytest.mark.parametrize("kind", ["ncf", "mf"])
def test_slice_at_zero_is_the_models_training_loss(kind: ModelKind) -> None:
    split, cfg, shared, private = _loss_setup(kind)
    loss = TrainingLoss(cfg, split, private, n_negatives=3, seed=0, chunk=50)
    assert loss.n_samples == split.n_train * 4
    # the same samples scored the plain way: the model's forward, one sample per row
    u, it, y = loss.users, loss.items, loss.labels
    rows = {t: shared[t][it][:, None, :] for t in cfg.item_tables()}
    dense = {n: shared[n] for n in cfg.dense_names()}
    logits = forward_batched(cfg, {k: v[u] for k, v in private.items()}, rows, dense, False)
    want = float(torch.nn.functional.binary_cross_entropy_with_logits(logits.squeeze(1), y))
    d = random_direction(shared, torch.Generator().manual_seed(0))
    line = slice_1d(loss, shared, d, [-0.5, 0.0, 0.5])
    assert line[1] == pytest.approx(want, rel=1e-5)
    plane = slice_2d(loss, shared, d, random_direction(shared, torch.Generator()), [0.0], [0.0])
    assert plane.shape == (1, 1) and plane[0, 0] == pytest.approx(want, rel=1e-5)
    assert line[0] != pytest.approx(want) and line[2] != pytest.approx(want)


def test_a_sample_subset_is_fixed_and_of_the_asked_size() -> None:
    split, cfg, shared, private = _loss_setup()
    full = TrainingLoss(cfg, split, private, n_negatives=3)
    a = TrainingLoss(cfg, split, private, n_negatives=3, max_samples=200)
    b = TrainingLoss(cfg, split, private, n_negatives=3, max_samples=200)
    assert a.n_samples == 200 and full.n_samples > 200
    assert a(shared) == b(shared)
    assert a(shared) == pytest.approx(full(shared), rel=0.25)


def test_sharpness_of_a_quadratic() -> None:
    params = {"w": torch.tensor([[1.0, 2.0]])}

    def quad(p: dict[str, torch.Tensor]) -> float:
        return float((p["w"] ** 2).sum())

    d = filter_normalise({"w": torch.tensor([[3.0, 4.0]])}, params)  # norm sqrt(5)
    out = sharpness(quad, params, [d], radius=0.1)
    # (w + r d)^2 - w^2 = 2 r w.d + r^2 |d|^2; the mean over +-r leaves r^2 |d|^2 = 0.05
    assert out["base"] == pytest.approx(5.0)
    assert out["mean_increase"] == pytest.approx(0.01 * 5.0, rel=1e-5)


def test_power_iteration_finds_the_top_eigenvalue() -> None:
    gen = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    eig = torch.tensor([5.0, 2.0, 1.0, 0.5, -0.3, 0.1], dtype=torch.float64)
    a = q @ torch.diag(eig) @ q.T

    def hvp(v: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"w": (a @ v["w"].reshape(-1)).reshape(2, 3)}

    like = {"w": torch.zeros(2, 3, dtype=torch.float64)}
    lam, hist = top_hessian_eigenvalue(hvp, like, gen, iters=200, tol=1e-10)
    assert lam == pytest.approx(5.0, rel=1e-6)
    assert len(hist) > 1


def test_hessian_vector_products_are_chunk_independent_and_symmetric() -> None:
    split, cfg, shared, private = _loss_setup()
    small = TrainingLoss(cfg, split, private, n_negatives=2, chunk=37)
    whole = TrainingLoss(cfg, split, private, n_negatives=2, chunk=10**6)
    gen = torch.Generator().manual_seed(5)
    v = {k: torch.randn(t.shape, generator=gen) for k, t in shared.items()}
    w = {k: torch.randn(t.shape, generator=gen) for k, t in shared.items()}
    hv_small, hv_whole = small.hvp(shared, v), whole.hvp(shared, v)
    for k in shared:
        torch.testing.assert_close(hv_small[k], hv_whole[k], rtol=1e-4, atol=1e-6)
    hw = whole.hvp(shared, w)
    vhw = sum(float((v[k] * hw[k]).sum()) for k in shared)
    whv = sum(float((w[k] * hv_whole[k]).sum()) for k in shared)
    assert vhw == pytest.approx(whv, rel=1e-3)


def test_curvature_matches_a_finite_difference_of_the_loss() -> None:
    split, cfg, shared, private = _loss_setup("mf")  # smooth: no ReLU kinks along the line
    loss = TrainingLoss(cfg, split, private, n_negatives=2)
    v = {
        k: torch.randn(t.shape, generator=torch.Generator().manual_seed(2))
        for k, t in shared.items()
    }
    hv = loss.hvp(shared, v)
    eps = 1e-2
    up, mid, down = (loss(moved(shared, [v], [s * eps])) for s in (1, 0, -1))
    fd = (up - 2 * mid + down) / eps**2
    vhv = sum(float((v[k] * hv[k]).sum()) for k in shared)
    assert vhv > 0
    assert fd == pytest.approx(vhv, rel=0.02)
