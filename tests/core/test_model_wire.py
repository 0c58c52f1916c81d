"""Model initialisation, scoring paths that must agree, and the safetensors codec."""

import json
from collections.abc import Callable

import numpy as np
import pytest
import torch

from fedrecgel.model import ModelConfig, Scorer, forward_batched, init_private, init_shared
from fedrecgel.sam import PrivateState, SAMConfig, client_rng, client_samples, cohort_step
from fedrecgel.uploads import Update
from fedrecgel.wire import (
    WireError,
    decode_model,
    decode_updates,
    encode_model,
    encode_updates,
    update_digest,
)

CFG = ModelConfig(n_items=30, factor=4, layers=3)


def test_shapes_follow_the_reference_architecture() -> None:
    cfg = ModelConfig(n_items=10)
    shapes = cfg.shared_shapes()
    assert shapes["item_mlp"] == (10, 128)
    assert [shapes[f"tower.{k}.weight"] for k in range(3)] == [(128, 256), (64, 128), (32, 64)]
    assert shapes["predict.weight"] == (1, 64)
    assert cfg.private_dims() == {"user_gmf": 32, "user_mlp": 128}


def test_init_is_seeded_and_biases_are_zero() -> None:
    a, b = init_shared(CFG, 3), init_shared(CFG, 3)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["item_gmf"], init_shared(CFG, 4)["item_gmf"])
    assert all(float(a[k].abs().sum()) == 0 for k in a if k.endswith("bias"))
    assert float(a["item_gmf"].std()) == pytest.approx(0.01, rel=0.3)


def test_private_init_of_a_shard_equals_the_whole_population() -> None:
    whole = init_private(CFG, 7, np.arange(10))
    shard = init_private(CFG, 7, np.array([3, 8]))
    for k in whole:
        assert torch.equal(whole[k][[3, 8]], shard[k])


def test_scorer_agrees_with_the_training_forward() -> None:
    shared = init_shared(CFG, 0)
    for k in shared:  # make the tower non-trivial
        shared[k] = shared[k] + 0.1 * torch.randn_like(shared[k])
    private = init_private(CFG, 0, np.arange(5))
    private = {k: v * 50 for k, v in private.items()}
    items = torch.randint(0, CFG.n_items, (5, 7))
    rows = {t: shared[t][items] for t in CFG.item_tables()}
    dense = {n: shared[n] for n in CFG.dense_names()}
    want = forward_batched(CFG, private, rows, dense, per_client_dense=False)
    scorer = Scorer(CFG, shared)
    torch.testing.assert_close(scorer.score(private, items), want, atol=1e-5, rtol=1e-5)
    full = scorer.score_all(private)
    torch.testing.assert_close(full.gather(1, items), want, atol=1e-5, rtol=1e-5)


def test_model_round_trip_through_safetensors() -> None:
    shared = init_shared(CFG, 1)
    cfg, back, version = decode_model(encode_model(CFG, shared, 12))
    assert cfg == CFG and version == 12
    assert all(torch.equal(back[k], shared[k]) for k in shared)


def _updates(n: int = 2) -> list[Update]:
    shared = init_shared(CFG, 0)
    users = np.arange(n)
    state = PrivateState.fresh(CFG, 0, users)
    samples = [
        client_samples(np.array([1, 2, 3]), CFG.n_items, 4, client_rng(0, 1, int(u))) for u in users
    ]
    return cohort_step(CFG, shared, users, state, samples, SAMConfig()).uploads


def test_updates_round_trip_and_digest_is_stable() -> None:
    ups = _updates()
    dec = decode_updates(encode_updates(5, ups), CFG)
    assert dec.round_id == 5 and [u.client_id for u in dec.updates] == [0, 1]
    for a, b in zip(ups, dec.updates, strict=True):
        assert all(torch.equal(a.dense[k], b.dense[k]) for k in a.dense)
        assert all(torch.equal(a.rows[k][1], b.rows[k][1]) for k in a.rows)
    assert dec.digests == [update_digest(5, u) for u in ups]
    assert update_digest(6, ups[0]) != dec.digests[0]


