"""The secure-aggregation library (fedrecgel/secagg): the fixed-point ring and its overflow
bound, Shamir sharing, and the protocol round with dropouts and malformed shares."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedrecgel.config import DEFAULTS
from fedrecgel.fixedpoint import FixedPoint, OverflowRefused
from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.secagg import crypto, shamir
from fedrecgel.secagg.layout import flatten, unflatten, vector_length
from fedrecgel.secagg.local import Faults, secure_sum
from fedrecgel.secagg.protocol import Client, RoundFailed, RoundSpec
from fedrecgel.secagg.server import Server
from fedrecgel.uploads import Update

COHORT = tuple(range(3, 3 + 2 * 12, 2))  # 12 clients, non-contiguous ids
LENGTH = 500


FP = DEFAULTS.secagg_fixed_point()


def make(
    round_id: int,
    cohort: tuple[int, ...] = COHORT,
    *,
    length: int = LENGTH,
    fixed: FixedPoint = FP,
    neighbours: int = 0,
    dropout: float = DEFAULTS.secagg_dropout,
    graph_seed: int = 0,
) -> RoundSpec:
    return RoundSpec(round_id, cohort, length, fixed, neighbours, dropout, graph_seed)


def inputs(seed: int = 0, cohort: tuple[int, ...] = COHORT) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {u: rng.normal(0.0, 0.5, LENGTH) for u in cohort}


def plain_sum(x: dict[int, np.ndarray], who: tuple[int, ...] | None = None) -> np.ndarray:
    return sum(v for u, v in x.items() if who is None or u in who)  # type: ignore[return-value]


# ------------------------------------------------------------------------------- encoding


def test_fixed_point_round_trip_is_within_half_a_step_and_clips_out_of_range() -> None:
    fp = FixedPoint(range_=2.0, scale_bits=20)
    x = np.array([0.0, 1e-7, -1.5, 1.999999, 3.0, -7.0])
    words, clipped = fp.encode(x)
    assert words.dtype == np.uint64 and clipped == 2
    back = fp.decode(words)
    assert np.abs(back[:4] - x[:4]).max() <= fp.step / 2
    assert back[4] == 2.0 and back[5] == -2.0
    with pytest.raises(OverflowRefused):
        fp.encode(x, refuse=True)
    with pytest.raises(OverflowRefused):
        fp.encode(np.array([np.nan]))


def test_the_cohort_bound_is_exactly_where_the_sum_would_wrap() -> None:
    fp = FixedPoint(range_=1.0, scale_bits=60)  # one value is 2^60: 7 fit below 2^63
    assert fp.max_cohort() == 7
    words, _ = fp.encode(np.ones(1))
    total = np.zeros(1, dtype=np.uint64)
    for _ in range(7):
        total += words
    assert fp.decode(total)[0] == 7.0  # no wrap at the bound
    total += words
    assert fp.decode(total)[0] < 0  # one more would wrap: what check_cohort refuses
    fp.check_cohort(7)
    with pytest.raises(OverflowRefused):
        fp.check_cohort(8)
    with pytest.raises(OverflowRefused):
        make(1, tuple(range(8)), length=4, fixed=fp)


# --------------------------------------------------------------------------------- shamir


def test_any_threshold_shares_recover_the_secret_and_fewer_do_not() -> None:
    secret = b"\x00\x01" + bytes(range(30))  # leading zero byte kept
    xs = [4, 9, 10, 22, 31]
    shares = shamir.split(secret, xs, 3)
    for subset in itertools.combinations(xs, 3):
        assert shamir.combine({x: shares[x] for x in subset}, 3) == secret
    two = {x: shares[x] for x in xs[:2]}
    with pytest.raises(shamir.NotEnoughShares):
        shamir.combine(two, 3)
    # interpolating t-1 shares as if they were enough gives something else (or garbage)
    try:
        wrong = shamir.combine(two, 2)
    except ValueError:
        wrong = None
    assert wrong != secret


def test_a_tampered_share_changes_the_interpolation() -> None:
    secret = bytes(range(32))
    shares = shamir.split(secret, [1, 2, 3], 3)
    shares[2] = (shares[2] + 1) % shamir.PRIME
    try:
        got = shamir.combine(shares, 3)
    except ValueError:
        got = None
    assert got != secret


# ------------------------------------------------------------------------------- protocol


@pytest.mark.parametrize("neighbours", [0, 2])
def test_the_secure_sum_is_the_plain_sum_within_the_step(neighbours: int) -> None:
    x = inputs()
    spec = make(7, COHORT, neighbours=neighbours, graph_seed=3)
    r = secure_sum(spec, x)
    step = spec.fixed.step
    assert np.abs(r.outcome.total - plain_sum(x)).max() <= len(COHORT) * step / 2
    assert r.outcome.survivors == COHORT and r.outcome.dropped == ()


def test_the_neighbourhood_graph_is_symmetric_and_sparse() -> None:
    spec = make(7, COHORT, neighbours=2, graph_seed=3)
    for u in COHORT:
        nb = spec.neighbours_of(u)
        assert len(nb) == 4 and u not in nb
        assert all(u in spec.neighbours_of(v) for v in nb)
        assert spec.threshold(u) == 4 - int(0.3 * 4) == 3


@pytest.mark.parametrize("neighbours", [0, 3])
def test_dropouts_before_and_after_masking_still_give_the_survivors_sum(neighbours: int) -> None:
    x = inputs(1)
    spec = make(2, COHORT, neighbours=neighbours, dropout=0.4, graph_seed=1)
    faults = Faults(
        no_keys=frozenset({COHORT[0]}),
        no_input=frozenset({COHORT[5]}),  # shared its keys, never masked: its masks removed
        no_reveal=frozenset({COHORT[8]}),  # sent its masked vector, then vanished
    )
    r = secure_sum(spec, x, faults)
    alive = tuple(u for u in COHORT if u not in (COHORT[0], COHORT[5]))
    assert r.outcome.survivors == alive and r.outcome.dropped == (COHORT[5],)
    assert np.abs(r.outcome.total - plain_sum(x, alive)).max() <= len(alive) * spec.fixed.step


def test_too_many_dropouts_fail_the_round_instead_of_giving_a_wrong_sum() -> None:
    spec = make(2, COHORT, neighbours=0, dropout=0.2)
    # t = 11 - 2 = 9 of each client's 11 neighbours: 4 silent revealers leave 8
    faults = Faults(no_reveal=frozenset(COHORT[:4]))
    with pytest.raises(RoundFailed, match="valid shares"):
        secure_sum(spec, inputs(), faults)


def test_unmasking_with_fewer_than_the_threshold_of_shares_fails() -> None:
    """The server holding every masked vector and t-1 shares of each seed learns nothing:
    it cannot unmask, and what it holds of one client is not that client's input."""
    x = inputs(2)
    spec = make(4, COHORT, neighbours=0)
    server = Server(spec)
    clients = {u: Client(spec, u) for u in COHORT}
    for u in COHORT:
        server.add_keys(clients[u].advertise())
    for u in COHORT:
        server.add_shares(clients[u].share(server.keys_for(u)))
    sent = {u: clients[u].masked(x[u], server.shares_for(u)) for u in COHORT}
    for m in sent.values():
        server.add_masked(m)
    alive, gone = server.survivors()
    t = spec.threshold(COHORT[0])
    # t - 1 clients other than the first reveal: t - 1 shares of the first client's seed
    reveals = [clients[u].reveal(alive, gone) for u in COHORT[1:t]]
    with pytest.raises(RoundFailed, match=f"client {COHORT[0]}: {t - 1} valid shares, {t} needed"):
        server.unmask(reveals)
    # the best it can do with one masked vector: decode it as it is -> noise, not the input
    y = spec.fixed.decode(sent[COHORT[0]].y)
    assert abs(np.corrcoef(y, x[COHORT[0]])[0, 1]) < 0.2
    # with every client's shares it closes (the same masked vectors)
    reveals += [clients[u].reveal(alive, gone) for u in (COHORT[0], *COHORT[t:])]
    out = server.unmask(reveals)
    assert np.abs(out.total - plain_sum(x)).max() <= len(COHORT) * spec.fixed.step


