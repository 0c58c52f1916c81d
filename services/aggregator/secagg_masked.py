"""Masked inputs over HTTP (``POST /v1/rounds/{r}/secagg/{masked|masked_b}``), taken by
:class:`~services.aggregator.secagg.SecureRounds`.

A body is one client's :func:`~fedrecgel.secagg.messages.encode_masked` bytes, or a batch of
several clients' (:func:`~fedrecgel.secagg.messages.encode_masked_batch`: a magic, a count,
then per client its id, the length of its message and the message). A batch malformed as a
whole (cut short, bytes left over, no client or more than the token holds, a client twice) is
422 and nothing of it is stored. Otherwise each client's input is checked as a single one is
(decoded to the round's layout, the sender held by the token and in the cohort, a duplicate
answered ``duplicate``, a different second one refused ``conflicting_message``, then
:meth:`~services.aggregator.secagg_checks.Checks.masked_refusals`) and refused on its own,
with its reason in the answer, while the others are taken: the accepted ones are added to the
running sum, and stored, in the request's one transaction. A body none of whose clients is
taken is refused with its first client's refusal (a single client's body is answered as
before: 422, 403 or 409 with the reason).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from fedrecgel.secagg import messages
from fedrecgel.secagg.protocol import Masked, RoundSpec
from services.aggregator.auth import Caller
from services.aggregator.errors import (
    AggregatorError,
    Conflict,
    Malformed,
    not_in_cohort,
    not_owned,
)
from services.aggregator.models import Round
from services.aggregator.schemas import UploadResult
from services.aggregator.secagg_checks import SLOT, Checks, Message
from services.aggregator.secagg_repository import SecAggRepository

#: a client's masked input, decoded, or why it is refused
Entry = tuple[int, Message | AggregatorError]
Layout = tuple[int, type[np.unsignedinteger[Any]]]


def frames(body: bytes, most: int) -> list[tuple[int, bytes]] | None:
    """The clients' messages of a batch body (422 when it is malformed as a whole); None for
    a single ``encode_masked`` body."""
    if not messages.is_masked_batch(body):
        return None
    try:
        return messages.split_masked_batch(body, most)
    except messages.MessageError as err:
        raise Malformed(f"masked batch: {err}", "malformed_message") from None


def decode_one(step: str, client_id: int | None, raw: bytes, layout: Layout) -> Message:
    """One client's masked message of ``step`` (``client_id``: the id its batch frames it
    with, None for a single body); 422 when it is malformed."""
    try:
        m = messages.decode_masked(raw, layout[0], layout[1])
    except messages.MessageError as err:
        who = "" if client_id is None else f" of client {client_id}"
        raise Malformed(f"{step} message{who}: {err}", "malformed_message") from None
    if client_id is not None and m.client_id != client_id:
        raise Malformed(
            f"a {step} message of client {m.client_id} framed as client {client_id}'s",
            "malformed_message",
        )
    digest = hashlib.sha256(raw).hexdigest()
    return Message(m.client_id, SLOT[step][0], digest, json.dumps(m.complaints).encode(), m)


def entries(
    step: str, caller: Caller, body: bytes, items: list[tuple[int, bytes]] | None, layout: Layout
) -> list[Entry]:
    """Each client's decoded message or refusal (a single body: raised at once, as before)."""
    if items is None:
        m = decode_one(step, None, body, layout)
        if m.client_id not in caller.client_ids:
            raise not_owned(m.client_id)
        return [(m.client_id, m)]
    out: list[Entry] = []
    for cid, raw in items:
        if cid not in caller.client_ids:
            out.append((cid, not_owned(cid)))
            continue
        try:
            out.append((cid, decode_one(step, cid, raw, layout)))
        except Malformed as err:
            out.append((cid, err))
    return out


def take(
    sa: SecAggRepository, live: Round, spec: RoundSpec, step: str, got: list[Entry]
) -> tuple[list[UploadResult], bool]:
    """Check each client's input, add the accepted ones to the running sum and store them;
    the answer per client, and whether any was new (raises the first refusal when none was
    taken)."""
    inst, stored = SLOT[step]
    refused = {c: e for c, e in got if isinstance(e, AggregatorError)}
    msgs = [e for _, e in got if isinstance(e, Message)]
    for m in msgs:
        if m.client_id not in live.cohort:
            refused[m.client_id] = not_in_cohort(m.client_id, live.round_id, live.attempt)
    msgs = [m for m in msgs if m.client_id not in refused]
    seen = sa.digests(live.id, stored, [m.client_id for m in msgs], inst)
    fresh: list[Message] = []
    duplicate: set[int] = set()
    for m in msgs:
        old = seen.get(m.client_id)
        if old is None:
            fresh.append(m)
        elif old == m.digest:
            duplicate.add(m.client_id)
        else:
            refused[m.client_id] = Conflict(
                f"client {m.client_id} already sent a different {step} message",
                "conflicting_message",
            )
    parsed: list[Masked] = [m.parsed for m in fresh]  # type: ignore[misc]
    refused.update(Checks(sa, live, spec, inst).masked_refusals(parsed))
    fresh = [m for m in fresh if m.client_id not in refused]
    if not fresh and not duplicate:
        raise refused[got[0][0]]
    if fresh:
        add_to_total(sa, live.id, spec, inst, [m.parsed for m in fresh])  # type: ignore[misc]
        for m in fresh:
            sa.add_message(live.id, stored, m.client_id, m.digest, m.stored, m.instance)
    results = []
    for c, _ in got:
        err = refused.get(c)
        if err is not None:
            results.append(
                UploadResult(client_id=c, status="refused", reason=err.code, detail=err.detail)
            )
        else:
            results.append(
                UploadResult(client_id=c, status="duplicate" if c in duplicate else "accepted")
            )
    return results, bool(fresh)


def words_of(spec: RoundSpec) -> np.dtype[Any]:
    """The stored words of an instance's running sum (little-endian)."""
    return np.dtype(spec.fixed.dtype).newbyteorder("<")


def add_to_total(
    sa: SecAggRepository, pk: int, spec: RoundSpec, inst: str, masked: list[Masked]
) -> None:
    """Add masked inputs to an instance's running sum (wrapping modulo 2^w, as the masks): the
    sum read and written once."""
    words = words_of(spec)
    raw = sa.total(pk, inst)
    total = (
        np.zeros(spec.length, dtype=words)
        if raw is None
        else np.frombuffer(raw, dtype=words).copy()
    )
    for m in masked:
        total += m.y
    sa.set_total(pk, total.astype(words).tobytes(), inst)
