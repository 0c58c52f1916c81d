"""The leak secure aggregation closes: from a plain sparse upload a curious server recovers a
client's positive items by the gradient-sign rule (:mod:`tests.support.sign_attack`); from
everything it receives in a secure-aggregation round, the same attack is at chance, and no
single client's update can be unmasked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedrecgel.data import load_split
from fedrecgel.secagg import crypto
from fedrecgel.secagg.layout import flatten
from fedrecgel.simulate import TrainConfig
from tests.core.secagg_round import first_round
from tests.support.sign_attack import precision, sign_attack

CONFIG = TrainConfig(
    rounds=1, fraction=0.01, secure_aggregation="dense", secagg_neighbours=3, eval_every=0
)


@pytest.fixture(scope="module")
def round_one():  # type: ignore[no-untyped-def]
    """FilmTrust, one round's cohort (15 clients): the plain uploads and what the server
    receives when the same uploads go through secure aggregation."""
    split = load_split("filmtrust")
    sim, uploads, spec, server, clients = first_round(split, CONFIG)
    cfg = sim.model_cfg
    seen: dict[str, list[Any]] = {"keys": [], "shares": [], "masked": [], "reveals": []}
    for u in spec.cohort:
        seen["keys"].append(clients[u].advertise())
        server.add_keys(seen["keys"][-1])
    for u in spec.cohort:
        seen["shares"].append(clients[u].share(server.keys_for(u)))
        server.add_shares(seen["shares"][-1])
    by_id = {u.client_id: u for u in uploads}
    for u in spec.cohort:
        seen["masked"].append(clients[u].masked(flatten(cfg, by_id[u]), server.shares_for(u)))
        server.add_masked(seen["masked"][-1])
    alive, gone = server.survivors()
    seen["reveals"] = [clients[u].reveal(alive, gone) for u in alive]
    outcome = server.unmask(seen["reveals"])
    return split, sim, uploads, spec, server, seen, outcome


def test_the_sign_rule_recovers_positives_from_plain_sparse_uploads(round_one) -> None:  # type: ignore[no-untyped-def]
    split, _, uploads, spec, *_ = round_one
    assert len(uploads) == len(spec.cohort) >= 10
    scores = []
    for u in uploads:
        idx, vals = u.rows["item_gmf"]
        named = sign_attack(idx.numpy(), vals.numpy())
        scores.append(precision(named, split.user_train(u.client_id)))
    print(
        f"plain sparse uploads: sign-rule precision {np.mean(scores):.3f} (min {min(scores):.3f})"
    )
    assert np.mean(scores) >= 0.95 and min(scores) >= 0.8


def _gmf_block(spec_len: int, n_items: int, factor: int, vec: np.ndarray) -> np.ndarray:
    assert vec.shape == (spec_len,)
    return vec[: n_items * factor].reshape(n_items, factor)  # item_gmf comes first


def test_on_what_the_server_sees_the_same_attack_is_at_chance(round_one) -> None:  # type: ignore[no-untyped-def]
    split, sim, _, spec, _, seen, _ = round_one
    cfg = sim.model_cfg
    items = np.arange(cfg.n_items)
    scores, chance = [], []
    for m in seen["masked"]:
        view = _gmf_block(spec.length, cfg.n_items, cfg.factor, spec.fixed.decode(m.y))
        named = sign_attack(items, view)
        pos = np.unique(split.user_train(m.client_id))
        scores.append(precision(named, pos))
        chance.append(len(pos) / cfg.n_items)
        assert len(named) > cfg.n_items // 3  # it names about half the catalogue: noise
    print(f"masked vectors: precision {np.mean(scores):.4f}, chance {np.mean(chance):.4f}")
    assert np.mean(scores) < 2 * np.mean(chance) + 0.01


def test_no_single_update_can_be_unmasked_from_the_servers_messages(round_one) -> None:  # type: ignore[no-untyped-def]
    """The server legitimately recovers each survivor's self-mask seed b_u; y_u - PRG(b_u)
    is still hidden by u's pairwise masks, whose seeds need u's s_sk: the server holds no
    share of it (u survived, so nobody revealed one), and its encrypted shares are AES-GCM
    ciphertexts under keys only u's neighbours can agree."""
    split, sim, uploads, spec, server, seen, outcome = round_one
    cfg = sim.model_cfg
    u = spec.cohort[0]
    assert all(u not in r.s_shares for r in seen["reveals"])
    held = {r.client_id: r.b_shares[u] for r in seen["reveals"] if u in r.b_shares}
    b = server._recover(u, {w + 1: int.from_bytes(y, "big") for w, y in held.items()})
    y = next(m.y for m in seen["masked"] if m.client_id == u)
    rest = y - crypto.prg_words(crypto.derive(b, "self", spec.round_id, u, u), spec.length)
    decoded = spec.fixed.decode(rest)
    x = flatten(cfg, next(up for up in uploads if up.client_id == u))
    assert abs(np.corrcoef(decoded, x)[0, 1]) < 0.05
    named = sign_attack(
        np.arange(cfg.n_items), _gmf_block(spec.length, cfg.n_items, cfg.factor, decoded)
    )
    pos = np.unique(split.user_train(u))
    assert precision(named, pos) < 2 * len(pos) / cfg.n_items + 0.01
    # and what it is meant to learn, it learns: the sum
    total = sum(flatten(cfg, up) for up in uploads)
    assert np.abs(outcome.total - total).max() <= len(uploads) * spec.fixed.step
