"""The batched cohort step agrees with the plain per-client loop reference."""

import numpy as np
import pytest
import torch

from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.reference import reference_client_step
from fedrecgel.sam import PrivateState, SAMConfig, client_rng, client_samples, cohort_step


def _setup(kind: str, n_users: int = 7, n_items: int = 60):
    cfg = ModelConfig(n_items=n_items, kind=kind, factor=8, layers=3)
    shared = init_shared(cfg, seed=1)
    users = np.arange(n_users)
    rng = np.random.default_rng(3)
    positives = [rng.choice(n_items, size=int(rng.integers(3, 40)), replace=False) for _ in users]
    return cfg, shared, users, positives


@pytest.mark.parametrize("kind", ["ncf", "mf"])
@pytest.mark.parametrize("rho", [(0.02, 0.02), (0.0, 0.0), (0.05, 0.0), (0.0, 0.3)])
def test_batched_step_matches_per_client_loop(kind, rho):
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
