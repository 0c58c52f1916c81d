"""The secure-aggregation protocol: the client and server sides of one round, transport-free.

It follows the SecAgg protocol of Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning" (CCS 2017), in its honest-but-curious variant (rounds 0-2
and 4; the consistency check of round 3 and the signatures, which only matter against an active
server, are left out), with the sparse neighbourhood graph of SecAgg+ (Bell et al., "Secure
Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020): each client masks with
and secret-shares to its neighbours only (``RoundSpec.neighbours``; 0 = every pair, the
original protocol).

Round (messages go through the server, which only routes them):

0. **advertise**: each client sends two fresh X25519 public keys, ``c_pk`` (to encrypt shares)
   and ``s_pk`` (to agree pairwise mask seeds).
1. **share**: each client draws a self-mask seed ``b``, splits ``b`` and its ``s_sk`` into
   t-of-deg Shamir shares (:mod:`.shamir`) for its neighbours, encrypts each neighbour's pair
   of shares with AES-GCM under the X25519 key agreed with that neighbour's ``c_pk`` (the
   context binds round, sender and receiver), and publishes a SHA-256 commitment to every
   share and to ``b``.
2. **masked input**: each client decrypts (and checks against the commitments) the shares it
   received, then sends y = x + PRG(b) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)
   (mod 2^w, the ring's word size: 64 bits, or fewer, :mod:`fedrecgel.fixedpoint`) over its
   neighbours v that took part in step 1.
3. **unmask**: the server names the survivors (whose y arrived) and the dropped; each
   responding client reveals its share of ``b_u`` for every surviving neighbour and of
   ``s_sk_v`` for every dropped one, never both for the same client. The server keeps the
   shares that match their commitments, recovers each secret from t of them, checks it (the
   public key of a recovered ``s_sk`` must be the advertised ``s_pk``; a recovered ``b`` must
   match its commitment), removes the masks, and decodes the sum.

Threat model (what holds): an honest-but-curious server, colluding with fewer than t of a
client's neighbours, learns nothing about that client's input beyond the sum of the survivors'
inputs; clients that drop out at any step after step 1 are tolerated while every secret still
has t live holders. A malformed share (bad ciphertext, or a revealed value that does not match
its commitment) is detected and left out; a secret that cannot be recovered from t valid
shares aborts the round (:class:`RoundFailed`), so the server never outputs a wrong sum. What an
active server could do: with no public-key infrastructure it could substitute keys
(man-in-the-middle) or claim different survivor sets to different clients (the consistency
check of the paper's round 3 addresses the latter), and so learn a single client's input;
this implementation does not defend against that.

Sparse secure aggregation (:func:`fedrecgel.secagg.aggregate.secure_sparse_mean`) runs two
instances of this protocol a round, each with its own :class:`Client` objects (fresh mask keys,
seeds and shares; one share-encryption key for both, see :class:`Client`); the first reveals,
as its sum, how many surviving clients hold each item outside the round's public negative
pool: that per-item count is an aggregate the server learns on top of the sum of the updates.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedrecgel.fixedpoint import FixedPoint
from fedrecgel.secagg import crypto, shamir


class RoundFailed(RuntimeError):
    """The round cannot close correctly (too many dropouts or bad shares): no sum is output."""


@dataclass(frozen=True)
class RoundSpec:
    """The public parameters of one secure-aggregation round.

    cohort:      the selected client ids
    neighbours:  SecAgg+ half-degree k (each client pairs with k clients on either side of it
                 in a ring ordered by a public per-round permutation); 0 = every pair
    dropout:     the fraction of a client's neighbours that may drop out (threshold
                 t = deg - floor(dropout * deg), always more than half of deg)
    instance:    which of a round's protocol instances this is ("a", or "b" for the update
                 instance of a sparse round): bound into the keys and contexts of the shares
    """

    round_id: int
    cohort: tuple[int, ...]
    length: int
    fixed: FixedPoint
    neighbours: int
    dropout: float
    graph_seed: int
    instance: str = "a"

    def __post_init__(self) -> None:
        if len(set(self.cohort)) != len(self.cohort) or len(self.cohort) < 2:
            raise ValueError("a secure-aggregation cohort needs at least two distinct clients")
        if not 0.0 <= self.dropout < 0.5:
            raise ValueError("dropout must be in [0, 0.5)")
        if self.length < 1:
            raise ValueError("length must be positive")
        self.fixed.check_cohort(len(self.cohort))

    @cached_property
    def _ring(self) -> tuple[list[int], dict[int, int]]:
        """The public ring order of the cohort, and each client's place in it (drawn once per
        spec: the server and each client ask it for every client's neighbours)."""
        rng = np.random.default_rng([self.graph_seed, self.round_id, 0x5EC])
        ring = [int(c) for c in rng.permutation(sorted(self.cohort))]
        return ring, {c: i for i, c in enumerate(ring)}

    def neighbours_of(self, u: int) -> tuple[int, ...]:
        """The clients ``u`` masks with and shares to (sorted; symmetric relation)."""
        n = len(self.cohort)
        k = self.neighbours
        if k == 0 or 2 * k >= n - 1:
            return tuple(sorted(c for c in self.cohort if c != u))
        ring, place = self._ring
        if u not in place:
            raise ValueError(f"{u} is not in the cohort")
        i = place[u]
        return tuple(sorted({ring[(i + d) % n] for d in range(-k, k + 1) if d}))

    def threshold(self, u: int) -> int:
        """Shares needed to recover ``u``'s secrets."""
        deg = len(self.neighbours_of(u))
        return max(1, deg - math.floor(self.dropout * deg))


