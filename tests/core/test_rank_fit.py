"""Ranking with embeddings fitted to the model (``rank_fit_steps``): the fit works on copies,
is keyed so that any shard of users computes it alike, lowers each user's own loss, and is
what the simulator's (and the ray backend's) evaluation ranks with."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fedrecgel import passes
from fedrecgel.metrics import KS, means, metric_sums
from fedrecgel.model import Scorer
from fedrecgel.rank_fit import RankFit, ranking_params
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.synthetic import synthetic_split

SPLIT = synthetic_split(
    n_users=90, n_items=120, interactions_per_user=12.0, seed=3, validation=True
)
CFG = TrainConfig(rounds=4, fraction=0.2, factor=8, layers=2, local_steps=1)
FIT = RankFit(steps=6, lr=0.1)


@pytest.fixture(scope="module")
def trained() -> Simulator:
    sim = Simulator(SPLIT, CFG)
    sim.run()
    return sim


def _fit(sim: Simulator, users: np.ndarray, fit: RankFit = FIT, version: int = 4) -> Any:
    state = sim.store.get(users)
    before = {k: v.clone() for k, v in state.params.items()}
    out = ranking_params(
        sim.model_cfg, sim.shared, state, users, SPLIT.user_train, sim.hp, fit, 0, version
    )
    for k, v in before.items():  # the stored state it was given is left as it was
        assert torch.equal(state.params[k], v)
    return out


def test_no_steps_ranks_with_the_stored_embeddings(trained: Simulator) -> None:
    users = np.arange(10)
    got = _fit(trained, users, RankFit(steps=0))
    for k, v in trained.store.params(users).items():
        assert torch.equal(got[k], v)


def test_the_fit_is_keyed_by_user_and_version_not_by_who_is_fitted_beside(
    trained: Simulator,
) -> None:
    users = np.arange(SPLIT.n_users)
    whole = _fit(trained, users)
    for shard in (users[users % 2 == 0], users[users % 3 == 1], users[40:41]):
        part = _fit(trained, shard)
        for k, v in part.items():
            torch.testing.assert_close(v, whole[k][shard], rtol=1e-5, atol=1e-6)
    again = _fit(trained, users)
    other = _fit(trained, users, version=5)
    for k, v in whole.items():
        assert torch.equal(again[k], v)
        assert not torch.equal(other[k], v)  # another version's draws


def test_the_fit_lowers_each_users_own_loss(trained: Simulator) -> None:
    """On a fixed draw of the users' items and negatives, the fitted embeddings' loss is lower
    than the stored ones' for nearly every user."""
    users = np.arange(SPLIT.n_users)
    samples = trained.clients.samples(99, users, SPLIT.user_train)
    sim = trained

    def losses(params: dict[str, torch.Tensor]) -> np.ndarray:
        out = []
        for i in range(len(users)):
            lay = passes.make_layout(samples[i : i + 1], sim.model_cfg.n_items, 1 << 10)
            ig = sim.shared["item_gmf"].index_select(0, lay.items)
            im = sim.shared["item_mlp"].index_select(0, lay.items)
            dense = {n: sim.shared[n] for n in sim.model_cfg.dense_names()}
            priv = {k: v[i : i + 1] for k, v in params.items()}
            fw = passes.forward(sim.model_cfg, lay, priv, ig, im, dense, False, None)
            loss, _ = passes.loss_grad(lay, fw.logits)
            out.append(float(loss.sum()))
        return np.array(out)

    stored = losses(sim.store.params(users))
    fitted = losses(_fit(sim, users, RankFit(steps=20, lr=0.05)))
    assert (fitted < stored).mean() > 0.9, fitted - stored


def test_the_simulator_ranks_with_the_fit_and_trains_as_without_it() -> None:
    cfg = CFG.replace(eval_every=1, popularity_prior=False)
    plain = Simulator(SPLIT, cfg)
    fitted = Simulator(SPLIT, cfg.replace(rank_fit_steps=FIT.steps, rank_fit_lr=FIT.lr))
    a, b = plain.run(), fitted.run()
    assert [r.loss for r in a.rounds] == [r.loss for r in b.rounds]
    for k, v in plain.shared.items():
        assert torch.equal(fitted.shared[k], v)
    for k, v in plain.store.data.params.items():
        assert torch.equal(fitted.store.data.params[k], v)
    assert [r.test for r in a.rounds] != [r.test for r in b.rounds]
    # the last round's figures are those of the final model ranked with the fitted embeddings
    users = np.arange(SPLIT.n_users)
    params = _fit(fitted, users, version=CFG.rounds)
    scorer = Scorer(fitted.model_cfg, fitted.shared)
    sums = metric_sums(scorer, params, SPLIT.test_items, SPLIT.test_negatives, KS)
    assert means(sums) == b.rounds[-1].test


def test_only_users_with_fewer_private_steps_than_the_fit_are_fitted(trained: Simulator) -> None:
    users = np.arange(SPLIT.n_users)
    state = trained.store.get(users)
    state.step[::2] = FIT.steps  # the even users took part in more rounds, the odd in fewer
    state.step[1::2] = torch.minimum(state.step[1::2], torch.tensor(FIT.steps - 1))
    before = {k: v.clone() for k, v in state.params.items()}
    got = ranking_params(
        trained.model_cfg, trained.shared, state, users, SPLIT.user_train, trained.hp, FIT, 0, 4
    )
    for k, v in before.items():
        assert torch.equal(got[k][::2], v[::2])
        assert not torch.equal(got[k][1::2], v[1::2])
        # the fitted users' values do not depend on who was left out beside them
        odd = state.select(slice(1, None, 2))
        alone = ranking_params(
            trained.model_cfg,
            trained.shared,
            odd,
            users[1::2],
            SPLIT.user_train,
            trained.hp,
            FIT,
            0,
            4,
        )
        torch.testing.assert_close(got[k][1::2], alone[k])
