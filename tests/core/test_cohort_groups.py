"""Cohorts of whole groups (``cohort_groups``), and what a secure run's per-round unions reveal
across rounds with and without them (harness/union_attack.py)."""

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedrecgel.cohort import (
    client_groups,
    cohort_size,
    groups_summary,
    largest_group_cohort,
    select_cohort,
)
from fedrecgel.config import RunParams
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.synthetic import synthetic_split
from harness.union_attack import attribute, holdings, observe, observe_dense, scores

IDS = np.arange(500)


def test_a_clients_group_depends_on_its_id_and_the_seed_alone() -> None:
    g = client_groups(IDS, 20, seed=3)
    assert g.min() >= 0 and g.max() < 20
    assert np.array_equal(client_groups(IDS[::7], 20, seed=3), g[::7])  # others do not move it
    assert not np.array_equal(client_groups(IDS, 20, seed=4), g)
    assert np.bincount(g, minlength=20).min() > 5  # spread, not all in a few groups


def test_a_run_says_how_large_the_groups_are_and_warns_of_users_alone() -> None:
    sizes = np.bincount(client_groups(IDS, 50, seed=3), minlength=50)
    line = groups_summary(IDS, 50, 3)
    assert f"{(sizes > 0).sum()} groups of {sizes.min()} to {sizes.max()} clients" in line
    assert "warning" not in line and sizes.min() > 1
    many = np.bincount(client_groups(IDS, 1000, seed=3), minlength=1000)
    alone = int((many == 1).sum())
    assert alone > 0 and f"warning: {alone} clients are alone" in groups_summary(IDS, 1000, 3)


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_a_grouped_cohort_is_the_groups_drawn_as_clients_are(sampling: str) -> None:
    g = client_groups(IDS, 20, seed=3)
    for r in range(1, 6):
        cohort = select_cohort(IDS, 0.2, 3, r, sampling=sampling, groups=20)  # type: ignore[arg-type]
        drawn = select_cohort(np.arange(20), 0.2, 3, r, sampling=sampling)  # type: ignore[arg-type]
        assert np.array_equal(cohort, IDS[np.isin(g, drawn)])
        if sampling == "fixed":
            assert len(drawn) == cohort_size(20, 0.2)
            assert len(cohort) <= largest_group_cohort(IDS, 0.2, 3, "fixed", 20)
    assert not np.array_equal(
        select_cohort(IDS, 0.2, 3, 1, groups=20), select_cohort(IDS, 0.2, 3, 2, groups=20)
    )


def test_cohort_groups_are_refused_with_differential_privacy() -> None:
    with pytest.raises(ValidationError, match="cohort_groups cannot be combined"):
        RunParams(cohort_groups=10, target_epsilon=3.0)
    with pytest.raises(ValidationError):
        RunParams(cohort_groups=1)


def test_the_simulator_trains_on_cohorts_of_whole_groups() -> None:
    split = synthetic_split(n_users=80, n_items=120, interactions_per_user=12.0, seed=3)
    cfg = TrainConfig(rounds=3, fraction=0.25, factor=8, layers=2, cohort_groups=8, eval_every=0)
    sim = Simulator(split, cfg)
    g = client_groups(sim.users, 8, cfg.seed)
    for r in (1, 2, 3):
        rec = sim.step()
        drawn = select_cohort(np.arange(8), 0.25, cfg.seed, r)
        assert rec.n_clients == int(np.isin(g, drawn).sum())
    plain = Simulator(split, cfg.replace(cohort_groups=None)).run()
    assert [r.n_clients for r in plain.rounds] == [cohort_size(80, 0.25)] * 3


def _population() -> list[np.ndarray]:
    """60 users: user u alone holds item u; every user also holds 3 of the items 60..79."""
    rng = np.random.default_rng(0)
    return [np.concatenate([[u], 60 + rng.choice(20, 3, replace=False)]) for u in range(60)]


