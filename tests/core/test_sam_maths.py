"""Maths of the SAM step, the aggregation and the server optimizers on tiny hand-built tensors."""

import numpy as np
import pytest
import torch

from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.sam import (
    PrivateState,
    SAMConfig,
    chunk_weights,
    client_rng,
    client_samples,
    cohort_step,
    repeated_in_row,
)
from fedrecgel.sampling import cohort_samples
from fedrecgel.strategy import (
    ClipUpdates,
    FedAvgGradients,
    ServerOptConfig,
    ServerOptimizer,
    aggregate_gradients,
    make_strategy,
)
from fedrecgel.uploads import Update


def _mf_single(
    rho_sh: float, rho_ns: float
) -> tuple[
    ModelConfig,
    dict[str, torch.Tensor],
    PrivateState,
    list[tuple[np.ndarray, np.ndarray]],
    SAMConfig,
]:
    """MF with one user, 3 items, one positive (item 1) and one negative (item 2)."""
    cfg = ModelConfig(n_items=3, kind="mf", factor=2)
    shared = {"item_gmf": torch.tensor([[0.0, 0.0], [0.5, -1.0], [1.0, 2.0]])}
    state = PrivateState.fresh(cfg, 0, np.array([0]))
    state.params["user_gmf"] = torch.tensor([[1.0, 0.5]])
    samples = [(np.array([1, 2]), np.array([1.0, 0.0], dtype=np.float32))]
    hp = SAMConfig(rho_sh=rho_sh, rho_ns=rho_ns, chunk_size=128)
    return cfg, shared, state, samples, hp


