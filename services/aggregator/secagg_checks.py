"""The checks of secure-aggregation messages before they are stored
(:mod:`services.aggregator.secagg`): a body parsed into one message per client and protocol
instance (422 on anything malformed), then each fresh message checked against what the attempt
has stored (422 with the reason; 409 ``not_a_survivor`` for an update-instance input of a
client whose count did not arrive)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedrecgel.secagg import crypto, messages, shamir
from fedrecgel.secagg.protocol import Keys, Masked, Reveal, RoundSpec, Shares
from fedrecgel.wire import WireError, load_json
from services.aggregator.errors import AggregatorError, Conflict, Malformed
from services.aggregator.models import Round
from services.aggregator.secagg_repository import SecAggRepository

#: each step (URL): the protocol instance and the stored step of its messages (the keys and
#: shares of a sparse round carry both instances, tagged)
SLOT = {
    "keys": ("a", "keys"),
    "shares": ("a", "shares"),
    "masked": ("a", "masked"),
    "reveal": ("a", "reveal"),
    "masked_b": ("b", "masked"),
    "reveal_b": ("b", "reveal"),
}
#: the steps whose body is masked vectors (one ``encode_masked``, or a batch of them)
MASKED_STEPS = ("masked", "masked_b")
#: one sealed pair of shares: nonce, two share values, GCM tag
SEALED_BYTES = crypto.NONCE_BYTES + 2 * shamir.SHARE_BYTES + 16


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _json_list(body: bytes, most: int, per: int = 1) -> list[tuple[str, bytes]]:
    """A body of a JSON list of at most ``per`` messages for each of ``most`` clients: each
    one's instance and canonical bytes (a list longer than the caller's clients is refused before its messages are
    serialized again: 600,000 empty objects in a 2 MB body took 2.6 s of CPU before the first
    was refused)."""
    try:
        doc = load_json(body, "the body")
    except WireError:
        raise Malformed("the body is not JSON", "malformed_message") from None
    if not isinstance(doc, list) or not doc:
        raise Malformed("the body is a non-empty JSON list of messages", "malformed_message")
    if len(doc) > most * per:
        each = "one per client" if per == 1 else f"{per} per client"
        raise Malformed(
            f"{len(doc)} messages in one body; {each}, and this token holds {most}",
            "malformed_message",
        )
    return [(messages.instance_of(m), json.dumps(m, sort_keys=True).encode()) for m in doc]


@dataclass(frozen=True)
class Message:
    """One client's message of one step and protocol instance, parsed."""

    client_id: int
    instance: str
    digest: str
    stored: bytes  # what is kept (the message; for a masked input, its complaints)
    parsed: Keys | Shares | Masked | Reveal


def decode(step: str, body: bytes, most: int, both: bool) -> list[Message]:
    """Decode a JSON body of ``step`` (keys, shares, reveals; the masked inputs are
    :mod:`.secagg_masked`'s) of at most ``most`` clients' messages (422 on anything
    malformed); ``both``: the keys and shares carry each client's message of both instances
    (a sparse round), else instance A's only (a reveal: its step's instance)."""
    inst = SLOT[step][0]
    try:
        decoder: Callable[[bytes], Keys | Shares | Reveal] = messages.decode_keys
        if step == "shares":
            decoder = messages.decode_shares
        elif step.startswith("reveal"):
            decoder = messages.decode_reveal
        paired = both and step in ("keys", "shares")
        out = []
        for got, raw in _json_list(body, most, 2 if paired else 1):
            if got != inst and not paired:
                raise messages.MessageError(f"a {step} message of instance {got}")
            parsed = decoder(raw)
            out.append(Message(parsed.client_id, got, _digest(raw), raw, parsed))
    except messages.MessageError as err:
        raise Malformed(f"{step} message: {err}", "malformed_message") from None
    seen = [(m.client_id, m.instance) for m in out]
    if len(set(seen)) != len(seen):
        raise Malformed("one message per client in a body", "malformed_message")
    if paired and {(c, i) for c, _ in seen for i in messages.INSTANCES} != set(seen):
        raise Malformed(
            f"a sparse round's {step} carry each client's message of both protocol instances",
            "malformed_message",
        )
    return out


