"""Sparse secure aggregation (``secure_aggregation=sparse``): a masked count of the cohort's
items, then masked rows of those items and the round's negative pool only, in 32-bit words.
It gives the plain mean of the same uploads (dropouts in either instance too) and the same
model, and what the server receives still hides each client's items."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrecgel.cohort import select_cohort
from fedrecgel.config import RunParams
from fedrecgel.data import load_split
from fedrecgel.fixedpoint import OverflowRefused
from fedrecgel.ray_backend import refusal
from fedrecgel.sam import negative_pool
from fedrecgel.secagg.aggregate import ROW_GAIN_BITS, row_gain, secure_sparse_mean
from fedrecgel.secagg.layout import flatten, vector_length
from fedrecgel.secagg.local import Faults, secure_sum
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.strategy import aggregate_gradients, clip_update
from fedrecgel.synthetic import synthetic_split
from fedrecgel.upload_modes import SecureSparse, mode_of
from tests.support.sign_attack import precision, sign_attack

SPLIT = synthetic_split(n_users=80, n_items=300, interactions_per_user=12.0, seed=3)
PLAIN = TrainConfig(rounds=3, fraction=0.2, factor=8, layers=2, eval_every=3, negative_pool=40)
SPARSE = PLAIN.replace(secure_aggregation="sparse", secagg_neighbours=3)


def _round_one(cfg: TrainConfig, split=SPLIT):  # type: ignore[no-untyped-def]
    sim = Simulator(split, cfg)
    cohort = select_cohort(sim.users, cfg.fraction, cfg.seed, 1)
    return sim, sim.clients.step_in(sim.store, sim.shared, 1, cohort, split.user_train).uploads


@pytest.mark.parametrize("clip", [None, 0.05])
def test_the_sparse_secure_mean_is_the_plain_mean_and_counts_the_items(
    clip: float | None,
) -> None:
    sim, uploads = _round_one(SPARSE.replace(clip=clip))
    assert isinstance(sim.mode, SecureSparse)
    cfg, params = sim.model_cfg, sim.params
    shapes = cfg.shared_shapes()
    clipped = [clip_update(u, clip) for u in uploads] if clip else uploads
    plain = aggregate_gradients(clipped, shapes, "mean")
    got = secure_sparse_mean(cfg, params, 1, uploads)
    ids = tuple(sorted(u.client_id for u in uploads))
    assert got.counted == got.mean.survivors == ids and not got.mean.dropped
    spec_a, spec_b = got.specs
    assert spec_a.fixed.word_bits == 8 and spec_b.fixed.word_bits == 32
    assert spec_b.fixed.scale_bits >= 20
    assert spec_b.length == vector_length(cfg, got.union) < vector_length(cfg)
    for name in shapes:
        # item rows are encoded ROW_GAIN_BITS finer than the score network
        step = spec_b.fixed.step / (2**ROW_GAIN_BITS if name in cfg.item_tables() else 1)
        err = (got.mean.grads[name].double() - plain[name].double()).abs()
        assert float((err - 1e-6 * plain[name].double().abs()).max()) <= step, name
        assert clip or float(plain[name].abs().max()) > 1e3 * step, name
    assert got.mean.loss == pytest.approx(float(np.mean([u.loss for u in uploads])), abs=1e-6)
    # A: per item, how many clients hold it outside the pool; U: those items and the pool
    pool = negative_pool(params.seed, 1, cfg.n_items, 40)
    want = np.zeros(cfg.n_items, dtype=np.int64)
    for u in ids:
        want[np.setdiff1d(SPLIT.user_train(u), pool)] += 1
    assert np.array_equal(got.counts, want)
    assert np.array_equal(got.union, np.union1d(np.flatnonzero(want), pool))
    assert len(got.union) < cfg.n_items // 2
    for u in uploads:  # every touched row is in U
        assert np.isin(u.rows["item_gmf"][0].numpy(), got.union).all()


def test_dropouts_in_either_instance_leave_the_mean_of_bs_survivors() -> None:
    sim, uploads = _round_one(SPARSE.replace(secagg_neighbours=0))  # every pair: t = 11 of 15
    ids = sorted(u.client_id for u in uploads)
    gone_a, gone_b, silent = ids[1], ids[4], ids[7]
    got = secure_sparse_mean(
        sim.model_cfg,
        sim.params,
        1,
        uploads,
        Faults(no_input=frozenset({gone_a})),
        Faults(no_input=frozenset({gone_b}), no_reveal=frozenset({silent})),
    )
    # B's cohort is A's, as over HTTP: the client gone from A counts as dropped in B
    assert gone_a not in got.counted and got.specs[1].cohort == got.specs[0].cohort
    assert got.mean.dropped == (gone_a, gone_b) and silent in got.mean.survivors
    pool = negative_pool(sim.params.seed, 1, sim.model_cfg.n_items, 40)
    want = np.zeros(sim.model_cfg.n_items, dtype=np.int64)
    for u in ids:
        if u != gone_a:  # the client dropped from A is not counted
            want[np.setdiff1d(SPLIT.user_train(u), pool)] += 1
    assert np.array_equal(got.counts, want)
    keep = [u for u in uploads if u.client_id not in (gone_a, gone_b)]
    plain = aggregate_gradients(keep, sim.model_cfg.shared_shapes(), "mean")
    for name, g in plain.items():
        torch.testing.assert_close(got.mean.grads[name], g, atol=1e-5, rtol=1e-5)


def test_a_sparse_secure_run_trains_the_plain_runs_model() -> None:
    plain, secure = Simulator(SPLIT, PLAIN), Simulator(SPLIT, SPARSE)
    a, b = plain.run(), secure.run()
    # 32-bit words: B's step is 2^-22 here (2^-30 on item rows), against 2^-32 for dense. Adam
    # divides by the root of the second moment, so a coordinate whose mean gradient is within
    # a few steps of zero can take a visibly different step: none moves by a tenth of an Adam
    # step (lr 1e-3) and fewer than 1% by more than 1e-5
    diffs = [(secure.shared[n] - p).abs().flatten() for n, p in plain.shared.items()]
    diff = torch.cat(diffs)
    assert float(diff.max()) < 1e-4 and float((diff > 1e-5).float().mean()) < 0.01
    assert b.rounds[-1].test == pytest.approx(a.rounds[-1].test, abs=1e-6)
    assert [r.loss for r in b.rounds] == pytest.approx([r.loss for r in a.rounds], abs=1e-6)


def test_on_what_the_server_receives_the_sign_attack_is_at_chance() -> None:
    """FilmTrust, one round's 15 clients, pool 128: the sign rule reads positives off a plain
    upload; on B's masked vectors (the rows of U only) it is at chance, and A's masked
    indicators do not correlate with the indicators."""
    split = load_split("filmtrust")
    cfg = TrainConfig(
        rounds=1, fraction=0.01, negative_pool=128, secure_aggregation="sparse", eval_every=0
    )
    sim, uploads = _round_one(cfg, split)
    got = secure_sparse_mean(sim.model_cfg, sim.params, 1, uploads)
    union, (spec_a, spec_b) = got.union, got.specs
    f = sim.model_cfg.factor
    by_id = {u.client_id: u for u in uploads}
    plain, masked, chance = [], [], []
    gain = row_gain(sim.model_cfg, union)
    r = secure_sum(
        spec_b, lambda c: flatten(sim.model_cfg, by_id[c], union) * gain, record=spec_b.cohort
    )
    for c, y in r.masked.items():
        pos = np.unique(split.user_train(c))
        idx, vals = by_id[c].rows["item_gmf"]
        plain.append(precision(sign_attack(idx.numpy(), vals.numpy()), pos))
        view = spec_b.fixed.decode(y)[: len(union) * f].reshape(len(union), f)
        masked.append(precision(sign_attack(union, view), pos))
        chance.append(np.isin(union, pos).mean())
    print(f"plain {np.mean(plain):.3f}, masked {np.mean(masked):.4f}, chance {np.mean(chance):.4f}")
    assert np.mean(plain) >= 0.8
    assert np.mean(masked) < 2 * np.mean(chance) + 0.02
    pool = negative_pool(cfg.seed, 1, sim.model_cfg.n_items, 128)
    a = secure_sum(
        spec_a,
        lambda c: np.isin(
            np.arange(sim.model_cfg.n_items), np.setdiff1d(split.user_train(c), pool)
        ).astype(float),
        record=spec_a.cohort,
    )
    for c, y in a.masked.items():
        ind = np.isin(np.arange(sim.model_cfg.n_items), split.user_train(c)).astype(float)
        assert abs(np.corrcoef(spec_a.fixed.decode(y), ind)[0, 1]) < 0.1


def test_sparse_secure_aggregation_is_refused_where_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="needs negative_pool"):
        RunParams(secure_aggregation="sparse")
    wide = RunParams(secure_aggregation="sparse", negative_pool=64, secagg_range=1e5)
    with pytest.raises(OverflowRefused, match="lower secagg_range"):
        mode_of(wide, SPLIT_MODEL).check_cohorts(1000, 100)
    mode_of(wide.model_copy(update={"secagg_range": 16.0}), SPLIT_MODEL).check_cohorts(1000, 100)
    why = refusal(SPARSE)
    assert why is not None and "secure aggregation" in why
    with pytest.raises(ValueError, match="at least 2 clients"):
        Simulator(SPLIT, SPARSE.replace(fraction=0.01))


SPLIT_MODEL = PLAIN.model(SPLIT.n_items)