def test_malformed_revealed_shares_are_detected_and_the_round_still_closes() -> None:
    x = inputs(3)
    spec = make(5, COHORT, neighbours=0, dropout=0.3)
    faults = Faults(no_input=frozenset({COHORT[2]}), bad_reveal=frozenset({COHORT[7]}))
    r = secure_sum(spec, x, faults)
    # every share it revealed: 10 surviving neighbours' seeds and the dropped one's key
    assert r.outcome.bad_shares == {COHORT[7]: len(COHORT) - 1}
    alive = tuple(u for u in COHORT if u != COHORT[2])
    assert np.abs(r.outcome.total - plain_sum(x, alive)).max() <= len(alive) * spec.fixed.step


def test_too_many_malformed_shares_fail_the_round_never_a_wrong_sum() -> None:
    spec = make(5, COHORT, neighbours=0, dropout=0.2)
    with pytest.raises(RoundFailed):
        secure_sum(spec, inputs(), Faults(bad_reveal=frozenset(COHORT[:4])))


def test_a_corrupted_share_ciphertext_is_refused_by_its_receiver() -> None:
    x = inputs(4)
    spec = make(6, COHORT, neighbours=0)
    sender, receiver = COHORT[1], COHORT[6]
    r = secure_sum(spec, x, Faults(bad_seal=frozenset({(sender, receiver)})))
    assert r.outcome.complaints == {receiver: (sender,)}
    assert np.abs(r.outcome.total - plain_sum(x)).max() <= len(COHORT) * spec.fixed.step


