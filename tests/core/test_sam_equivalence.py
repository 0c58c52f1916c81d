"""The batched cohort step agrees with the plain per-client loop reference."""

import numpy as np
import pytest
import torch

from fedrecgel.model import ModelConfig, ModelKind, init_shared
from fedrecgel.reference import reference_client_step
from fedrecgel.sam import PrivateState, SAMConfig, client_rng, client_samples, cohort_step


def _setup(
    kind: ModelKind, n_users: int = 7, n_items: int = 60
) -> tuple[ModelConfig, dict[str, torch.Tensor], np.ndarray, list[np.ndarray]]:
    cfg = ModelConfig(n_items=n_items, kind=kind, factor=8, layers=3)
    shared = init_shared(cfg, seed=1)
    users = np.arange(n_users)
    rng = np.random.default_rng(3)
    positives = [rng.choice(n_items, size=int(rng.integers(3, 40)), replace=False) for _ in users]
    return cfg, shared, users, positives


@pytest.mark.parametrize("kind", ["ncf", "mf"])
@pytest.mark.parametrize("rho", [(0.02, 0.02), (0.0, 0.0), (0.05, 0.0), (0.0, 0.3)])
def test_batched_step_matches_per_client_loop(kind: ModelKind, rho: tuple[float, float]) -> None:
    cfg, shared, users, positives = _setup(kind)
    hp = SAMConfig(rho_sh=rho[0], rho_ns=rho[1], chunk_size=16)
    state = PrivateState.fresh(cfg, 0, users)
    for rnd in range(3):
        samples = [
            client_samples(positives[u], cfg.n_items, hp.n_negatives, client_rng(0, rnd, u))
            for u in users
        ]
        res = cohort_step(cfg, shared, users, state, samples, hp)
        shapes = cfg.shared_shapes()
        for i, u in enumerate(users):
            ref_up, ref_state = reference_client_step(
                cfg, shared, int(u), state.select([i]), *samples[i], hp
            )
            got = res.uploads[i].densify(shapes)
            want = ref_up.densify(shapes)
            for name in shapes:
                torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4)
            for k in state.params:
                torch.testing.assert_close(
                    res.state.params[k][i], ref_state.params[k][0], atol=1e-5, rtol=1e-4
                )
            assert res.uploads[i].loss == pytest.approx(ref_up.loss, rel=1e-5)
        state = res.state


@pytest.mark.parametrize("kind", ["ncf", "mf"])
@pytest.mark.parametrize("rho", [(0.02, 0.02), (0.0, 0.0)])
def test_local_steps_match_the_per_client_loop(kind: ModelKind, rho: tuple[float, float]) -> None:
    """Private steps before the SAM step: the uploads and the private state are the plain
    loop's (Adam steps on the user's embeddings alone, then the three passes), per client and
    summed inside the backward (the simulator's aggregate path, native kernels where built)."""
    cfg, shared, users, positives = _setup(kind)
    hp = SAMConfig(rho_sh=rho[0], rho_ns=rho[1], chunk_size=16, client_lr=0.05, local_steps=3)
    state = PrivateState.fresh(cfg, 0, users)
    shapes = cfg.shared_shapes()
    for rnd in range(2):
        samples = [
            client_samples(positives[u], cfg.n_items, hp.n_negatives, client_rng(0, rnd, u))
            for u in users
        ]
        res = cohort_step(cfg, shared, users, state, samples, hp)
        weights = np.linspace(0.5, 1.5, len(users))
        agg = cohort_step(cfg, shared, users, state, samples, hp, weights)
        assert agg.aggregate is not None
        total = {n: torch.zeros(s) for n, s in shapes.items()}
        for i, u in enumerate(users):
            ref_up, ref_state = reference_client_step(
                cfg, shared, int(u), state.select([i]), *samples[i], hp
            )
            want = ref_up.densify(shapes)
            got = res.uploads[i].densify(shapes)
            for name in shapes:
                torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4)
                total[name] += float(weights[i]) * want[name]
            for k in state.params:
                torch.testing.assert_close(
                    res.state.params[k][i], ref_state.params[k][0], atol=1e-5, rtol=1e-4
                )
                torch.testing.assert_close(res.state.exp_avg_sq[k][i], ref_state.exp_avg_sq[k][0])
            assert int(res.state.step[i]) == int(ref_state.step[0]) == (rnd + 1) * 4
        for name in shapes:
            torch.testing.assert_close(agg.aggregate[name], total[name], atol=1e-5, rtol=1e-4)
        for k in state.params:
            torch.testing.assert_close(agg.state.params[k], res.state.params[k])
        state = res.state


def test_local_steps_change_the_step() -> None:
    cfg, shared, users, positives = _setup("ncf")
    samples = [client_samples(positives[u], cfg.n_items, 4, client_rng(0, 0, u)) for u in users]
    state = PrivateState.fresh(cfg, 0, users)
    plain = cohort_step(cfg, shared, users, state, samples, SAMConfig())
    fitted = cohort_step(cfg, shared, users, state, samples, SAMConfig(local_steps=2))
    assert not torch.equal(plain.state.params["user_gmf"], fitted.state.params["user_gmf"])
    assert fitted.losses.sum() < plain.losses.sum()  # pass 1 runs at the fitted embeddings
