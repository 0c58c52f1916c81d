"""Closing rounds: at the deadline or once the cohort is complete, a round attempt becomes the
next model version (aggregation), or, below quorum, a failed attempt followed by a new one.

Closing happens exactly once: a conditional ``UPDATE rounds SET state=... WHERE state='open'``
inside the closing transaction is the guard (uploads lock the same row first, so no upload can
be acknowledged for a round that is being closed), and with Redis configured replicas also
hold ``fedrec:lock:close:{run}:{round}`` so they do not aggregate the same round in parallel.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import torch

from fedrecgel.robust import DEFAULT_FACTOR, all_finite
from fedrecgel.secagg.protocol import RoundFailed
from fedrecgel.strategy import Strategy
from fedrecgel.upload_modes import Aggregate, RoundUploads, Upload, UploadMode, mode_of
from fedrecgel.wire import encode_model, encode_state
from services.aggregator import deadlines, secagg
from services.aggregator.db import Database
from services.aggregator.events import RedisBus
from services.aggregator.metrics import AggregatorMetrics
from services.aggregator.models import Clock, Round, Run
from services.aggregator.modelstore import ModelState, ModelStore
from services.aggregator.pending import PendingUpdates
from services.aggregator.privacy import run_plan
from services.aggregator.repository import Repository
from services.aggregator.runs import open_round
from services.aggregator.schemas import RunConfig
from services.aggregator.secagg_repository import SecAggRepository
from services.aggregator.storage import StorageKeeper
from services.contract import ModelBlob

log = logging.getLogger(__name__)

#: a round's aggregate from the base version's strategy, the parameters' shapes and the
#: public cohort size (a DP mean's denominator)
Combine = Callable[[Strategy, dict[str, tuple[int, ...]], float | None], Aggregate | None]
#: the clients a due round counts, and how to combine what they sent
Gathered = tuple[int, Combine]


class CloseOutcome(enum.StrEnum):
    """What an attempt to close a round did."""

    CLOSED = "closed"  # aggregated into the next model version
    RETRIED = "retried"  # below quorum at the deadline: failed, a new attempt opened
    NOT_READY = "not_ready"  # neither complete nor past its deadline
    NOT_OPEN = "not_open"  # closed already (here or by a replica), paused or aborted
    LOCKED = "locked"  # another replica holds the closing lock
    ADVANCED = "advanced"  # secure aggregation: the attempt moved on to its next phase


@dataclass(frozen=True)
class _Aggregated:
    """A committed aggregation: the new live state and its encoded version."""

    state: ModelState
    blob: ModelBlob
    next_round: int | None
    epsilon: float | None = None  # DP runs: the privacy spent once this round is released


class _NotReady(Exception):
    """Raised inside a closing transaction to roll it back: nothing to do yet."""


class _NonFinite(Exception):
    """The server step would have kept non-finite values: the attempt is retried instead."""


class RoundCloser:
    """Closes round attempts and resumes the live one after a restart.

    Locking: the closing transaction's guard (above) serialises closes across threads and
    replicas; in memory, the model state is taken out of :class:`ModelStore` while it is
    stepped and put back only after the commit, and :class:`PendingUpdates` is read under its
    own lock.
    """

    def __init__(
        self,
        db: Database,
        metrics: AggregatorMetrics,
        clock: Clock,
        models: ModelStore,
        pending: PendingUpdates,
        storage: StorageKeeper,
        bus: RedisBus | None = None,
        screen_factor: float = DEFAULT_FACTOR,
        deadline_poll_s: float = 1.0,
    ) -> None:
        self.db = db
        self.screen_factor = screen_factor
        self.deadline_poll_s = deadline_poll_s  # the deadline task's period (deadlines.py)
        self.metrics = metrics
        self.clock = clock
        self.models = models
        self.pending = pending
        self.storage = storage
        self.bus = bus

    def tick(self) -> CloseOutcome | None:
        """Close the live round if it is complete or past its deadline (the background task);
        None when there is no open round to look at."""
        with self.db.read() as s:
            repo = Repository(s)
            run = repo.active_run()
            if run is None or run.state != "running":
                return None
            live = repo.live_round(run.id)
            # drop decoded updates of rounds closed elsewhere (a replica)
            self.pending.keep_only(None if live is None else live.id)
            if live is None or live.state != "open":
                return None
            secure = live.secagg_phase is not None  # then advance() decides
            complete = live.updates_received >= len(live.cohort)
            now = self.clock()
            pk, expired = live.id, now >= live.deadline
            alive_due = now - deadlines.last_alive(live) >= timedelta(seconds=deadlines.HEARTBEAT_S)
        if alive_due and not (complete or expired):
            with self.db.transaction() as s:
                rnd = Repository(s).get_round(pk)
                if rnd is not None:
                    deadlines.heartbeat(s, rnd, now)
        if secure:
            return self.advance(pk)
        if complete or expired:
            return self.close_round(pk)
        return None

    def advance(self, pk: int) -> CloseOutcome:
        """Secure aggregation: move a finished phase on (``ADVANCED``), or close the attempt
        when it is due (:mod:`services.aggregator.secagg`)."""
        now = self.clock()
        with self.db.transaction() as s:
            rnd = Repository(s).get_round(pk)
            if rnd is None or rnd.state != "open" or rnd.secagg_phase is None:
                return CloseOutcome.NOT_OPEN
            run = Repository(s).get_run(rnd.run_id)
            assert run is not None
            cfg = RunConfig.model_validate(run.config)
            sa = SecAggRepository(s)
            decision = secagg.decide(sa, rnd, cfg, now)
            if decision == secagg.Decision.WAIT:
                return CloseOutcome.NOT_READY
            failed: RoundFailed | None = None
            if decision == secagg.Decision.NEXT:
                phase = rnd.secagg_phase
                nxt = secagg.next_phase(cfg, phase)
                assert nxt is not None
                union = None
                try:
                    secagg.check_whole_groups(sa, rnd, cfg, phase)
                    if phase == "unmask":  # a sparse attempt's counts give its union
                        union = secagg.count_union(sa, rnd, cfg, now)
                except RoundFailed as err:
                    failed = err
                else:
                    deadline = now + timedelta(seconds=cfg.deadline_s)
                    if not sa.advance_phase(pk, phase, nxt, deadline, union):
                        return CloseOutcome.NOT_OPEN
                    log.info(
                        "round %d attempt %d: secure aggregation %s -> %s%s",
                        rnd.round_id,
                        rnd.attempt,
                        phase,
                        nxt,
                        "" if union is None else f" (union of {len(union)} items)",
                    )
                    return CloseOutcome.ADVANCED
        return self.close_round(pk, failed)

    def close_round(self, pk: int, failed: RoundFailed | None = None) -> CloseOutcome:
        """Close (or retry below quorum) a round attempt if it is due; exactly once.
        ``failed``: why a secure attempt cannot go on (then it is failed and retried)."""
        with self.db.read() as s:
            rnd = Repository(s).get_round(pk)
            if rnd is None or rnd.state != "open":
                return CloseOutcome.NOT_OPEN
            run_id, round_id = rnd.run_id, rnd.round_id
        if self.bus is None:
            return self._close_round(pk, failed)
        with self.bus.close_lock(run_id, round_id) as acquired:
            if not acquired:
                return CloseOutcome.LOCKED
            return self._close_round(pk, failed)

    def _close_round(self, pk: int, failed: RoundFailed | None = None) -> CloseOutcome:
        t0 = time.perf_counter()
        now = self.clock()
        aggregated: _Aggregated | None = None
        n = 0
        try:
            with self.db.transaction() as s:
                repo = Repository(s)
                # The guard: only one transaction moves the round out of "open"; concurrent
                # uploads wait for it and are then refused as "round not open".
                if not repo.transition_round(pk, ["open"], "closing"):
                    return CloseOutcome.NOT_OPEN
                rnd = repo.get_round(pk)
                assert rnd is not None
                run = repo.get_run(rnd.run_id)
                assert run is not None
                cfg = RunConfig.model_validate(run.config)
                m = len(rnd.cohort)
                try:
                    if failed is not None:
                        raise failed
                    n, combine = self._gather(repo, cfg, rnd, now)
                    aggregated = self._aggregate(repo, run, cfg, rnd, now, combine)
                except (RoundFailed, _NonFinite) as err:  # nothing kept: the state was taken out
                    log.warning("round %d attempt %d: %s", rnd.round_id, rnd.attempt, err)
                    new_attempt = self._retry(repo, run, cfg, rnd, now)
        except _NotReady:
            return CloseOutcome.NOT_READY
        self.pending.drop(pk)
        if aggregated is None:
            self.metrics.rounds_retried.inc()
            log.warning("round %d: not aggregated; attempt %s", rnd.round_id, new_attempt)
            return CloseOutcome.RETRIED
        self.models.put_state(aggregated.state)
        self.models.remember(aggregated.blob)
        self.storage.notify()
        self.metrics.rounds_closed.inc()
        if aggregated.epsilon is not None:
            self.metrics.dp_epsilon.set(aggregated.epsilon)
        self.metrics.round_duration.observe(max(0.0, (now - rnd.opened_at).total_seconds()))
        seconds = time.perf_counter() - t0
        self.metrics.close_seconds.observe(seconds)
        version = aggregated.blob.version
        log.info(
            "round %d closed: %d/%d updates -> version %d in %.1f ms",
            rnd.round_id,
            n,
            m,
            version,
            seconds * 1e3,
        )
        if self.bus is not None:
            try:
                with self.metrics.stage_seconds.labels(stage="publish").time():
                    self.bus.publish_version(rnd.run_id, version, rnd.round_id)
            except Exception:
                log.exception("publishing version %d failed", version)
        return CloseOutcome.CLOSED

    def _retry(self, repo: Repository, run: Run, cfg: RunConfig, rnd: Round, now: datetime) -> int:
        """Fail the attempt, drop its updates, open attempt + 1 with a new cohort."""
        repo.delete_updates(rnd.id)
        SecAggRepository(repo.session).delete_round(rnd.id)
        rnd.state, rnd.closed_at, rnd.n_updates = "failed", now, 0
        nxt = open_round(
            repo, run.id, cfg, rnd.round_id, rnd.attempt + 1, rnd.base_version, None, now
        )
        return nxt.attempt

    def _gather(self, repo: Repository, cfg: RunConfig, rnd: Round, now: datetime) -> Gathered:
        """Once the attempt is due: the clients it counts and how to combine what they sent
        (:class:`_NotReady` before; :class:`RoundFailed` below quorum, or for a secure round
        that cannot be unmasked). A round of the secure mode's phases is unmasked
        (:mod:`services.aggregator.secagg`); any other reads back its stored uploads and
        combines them as the run's upload mode does."""
        m = len(rnd.cohort)
        if rnd.secagg_phase is not None:
            sa = SecAggRepository(repo.session)
            if secagg.decide(sa, rnd, cfg, now) != secagg.Decision.CLOSE:
                raise _NotReady
            mean = secagg.unmask(sa, rnd, cfg)
            return mean.n, lambda *_: mean
        meta = repo.update_meta(rnd.id)
        if len(meta) < m and now < rnd.deadline:
            raise _NotReady
        if not meta or len(meta) < cfg.quorum_count(m):
            raise RoundFailed(f"{len(meta)} of {m} updates at the deadline, below quorum")
        mode = mode_of(cfg, cfg.model(), self.screen_factor or None)
        uploads = [u for _, u in self._round_uploads(repo, rnd.id, meta, mode)]
        return len(meta), lambda strategy, shapes, public: mode.combine(
            strategy, shapes, RoundUploads(rnd.round_id, uploads, public)
        )

    def _aggregate(
        self,
        repo: Repository,
        run: Run,
        cfg: RunConfig,
        rnd: Round,
        now: datetime,
        combine: Combine,
    ) -> _Aggregated:
        """The server step on the round's aggregate (``combine``'s, from the base version's
        strategy), as the simulator takes it; persist version v+1."""
        mcfg = cfg.model()
        latest = repo.latest_version_number(run.id)
        if latest != rnd.base_version:
            raise RuntimeError(
                f"round {rnd.round_id} was opened on version {rnd.base_version}, latest is {latest}"
            )
        # stepped in place below; back in the store only after the commit
        base = self.models.take_state(repo, run.id, rnd.base_version, cfg)
        params, strategy = base.params, base.strategy
        plan = run_plan(repo, cfg)
        # a DP mean divides by the public cohort size, not by the uploads that arrived
        public = len(rnd.cohort) if plan is not None and plan.sampling == "fixed" else None
        stage = self.metrics.stage_seconds
        with torch.no_grad(), stage.labels(stage="aggregate").time():
            shapes = {k: tuple(v.shape) for k, v in params.items()}
            agg = combine(strategy, shapes, public)
            assert agg is not None  # a round is aggregated with at least one upload
            agg.apply(strategy, params)
            rnd.bounded = agg.bounded or None
        version = rnd.base_version + 1
        state = strategy.state_dict()
        if not all_finite(params, state):
            raise _NonFinite(
                "the server step gave non-finite params or optimizer state; the attempt's "
                "uploads are dropped and the model is kept"
            )
        with stage.labels(stage="encode_model").time():
            blob = encode_model(mcfg, params, version)
        digest = hashlib.sha256(blob).hexdigest()
        SecAggRepository(repo.session).delete_round(rnd.id)
        loss, n_updates = agg.loss, agg.n
        repo.add_version(
            run.id,
            version,
            rnd.round_id,
            blob,
            encode_state(state),
            digest,
            n_updates,
            loss,
            now,
        )
        rnd.state, rnd.closed_at = "closed", now
        rnd.n_updates, rnd.loss, rnd.model_version = n_updates, loss, version
        next_round: int | None = None
        last = cfg.rounds if plan is None else plan.rounds  # a target epsilon may stop it
        if rnd.round_id < last and run.state == "running":
            next_round = open_round(
                repo, run.id, cfg, rnd.round_id + 1, 0, version, None, now
            ).round_id
        elif rnd.round_id >= last:
            run.state, run.active, run.finished_at = "finished", None, now
        return _Aggregated(
            ModelState(run.id, version, params, strategy),
            ModelBlob(run.id, version, blob, digest),
            next_round,
            None if plan is None else plan.epsilon(rnd.round_id),
        )

    def _round_uploads(
        self, repo: Repository, pk: int, meta: list[tuple[int, str]], mode: UploadMode
    ) -> list[tuple[str, Upload]]:
        """The round's uploads with their digests, in first-client order (each is stored once,
        under its first client; its digest on every client it covers): from memory, else
        decoded from the DB."""
        firsts: dict[str, int] = {}
        for client_id, digest in meta:  # by client id: the first seen is the first covered
            firsts.setdefault(digest, client_id)
        pending = self.pending.snapshot(pk)
        out: dict[int, tuple[str, Upload]] = {}
        missing: dict[int, str] = {}
        for digest, first in firsts.items():
            hit = pending.get(first)
            if hit is not None and hit[0] == digest:
                out[first] = hit
            else:
                missing[first] = digest
        if missing:
            for first, blob in repo.update_blobs(pk, list(missing)).items():
                out[first] = (missing[first], mode.decode(blob).uploads[0])
            log.info("decoded %d stored updates of round attempt %d", len(missing), pk)
        uploads = [out[c] for c in sorted(out)]
        covered = sum(len(u.client_ids) for _, u in uploads)
        if covered != len(meta):
            raise RuntimeError(f"round attempt {pk}: uploads cover {covered} of {len(meta)}")
        return uploads

    def warm(self) -> None:
        """After a (re)start: rebuild the model state and the open round's updates from the DB."""
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.active_run() or repo.latest_run()
            if run is None:
                return
            cfg = RunConfig.model_validate(run.config)
            version = repo.latest_version_number(run.id)
            if version is not None:
                self.models.state(repo, run.id, version, cfg)
            live = repo.live_round(run.id)
            if live is None:
                return
            if run.state == "running":  # no aggregator ran: the deadline did not run either
                deadlines.resume_after_downtime(s, live, self.clock(), self.deadline_poll_s)
            meta = repo.update_meta(live.id)
            uploads = self._round_uploads(repo, live.id, meta, mode_of(cfg, cfg.model()))
            kept = {u.client_id: (d, u) for d, u in uploads}
        self.pending.replace(live.id, kept)
        log.info(
            "resumed run %d round %d with %d acknowledged updates",
            run.id,
            live.round_id,
            len(meta),
        )