# ------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Keys:
    """Step 0: a client's two public keys."""

    client_id: int
    c_pk: bytes
    s_pk: bytes


@dataclass(frozen=True)
class Shares:
    """Step 1: encrypted shares for each neighbour, and the public commitments."""

    client_id: int
    sealed: dict[int, bytes]  # receiver -> AES-GCM(share of s_sk || share of b)
    share_commits: dict[int, tuple[bytes, bytes]]  # receiver -> (commit s share, commit b share)
    b_commit: bytes


@dataclass(frozen=True)
class Masked:
    """Step 2: the masked vector, and the senders whose shares did not check out."""

    client_id: int
    y: np.ndarray  # words of the round's ring, uint64 by default (length,)
    complaints: tuple[int, ...] = ()


@dataclass(frozen=True)
class Reveal:
    """Step 3: a client's shares of surviving neighbours' ``b`` and dropped ones' ``s_sk``."""

    client_id: int
    b_shares: dict[int, bytes]  # owner -> share value
    s_shares: dict[int, bytes]


def _sign(u: int, v: int) -> int:
    """+1 when u adds PRG(s_uv), -1 when it subtracts it (the two cancel in the sum)."""
    return 1 if u < v else -1


def _share_context(spec: RoundSpec, sender: int, receiver: int) -> bytes:
    return f"shares|{spec.instance}|{spec.round_id}|{sender}|{receiver}".encode()


# --------------------------------------------------------------------------------- client


