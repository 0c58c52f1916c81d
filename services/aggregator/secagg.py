"""Secure aggregation over HTTP: the rounds of :mod:`fedrecgel.secagg.protocol` between the
aggregator and the workers, each worker speaking for its clients.

A round attempt of a run with ``secure_aggregation`` on goes through four phases, stored in
``rounds.secagg_phase`` (``keys`` -> ``shares`` -> ``masked`` -> ``unmask``); in each one the
clients send one message (``POST /v1/rounds/{r}/secagg/{keys|shares|masked|reveal}``) and read
what they need from ``GET /v1/rounds/{r}/secagg``. A phase ends when every client that took
the previous one has sent its message, or at the round deadline (which each new phase renews:
the deadline machinery of plain rounds, once per phase). A phase that ends with fewer than
``max(2, quorum_count(cohort))`` senders fails the attempt, and so does an unmasking that
cannot recover and check every secret it needs: a new attempt opens with a new cohort and new
keys (:meth:`~services.aggregator.rounds.RoundCloser.close_round`), and no model is published.

Everything lives in the SQL store (:class:`~services.aggregator.secagg_repository.
SecAggRepository`): the keys, encrypted shares and revealed shares as the clients sent them,
and the running sum of the masked inputs (each vector is added in the transaction that accepts
it and never kept on its own). A restarted aggregator continues the phase it was in.

Every message is checked before it is stored (422 with the reason): format and lengths, the
sender held by the caller's token and in the cohort, shares addressed to the sender's
neighbours only, revealed shares matching the commitments their dealer published; a message
for another phase is 409, a second different one from the same client 409, the same one again
``duplicate``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from fedrecgel.secagg import crypto, messages, shamir
from fedrecgel.secagg.aggregate import round_spec
from fedrecgel.secagg.layout import unflatten, vector_length
from fedrecgel.secagg.protocol import Keys, Masked, Reveal, RoundFailed, RoundSpec, Shares
from fedrecgel.secagg.server import Outcome, Server
from fedrecgel.upload_modes import Aggregate
from fedrecgel.wire import WireError, load_json
from services.aggregator.auth import Caller
from services.aggregator.db import Database
from services.aggregator.errors import Conflict, Forbidden, Malformed
from services.aggregator.models import Clock, Round
from services.aggregator.repository import Repository
from services.aggregator.schemas import RunConfig, UploadResult
from services.aggregator.secagg_repository import SecAggRepository
from services.contract import SecAggRound

log = logging.getLogger(__name__)

#: the phase in which each step's message is accepted, and the step each phase waits for
PHASE_OF_STEP = {"keys": "keys", "shares": "shares", "masked": "masked", "reveal": "unmask"}
STEP_OF_PHASE = {v: k for k, v in PHASE_OF_STEP.items()}
NEXT_PHASE = {"keys": "shares", "shares": "masked", "masked": "unmask"}
#: the step whose senders a step waits for (everyone who took the one before it)
PREVIOUS_STEP = {"shares": "keys", "masked": "shares", "reveal": "masked"}
#: one sealed pair of shares: nonce, two share values, GCM tag
SEALED_BYTES = crypto.NONCE_BYTES + 2 * shamir.SHARE_BYTES + 16


class Decision:
    """What the end of a phase asks for."""

    WAIT = "wait"  # neither complete nor past its deadline
    NEXT = "next"  # move on to the next phase
    CLOSE = "close"  # unmask and publish, or fail the attempt (too few clients)


def is_secure(cfg: RunConfig) -> bool:
    """Whether a run aggregates its uploads securely."""
    return cfg.secure_aggregation != "off"


def spec_of(cfg: RunConfig, rnd: Round) -> RoundSpec:
    """The public parameters of a round attempt (the attempt's own cohort)."""
    return round_spec(cfg.model(), cfg, rnd.round_id, rnd.cohort)


def minimum(cfg: RunConfig, cohort_size: int) -> int:
    """Clients a phase must end with for the attempt to go on."""
    return max(2, cfg.quorum_count(cohort_size))


def decide(sa: SecAggRepository, rnd: Round, cfg: RunConfig, now: datetime) -> str:
    """What the current phase of an open attempt asks for now."""
    phase = rnd.secagg_phase or "keys"
    step = STEP_OF_PHASE[phase]
    n = sa.count(rnd.id, step)
    prev = PREVIOUS_STEP.get(step)
    expected = len(rnd.cohort) if prev is None else sa.count(rnd.id, prev)
    if n < expected and now < rnd.deadline:
        return Decision.WAIT
    if phase == "unmask" or n < minimum(cfg, len(rnd.cohort)):
        return Decision.CLOSE
    return Decision.NEXT


def unmask(sa: SecAggRepository, rnd: Round, cfg: RunConfig) -> Aggregate:
    """The survivors' mean (gradient, mean loss, how many they were), from the stored messages and running sum; :class:`RoundFailed`
    when the attempt did not reach the unmasking phase with enough clients, or a secret it
    needs cannot be recovered and checked (then no sum is output)."""
    if rnd.secagg_phase != "unmask":
        raise RoundFailed(
            f"round {rnd.round_id} attempt {rnd.attempt} ended in phase {rnd.secagg_phase} "
            "with too few clients"
        )
    spec = spec_of(cfg, rnd)
    keys = {u: messages.decode_keys(b) for u, b in sa.bodies(rnd.id, "keys").items()}
    shares = {u: messages.decode_shares(b) for u, b in sa.bodies(rnd.id, "shares").items()}
    arrived = {
        u: tuple(int(c) for c in json.loads(b)) for u, b in sa.bodies(rnd.id, "masked").items()
    }
    if len(arrived) < minimum(cfg, len(rnd.cohort)):
        raise RoundFailed(f"round {rnd.round_id}: {len(arrived)} masked inputs, too few")
    raw = sa.total(rnd.id)
    assert raw is not None
    server = Server.restore(spec, keys, shares, arrived, np.frombuffer(raw, dtype="<u8"))
    reveals = [messages.decode_reveal(b) for b in sa.bodies(rnd.id, "reveal").values()]
    out: Outcome = server.unmask(reveals)
    grads, loss = unflatten(cfg.model(), out.total / len(out.survivors))
    if out.bad_shares or out.complaints:
        log.warning(
            "round %d: unmasked despite refused shares %s and complaints %s",
            rnd.round_id,
            out.bad_shares,
            out.complaints,
        )
    return Aggregate(grads, loss, len(out.survivors))


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _json_list(body: bytes, most: int) -> list[bytes]:
    """A body of a JSON list of at most ``most`` messages: each one's canonical bytes (a list
    longer than the caller's clients is refused before its messages are serialized again:
    600,000 empty objects in a 2 MB body took 2.6 s of CPU before the first was refused)."""
    try:
        doc = load_json(body, "the body")
    except WireError:
        raise Malformed("the body is not JSON", "malformed_message") from None
    if not isinstance(doc, list) or not doc:
        raise Malformed("the body is a non-empty JSON list of messages", "malformed_message")
    if len(doc) > most:
        raise Malformed(
            f"{len(doc)} messages in one body; one per client, and this token holds {most}",
            "malformed_message",
        )
    return [json.dumps(m, sort_keys=True).encode() for m in doc]


@dataclass(frozen=True)
class _Message:
    client_id: int
    digest: str
    stored: bytes  # what is kept (the message; for a masked input, its complaints)
    parsed: Keys | Shares | Masked | Reveal


def _decode(step: str, body: bytes, length: int, most: int) -> list[_Message]:
    """Decode a body of ``step`` of at most ``most`` messages (422 on anything malformed)."""
    try:
        if step == "masked":
            m = messages.decode_masked(body, length)
            return [_Message(m.client_id, _digest(body), json.dumps(m.complaints).encode(), m)]
        decoder: Callable[[bytes], Keys | Shares | Reveal] = messages.decode_keys
        if step == "shares":
            decoder = messages.decode_shares
        elif step == "reveal":
            decoder = messages.decode_reveal
        out = []
        for raw in _json_list(body, most):
            parsed = decoder(raw)
            out.append(_Message(parsed.client_id, _digest(raw), raw, parsed))
        return out
    except messages.MessageError as err:
        raise Malformed(f"{step} message: {err}", "malformed_message") from None


class SecureRounds:
    """The secure-aggregation endpoints: what a caller's clients need in the current phase,
    and their messages, checked and stored; ``advance`` moves a finished phase on (or closes
    the attempt)."""

    def __init__(self, db: Database, clock: Clock, advance: Callable[[int], object]) -> None:
        self.db = db
        self.clock = clock
        self.advance = advance

    def _live(self, repo: Repository, round_id: int) -> tuple[Round, RunConfig]:
        run = repo.active_run()
        if run is None or run.state != "running":
            raise Conflict(f"round {round_id} is not open", "round_not_open")
        cfg = RunConfig.model_validate(run.config)
        if not is_secure(cfg):
            raise Conflict("the run does not aggregate securely", "not_secure")
        live = repo.live_round(run.id)
        if live is None or live.round_id != round_id or live.state != "open":
            raise Conflict(f"round {round_id} is not open", "round_not_open")
        return live, cfg

    def view(self, caller: Caller, round_id: int) -> SecAggRound:
        """``GET /v1/rounds/{round_id}/secagg``."""
        with self.db.transaction() as s:
            live, cfg = self._live(Repository(s), round_id)
            sa = SecAggRepository(s)
            mine = sorted(set(live.cohort) & caller.client_ids)
            if not mine:
                raise Forbidden(f"no client of this token is in round {round_id}", "not_in_cohort")
            spec = spec_of(cfg, live)
            phase = live.secagg_phase or "keys"
            near = sorted({v for u in mine for v in spec.neighbours_of(u)})
            docs: list[dict[str, object]] = []
            survivors: list[int] = []
            dropped: list[int] = []
            if phase == "shares":
                docs = [json.loads(b) for b in sa.bodies(live.id, "keys", near).values()]
            elif phase == "masked":
                want = set(mine)
                for body in sa.bodies(live.id, "shares", near).values():
                    sh = messages.decode_shares(body)
                    to = {v for v in sh.sealed if v in want}
                    if to:
                        trimmed = Shares(
                            sh.client_id,
                            {v: sh.sealed[v] for v in to},
                            {v: sh.share_commits[v] for v in to},
                            sh.b_commit,
                        )
                        docs.append(json.loads(messages.encode_shares(trimmed)))
            elif phase == "unmask":
                survivors = sa.senders(live.id, "masked")
                dropped = sorted(set(sa.senders(live.id, "shares")) - set(survivors))
            return SecAggRound(
                round_id=live.round_id,
                attempt=live.attempt,
                phase=phase,  # type: ignore[arg-type]
                deadline=live.deadline,
                cohort=sorted(live.cohort),
                messages=docs,
                survivors=survivors,
                dropped=dropped,
            )

    def submit(  # noqa: C901  # the protocol's refusals in its order, in one transaction
        self, caller: Caller, round_id: int, step: str, body: bytes, cfg: RunConfig
    ) -> list[UploadResult]:
        """``POST /v1/rounds/{round_id}/secagg/{step}`` (``cfg``: the newest run's)."""
        if not caller.client_ids:
            raise Forbidden("only clients take part in secure aggregation", "not_owned")
        msgs = _decode(step, body, vector_length(cfg.model()), len(caller.client_ids))
        ids = [m.client_id for m in msgs]
        if len(set(ids)) != len(ids):
            raise Malformed("one message per client in a body", "malformed_message")
        for c in ids:
            if c not in caller.client_ids:
                raise Forbidden(f"client {c} is not held by this token", "not_owned")
        now = self.clock()
        with self.db.transaction() as s:
            repo, sa = Repository(s), SecAggRepository(s)
            live, cfg = self._live(repo, round_id)
            if repo.touch_open_round(live.id, now) is None:  # locks the row
                raise Conflict(f"round {round_id} is not open", "round_not_open")
            phase = live.secagg_phase or "keys"
            if phase != PHASE_OF_STEP[step]:
                raise Conflict(
                    f"round {round_id} attempt {live.attempt} is in phase {phase}; "
                    f"{step} messages are not taken now",
                    "wrong_phase",
                )
            for c in ids:
                if c not in live.cohort:
                    raise Forbidden(
                        f"client {c} is not in the cohort of round {round_id} "
                        f"(attempt {live.attempt})",
                        "not_in_cohort",
                    )
            seen = sa.digests(live.id, step, ids)
            results, fresh = [], []
            for m in msgs:
                old = seen.get(m.client_id)
                if old is None:
                    fresh.append(m)
                    results.append(UploadResult(client_id=m.client_id, status="accepted"))
                elif old == m.digest:
                    results.append(UploadResult(client_id=m.client_id, status="duplicate"))
                else:
                    raise Conflict(
                        f"client {m.client_id} already sent a different {step} message",
                        "conflicting_message",
                    )
            if fresh:
                _Checks(sa, live, spec_of(cfg, live)).check(step, [m.parsed for m in fresh])
                if step == "masked":
                    _add_to_total(sa, live.id, [m.parsed for m in fresh])  # type: ignore[misc]
                for m in fresh:
                    sa.add_message(live.id, step, m.client_id, m.digest, m.stored)
            prev = PREVIOUS_STEP.get(step)
            expected = len(live.cohort) if prev is None else sa.count(live.id, prev)
            complete = bool(fresh) and sa.count(live.id, step) >= expected
            pk = live.id
        if complete:
            self.advance(pk)
        return results


def _add_to_total(sa: SecAggRepository, pk: int, masked: list[Masked]) -> None:
    raw = sa.total(pk)
    total = (
        np.zeros(len(masked[0].y), dtype=np.uint64)
        if raw is None
        else np.frombuffer(raw, dtype="<u8").copy()
    )
    for m in masked:
        total += m.y  # wraps modulo 2^64, as the masks do
    sa.set_total(pk, total.astype("<u8").tobytes())


class _Checks:
    """The checks of fresh messages against what the attempt has stored (422 on failure)."""

    def __init__(self, sa: SecAggRepository, rnd: Round, spec: RoundSpec) -> None:
        self.sa, self.rnd, self.spec = sa, rnd, spec

    def check(self, step: str, parsed: list[Any]) -> None:
        getattr(self, f"_{step}")(parsed)

    def _keys(self, msgs: list[Keys]) -> None:
        for m in msgs:
            if m.c_pk == m.s_pk:
                raise Malformed(
                    f"client {m.client_id}: the two public keys must differ", "malformed_message"
                )

    def _shares(self, msgs: list[Shares]) -> None:
        advertised = set(self.sa.senders(self.rnd.id, "keys"))
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
        shared = set(self.sa.senders(self.rnd.id, "shares"))
        for m in msgs:
            if len(m.y) != self.spec.length:
                raise Malformed(
                    f"client {m.client_id}: masked vector of {len(m.y)} values, the round's "
                    f"layout has {self.spec.length}",
                    "malformed_message",
                )
            if m.client_id not in shared:
                raise Malformed(
                    f"client {m.client_id} sent no shares in this attempt", "malformed_message"
                )
            if set(m.complaints) - set(self.spec.neighbours_of(m.client_id)):
                raise Malformed(
                    f"client {m.client_id}: complaints name non-neighbours", "malformed_message"
                )

    def _reveal(self, msgs: list[Reveal]) -> None:
        pk, r = self.rnd.id, self.spec.round_id
        survivors = set(self.sa.senders(pk, "masked"))
        for m in msgs:
            if m.client_id not in survivors:
                raise Malformed(
                    f"client {m.client_id} sent no masked input: it has nothing to reveal",
                    "malformed_message",
                )
        dealt = {
            u: messages.decode_shares(b)
            for u, b in self.sa.bodies(pk, "shares").items()
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
