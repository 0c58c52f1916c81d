"""The hand-written passes: the model's logits, and the aggregate path against the sum of the
per-client uploads (equal up to float rounding, measured against each tensor's norm)."""

from collections.abc import Callable

import numpy as np
import pytest
import torch

from fedrecgel.config import Weighting
from fedrecgel.model import ModelConfig, ModelKind, forward_batched, init_shared
from fedrecgel.passes import forward, make_layout
from fedrecgel.sam import (
    PrivateState,
    SAMConfig,
    chunk_weights,
    client_rng,
    client_samples,
    cohort_step,
)
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.strategy import aggregate_gradients, mean_weights
from fedrecgel.synthetic import synthetic_split

#: relative to the norm of the tensor compared (float32 sums in another order)
REL = 1e-5


def _cohort(
    kind: ModelKind, n_users: int = 9, n_items: int = 70, seed: int = 3
) -> tuple[
    ModelConfig,
    dict[str, torch.Tensor],
    np.ndarray,
    PrivateState,
    list[tuple[np.ndarray, np.ndarray]],
]:
    cfg = ModelConfig(n_items=n_items, kind=kind, factor=8, layers=3)
    shared = init_shared(cfg, seed=1)
    users = np.arange(10, 10 + n_users)
    rng = np.random.default_rng(seed)
    positives = [rng.choice(n_items, size=int(rng.integers(2, 30)), replace=True) for _ in users]
    samples = [
        client_samples(p, n_items, 4, client_rng(0, 1, int(u)))
        for p, u in zip(positives, users, strict=True)
    ]
    return cfg, shared, users, PrivateState.fresh(cfg, 0, users), samples


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / max(float(want.norm()), 1e-30))


def test_layout_chunk_weights_and_pairs() -> None:
    _, _, _, _, samples = _cohort("ncf")
    lay = make_layout(samples, 70, chunk_size=16)
    for c, (a, b) in enumerate(lay.spans()):
        items = samples[c][0]
        np.testing.assert_array_equal(lay.items[a:b].numpy(), items)
        np.testing.assert_allclose(lay.weights[a:b].numpy(), chunk_weights(len(items), 16))
        p0, p1 = lay.pair_offsets[c], lay.pair_offsets[c + 1]
        assert lay.pair_items[p0:p1].tolist() == sorted(set(items.tolist()))
        assert (lay.pair_items[lay.sample_pair[a:b]].numpy() == items).all()


@pytest.mark.parametrize("kind", ["ncf", "mf"])
def test_forward_gives_the_models_logits(kind: ModelKind) -> None:
    cfg, shared, _, state, samples = _cohort(kind)
    lay = make_layout(samples, cfg.n_items, 128)
    ig = shared["item_gmf"][lay.items]
    im = shared["item_mlp"][lay.items] if kind == "ncf" else None
    dense = {n: shared[n] for n in cfg.dense_names()}
    got = forward(cfg, lay, state.params, ig, im, dense, False).logits
    per_client = {n: t.expand(lay.n_clients, *t.shape) for n, t in dense.items()}
    got_pc = forward(cfg, lay, state.params, ig, im, per_client, True).logits
    for c, (a, b) in enumerate(lay.spans()):
        items = torch.from_numpy(samples[c][0])[None]
        rows = {t: shared[t][items] for t in cfg.item_tables()}
        priv = {k: v[c : c + 1] for k, v in state.params.items()}
        want = forward_batched(cfg, priv, rows, dense, False)[0]
        torch.testing.assert_close(got[a:b], want, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got_pc[a:b], want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", ["ncf", "mf"])
@pytest.mark.parametrize("rho", [(0.02, 0.02), (0.0, 0.05), (0.3, 0.0)])
@pytest.mark.parametrize("weighting", ["mean", "samples"])
@pytest.mark.parametrize("group", [1 << 15, 40])
def test_aggregate_path_equals_the_sum_of_uploads(
    kind: ModelKind, rho: tuple[float, float], weighting: Weighting, group: int
) -> None:
    cfg, shared, users, state, samples = _cohort(kind)
    hp = SAMConfig(rho_sh=rho[0], rho_ns=rho[1], chunk_size=16, max_batch_samples=group)
    per_client = cohort_step(cfg, shared, users, state, samples, hp)
    sizes = np.array([len(s[0]) for s in samples])
    fused = cohort_step(
        cfg, shared, users, state, samples, hp, weights=mean_weights(sizes, weighting)
    )
    assert fused.uploads == [] and fused.aggregate is not None
    want = aggregate_gradients(per_client.uploads, cfg.shared_shapes(), weighting)
    assert set(fused.aggregate) == set(want)
    for k in want:
        assert fused.aggregate[k].shape == want[k].shape
        assert _rel(fused.aggregate[k], want[k]) < REL, k
    for k in state.params:
        assert _rel(fused.state.params[k], per_client.state.params[k]) < REL
    np.testing.assert_allclose(fused.losses, per_client.losses, rtol=1e-6)


def test_simulator_paths_agree_and_bit_identity_stays_selectable() -> None:
    split = synthetic_split(n_users=60, n_items=150, interactions_per_user=12.0, seed=4)
    cfg = TrainConfig(rounds=1, fraction=0.5, factor=8, layers=2, eval_every=0)
    fast = Simulator(split, cfg)
    exact = Simulator(split, cfg.replace(per_client_uploads=True))
    seen: list[dict[str, torch.Tensor]] = []
    for sim in (fast, exact):
        inner = sim.strategy.apply

        def spy(
            params: dict[str, torch.Tensor],
            grads: dict[str, torch.Tensor],
            rows: dict[str, torch.Tensor] | None = None,
            inner: Callable[..., None] = inner,
        ) -> None:
            seen.append({k: v.clone() for k, v in grads.items()})
            inner(params, grads, rows)

        sim.strategy.apply = spy  # type: ignore[method-assign]
        sim.run()
    assert set(seen[0]) == set(seen[1])
    for k in seen[1]:
        assert _rel(seen[0][k], seen[1][k]) < REL, k
    users = np.arange(split.n_users)
    a, b = fast.store.params(users), exact.store.params(users)
    for k in a:
        assert _rel(a[k], b[k]) < REL
    # a strategy that is not a weighted mean always gets the per-client uploads
    clipped = Simulator(split, cfg.replace(clip=0.5))
    assert clipped.strategy.linear_weights(np.array([5, 10])) is None
    assert fast.strategy.linear_weights(np.array([5, 10])) == pytest.approx([0.5, 0.5])
