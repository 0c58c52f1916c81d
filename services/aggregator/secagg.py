"""Secure aggregation over HTTP: the rounds of :mod:`fedrecgel.secagg.protocol` between the
aggregator and the workers, each worker speaking for its clients.

A round attempt of a run with ``secure_aggregation=dense`` goes through four phases, stored in
``rounds.secagg_phase`` (``keys`` -> ``shares`` -> ``masked`` -> ``unmask``); in each one the
clients send one message (``POST /v1/rounds/{r}/secagg/{keys|shares|masked|reveal}``) and read
what they need from ``GET /v1/rounds/{r}/secagg``.

``secure_aggregation=sparse`` runs the two protocol instances of
:func:`fedrecgel.secagg.aggregate.secure_sparse_mean` in six phases. Both instances' keys and
shares are exchanged up front (each client sends its keys, then its shares, of A and of B in
one body; B's cohort and neighbour graph are A's). ``masked`` and ``unmask`` are A's (the
clients' item indicators, in the counting ring); when A's unmasking ends, the aggregator
forms the public union U (items counted, plus the round's negative pool) and stores it with
the attempt (``rounds.secagg_union``), or fails the attempt when A cannot be unmasked. Then
``masked_b`` (each of A's survivors' update on U's rows, 32-bit words; a client outside A's
survivors is refused, and counts as dropped in B) and ``unmask_b`` (``reveal_b``); the mean
over B's survivors is the round's aggregate. A phase ends when every client that took
the previous one has sent its message, or at the round deadline (which each new phase renews:
the deadline machinery of plain rounds, once per phase). A phase that ends with fewer than
``max(2, quorum_count(cohort))`` senders fails the attempt, and so does an unmasking that
cannot recover and check every secret it needs: a new attempt opens with a new cohort and new
keys (:meth:`~services.aggregator.rounds.RoundCloser.close_round`), and no model is published.

Everything lives in the SQL store (:class:`~services.aggregator.secagg_repository.
SecAggRepository`): the keys, encrypted shares and revealed shares as the clients sent them,
and the running sum of the masked inputs, each of its protocol instance (each vector is added in the transaction that accepts
it and never kept on its own). A restarted aggregator continues the phase it was in.

Every message is checked before it is stored (:mod:`.secagg_checks`; 422 with the reason): format and lengths, the
sender held by the caller's token and in the cohort, shares addressed to the sender's
neighbours only, revealed shares matching the commitments their dealer published; a message
for another phase is 409, a second different one from the same client 409, the same one again
``duplicate``. A masked body may carry several clients' inputs (:mod:`.secagg_masked`):
each is checked on its own, and refused on its own with its reason in the answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import numpy as np

from fedrecgel.cohort import broken_groups
from fedrecgel.prior import RoundCounts
from fedrecgel.secagg import messages
from fedrecgel.secagg.aggregate import (
    counts_spec,
    round_pool,
    round_spec,
    row_gain,
    union_of,
    update_spec,
)
from fedrecgel.secagg.layout import unflatten, vector_length
from fedrecgel.secagg.protocol import Keys, RoundFailed, RoundSpec, Shares
from fedrecgel.secagg.server import Outcome, Server
from fedrecgel.upload_modes import Aggregate
from services.aggregator import secagg_masked
from services.aggregator.auth import Caller
from services.aggregator.db import Database
from services.aggregator.errors import Conflict, Forbidden, not_in_cohort, not_owned
from services.aggregator.models import Clock, Round
from services.aggregator.popularity import CountRepository
from services.aggregator.repository import Repository
from services.aggregator.schemas import RunConfig, UploadResult
from services.aggregator.secagg_checks import (
    MASKED_STEPS,
    SLOT,
    Checks,
    Message,
    decode,
    fresh_keys,
)
from services.aggregator.secagg_repository import SecAggRepository
from services.contract import PHASE_OF_STEP, STEP_OF_PHASE, SecAggRound

log = logging.getLogger(__name__)

#: the phases of a dense and of a sparse attempt, in order
PHASES = {
    "dense": ("keys", "shares", "masked", "unmask"),
    "sparse": ("keys", "shares", "masked", "unmask", "masked_b", "unmask_b"),
}
#: the step whose senders a step waits for (everyone who took the one before it; B's inputs:
#: A's survivors)
PREVIOUS_STEP = {
    "shares": "keys",
    "masked": "shares",
    "reveal": "masked",
    "masked_b": "masked",
    "reveal_b": "masked_b",
}


class Decision:
    """What the end of a phase asks for."""

    WAIT = "wait"  # neither complete nor past its deadline
    NEXT = "next"  # move on to the next phase
    CLOSE = "close"  # unmask and publish, or fail the attempt (too few clients)


def is_secure(cfg: RunConfig) -> bool:
    """Whether a run aggregates its uploads securely."""
    return cfg.secure_aggregation != "off"


def is_sparse(cfg: RunConfig) -> bool:
    """Whether a run aggregates securely in two instances (counts, then the union's rows)."""
    return cfg.secure_aggregation == "sparse"


def next_phase(cfg: RunConfig, phase: str) -> str | None:
    """The phase after ``phase`` in the run's mode (None: the last one)."""
    phases = PHASES["sparse" if is_sparse(cfg) else "dense"]
    i = phases.index(phase) + 1
    return phases[i] if i < len(phases) else None


def spec_of(cfg: RunConfig, rnd: Round) -> RoundSpec:
    """The public parameters of a round attempt (the attempt's own cohort): of its instance A
    (a sparse attempt's counts), whose neighbour graph B shares."""
    if is_sparse(cfg):
        return counts_spec(cfg.model(), cfg, rnd.round_id, rnd.cohort)
    return round_spec(cfg.model(), cfg, rnd.round_id, rnd.cohort)


def spec_b(cfg: RunConfig, rnd: Round, union: list[int] | None) -> RoundSpec:
    """A sparse attempt's instance B on its ``union`` (A's cohort: those outside A's
    survivors count as dropped)."""
    if union is None:
        raise RoundFailed(f"round {rnd.round_id}: the update instance has no union yet")
    u = np.asarray(union, dtype=np.int64)
    return update_spec(cfg.model(), cfg, rnd.round_id, rnd.cohort, u)


def minimum(cfg: RunConfig, cohort_size: int) -> int:
    """Clients a phase must end with for the attempt to go on."""
    return max(2, cfg.quorum_count(cohort_size))


def check_whole_groups(sa: SecAggRepository, rnd: Round, cfg: RunConfig, phase: str) -> None:
    """:class:`RoundFailed` when a run with ``cohort_groups`` ends a masked phase with some of
    a group's members' inputs and not all: the survivors are never announced, so nothing of
    such a sum is unmasked (a new attempt draws new groups)."""
    if cfg.cohort_groups is None or phase not in MASKED_STEPS:
        return
    inst, stored = SLOT[STEP_OF_PHASE[phase]]
    sent = sa.bodies(rnd.id, stored, inst=inst).keys()
    broken = broken_groups(rnd.cohort, sent, cfg.cohort_groups, cfg.seed)
    if broken:
        raise RoundFailed(
            f"round {rnd.round_id}: {len(broken)} group(s) of the cohort sent masked inputs in "
            "part; a run with cohort_groups unmasks whole groups only"
        )


def _count(sa: SecAggRepository, pk: int, step: str) -> int:
    inst, stored = SLOT[step]
    return sa.count(pk, stored, inst)


def decide(sa: SecAggRepository, rnd: Round, cfg: RunConfig, now: datetime) -> str:
    """What the current phase of an open attempt asks for now."""
    phase = rnd.secagg_phase or "keys"
    step = STEP_OF_PHASE[phase]
    n = _count(sa, rnd.id, step)
    prev = PREVIOUS_STEP.get(step)
    expected = len(rnd.cohort) if prev is None else _count(sa, rnd.id, prev)
    if n < expected and now < rnd.deadline:
        return Decision.WAIT
    if next_phase(cfg, phase) is None:
        return Decision.CLOSE
    if phase == "unmask":  # a sparse attempt's counts: unmasked as it moves on (or it fails)
        return Decision.NEXT
    return Decision.CLOSE if n < minimum(cfg, len(rnd.cohort)) else Decision.NEXT


def _unmask(
    sa: SecAggRepository, rnd: Round, cfg: RunConfig, spec: RoundSpec, inst: str
) -> Outcome:
    """Unmask the survivors' sum of one instance from its stored messages and running sum."""
    pk = rnd.id
    keys = {u: messages.decode_keys(b) for u, b in sa.bodies(pk, "keys", inst=inst).items()}
    shares = {u: messages.decode_shares(b) for u, b in sa.bodies(pk, "shares", inst=inst).items()}
    arrived = {
        u: tuple(int(c) for c in json.loads(b))
        for u, b in sa.bodies(pk, "masked", inst=inst).items()
    }
    if len(arrived) < minimum(cfg, len(rnd.cohort)):
        raise RoundFailed(f"round {rnd.round_id}: {len(arrived)} masked inputs, too few")
    raw = sa.total(pk, inst)
    assert raw is not None
    total = np.frombuffer(raw, dtype=secagg_masked.words_of(spec))
    server = Server.restore(spec, keys, shares, arrived, total)
    reveals = [messages.decode_reveal(b) for b in sa.bodies(pk, "reveal", inst=inst).values()]
    out = server.unmask(reveals)
    if out.bad_shares or out.complaints:
        log.warning(
            "round %d: unmasked despite refused shares %s and complaints %s",
            rnd.round_id,
            out.bad_shares,
            out.complaints,
        )
    return out


def count_union(sa: SecAggRepository, rnd: Round, cfg: RunConfig, now: datetime) -> list[int]:
    """A sparse attempt's public union, from its unmasked counts (instance A) and the round's
    negative pool; :class:`RoundFailed` when A cannot be unmasked. The counts go to the run's
    popularity prior when it takes them (:meth:`CountRepository.add_round`)."""
    out = _unmask(sa, rnd, cfg, spec_of(cfg, rnd), "a")
    counts = np.rint(out.total).astype(np.int64)
    model = cfg.model()
    pool = round_pool(cfg, model.n_items, rnd.round_id)
    if cfg.prior_from_rounds:  # the popularity prior's input: what A unmasked anyway
        got = RoundCounts(counts, pool, len(out.survivors))
        if CountRepository(sa.session).add_round(rnd.run_id, got, now):
            log.info("run %d: popularity prior fixed from the rounds' counts", rnd.run_id)
    return [int(i) for i in union_of(counts, pool)]


def unmask(sa: SecAggRepository, rnd: Round, cfg: RunConfig) -> Aggregate:
    """The survivors' mean (gradient, mean loss, how many they were), from the stored messages
    and running sum (a sparse attempt's: instance B's, on the rows of its union);
    :class:`RoundFailed` when the attempt did not reach its last phase with enough clients, or
    a secret it needs cannot be recovered and checked (then no sum is output)."""
    if next_phase(cfg, rnd.secagg_phase or "keys") is not None:
        raise RoundFailed(
            f"round {rnd.round_id} attempt {rnd.attempt} ended in phase {rnd.secagg_phase} "
            "with too few clients"
        )
    model = cfg.model()
    if not is_sparse(cfg):
        out = _unmask(sa, rnd, cfg, spec_of(cfg, rnd), "a")
        grads, loss = unflatten(model, out.total / len(out.survivors))
        return Aggregate(grads, loss, len(out.survivors))
    spec = spec_b(cfg, rnd, sa.union(rnd.id))
    out = _unmask(sa, rnd, cfg, spec, "b")
    union = np.asarray(sa.union(rnd.id), dtype=np.int64)
    total = out.total / row_gain(model, union)
    grads, loss = unflatten(model, total / len(out.survivors), union)
    return Aggregate(grads, loss, len(out.survivors))


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
            both = ("a", "b") if is_sparse(cfg) else ("a",)
            docs: list[dict[str, object]] = []
            extra: dict[str, Any] = {}
            inst, step = SLOT[STEP_OF_PHASE[phase]]
            if phase == "shares":
                for i in both:
                    docs += [json.loads(b) for b in sa.bodies(live.id, "keys", near, i).values()]
            elif phase in MASKED_STEPS:
                docs = _addressed(sa.bodies(live.id, "shares", near, inst), set(mine), inst)
            if phase == "masked_b":
                union = sa.union(live.id)
                b = spec_b(cfg, live, union)
                extra = {
                    "union": union,
                    "length": b.length,
                    "word_bits": b.fixed.word_bits,
                    "scale_bits": b.fixed.scale_bits,
                }
            if step == "reveal":
                extra["survivors"] = sa.senders(live.id, "masked", inst)
                shared = sa.senders(live.id, "shares", inst)
                extra["dropped"] = sorted(set(shared) - set(extra["survivors"]))
            return SecAggRound(
                round_id=live.round_id,
                attempt=live.attempt,
                phase=phase,  # type: ignore[arg-type]
                deadline=live.deadline,
                cohort=sorted(live.cohort),
                messages=docs,
                **extra,
            )

    def submit(
        self, caller: Caller, round_id: int, step: str, body: bytes, cfg: RunConfig
    ) -> list[UploadResult]:
        """``POST /v1/rounds/{round_id}/secagg/{step}`` (``cfg``: the newest run's)."""
        if not caller.client_ids:
            raise Forbidden("only clients take part in secure aggregation", "not_owned")
        if not is_secure(cfg):  # before reading the body (checked again in the transaction)
            raise Conflict("the run does not aggregate securely", "not_secure")
        most = len(caller.client_ids)
        masked = step in MASKED_STEPS
        items = secagg_masked.frames(body, most) if masked else None
        # a sparse attempt's masked layouts are its own (cohort, union): read in the transaction
        late = is_sparse(cfg) and masked
        got: list[secagg_masked.Entry] = []
        msgs: list[Message] = []
        if masked and not late:
            got = secagg_masked.entries(step, caller, body, items, _dense(cfg))
        elif not masked:
            msgs = _owned(caller, decode(step, body, most, is_sparse(cfg)))
        now = self.clock()
        inst = SLOT[step][0]
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
            spec = spec_of(cfg, live) if inst == "a" else spec_b(cfg, live, sa.union(live.id))
            if late:
                layout = (spec.length, spec.fixed.dtype)
                got = secagg_masked.entries(step, caller, body, items, layout)
            if masked:
                results, fresh = secagg_masked.take(sa, live, spec, step, got)
            else:
                results, fresh = _take_json(sa, live, cfg, spec, step, msgs)
            prev = PREVIOUS_STEP.get(step)
            expected = len(live.cohort) if prev is None else _count(sa, live.id, prev)
            complete = fresh and _count(sa, live.id, step) >= expected
            pk = live.id
        if complete:
            self.advance(pk)
        return results


def _take_json(
    sa: SecAggRepository,
    live: Round,
    cfg: RunConfig,
    spec: RoundSpec,
    step: str,
    msgs: list[Message],
) -> tuple[list[UploadResult], bool]:
    """Check and store the messages of a JSON step (keys, shares, reveals), all or none: the
    answer per client, and whether any was new."""
    stored = SLOT[step][1]
    ids = sorted({m.client_id for m in msgs})
    for c in ids:
        if c not in live.cohort:
            raise not_in_cohort(c, live.round_id, live.attempt)
    seen = {i: sa.digests(live.id, stored, ids, i) for i in {m.instance for m in msgs}}
    status: dict[int, str] = {}
    fresh: list[Message] = []
    for m in msgs:
        old = seen[m.instance].get(m.client_id)
        if old is None:
            fresh.append(m)
        elif old != m.digest:
            raise Conflict(
                f"client {m.client_id} already sent a different {step} message",
                "conflicting_message",
            )
        got = "accepted" if old is None else "duplicate"
        if status.setdefault(m.client_id, got) != got:
            raise Conflict(
                f"client {m.client_id}: one instance's {step} message is stored, the "
                "other's is not",
                "conflicting_message",
            )
    if fresh:
        if step == "keys" and is_sparse(cfg):
            pairs: dict[int, list[Keys]] = {}
            for m in fresh:
                pairs.setdefault(m.client_id, []).append(m.parsed)  # type: ignore[arg-type]
            fresh_keys(pairs)
        for i in sorted({m.instance for m in fresh}):
            mine = [m.parsed for m in fresh if m.instance == i]
            Checks(sa, live, spec, i).check(stored, mine)
        for m in fresh:
            sa.add_message(live.id, stored, m.client_id, m.digest, m.stored, m.instance)
    results = [UploadResult(client_id=c, status=st) for c, st in status.items()]  # type: ignore[arg-type]
    return results, bool(fresh)


def _dense(cfg: RunConfig) -> tuple[int, type[np.unsignedinteger[Any]]]:
    """A dense run's masked vector: its whole layout in the run's words."""
    return vector_length(cfg.model()), cfg.secagg_fixed_point().dtype


def _owned(caller: Caller, msgs: list[Message]) -> list[Message]:
    """``msgs``, each of a client the caller holds (403 otherwise)."""
    for m in msgs:
        if m.client_id not in caller.client_ids:
            raise not_owned(m.client_id)
    return msgs


def _addressed(bodies: dict[int, bytes], want: set[int], inst: str) -> list[dict[str, object]]:
    """The share messages of ``bodies`` cut to the shares addressed to ``want``."""
    docs: list[dict[str, object]] = []
    for body in bodies.values():
        sh = messages.decode_shares(body)
        to = {v for v in sh.sealed if v in want}
        if to:
            trimmed = Shares(
                sh.client_id,
                {v: sh.sealed[v] for v in to},
                {v: sh.share_commits[v] for v in to},
                sh.b_commit,
            )
            docs.append(json.loads(messages.encode_shares(trimmed, inst)))
    return docs
