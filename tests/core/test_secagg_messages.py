"""The secure-aggregation messages as bytes: a round whose every message crosses as a body
still closes with the right sum; no recorded body lets the server recover any single client's
update; malformed bodies are refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedrecgel.secagg import messages as msg
from fedrecgel.secagg.layout import flatten
from fedrecgel.secagg.protocol import Client, Masked, RoundFailed
from fedrecgel.secagg.server import Server
from fedrecgel.simulate import TrainConfig
from fedrecgel.synthetic import synthetic_split
from tests.core.secagg_round import first_round
from tests.support.sign_attack import precision, sign_attack

SPLIT = synthetic_split(n_users=100, n_items=400, interactions_per_user=12.0, seed=5)
CONFIG = TrainConfig(
    rounds=1, fraction=0.12, factor=8, layers=2, secure_aggregation="dense", secagg_neighbours=3
)


@pytest.fixture(scope="module")
def recorded():  # type: ignore[no-untyped-def]
    """One round over bytes: (spec, uploads, bodies the server received by client, outcome)."""
    sim, uploads, spec, server, clients = first_round(SPLIT, CONFIG)
    cfg = sim.model_cfg
    by_id = {u.client_id: u for u in uploads}
    bodies: dict[int, list[bytes]] = {u: [] for u in spec.cohort}

    def send(u: int, body: bytes) -> bytes:
        bodies[u].append(body)
        return body

    for u in spec.cohort:
        server.add_keys(msg.decode_keys(send(u, msg.encode_keys(clients[u].advertise()))))
    for u in spec.cohort:
        sh = clients[u].share(server.keys_for(u))
        server.add_shares(msg.decode_shares(send(u, msg.encode_shares(sh))))
    for u in spec.cohort:
        # what the server forwards crosses as bytes too
        got = {v: msg.decode_shares(msg.encode_shares(m)) for v, m in server.shares_for(u).items()}
        m = clients[u].masked(flatten(cfg, by_id[u]), got)
        server.add_masked(msg.decode_masked(send(u, msg.encode_masked(m)), spec.length))
    alive, gone = server.survivors()
    reveals = [
        msg.decode_reveal(send(u, msg.encode_reveal(clients[u].reveal(alive, gone)))) for u in alive
    ]
    return spec, cfg, uploads, bodies, server.unmask(reveals)


def test_a_round_over_bytes_closes_with_the_plain_sum(recorded) -> None:  # type: ignore[no-untyped-def]
    spec, cfg, uploads, _, outcome = recorded
    total = sum(flatten(cfg, u) for u in uploads)
    assert np.abs(outcome.total - total).max() <= len(uploads) * spec.fixed.step


def test_no_recorded_body_lets_the_server_recover_a_single_update(recorded) -> None:  # type: ignore[no-untyped-def]
    spec, cfg, uploads, bodies, _ = recorded
    items = np.arange(cfg.n_items)
    scores, chance = [], []
    for u in uploads:
        idx, vals = u.rows["item_gmf"]
        assert (
            precision(sign_attack(idx.numpy(), vals.numpy()), SPLIT.user_train(u.client_id)) > 0.9
        )
        sent = bodies[u.client_id]
        assert len(sent) == 4  # keys, shares, masked input, reveal: nothing else
        # the update's own values appear in no body, neither as float32 nor as float64
        for raw in (vals.numpy().tobytes()[:64], vals.double().numpy().tobytes()[:64]):
            assert all(raw not in b for b in sent)
        masked = msg.decode_masked(sent[2], spec.length)  # the third body: the masked input
        view = spec.fixed.decode(masked.y)[: cfg.n_items * cfg.factor].reshape(cfg.n_items, -1)
        pos = np.unique(SPLIT.user_train(u.client_id))
        scores.append(precision(sign_attack(items, view), pos))
        chance.append(len(pos) / cfg.n_items)
    assert np.mean(scores) < 2 * np.mean(chance) + 0.02, (np.mean(scores), np.mean(chance))


def test_malformed_bodies_are_refused(recorded) -> None:  # type: ignore[no-untyped-def]
    spec, _, _, bodies, _ = recorded
    keys, shares, masked, reveal = bodies[spec.cohort[0]]
    bad = [
        (msg.decode_keys, keys[:-5]),
        (msg.decode_keys, shares),  # another kind
        (msg.decode_keys, keys.replace(b'"c_pk": "', b'"c_pk": "!!')),
        (msg.decode_shares, b"[]"),
        (msg.decode_reveal, reveal.replace(b'"client_id": ', b'"client_id": -')),
        (lambda b: msg.decode_masked(b, spec.length), masked[:100]),
        (lambda b: msg.decode_masked(b, spec.length + 1), masked),
        (msg.decode_keys, b"[" * 100_000 + b"]" * 100_000),  # too deep for the parser
        (msg.decode_keys, keys.replace(b'"client_id": ', b'"client_id": 1e400, "x": ')),
    ]
    for decode, body in bad:
        with pytest.raises(msg.MessageError):
            decode(body)


def test_a_replayed_or_foreign_message_is_refused_by_the_server(recorded) -> None:  # type: ignore[no-untyped-def]
    spec, *_ = recorded
    server = Server(spec)
    c = Client(spec, spec.cohort[0])
    body = msg.encode_keys(c.advertise())
    server.add_keys(msg.decode_keys(body))
    with pytest.raises(ValueError):
        server.add_keys(msg.decode_keys(body))
    with pytest.raises(RoundFailed):
        server.unmask([])


def test_a_masked_input_with_a_header_over_the_limit_is_refused_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The masked input is a safetensors body of up to the upload limit: its header is bounded
    as every upload's is (fedrecgel.wire.MAX_HEADER_BYTES), not parsed whatever its size."""
    from fedrecgel import wire

    monkeypatch.setattr(wire, "MAX_HEADER_BYTES", 1024)
    header = b'{"x":[' + b"[]," * 400 + b"[]]}"
    header += b" " * (-len(header) % 8)
    with pytest.raises(msg.MessageError, match="over the limit"):
        msg.decode_masked(len(header).to_bytes(8, "little") + header, 4)


def test_a_batch_of_masked_inputs_frames_each_clients_message() -> None:
    ones = {u: msg.encode_masked(Masked(u, np.full(5, u, dtype=np.uint64))) for u in (3, 1, 7)}
    body = msg.encode_masked_batch(list(ones.items()))
    assert msg.is_masked_batch(body) and not msg.is_masked_batch(ones[3])
    assert msg.split_masked_batch(body, 3) == list(ones.items())
    assert [msg.decode_masked(b, 5).client_id for _, b in msg.split_masked_batch(body, 3)] == [
        3,
        1,
        7,
    ]
    twice = msg.encode_masked_batch([(3, ones[3]), (3, ones[3])])
    for bad, most in [
        (body, 2),  # more clients than the caller may send
        (body[:-1], 3),
        (body + b"\x00", 3),
        (msg.BATCH_MAGIC + (0).to_bytes(4, "little"), 3),
        (msg.BATCH_MAGIC, 3),
        (twice, 3),
        (ones[3], 3),  # a single message is not a batch
    ]:
        with pytest.raises(msg.MessageError):
            msg.split_masked_batch(bad, most)
    with pytest.raises(msg.MessageError):
        msg.encode_masked_batch([])
