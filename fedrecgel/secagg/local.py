"""All clients and the server of a secure-aggregation round in one process: the simulator's
path, and the harness of the protocol tests (:class:`Faults` makes clients drop out or
misbehave at a given step)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from fedrecgel.secagg.protocol import Client, Reveal, RoundFailed, RoundSpec, Shares
from fedrecgel.secagg.server import Outcome, Server


@dataclass(frozen=True)
class Faults:
    """Who misbehaves in a round (client ids).

    no_keys / no_shares / no_input: drop out before step 0 / 1 / 2 (no masked input);
    no_reveal: drops out after sending its masked input;
    bad_seal: (sender, receiver) pairs whose step-1 ciphertext is corrupted;
    bad_reveal: clients that reveal random bytes instead of their shares.
    """

    no_keys: frozenset[int] = frozenset()
    no_shares: frozenset[int] = frozenset()
    no_input: frozenset[int] = frozenset()
    no_reveal: frozenset[int] = frozenset()
    bad_seal: frozenset[tuple[int, int]] = frozenset()
    bad_reveal: frozenset[int] = frozenset()


@dataclass
class LocalRound:
    """The outcome of one in-process round, the masked vectors of the clients asked for in
    ``record`` (what the server saw of them), and how many values were clipped."""

    server: Server
    outcome: Outcome
    masked: dict[int, np.ndarray] = field(default_factory=dict)
    clipped: int = 0
    clients: dict[int, Client] = field(default_factory=dict)


def _corrupt(sh: Shares, receivers: set[int]) -> Shares:
    sealed = {v: (os.urandom(len(c)) if v in receivers else c) for v, c in sh.sealed.items()}
    return replace(sh, sealed=sealed)


def secure_sum(
    spec: RoundSpec,
    inputs: Mapping[int, np.ndarray] | Callable[[int], np.ndarray],
    faults: Faults | None = None,
    pairs: Mapping[int, Client] | None = None,
    record: Iterable[int] = (),
) -> LocalRound:
    """Run one round over ``inputs`` (client id -> float vector, for every cohort member; a
    function is called once per client when it masks, so a cohort's dense inputs need not all
    be in memory at once); ``pairs``: the clients of the round's other instance, whose share
    keys these use (:class:`~fedrecgel.secagg.protocol.Client`);
    :class:`~fedrecgel.secagg.protocol.RoundFailed` when it cannot close."""
    f = faults or Faults()
    get = inputs if callable(inputs) else inputs.__getitem__
    if not callable(inputs) and set(inputs) != set(spec.cohort):
        raise ValueError("one input per cohort member")
    keep = set(record)
    masked: dict[int, np.ndarray] = {}
    server = Server(spec)
    clients = {u: Client(spec, u, (pairs or {}).get(u)) for u in spec.cohort}
    live = [u for u in spec.cohort if u not in f.no_keys]
    for u in live:
        server.add_keys(clients[u].advertise())
    live = [u for u in live if u not in f.no_shares]
    for u in live:
        sh = clients[u].share(server.keys_for(u))
        bad = {v for (s, v) in f.bad_seal if s == u}
        server.add_shares(_corrupt(sh, bad) if bad else sh)
    live = [u for u in live if u not in f.no_input]
    clipped = 0
    for u in live:
        m = clients[u].masked(get(u), server.shares_for(u))
        clipped += clients[u].clipped
        if u in keep:
            masked[u] = m.y.copy()
        server.add_masked(m)
    alive, gone = server.survivors()
    reveals = []
    for u in alive:
        if u in f.no_reveal:
            continue
        rv = clients[u].reveal(alive, gone)
        if u in f.bad_reveal:
            rv = Reveal(
                u,
                {k: os.urandom(len(b)) for k, b in rv.b_shares.items()},
                {k: os.urandom(len(b)) for k, b in rv.s_shares.items()},
            )
        reveals.append(rv)
    outcome = server.unmask(reveals)
    return LocalRound(server, outcome, masked, clipped, clients)


__all__ = ["Faults", "LocalRound", "RoundFailed", "secure_sum"]