#: changes the tensors and the metadata of a decoded body in place
Mutation = Callable[[dict[str, torch.Tensor], dict[str, str]], object]


def _tamper(body: bytes, fn: Mutation) -> bytes:
    from safetensors.torch import load, save

    header_len = int.from_bytes(body[:8], "little")
    meta = json.loads(body[8 : 8 + header_len])["__metadata__"]
    tensors = load(body)
    fn(tensors, meta)
    return save(tensors, metadata=meta)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t, m: t.__setitem__("0/predict.bias", torch.zeros(2)), "shape"),
        (
            lambda t, m: t.__setitem__("0/predict.bias", torch.zeros(1, dtype=torch.float64)),
            "dtype",
        ),
        (lambda t, m: t.__setitem__("0/predict.bias", torch.tensor([float("nan")])), "NaN"),
        (lambda t, m: t["0/item_gmf.values"].__setitem__(0, float("inf")), "NaN or Inf"),
        (
            lambda t, m: t.__setitem__("0/item_gmf.rows", t["0/item_gmf.rows"] + 1000),
            "out of range",
        ),
        (lambda t, m: t.__setitem__("0/user_gmf", torch.zeros(4)), "unexpected tensors"),
        (lambda t, m: t.pop("0/tower.0.weight"), "missing dense"),
        (lambda t, m: m.__setitem__("updates", "[]"), "at least one"),
        (lambda t, m: m.__setitem__("format", "x"), "not an updates blob"),
        (lambda t, m: m.__setitem__("user_gmf", "[0.1, 0.2]"), "unexpected metadata"),
        (
            lambda t, m: m.__setitem__(
                "updates", '[{"client_id": 0, "n_samples": 5, "items": [1, 2]}]'
            ),
            "unexpected fields",
        ),
    ],
)
def test_bad_updates_are_refused_with_a_reason(mutate: Mutation, message: str) -> None:
    body = _tamper(encode_updates(1, _updates(1)), mutate)
    with pytest.raises(WireError, match=message):
        decode_updates(body, CFG)


def test_garbage_is_not_a_safetensors_blob() -> None:
    for body in (b"", b"12345678", b"\xff" * 64):
        with pytest.raises(WireError):
            decode_updates(body, CFG)


def _with_updates_meta(text: str) -> bytes:
    return _tamper(encode_updates(1, _updates(1)), lambda t, m: m.__setitem__("updates", text))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('{"client_id": 1e400, "n_samples": 5}', "client_id must be an integer"),
        ('{"client_id": 0, "n_samples": 1e400}', "n_samples must be an integer"),
        ('{"client_id": 0.7, "n_samples": 5}', "client_id must be an integer"),
        ('{"client_id": true, "n_samples": 5}', "client_id must be an integer"),
        ('{"client_id": "0", "n_samples": 5}', "client_id must be an integer"),
        ('{"client_id": 0, "n_samples": 5, "loss": "0.1"}', "loss must be a number"),
        ('{"client_id": 0, "n_samples": 5, "loss": 1' + "0" * 400 + "}", "float range"),
        ('{"n_samples": 5}', "needs client_id"),
    ],
)
def test_update_metadata_is_read_strictly(entry: str, message: str) -> None:
    # a lenient reading would crash on infinity or take 0.7, true or "0" for client 0
    with pytest.raises(WireError, match=message):
        decode_updates(_with_updates_meta(f"[{entry}]"), CFG)


def test_deeply_nested_metadata_is_refused_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(WireError, match="nested too deeply"):
        decode_updates(_with_updates_meta(deep), CFG)


@pytest.mark.parametrize("text", ["-1", "01", " 1", "1.0", "2147483648", "9" * 5000, "x"])
def test_the_round_of_a_body_is_a_plain_bounded_integer(text: str) -> None:
    body = _tamper(encode_updates(1, _updates(1)), lambda t, m: m.__setitem__("round", text))
    with pytest.raises(WireError, match="round must be a decimal integer"):
        decode_updates(body, CFG)