def _mf_grads(u: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Analytic gradients of mean BCE over (item 1, label 1), (item 2, label 0) for MF."""
    s1, s2 = torch.sigmoid(u @ v[1]), torch.sigmoid(u @ v[2])
    # loss = 0.5 * (bce(s1, 1) + bce(s2, 0)); d/dlogit = (s - y) / 2
    d1, d2 = (s1 - 1) / 2, s2 / 2
    gu = d1 * v[1] + d2 * v[2]
    gv = torch.zeros_like(v)
    gv[1], gv[2] = d1 * u, d2 * u
    return gu, gv


def test_rho_zero_uploads_the_plain_gradient_and_steps_adam_on_it() -> None:
    cfg, shared, state, samples, hp = _mf_single(0.0, 0.0)
    res = cohort_step(cfg, shared, np.array([0]), state, samples, hp)
    u = state.params["user_gmf"][0]
    gu, gv = _mf_grads(u, shared["item_gmf"])
    idx, vals = res.uploads[0].rows["item_gmf"]
    assert idx.tolist() == [1, 2]
    torch.testing.assert_close(vals, gv[1:], atol=1e-6, rtol=1e-5)
    # first Adam step moves each coordinate by lr * sign(g) (bias-corrected m / sqrt(v))
    step = res.state.params["user_gmf"][0] - u
    torch.testing.assert_close(step, -0.1 * torch.sign(gu), atol=1e-6, rtol=1e-4)


def test_shared_sam_upload_is_the_gradient_at_the_perturbed_point() -> None:
    rho = 0.3
    cfg, shared, state, samples, hp = _mf_single(rho, 0.0)
    res = cohort_step(cfg, shared, np.array([0]), state, samples, hp)
    u, v = state.params["user_gmf"][0], shared["item_gmf"]
    _, gv = _mf_grads(u, v)
    e = rho * gv / gv.norm()
    assert float(e.norm()) == pytest.approx(rho, rel=1e-6)  # the perturbation has norm rho
    _, gv_sam = _mf_grads(u, v + e)
    torch.testing.assert_close(res.uploads[0].rows["item_gmf"][1], gv_sam[1:], atol=1e-6, rtol=1e-5)


def test_private_sam_uses_the_gradient_at_the_perturbed_user() -> None:
    rho = 0.5
    cfg, shared, state, samples, hp = _mf_single(0.0, rho)
    res = cohort_step(cfg, shared, np.array([0]), state, samples, hp)
    u, v = state.params["user_gmf"][0], shared["item_gmf"]
    gu, _ = _mf_grads(u, v)
    e = rho * gu / gu.norm()
    gu_sam, _ = _mf_grads(u + e, v)
    # Adam's first step stores (1 - beta1) * g in exp_avg
    torch.testing.assert_close(res.state.exp_avg["user_gmf"][0], 0.1 * gu_sam, atol=1e-7, rtol=1e-5)
    # and the shared upload is unaffected by the private perturbation
    _, gv = _mf_grads(u, v)
    torch.testing.assert_close(res.uploads[0].rows["item_gmf"][1], gv[1:], atol=1e-6, rtol=1e-5)


def test_upload_holds_only_shared_gradients_of_touched_rows() -> None:
    cfg = ModelConfig(n_items=50, factor=4, layers=2)
    shared = init_shared(cfg, 0)
    users = np.array([3, 7])
    state = PrivateState.fresh(cfg, 0, users)
    pos = [np.array([1, 2, 3]), np.array([10, 11])]
    samples = [
        client_samples(p, 50, 4, client_rng(0, 1, int(u))) for p, u in zip(pos, users, strict=True)
    ]
    res = cohort_step(cfg, shared, users, state, samples, SAMConfig())
    for up, (items, _) in zip(res.uploads, samples, strict=True):
        assert set(up.rows) == {"item_gmf", "item_mlp"}
        assert set(up.dense) == set(cfg.dense_names())
        assert up.rows["item_gmf"][0].tolist() == sorted(set(items.tolist()))
        assert not any("user" in k for k in [*up.rows, *up.dense])
    assert res.uploads[0].client_id == 3 and res.uploads[1].client_id == 7


def test_client_samples_put_negatives_after_each_positive_and_avoid_seen_items() -> None:
    rng = client_rng(1, 2, 3)
    pos = np.array([0, 5, 9, 9])  # a repeated interaction stays two positives
    items, labels = client_samples(pos, 12, 4, rng)
    grid = items.reshape(4, 5)
    assert sorted(grid[:, 0].tolist()) == [0, 5, 9, 9]
    assert labels.reshape(4, 5)[:, 0].tolist() == [1, 1, 1, 1]
    negs = grid[:, 1:]
    assert not np.isin(negs, pos).any()
    assert all(len(set(row)) == 4 for row in negs.tolist())
    again, _ = client_samples(pos, 12, 4, client_rng(1, 2, 3))
    assert (again == items).all()


def _plain_client_samples(
    positives: np.ndarray, n_items: int, n_negatives: int, rng: np.random.Generator
) -> np.ndarray:
    """The sampling rule written plainly: redraw every negative that is a seen item or
    repeats an earlier negative of its row, until none does."""
    pos = rng.permutation(np.asarray(positives, dtype=np.int64))
    negs = rng.integers(0, n_items, size=(len(pos), n_negatives))
    while True:
        bad = np.isin(negs, pos)
        for j in range(1, n_negatives):
            bad[:, j] |= (negs[:, :j] == negs[:, j : j + 1]).any(axis=1)
        if not bad.any():
            break
        negs[bad] = rng.integers(0, n_items, size=int(bad.sum()))
    return np.concatenate([pos[:, None], negs], axis=1).reshape(-1)


def test_client_samples_draw_what_the_plain_rule_draws() -> None:
    """Same draws from the same stream, redraws included (small catalogues force many)."""
    gen = np.random.default_rng(0)
    for t in range(300):
        n_items = int(gen.integers(6, 40))
        pos = gen.integers(0, n_items, size=int(gen.integers(0, 12)))
        n_neg = int(gen.integers(1, 6))
        if n_items - len(set(pos.tolist())) < n_neg:
            continue
        items, _ = client_samples(pos, n_items, n_neg, client_rng(0, t, 1))
        assert np.array_equal(
            items, _plain_client_samples(pos, n_items, n_neg, client_rng(0, t, 1))
        )


def test_cohort_samples_draw_what_each_client_draws_alone() -> None:
    """A cohort drawn together gives every client the draws of its own stream alone, including
    clients with no positives, repeated positives and small catalogues (many redraws)."""
    gen = np.random.default_rng(1)
    for t in range(40):
        n_items, n_neg = int(gen.integers(8, 40)), int(gen.integers(1, 5))
        pos = [gen.integers(0, n_items, size=int(gen.integers(0, 8))) for _ in range(15)]
        got = cohort_samples(pos, n_items, n_neg, [client_rng(t, 1, u) for u in range(15)])
        for u, (items, labels) in enumerate(got):
            want = client_samples(pos[u], n_items, n_neg, client_rng(t, 1, u))
            assert np.array_equal(items, want[0]) and np.array_equal(labels, want[1])
    assert cohort_samples([], 10, 4, []) == []
    with pytest.raises(ValueError, match="cannot draw"):
        cohort_samples([np.array([1]), np.array([0, 1, 2])], 5, 4, [client_rng(0, 0, 0)] * 2)


def test_repeats_in_wide_rows_are_found_by_sorting_as_by_comparing_every_pair() -> None:
    gen = np.random.default_rng(2)
    for width in (33, 64, 200):
        negs = gen.integers(0, width // 2, size=(50, width))
        pairs = np.triu(np.ones((width, width), dtype=bool), k=1)
        want = ((negs[:, :, None] == negs[:, None, :]) & pairs).any(axis=1)
        assert np.array_equal(repeated_in_row(negs), want)


def test_a_thousand_negatives_take_memory_in_proportion_to_the_samples() -> None:
    """The pairwise test of 1,000 negatives took (rows, 1000, 1000) booleans: 30 GiB for a
    FilmTrust cohort at fraction 1; the draws are the same as one client's alone."""
    import tracemalloc

    gen = np.random.default_rng(3)
    pos = [gen.choice(5000, size=100, replace=False) for _ in range(3)]
    rngs = [client_rng(0, 1, u) for u in range(3)]
    tracemalloc.start()
    try:
        got = cohort_samples(pos, 5000, 1000, rngs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 60e6, peak  # 300 rows: the pairs alone were 300 MB
    want = client_samples(pos[1], 5000, 1000, client_rng(0, 1, 1))
    assert np.array_equal(got[1][0], want[0])


def test_client_samples_refuses_when_too_few_negatives_exist() -> None:
    with pytest.raises(ValueError, match="cannot draw"):
        client_samples(np.array([0, 1, 2]), 5, 4, client_rng(0, 0, 0))


def test_chunk_weights_make_a_sum_of_chunk_means() -> None:
    w = chunk_weights(300, 128)
    assert w[:256].tolist() == [1 / 128] * 256
    assert w[256:] == pytest.approx([1 / 44] * 44)
    assert w.sum() == pytest.approx(3.0)


def _update(cid: int, rows: list[int], vals: list[list[float]], dense: float, n: int = 1) -> Update:
    return Update(
        client_id=cid,
        n_samples=n,
        rows={"item_gmf": (torch.tensor(rows), torch.tensor(vals))},
        dense={"predict.bias": torch.tensor([dense])},
    )


SHAPES = {"item_gmf": (4, 1), "predict.bias": (1,)}


def test_aggregation_is_the_plain_mean_over_reporting_clients() -> None:
    ups = [_update(2, [0, 3], [[1.0], [2.0]], 3.0), _update(1, [3], [[4.0]], 1.0)]
    g = aggregate_gradients(ups, SHAPES)
    torch.testing.assert_close(g["item_gmf"], torch.tensor([[0.5], [0.0], [0.0], [3.0]]))
    torch.testing.assert_close(g["predict.bias"], torch.tensor([2.0]))


def test_sample_weighting_weights_by_sample_count() -> None:
    ups = [_update(1, [0], [[1.0]], 0.0, n=1), _update(2, [0], [[4.0]], 0.0, n=3)]
    g = aggregate_gradients(ups, SHAPES, weighting="samples")
    assert float(g["item_gmf"][0, 0]) == pytest.approx(0.25 * 1 + 0.75 * 4)


def test_aggregation_does_not_depend_on_arrival_order() -> None:
    rng = np.random.default_rng(0)
    ups = [
        _update(i, [int(rng.integers(4))], [[float(rng.normal())]], float(rng.normal()))
        for i in range(20)
    ]
    a = aggregate_gradients(ups, SHAPES)
    b = aggregate_gradients(list(reversed(ups)), SHAPES)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_empty_round_cannot_be_aggregated() -> None:
    with pytest.raises(ValueError):
        aggregate_gradients([], SHAPES)


def test_server_adam_matches_torch_adam() -> None:
    p = {"w": torch.tensor([1.0, -2.0, 0.5])}
    ref = torch.nn.Parameter(p["w"].clone())
    opt = torch.optim.Adam([ref], lr=0.001)
    mine = ServerOptimizer(ServerOptConfig())
    for t in range(5):
        g = torch.tensor([0.3, -0.1 * t, 2.0])
        ref.grad = g.clone()
        opt.step()
        mine.step(p, {"w": g})
    torch.testing.assert_close(p["w"], ref.detach(), atol=1e-7, rtol=0)


def test_server_sgd_and_adaptive_optimizers_take_effect() -> None:
    for name in ("sgd", "fedadam", "fedyogi", "fedadagrad"):
        s = make_strategy(name, lr=0.1)
        params = {"item_gmf": torch.zeros(4, 1), "predict.bias": torch.zeros(1)}
        s.round(params, [_update(1, [0], [[1.0]], -1.0)])
        assert float(params["item_gmf"][0, 0]) < 0 and float(params["predict.bias"][0]) > 0, name
    params = {"item_gmf": torch.zeros(4, 1), "predict.bias": torch.zeros(1)}
    make_strategy("sgd", lr=0.5).round(params, [_update(1, [0], [[1.0]], 0.0)])
    assert float(params["item_gmf"][0, 0]) == pytest.approx(-0.5)


def test_strategy_state_round_trips() -> None:
    s1 = FedAvgGradients()
    p1 = {"item_gmf": torch.zeros(4, 1), "predict.bias": torch.zeros(1)}
    s1.round(p1, [_update(1, [0], [[1.0]], 1.0)])
    s2 = FedAvgGradients()
    s2.load_state_dict(s1.state_dict())
    p2 = {k: v.clone() for k, v in p1.items()}
    up = [_update(1, [1], [[2.0]], -1.0)]
    s1.round(p1, up)
    s2.round(p2, up)
    assert all(torch.equal(p1[k], p2[k]) for k in p1)


def test_clipping_wrapper_bounds_each_update() -> None:
    s = ClipUpdates(FedAvgGradients(ServerOptConfig(name="sgd", lr=1.0)), max_norm=1.0)
    g = s.aggregate([_update(1, [0], [[3.0]], 4.0)], SHAPES)
    norm = float(torch.sqrt(g["item_gmf"].pow(2).sum() + g["predict.bias"].pow(2).sum()))
    assert norm <= 1.0
    assert norm == pytest.approx(1.0, rel=1e-5)
