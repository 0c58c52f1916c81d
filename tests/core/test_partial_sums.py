"""Per-worker partial sums (``upload_grouping=worker``) compute the same maths as per-client
uploads: a partial sum is the weighted sum of its clients' uploads over the items they touched,
and a simulation with partial sums follows the per-client one up to float rounding, with either
weighting; the wire codec keeps a partial sum exactly and refuses what it must not carry."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedrecgel.cohort import select_cohort
from fedrecgel.config import RunParams
from fedrecgel.simulate import Simulator, TrainConfig
from fedrecgel.strategy import partial_weights
from fedrecgel.synthetic import synthetic_split
from fedrecgel.wire import WireError, decode_partial, encode_partial

SPLIT = synthetic_split(n_users=80, n_items=120, interactions_per_user=12.0, seed=3)
SMALL = TrainConfig(rounds=3, fraction=0.25, factor=8, layers=2, shards=2, eval_every=0)


@pytest.mark.parametrize("weighting", ["mean", "samples"])
def test_a_partial_sum_is_the_weighted_sum_of_its_clients_uploads(weighting: str) -> None:
    sim = Simulator(SPLIT, SMALL)
    cohort = select_cohort(np.arange(SPLIT.n_users), SMALL.fraction, SMALL.seed, 1)
    part = cohort[cohort % 2 == 1]
    state = sim.store.get(part)
    args = (sim.shared, 1, part, SPLIT.user_train, state)
    per_client = sim.clients.step(*args)
    partial = sim.clients.partial_step(*args, weighting).partial  # type: ignore[arg-type]
    assert partial is not None
    assert partial.client_ids == tuple(int(u) for u in part)
    assert partial.n_samples == tuple(u.n_samples for u in per_client.uploads)
    # float32 losses, summed in another order where the native kernels compute the partial sum
    assert partial.loss == pytest.approx(sum(u.loss for u in per_client.uploads), rel=1e-6)
    shapes = sim.model_cfg.shared_shapes()
    w = partial_weights(np.array(partial.n_samples), weighting)  # type: ignore[arg-type]
    dense = [u.densify(shapes) for u in per_client.uploads]
    for t, (idx, vals) in partial.rows.items():
        touched = sorted({int(i) for u in per_client.uploads for i in u.rows[t][0]})
        assert idx.tolist() == touched
        want = sum(float(wc) * d[t] for wc, d in zip(w, dense, strict=True))
        assert isinstance(want, torch.Tensor)  # not the empty sum's 0
        torch.testing.assert_close(vals, want[idx], atol=1e-6, rtol=1e-4)
    for n, g in partial.dense.items():
        want = sum(float(wc) * d[n] for wc, d in zip(w, dense, strict=True))
        torch.testing.assert_close(g, want, atol=1e-6, rtol=1e-4)
    back = decode_partial(encode_partial(1, partial), sim.model_cfg)
    assert back.round_id == 1 and back.partial.client_ids == partial.client_ids
    assert back.partial.loss == partial.loss
    for t, (idx, vals) in partial.rows.items():
        assert torch.equal(back.partial.rows[t][0], idx)
        assert torch.equal(back.partial.rows[t][1], vals)


@pytest.mark.parametrize("weighting", ["mean", "samples"])
def test_partial_sums_follow_the_per_client_run(weighting: str) -> None:
    base = SMALL.replace(weighting=weighting)
    per_client = Simulator(SPLIT, base.replace(per_client_uploads=True))
    grouped = Simulator(SPLIT, base.replace(upload_grouping="worker"))
    a, b = per_client.run(), grouped.run()
    for k in per_client.shared:
        torch.testing.assert_close(grouped.shared[k], per_client.shared[k], atol=1e-5, rtol=1e-4)
    for r1, r2 in zip(a.rounds, b.rounds, strict=True):
        assert r1.n_clients == r2.n_clients
        assert r2.loss == pytest.approx(r1.loss, rel=1e-5)


def test_partial_sums_refuse_what_needs_per_client_updates() -> None:
    for bad in ({"clip": 1.0}, {"dp_noise": 1.0}, {"secure_aggregation": "dense"}):
        with pytest.raises(ValueError, match="upload_grouping"):
            RunParams(upload_grouping="worker", **bad)
    with pytest.raises(ValueError, match="upload_grouping"):
        Simulator(SPLIT, SMALL.replace(upload_grouping="worker", clip=1.0))


def test_the_codec_refuses_a_partial_sum_with_a_client_listed_twice() -> None:
    sim = Simulator(SPLIT, SMALL)
    part = np.array([1, 3])
    res = sim.clients.partial_step(
        sim.shared, 1, part, SPLIT.user_train, sim.store.get(part), "mean"
    )
    assert res.partial is not None
    twice = replace(res.partial, client_ids=(1, 1))
    with pytest.raises(WireError, match="once each"):
        decode_partial(encode_partial(1, twice), sim.model_cfg)


@pytest.mark.parametrize(
    ("clients", "message"),
    [
        ('[{"client_id": 1e400, "n_samples": 3}]', "client_id must be an integer"),
        ('[{"client_id": 1, "n_samples": 2.5}]', "n_samples must be an integer"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_the_codec_reads_a_partial_sums_clients_strictly(clients: str, message: str) -> None:
    from safetensors.torch import load, save

    sim = Simulator(SPLIT, SMALL)
    part = np.array([1, 3])
    res = sim.clients.partial_step(
        sim.shared, 1, part, SPLIT.user_train, sim.store.get(part), "mean"
    )
    assert res.partial is not None
    body = encode_partial(1, res.partial)
    n = int.from_bytes(body[:8], "little")
    meta = json.loads(body[8 : 8 + n])["__metadata__"]
    tampered = save(load(body), metadata={**meta, "clients": clients})
    with pytest.raises(WireError, match=message):
        decode_partial(tampered, sim.model_cfg)