class Checks:
    """The checks of fresh messages of one instance against what the attempt has stored (422
    on failure; ``spec``: that instance's public parameters, the neighbour graph of both)."""

    def __init__(self, sa: SecAggRepository, rnd: Round, spec: RoundSpec, inst: str) -> None:
        self.sa, self.rnd, self.spec, self.inst = sa, rnd, spec, inst

    def check(self, step: str, parsed: list[Any]) -> None:
        getattr(self, f"_{step}")(parsed)

    def _senders(self, step: str, inst: str | None = None) -> set[int]:
        return set(self.sa.senders(self.rnd.id, step, inst or self.inst))

    def _keys(self, msgs: list[Keys]) -> None:
        for m in msgs:
            if m.c_pk == m.s_pk:
                raise Malformed(
                    f"client {m.client_id}: the two public keys must differ", "malformed_message"
                )

    def _shares(self, msgs: list[Shares]) -> None:
        advertised = self._senders("keys")
        for m in msgs:
            u = m.client_id
            if u not in advertised:
                raise Malformed(f"client {u} sent no keys in this attempt", "malformed_message")
            nbrs = set(self.spec.neighbours_of(u)) & advertised
            to = set(m.sealed)
            if to - nbrs or to != set(m.share_commits):
                raise Malformed(
                    f"client {u}: shares must go to neighbours that advertised keys, each with "
                    "its commitment",
                    "malformed_share",
                )
            if len(to) < self.spec.threshold(u):
                raise Malformed(
                    f"client {u}: {len(to)} shares, the threshold is {self.spec.threshold(u)}",
                    "malformed_share",
                )
            bad = [v for v, c in m.sealed.items() if len(c) != SEALED_BYTES]
            if bad:
                raise Malformed(
                    f"client {u}: sealed shares for {bad[:5]} are not {SEALED_BYTES} bytes",
                    "malformed_share",
                )

    def _masked(self, msgs: list[Masked]) -> None:
        refused = self.masked_refusals(msgs)
        for m in msgs:
            if m.client_id in refused:
                raise refused[m.client_id]

    def masked_refusals(self, msgs: list[Masked]) -> dict[int, AggregatorError]:
        """The masked inputs of ``msgs`` that are refused: client -> the refusal (the others
        pass)."""
        shared = self._senders("shares")
        counted = self._senders("masked", "a") if self.inst == "b" else shared
        out: dict[int, AggregatorError] = {}
        for m in msgs:
            u = m.client_id
            if len(m.y) != self.spec.length:
                out[u] = Malformed(
                    f"client {u}: masked vector of {len(m.y)} values, the round's "
                    f"layout has {self.spec.length}",
                    "malformed_message",
                )
            elif u not in shared:
                out[u] = Malformed(
                    f"client {u} sent no shares in this attempt", "malformed_message"
                )
            elif u not in counted:
                out[u] = Conflict(
                    f"client {u} sent no masked count (instance A): only A's "
                    "survivors take part in the update instance, it counts as dropped there",
                    "not_a_survivor",
                )
            elif set(m.complaints) - set(self.spec.neighbours_of(u)):
                out[u] = Malformed(
                    f"client {u}: complaints name non-neighbours", "malformed_message"
                )
        return out

    def _reveal(self, msgs: list[Reveal]) -> None:
        pk, r = self.rnd.id, self.spec.round_id
        survivors = self._senders("masked")
        for m in msgs:
            if m.client_id not in survivors:
                raise Malformed(
                    f"client {m.client_id} sent no masked input: it has nothing to reveal",
                    "malformed_message",
                )
        dealt = {
            u: messages.decode_shares(b)
            for u, b in self.sa.bodies(pk, "shares", inst=self.inst).items()
            if any(u in m.b_shares or u in m.s_shares for m in msgs)
        }
        for m in msgs:
            w = m.client_id
            for kind, got in (("b", m.b_shares), ("s", m.s_shares)):
                for owner, y in got.items():
                    if (owner in survivors) != (kind == "b"):
                        raise Malformed(
                            f"client {w}: a {kind} share of client {owner}, which "
                            + ("survived" if owner in survivors else "dropped"),
                            "malformed_share",
                        )
                    commits = dealt[owner].share_commits.get(w) if owner in dealt else None
                    idx = 0 if kind == "s" else 1
                    if commits is None or commits[idx] != crypto.commit(kind, r, owner, w, y):
                        raise Malformed(
                            f"client {w}: its {kind} share of client {owner} does not match the "
                            "commitment the dealer published",
                            "malformed_share",
                        )


def fresh_keys(pairs: dict[int, list[Keys]]) -> None:
    """422 when a client's two instances share a mask key, or a mask key is also an encryption
    key (each instance's mask key is fresh; the key that encrypts shares may serve both)."""
    for u, keys in pairs.items():
        masks = {m.s_pk for m in keys}
        if len(masks) != len(keys) or masks & {m.c_pk for m in keys}:
            raise Malformed(
                f"client {u}: each protocol instance needs its own fresh mask key",
                "malformed_message",
            )
