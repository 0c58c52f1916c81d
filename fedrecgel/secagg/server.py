"""The server side of a secure-aggregation round (:mod:`fedrecgel.secagg.protocol`): it routes
the clients' messages, and at the end removes the masks and decodes the sum of the survivors'
inputs. It never sees an unmasked single input: each y it holds is masked by the client's self
mask, whose seed it may only recover for clients it declared surviving (and then it never
receives their ``s_sk`` shares)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from fedrecgel.secagg import crypto, shamir
from fedrecgel.secagg.protocol import (
    Keys,
    Masked,
    Reveal,
    RoundFailed,
    RoundSpec,
    Shares,
    _sign,
)


@dataclass
class Outcome:
    """A closed round: the sum of the survivors' inputs (decoded) and who took part."""

    total: np.ndarray  # float64 (length,)
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    bad_shares: dict[int, int] = field(default_factory=dict)  # revealer -> shares refused
    complaints: dict[int, tuple[int, ...]] = field(default_factory=dict)


class Server:
    """Collects one round's messages and unmasks the sum."""

    def __init__(self, spec: RoundSpec) -> None:
        self.spec = spec
        self.keys: dict[int, Keys] = {}
        self.shares: dict[int, Shares] = {}
        self.arrived: dict[int, tuple[int, ...]] = {}  # client -> its complaints
        self._total = np.zeros(spec.length, dtype=spec.fixed.dtype)  # running sum of the y's

    @classmethod
    def restore(
        cls,
        spec: RoundSpec,
        keys: Mapping[int, Keys],
        shares: Mapping[int, Shares],
        arrived: Mapping[int, tuple[int, ...]],
        total: np.ndarray,
    ) -> Server:
        """A server rebuilt from what a transport stored (the keys and shares as accepted, who
        sent a masked input with its complaints, and the running sum of those inputs)."""
        server = cls(spec)
        server.keys = dict(keys)
        server.shares = dict(shares)
        server.arrived = dict(arrived)
        t = np.asarray(total)
        if t.dtype != spec.fixed.dtype or t.shape != (spec.length,):
            raise ValueError(f"running sum must be {spec.fixed.dtype.__name__} ({spec.length},)")
        server._total = t.copy()
        return server

    # step 0 -> 1
    def add_keys(self, msg: Keys) -> None:
        """Keep a client's public keys (one set per client; distinct keys)."""
        if msg.client_id not in self.spec.cohort:
            raise ValueError(f"client {msg.client_id} is not in the cohort")
        if msg.client_id in self.keys:
            raise ValueError(f"client {msg.client_id} already advertised keys")
        if len(msg.c_pk) != 32 or len(msg.s_pk) != 32 or msg.c_pk == msg.s_pk:
            raise ValueError("keys must be two distinct 32-byte X25519 public keys")
        self.keys[msg.client_id] = msg

    def keys_for(self, u: int) -> dict[int, Keys]:
        """The keys forwarded to ``u``: those of its neighbours that advertised."""
        return {v: self.keys[v] for v in self.spec.neighbours_of(u) if v in self.keys}

    # step 1 -> 2
    def add_shares(self, msg: Shares) -> None:
        """Keep a client's encrypted shares and commitments."""
        u = msg.client_id
        if u not in self.keys or u in self.shares:
            raise ValueError(f"client {u} did not advertise keys, or already shared")
        nbrs = set(self.spec.neighbours_of(u))
        if set(msg.sealed) - nbrs or set(msg.sealed) != set(msg.share_commits):
            raise ValueError(f"client {u}: shares addressed outside its neighbourhood")
        self.shares[u] = msg

    def shares_for(self, u: int) -> dict[int, Shares]:
        """The step-1 messages forwarded to ``u``: its neighbours' that address it."""
        return {v: m for v, m in self.shares.items() if u in m.sealed}

    # step 2 -> 3
    def add_masked(self, msg: Masked) -> None:
        """Keep a client's masked vector."""
        u = msg.client_id
        if u not in self.shares or u in self.arrived:
            raise ValueError(f"client {u} did not share, or already sent its input")
        y = np.asarray(msg.y)
        if y.dtype != self.spec.fixed.dtype or y.shape != (self.spec.length,):
            word = self.spec.fixed.dtype.__name__
            raise ValueError(f"client {u}: masked vector must be {word} ({self.spec.length},)")
        self._total += y  # only the sum is kept
        self.arrived[u] = msg.complaints

    def survivors(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(survivors: input arrived, dropped: shared but no input)."""
        alive = tuple(sorted(self.arrived))
        gone = tuple(sorted(set(self.shares) - set(self.arrived)))
        return alive, gone

    # step 3 -> sum
    def unmask(self, reveals: Iterable[Reveal]) -> Outcome:
        """Remove the masks with the revealed shares and decode the survivors' sum;
        :class:`RoundFailed` when a needed secret cannot be recovered and checked."""
        alive, gone = self.survivors()
        if len(alive) < 2:
            raise RoundFailed(f"{len(alive)} masked inputs: a sum of fewer than 2 is no secret")
        r = self.spec.round_id
        b_sh: dict[int, dict[int, int]] = {u: {} for u in alive}
        s_sh: dict[int, dict[int, int]] = {v: {} for v in gone}
        bad: dict[int, int] = {}
        for rv in reveals:
            w = rv.client_id
            for kind, got, into in (("b", rv.b_shares, b_sh), ("s", rv.s_shares, s_sh)):
                for owner, yb in got.items():
                    dealt = self.shares.get(owner)
                    commits = dealt.share_commits.get(w) if dealt else None
                    idx = 0 if kind == "s" else 1
                    ok = (
                        owner in into
                        and commits is not None
                        and commits[idx] == crypto.commit(kind, r, owner, w, yb)
                    )
                    if not ok:
                        bad[w] = bad.get(w, 0) + 1
                        continue
                    into[owner][w + 1] = shamir.from_bytes(yb)
        total = self._total.copy()
        for u in alive:
            seed = self._recover(u, b_sh[u])
            if crypto.commit("seed", r, u, seed) != self.shares[u].b_commit:
                raise RoundFailed(f"client {u}: recovered self-mask seed fails its commitment")
            crypto.mask_into(total, crypto.derive(seed, "self", r, u, u), subtract=True)
        for v in gone:
            sk_bytes = self._recover(v, s_sh[v])
            try:
                sk = crypto.private_from_bytes(sk_bytes)
            except ValueError:
                raise RoundFailed(f"client {v}: recovered key is malformed") from None
            if crypto.public_bytes(sk) != self.keys[v].s_pk:
                raise RoundFailed(f"client {v}: recovered key does not match its public key")
            for u in alive:
                if v not in self.shares[u].sealed or u not in self.shares[v].sealed:
                    # not mask partners (not neighbours, or one had no keys of the other)
                    continue
                key = crypto.agree(sk, self.keys[u].s_pk, "mask", r, u, v)
                # u added sign(u, v) * PRG(key): take it out
                crypto.mask_into(total, key, subtract=_sign(u, v) > 0)
        return Outcome(
            total=self.spec.fixed.decode(total),
            survivors=alive,
            dropped=gone,
            bad_shares=bad,
            complaints={u: c for u, c in self.arrived.items() if c},
        )

    def _recover(self, owner: int, shares: Mapping[int, int]) -> bytes:
        t = self.spec.threshold(owner)
        if len(shares) < t:
            raise RoundFailed(f"client {owner}: {len(shares)} valid shares, {t} needed")
        try:
            return shamir.combine(dict(shares), t)
        except ValueError as err:
            raise RoundFailed(f"client {owner}: {err}") from None