class Client:
    """One client's side of a round (fresh keys; nothing is reused across rounds).

    ``pair``: the same client's :class:`Client` in the round's other instance (sparse rounds):
    the two use one key pair to encrypt shares (its private key is never revealed, so sharing
    it exposes nothing; each X25519 agreement with a neighbour is taken once for both, and the
    share keys are derived apart, per instance). The mask key pair and the self-mask seed are
    each instance's own: a survivor's seed revealed in one instance and its mask key, dropped,
    in the other must never open the same masked input."""

    spec: RoundSpec
    id: int
    _c_sk: X25519PrivateKey
    _c_secrets: dict[bytes, bytes]

    def __init__(self, spec: RoundSpec, client_id: int, pair: Client | None = None) -> None:
        if client_id not in spec.cohort:
            raise ValueError(f"client {client_id} is not in the cohort")
        if pair is not None and (
            pair.id != client_id
            or pair.spec.round_id != spec.round_id
            or pair.spec.instance == spec.instance
        ):
            raise ValueError("a pair is the same client's client in the round's other instance")
        self.spec = spec
        self.id = client_id
        self.nbrs = spec.neighbours_of(client_id)
        self.t = spec.threshold(client_id)
        self._c_sk = crypto.new_private_key() if pair is None else pair._c_sk
        #: neighbour's share-encryption public key -> the X25519 secret with it (shared with
        #: ``pair``: agreed once for both instances)
        self._c_secrets = {} if pair is None else pair._c_secrets
        self._s_sk = crypto.new_private_key()
        self._b = os.urandom(32)
        self._keys: dict[int, Keys] = {}
        #: neighbour -> the key of the shares between the two (the same both ways: sealed
        #: to it at step 1, opened from it at step 2), agreed once
        self._share_keys: dict[int, bytes] = {}
        self._held: dict[int, tuple[int, int]] = {}  # owner -> (s share, b share)
        self._partners: tuple[int, ...] = ()
        self.clipped = 0

    def respec(self, spec: RoundSpec) -> None:
        """Take the round's final public parameters before step 2: the update instance of a
        sparse round over HTTP deals its shares before its layout (the union) is known. Only
        the length and encoding may change (ValueError otherwise)."""

        def fixed(s: RoundSpec) -> tuple[object, ...]:
            return (s.round_id, s.cohort, s.neighbours, s.dropout, s.graph_seed, s.instance)

        if fixed(spec) != fixed(self.spec):
            raise ValueError("a round's cohort and neighbour graph cannot change")
        self.spec = spec

    def advertise(self) -> Keys:
        """Step 0."""
        return Keys(self.id, crypto.public_bytes(self._c_sk), crypto.public_bytes(self._s_sk))

    def share(self, keys: Mapping[int, Keys]) -> Shares:
        """Step 1, given the keys the server forwards (those of the neighbours that sent
        theirs); refuses with :class:`RoundFailed` when fewer than t neighbours are left."""
        live = [v for v in self.nbrs if v in keys and keys[v].client_id == v]
        if len(live) < self.t:
            raise RoundFailed(f"client {self.id}: {len(live)} neighbours left, {self.t} needed")
        self._keys = {v: keys[v] for v in live}
        xs = [v + 1 for v in live]
        s_sh = shamir.split(crypto.private_bytes(self._s_sk), xs, self.t)
        b_sh = shamir.split(self._b, xs, self.t)
        sealed, commits = {}, {}
        r = self.spec.round_id
        for v in live:
            ys, yb = shamir.to_bytes(s_sh[v + 1]), shamir.to_bytes(b_sh[v + 1])
            key = self._share_key(v)
            sealed[v] = crypto.seal(key, ys + yb, _share_context(self.spec, self.id, v))
            commits[v] = (
                crypto.commit("s", r, self.id, v, ys),
                crypto.commit("b", r, self.id, v, yb),
            )
        return Shares(self.id, sealed, commits, crypto.commit("seed", r, self.id, self._b))

    def _share_key(self, v: int) -> bytes:
        """The key of this instance's shares between this client and neighbour ``v`` (X25519
        of the two c keys, then HKDF over the instance and the ordered pair: the same whichever
        of the two derives it)."""
        if v not in self._share_keys:
            peer = self._keys[v].c_pk
            raw = self._c_secrets.get(peer)
            if raw is None:
                raw = self._c_secrets[peer] = crypto.exchange(self._c_sk, peer)
            purpose = f"shares-{self.spec.instance}"
            self._share_keys[v] = crypto.pair_key(raw, purpose, self.spec.round_id, self.id, v)
        return self._share_keys[v]

    def masked(self, x: np.ndarray, received: Mapping[int, Shares]) -> Masked:
        """Step 2: store the shares addressed to this client (``received``: the step-1
        messages of the neighbours that sent one), then mask ``x``."""
        r = self.spec.round_id
        complaints = []
        partners = []
        for v in self.nbrs:
            msg = received.get(v)
            if msg is None or v not in self._keys or self.id not in msg.sealed:
                continue
            partners.append(v)  # v shared its keys: its pairwise mask is in the sum
            try:
                key = self._share_key(v)
                context = _share_context(self.spec, v, self.id)
                plain = crypto.open_sealed(key, msg.sealed[self.id], context)
                ys, yb = plain[: shamir.SHARE_BYTES], plain[shamir.SHARE_BYTES :]
                if msg.share_commits.get(self.id) != (
                    crypto.commit("s", r, v, self.id, ys),
                    crypto.commit("b", r, v, self.id, yb),
                ):
                    raise crypto.DecryptError("share does not match its commitment")
                self._held[v] = (shamir.from_bytes(ys), shamir.from_bytes(yb))
            except (crypto.DecryptError, ValueError):
                complaints.append(v)
        if len(partners) < self.t:
            raise RoundFailed(f"client {self.id}: {len(partners)} partners, {self.t} needed")
        self._partners = tuple(partners)
        words, self.clipped = self.spec.fixed.encode(x)
        if len(words) != self.spec.length:
            raise ValueError(f"input has {len(words)} values, the round {self.spec.length}")
        y = words  # encode's own fresh array: masked in place from here
        crypto.mask_into(y, crypto.derive(self._b, "self", r, self.id, self.id))
        for v in partners:
            key = crypto.agree(self._s_sk, self._keys[v].s_pk, "mask", r, self.id, v)
            crypto.mask_into(y, key, subtract=_sign(self.id, v) < 0)
        return Masked(self.id, y, tuple(complaints))

    def reveal(self, survivors: Iterable[int], dropped: Iterable[int]) -> Reveal:
        """Step 3: shares of survivors' ``b`` and dropped clients' ``s_sk`` (refuses a request
        that names a client in both sets, or fewer than t surviving neighbours)."""
        alive, gone = set(survivors), set(dropped)
        if alive & gone:
            raise RoundFailed("the server named a client both surviving and dropped")
        if len(alive) < self.t:
            raise RoundFailed(f"client {self.id}: {len(alive)} survivors, {self.t} needed")
        b = {u: shamir.to_bytes(sh[1]) for u, sh in self._held.items() if u in alive}
        s = {v: shamir.to_bytes(sh[0]) for v, sh in self._held.items() if v in gone}
        return Reveal(self.id, b, s)