def test_across_rounds_the_unions_name_who_holds_an_item_held_by_one_client() -> None:
    held = _population()
    params = RunParams(secure_aggregation="sparse", negative_pool=8, fraction=0.1, seed=1)
    observed = list(observe(held, 80, params, rounds=200, protocol_rounds=3))
    got = scores(attribute(observed, 60, 80), holdings(held, 80))
    assert got["recall"] == 1.0  # a holder is never ruled out
    assert got["single_items"] == 60 and got["single_named"] == 1.0
    early = scores(attribute(observed[:3], 60, 80), holdings(held, 80))
    assert early["single_named"] == 0.0  # three rounds of 6 clients name nobody


def test_with_cohort_groups_the_unions_point_to_the_holders_group_only() -> None:
    held = _population()
    params = RunParams(
        secure_aggregation="sparse", negative_pool=8, fraction=0.2, seed=1, cohort_groups=6
    )
    observed = list(observe(held, 80, params, rounds=200, protocol_rounds=3))
    suspects = attribute(observed, 60, 80)
    g = client_groups(np.arange(60), 6, 1)
    for u in range(60):  # item u: exactly the members of u's group
        assert np.array_equal(np.flatnonzero(suspects[:, u]), np.flatnonzero(g == g[u]))
    got = scores(suspects, holdings(held, 80))
    assert got["single_named"] == float(np.mean(np.bincount(g)[g] == 1))


def test_a_sparse_secure_run_on_whole_groups_trains_the_plain_runs_model() -> None:
    split = synthetic_split(n_users=80, n_items=120, interactions_per_user=12.0, seed=3)
    plain = TrainConfig(
        rounds=2, fraction=0.25, factor=8, layers=2, eval_every=2, cohort_groups=8, negative_pool=16
    )
    secure = plain.replace(secure_aggregation="sparse", secagg_neighbours=3)
    a, b = Simulator(split, plain), Simulator(split, secure)
    ra, rb = a.run(), b.run()
    assert [r.n_clients for r in rb.rounds] == [r.n_clients for r in ra.rounds]
    # as in tests/core/test_secagg_sparse.py: B's 32-bit step moves a coordinate whose mean is
    # within a few steps of zero by up to an Adam step (lr 1e-3); few move at all
    diff = torch.cat([(b.shared[n] - p).abs().flatten() for n, p in a.shared.items()])
    assert float(diff.max()) < 1e-3 and float((diff > 1e-5).float().mean()) < 0.01
    assert rb.rounds[-1].test == pytest.approx(ra.rounds[-1].test, abs=1e-6)


def test_a_dense_rounds_nonzero_rows_are_its_positives_and_many_negatives() -> None:
    held = _population()
    params = RunParams(fraction=0.1, seed=1, n_negatives=4)
    observed = list(observe_dense(held, 80, params, rounds=50))
    for obs in observed:  # every cohort member's items are among the nonzero rows
        assert obs.counts[np.concatenate([held[u] for u in obs.cohort])].all()
    # 6 clients x 16 samples over 80 items: most rows are touched by negatives each round
    assert np.mean([o.counts.mean() for o in observed]) > 0.5


def test_a_secure_round_draws_again_until_its_cohort_holds_two_clients() -> None:
    """As the aggregator fails an attempt of fewer than 2 clients and draws a new cohort."""
    split = synthetic_split(n_users=80, n_items=120, interactions_per_user=12.0, seed=3)
    cfg = TrainConfig(
        rounds=6, fraction=0.03, factor=8, layers=2, eval_every=0, sampling="poisson"
    ).replace(secure_aggregation="dense", secagg_neighbours=1)
    sim = Simulator(split, cfg)
    redrawn = 0
    for r in range(1, 7):
        first = select_cohort(sim.users, 0.03, cfg.seed, r, 0, "poisson")
        want, attempt = first, 0
        while len(want) < 2:
            attempt += 1
            want = select_cohort(sim.users, 0.03, cfg.seed, r, attempt, "poisson")
        redrawn += attempt > 0
        assert np.array_equal(sim.cohort(r), want)
        assert sim.step().n_clients == len(want)
    assert redrawn  # at 2.4 clients a round some first draws hold fewer than 2