def test_a_client_never_reveals_both_secrets_of_one_client() -> None:
    spec = make(6, COHORT[:4])
    server = Server(spec)
    clients = {u: Client(spec, u) for u in spec.cohort}
    for u in spec.cohort:
        server.add_keys(clients[u].advertise())
    for u in spec.cohort:
        server.add_shares(clients[u].share(server.keys_for(u)))
    c = clients[spec.cohort[0]]
    c.masked(np.zeros(LENGTH), server.shares_for(c.id))
    with pytest.raises(RoundFailed, match="both"):
        c.reveal(spec.cohort, [spec.cohort[1]])


def test_a_clients_two_instances_share_the_encryption_key_only_and_keep_their_shares_apart() -> (
    None
):
    """A sparse round's B client takes its A client's share-encryption key (one X25519
    agreement a neighbour for both) but a mask key and seed of its own; a share message of A
    routed to B does not open there (the share keys and contexts are each instance's)."""
    spec_a = make(7, COHORT[:5])
    spec_b = replace(spec_a, instance="b")
    a = {u: Client(spec_a, u) for u in spec_a.cohort}
    b = {u: Client(spec_b, u, a[u]) for u in spec_b.cohort}
    for u in spec_a.cohort:
        ka, kb = a[u].advertise(), b[u].advertise()
        assert ka.c_pk == kb.c_pk and ka.s_pk != kb.s_pk
    with pytest.raises(ValueError, match="other instance"):
        Client(spec_a, COHORT[0], a[COHORT[0]])  # a pair is from the other instance
    with pytest.raises(ValueError, match="other instance"):
        Client(spec_b, COHORT[0], a[COHORT[1]])  # and the same client
    servers = {"a": Server(spec_a), "b": Server(spec_b)}
    for inst, clients in (("a", a), ("b", b)):
        for c in clients.values():
            servers[inst].add_keys(c.advertise())
    for inst, clients in (("a", a), ("b", b)):
        for c in clients.values():
            servers[inst].add_shares(c.share(servers[inst].keys_for(c.id)))
    u = COHORT[0]
    # B's client u handed A's share messages as B's: every one fails to open, a complaint each
    m = b[u].masked(np.zeros(LENGTH), servers["a"].shares_for(u))
    assert set(m.complaints) == set(spec_b.neighbours_of(u))
    # its own instance's open (both instances' sums are checked end to end elsewhere)
    assert a[u].masked(np.zeros(LENGTH), servers["a"].shares_for(u)).complaints == ()


def test_the_server_refuses_malformed_messages() -> None:
    spec = make(6, COHORT[:3])
    server = Server(spec)
    c = Client(spec, COHORT[0])
    server.add_keys(c.advertise())
    with pytest.raises(ValueError):
        server.add_keys(c.advertise())  # twice
    with pytest.raises(ValueError):
        make(6, (1,))  # a sum of one client is no secret


def test_keys_are_fresh_and_the_prg_depends_on_its_key() -> None:
    a, b = crypto.new_private_key(), crypto.new_private_key()
    assert crypto.public_bytes(a) != crypto.public_bytes(b)
    k1 = crypto.agree(a, crypto.public_bytes(b), "mask", 1, 2, 3)
    assert k1 == crypto.agree(b, crypto.public_bytes(a), "mask", 1, 3, 2)
    assert k1 != crypto.agree(a, crypto.public_bytes(b), "mask", 2, 2, 3)
    assert not np.array_equal(crypto.prg_words(k1, 8), crypto.prg_words(bytes(32), 8))
    sealed = crypto.seal(k1, b"share", b"ctx")
    assert crypto.open_sealed(k1, sealed, b"ctx") == b"share"
    with pytest.raises(crypto.DecryptError):
        crypto.open_sealed(k1, sealed, b"other context")


# --------------------------------------------------------------------------------- layout


def test_the_layout_round_trips_an_update() -> None:
    cfg = ModelConfig(n_items=30, factor=4, layers=2)
    shapes = cfg.shared_shapes()
    g = {k: torch.randn_like(v) for k, v in init_shared(cfg, 0).items()}
    idx = torch.tensor([2, 5, 29])
    u = Update(
        client_id=1,
        n_samples=9,
        rows={t: (idx, g[t][idx]) for t in cfg.item_tables()},
        dense={n: g[n] for n in cfg.dense_names()},
        loss=0.25,
    )
    vec = flatten(cfg, u)
    assert vec.shape == (vector_length(cfg),)
    back, loss = unflatten(cfg, vec)
    dense = u.densify(shapes)
    assert loss == 0.25
    for k in shapes:
        torch.testing.assert_close(back[k], dense[k])
