"""The aggregator's logic: clients, runs, rounds, uploads, closing, models and evaluations.

Routes only translate HTTP into these calls; every query goes through :class:`Repository`.
Methods are synchronous (run in worker threads) and each opens its own transactions, because
an upload must be committed *before* the round it completes is closed. Uploads that arrive
together are checked and stored in one transaction (:class:`GroupCommit`), each still answered
(or refused) on its own and only after that transaction committed.

Closing happens exactly once: a conditional ``UPDATE rounds SET state=... WHERE state='open'``
inside the closing transaction is the guard (uploads take the same row first, so no upload can
be acknowledged for a round that is being closed), and with Redis configured replicas also
hold ``fedrec:lock:close:{run}:{round}`` so they do not aggregate the same round in parallel.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import torch
from sqlalchemy.exc import IntegrityError
from torch import Tensor

from fedrecgel.cohort import select_cohort
from fedrecgel.model import ModelConfig, init_shared
from fedrecgel.sam import Update
from fedrecgel.strategy import Strategy, make_strategy
from fedrecgel.wire import (
    WireError,
    decode_model,
    decode_state,
    decode_updates,
    encode_model,
    encode_state,
    encode_updates,
)
from services.aggregator.db import Database
from services.aggregator.errors import (
    AggregatorError,
    Conflict,
    Forbidden,
    Gone,
    Malformed,
    NotFound,
    Unauthorized,
)
from services.aggregator.events import RedisBus
from services.aggregator.groupcommit import GroupCommit
from services.aggregator.metrics import AggregatorMetrics
from services.aggregator.models import Round, Run, utcnow
from services.aggregator.repository import Repository
from services.aggregator.schemas import (
    CurrentRound,
    EvaluationAck,
    EvaluationRequest,
    Health,
    History,
    HistoryRound,
    RoundInfo,
    RunConfig,
    RunStarted,
    RunStatus,
    UploadResult,
)
from services.aggregator.settings import Settings
from services.aggregator.storage import RetentionPolicy, StorageKeeper
from services.contract import ModelBlob

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

# What an upload body may carry besides tensors; anything else is refused (privacy invariant).
_BODY_METADATA_KEYS = frozenset({"format", "round", "updates"})
_UPDATE_ENTRY_KEYS = frozenset({"client_id", "n_samples", "loss"})


def hash_token(token: str) -> str:
    """The stored form of a credential: sha256 hex (tokens are random, 256 bits)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Caller:
    """Who is calling: the clients its credential holds, or the operator."""

    client_ids: frozenset[int]
    operator: bool = False


@dataclass
class _ModelState:
    """Live shared params and strategy of one version.

    The closing transaction takes it out of the cache and steps it in place (no copies of the
    params or the optimizer state); if that transaction fails, the next close rebuilds it from
    the latest version row.
    """

    run_id: int
    version: int
    params: dict[str, Tensor]
    strategy: Strategy


class _NotReady(Exception):
    """Raised inside a closing transaction to roll it back: nothing to do yet."""


@dataclass(frozen=True)
class _RunRef:
    """The newest run as uploads need it: its id and model shape."""

    run_id: int
    model: ModelConfig


@dataclass(frozen=True)
class _PendingUpload:
    """A decoded, validated upload body waiting for the group commit."""

    run_id: int
    round_id: int
    updates: list[Update]
    digests: list[str]
    blobs: list[bytes]  # what is stored per update: a one-update wire body


@dataclass(frozen=True)
class _Stored:
    """A committed upload: per-client results, its new updates, and its round's count after."""

    results: list[UploadResult]
    fresh: list[tuple[str, Update]]
    round_pk: int | None  # None: a duplicate of a round that is not open any more
    received: int
    cohort_size: int


class _StaleRun(Exception):
    """The upload was decoded for a run that is no longer the newest one: decode again."""


@dataclass
class _LiveRound:
    """The open round attempt a batch writes to (locked for its transaction)."""

    pk: int
    attempt: int
    cohort: frozenset[int]
    received: int  # stored updates, counting the batch's own so far

    @property
    def cohort_size(self) -> int:
        """How many clients the attempt waits for."""
        return len(self.cohort)


class _UploadBatch:
    """The state of one group-commit transaction: locked rounds, known digests, rows to add.

    ``open_rounds`` remembers, across batches, the open attempt of each (run, round) seen: an
    attempt's pk, number and cohort never change, so the next batch only needs the locking
    UPDATE (which also proves it is still open) instead of querying the live round again.
    """

    def __init__(
        self,
        repo: Repository,
        now: datetime,
        uploads: Sequence[_PendingUpload],
        open_rounds: dict[tuple[int, int], _LiveRound],
    ) -> None:
        self.repo = repo
        self.now = now
        self._open_rounds = open_rounds
        self._rounds: dict[tuple[int, int], _LiveRound | str] = {}
        # the clients of each round the batch may touch: their digests are read in one query
        self._wanted: dict[tuple[int, int], set[int]] = {}
        for up in uploads:
            self._wanted.setdefault((up.run_id, up.round_id), set()).update(
                u.client_id for u in up.updates
            )
        self._digests: dict[tuple[int, int], dict[int, str]] = {}
        self._rows: list[dict[str, Any]] = []
        self._added: dict[int, int] = {}

    def live_round(self, run_id: int, round_id: int) -> _LiveRound | str:
        """The round's open attempt, locked; else why not: "paused" or "not open"."""
        key = (run_id, round_id)
        if key not in self._rounds:
            self._rounds[key] = self._lock_round(run_id, round_id)
        return self._rounds[key]

    def _lock_round(self, run_id: int, round_id: int) -> _LiveRound | str:
        key = (run_id, round_id)
        known = self._open_rounds.get(key)
        if known is not None:
            received = self.repo.touch_open_round(known.pk, self.now)
            if received is not None:
                return _LiveRound(known.pk, known.attempt, known.cohort, received)
            del self._open_rounds[key]
        live = self.repo.live_round(run_id)
        if live is not None and live.round_id == round_id:
            received = self.repo.touch_open_round(live.id, self.now)
            if received is not None:
                if len(self._open_rounds) > 16:
                    self._open_rounds.clear()
                found = _LiveRound(live.id, live.attempt, frozenset(live.cohort), received)
                self._open_rounds[key] = found
                return _LiveRound(found.pk, found.attempt, found.cohort, received)
        return "paused" if live is not None and live.state == "paused" else "not open"

    def digest(self, run_id: int, round_id: int, client_id: int) -> str | None:
        """The digest of the client's stored (or batched) update of the round, if any.

        Read after :meth:`live_round` locked the round, so a replica's concurrent upload of the
        same client has committed (PostgreSQL row lock) or waits for this transaction.
        """
        key = (run_id, round_id)
        if key not in self._digests:
            self._digests[key] = self.repo.update_digests(run_id, round_id, self._wanted[key])
        return self._digests[key].get(client_id)

    def add(
        self, live: _LiveRound, run_id: int, round_id: int, u: Update, digest: str, blob: bytes
    ) -> None:
        """Queue one accepted update for :meth:`write`; later checks of the batch see it."""
        self._rows.append(
            {
                "round_pk": live.pk,
                "run_id": run_id,
                "round_id": round_id,
                "client_id": u.client_id,
                "digest": digest,
                "n_samples": u.n_samples,
                "loss": u.loss,
                "blob": blob,
                "created_at": self.now,
            }
        )
        self._digests[(run_id, round_id)][u.client_id] = digest
        self._added[live.pk] = self._added.get(live.pk, 0) + 1
        live.received += 1

    def write(self) -> None:
        """Insert the queued rows and count them on their rounds (same transaction)."""
        self.repo.add_updates(self._rows)
        for pk, n in self._added.items():
            self.repo.add_received(pk, n)


def _strict_metadata(body: bytes) -> None:
    """Refuse metadata beyond the wire format's own fields (it could carry user data)."""
    n = int.from_bytes(body[:8], "little")
    meta = json.loads(body[8 : 8 + n]).get("__metadata__") or {}
    extra = set(meta) - _BODY_METADATA_KEYS
    if extra:
        raise Malformed(f"unexpected metadata keys {sorted(extra)}", "malformed_update")
    for i, entry in enumerate(json.loads(meta["updates"])):
        extra = set(entry) - _UPDATE_ENTRY_KEYS
        if extra:
            raise Malformed(f"update {i}: unexpected fields {sorted(extra)}", "malformed_update")


class AggregatorService:
    """Round lifecycle and model store of one aggregator instance."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        metrics: AggregatorMetrics,
        bus: RedisBus | None = None,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self.bus = bus
        self.clock = clock
        self._lock = threading.RLock()
        self._model: _ModelState | None = None
        self._blobs: OrderedDict[tuple[int, int], ModelBlob] = OrderedDict()
        # Decoded updates of open rounds, by round attempt pk then client id: (digest, update).
        self._pending: dict[int, dict[int, tuple[str, Update]]] = {}
        self._tokens: dict[str, frozenset[int]] = {}
        self._run_ref: _RunRef | None = None  # the newest run, for uploads
        # Open attempts seen by upload batches (only the group commit's leader touches it).
        self._open_rounds: dict[tuple[int, int], _LiveRound] = {}
        # Uploads arriving together are stored in one transaction (see GroupCommit).
        self._writer: GroupCommit[_PendingUpload, _Stored] = GroupCommit(self._store_batch)
        self.storage = StorageKeeper(
            db,
            RetentionPolicy(settings.keep_latest_versions, settings.keep_every_versions),
            settings.compact_interval_s,
            on_pruned=self._forget_versions,
        )

    # ------------------------------------------------------------------ auth & clients

    def authenticate(self, token: str | None) -> Caller:
        """The caller behind a bearer token (401 when missing or unknown)."""
        if not token:
            raise Unauthorized("missing bearer token")
        if secrets.compare_digest(token.encode(), self.settings.operator_token.encode()):
            return Caller(frozenset(), operator=True)
        reader = self.settings.reader_token
        if reader and secrets.compare_digest(token.encode(), reader.encode()):
            return Caller(frozenset())  # may read rounds and models, owns no client
        h = hash_token(token)
        with self._lock:
            cached = self._tokens.get(h)
        if cached is None:
            with self.db.transaction() as s:
                ids = Repository(s).clients_of_token(h)
            if not ids:
                raise Unauthorized("unknown token")
            cached = frozenset(ids)
            with self._lock:
                if len(self._tokens) > 4096:
                    self._tokens.clear()
                self._tokens[h] = cached
        return Caller(cached)

    def require_operator(self, token: str | None) -> None:
        """401 unless the token is the operator token."""
        if not token or not secrets.compare_digest(
            token.encode(), self.settings.operator_token.encode()
        ):
            raise Unauthorized("operator token required")

    def count_clients(self) -> int:
        """How many clients are registered."""
        with self.db.transaction() as s:
            return Repository(s).count_clients()

    def register_clients(self, client_ids: list[int]) -> tuple[str, list[int]]:
        """Register clients under a new credential; returns (token, ids)."""
        token = secrets.token_urlsafe(32)
        try:
            with self.db.transaction() as s:
                repo = Repository(s)
                taken = repo.existing_clients(client_ids)
                if taken:
                    raise Conflict(
                        f"clients already registered: {taken[:10]}", "already_registered"
                    )
                repo.add_clients(client_ids, hash_token(token))
        except IntegrityError:
            raise Conflict("clients already registered", "already_registered") from None
        log.info("registered %d clients", len(client_ids))
        return token, client_ids

    # ------------------------------------------------------------------ runs

    def start_run(self, cfg: RunConfig) -> RunStarted:
        """Start a run: version 0 = init_shared(model, seed), round 1 open (409 if one runs)."""
        mcfg = cfg.model()
        params = init_shared(mcfg, cfg.seed)
        strategy = make_strategy(cfg.optimizer, cfg.server_lr, cfg.weighting, cfg.clip)
        state = strategy.state_dict()
        blob = encode_model(mcfg, params, 0)
        digest = hashlib.sha256(blob).hexdigest()
        now = self.clock()
        try:
            with self.db.transaction() as s:
                repo = Repository(s)
                if repo.active_run() is not None:
                    raise Conflict("a run is already active", "run_active")
                candidates = repo.all_client_ids()
                if not candidates:
                    raise Conflict("no clients are registered", "no_clients")
                run = repo.add_run(cfg.model_dump(mode="json"), now)
                repo.add_version(run.id, 0, 0, blob, encode_state(state), digest, 0, None, now)
                rnd = self._open_round(repo, run.id, cfg, 1, 0, 0, candidates, now)
                run_id, cohort_size = run.id, len(rnd.cohort)
        except IntegrityError:
            raise Conflict("a run is already active", "run_active") from None
        with self._lock:
            self._run_ref = _RunRef(run_id, mcfg)
            self._model = _ModelState(run_id, 0, params, strategy)
            self._remember_blob(ModelBlob(run_id, 0, blob, digest))
        log.info("run %d started: %d rounds, cohort %d", run_id, cfg.rounds, cohort_size)
        return RunStarted(
            run_id=run_id,
            state="running",
            round_id=1,
            model_version=0,
            cohort_size=cohort_size,
            config=cfg,
        )

    def _open_round(
        self,
        repo: Repository,
        run_id: int,
        cfg: RunConfig,
        round_id: int,
        attempt: int,
        base_version: int,
        candidates: list[int] | None,
        now: datetime,
    ) -> Round:
        """Insert a round attempt with its cohort drawn from the registered clients."""
        ids = np.asarray(candidates if candidates is not None else repo.all_client_ids())
        cohort = select_cohort(ids, cfg.fraction, cfg.seed, round_id, attempt)
        deadline = now + timedelta(seconds=cfg.deadline_s)
        return repo.add_round(
            run_id, round_id, attempt, [int(c) for c in cohort], base_version, now, deadline
        )

    def _set_run_state(self, action: str) -> RunStatus:
        now = self.clock()
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.active_run()
            if run is None:
                raise Conflict("no run is active", "no_run")
            cfg = RunConfig.model_validate(run.config)
            live = repo.live_round(run.id)
            if action == "pause" and run.state == "running":
                if live is not None and not repo.transition_round(live.id, ["open"], "paused"):
                    raise Conflict("the round is closing; retry", "round_closing")
                run.state = "paused"
            elif action == "resume" and run.state == "paused":
                if live is not None:
                    deadline = now + timedelta(seconds=cfg.deadline_s)
                    repo.transition_round(live.id, ["paused"], "open", deadline=deadline)
                run.state = "running"
            elif action == "stop":
                if live is not None and not repo.transition_round(
                    live.id, ["open", "paused"], "aborted", closed_at=now
                ):
                    raise Conflict("the round is closing; retry", "round_closing")
                run.state, run.active, run.finished_at = "stopped", None, now
            status = RunStatus(
                run_id=run.id,
                state=run.state,  # type: ignore[arg-type]
                round_id=None if live is None else live.round_id,
            )
        if action == "stop" and live is not None:
            with self._lock:
                self._pending.pop(live.id, None)
        log.info("run %d: %s -> %s", status.run_id, action, status.state)
        return status

    def pause_run(self) -> RunStatus:
        """Pause the active run: uploads are refused and no deadline runs until resumed."""
        return self._set_run_state("pause")

    def resume_run(self) -> RunStatus:
        """Resume a paused run; the open round gets a fresh deadline."""
        return self._set_run_state("resume")

    def stop_run(self) -> RunStatus:
        """Stop the active run for good; its live round is aborted."""
        return self._set_run_state("stop")

    # ------------------------------------------------------------------ reads

    def current_round(self, caller: Caller) -> CurrentRound:
        """The current round as a client sees it (its own cohort members only)."""
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.latest_run()
            if run is None:
                return CurrentRound(
                    run_id=None,
                    round_id=None,
                    attempt=None,
                    state="idle",
                    deadline=None,
                    model_version=None,
                    cohort=[],
                    cohort_size=0,
                    config=None,
                )
            cfg = RunConfig.model_validate(run.config)
            live = repo.live_round(run.id)
            rnd = live if live is not None else repo.last_round(run.id)
            version = repo.latest_version_number(run.id)
        if live is not None:
            state = "paused" if live.state == "paused" or run.state == "paused" else "open"
        else:
            state = "finished" if run.state in ("finished", "stopped") else "closed"
        cohort: list[int] = []
        if rnd is not None and live is not None:
            cohort = (
                list(rnd.cohort)
                if caller.operator
                else [c for c in rnd.cohort if c in caller.client_ids]
            )
        return CurrentRound(
            run_id=run.id,
            round_id=None if rnd is None else rnd.round_id,
            attempt=None if rnd is None else rnd.attempt,
            state=state,  # type: ignore[arg-type]
            deadline=live.deadline if live is not None else None,
            model_version=live.base_version if live is not None else version,
            cohort=cohort,
            cohort_size=0 if rnd is None else len(rnd.cohort),
            config=cfg,
        )

    def round_info(self, round_id: int) -> RoundInfo:
        """The latest attempt of a round of the current run."""
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.latest_run()
            rnd = None if run is None else repo.latest_attempt(run.id, round_id)
            if run is None or rnd is None:
                raise NotFound(f"round {round_id} does not exist", "round_not_found")
            received = repo.count_updates(rnd.id)
            metrics = None
            if rnd.model_version is not None:
                row = repo.version_meta(run.id, rnd.model_version)
                metrics = None if row is None else row.metrics
        return RoundInfo(
            round_id=rnd.round_id,
            attempt=rnd.attempt,
            state=rnd.state,  # type: ignore[arg-type]
            cohort_size=len(rnd.cohort),
            updates_received=received,
            metrics=metrics,
            model_version=rnd.model_version,
            base_version=rnd.base_version,
            deadline=rnd.deadline,
            loss=rnd.loss,
        )

    def history(self) -> History:
        """Every closed round of the current run."""
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.latest_run()
            if run is None:
                return History(run_id=None, rounds=[])
            rounds = repo.closed_rounds(run.id)
            metrics = repo.version_metrics(run.id)
        out = []
        for r in rounds:
            assert r.closed_at is not None and r.model_version is not None
            out.append(
                HistoryRound(
                    round_id=r.round_id,
                    model_version=r.model_version,
                    n_updates=r.n_updates or 0,
                    loss=r.loss,
                    metrics=metrics.get(r.model_version),
                    closed_at=r.closed_at,
                    seconds=(r.closed_at - r.opened_at).total_seconds(),
                )
            )
        return History(run_id=run.id, rounds=out)

    def model_blob(self, version: int | None) -> ModelBlob:
        """An encoded version of the current run's model (the latest when ``version`` is None)."""
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.latest_run()
            if run is None:
                raise NotFound("no run has been started", "no_run")
            v = repo.latest_version_number(run.id) if version is None else version
            if v is None:
                raise NotFound("no model version exists", "version_not_found")
            with self._lock:
                hit = self._blobs.get((run.id, v))
                if hit is not None:
                    self._blobs.move_to_end((run.id, v))
                    return hit
            row = repo.version_with_blobs(run.id, v)
            if row is None:
                raise NotFound(f"model version {v} does not exist", "version_not_found")
            if row.params is None:
                raise Gone(
                    f"model version {v} was pruned by the retention policy", "version_pruned"
                )
            blob = ModelBlob(run.id, v, row.params, row.digest)
        with self._lock:
            self._remember_blob(blob)
        return blob

    def _forget_versions(self, run_id: int, versions: list[int]) -> None:
        with self._lock:
            for v in versions:
                self._blobs.pop((run_id, v), None)

    def _remember_blob(self, blob: ModelBlob) -> None:
        self._blobs[(blob.run_id, blob.version)] = blob
        self._blobs.move_to_end((blob.run_id, blob.version))
        while len(self._blobs) > self.settings.model_cache_versions:
            self._blobs.popitem(last=False)

    # ------------------------------------------------------------------ uploads

    def accept_updates(self, caller: Caller, round_id: int, body: bytes) -> list[UploadResult]:
        """Validate and durably store every update of an upload body (all or nothing)."""
        try:
            return self._accept_updates(caller, round_id, body)
        except AggregatorError as err:
            self.metrics.updates_refused.labels(reason=err.code).inc()
            raise

    def _accept_updates(self, caller: Caller, round_id: int, body: bytes) -> list[UploadResult]:
        if not caller.client_ids:
            raise Forbidden("only clients upload updates", "not_owned")
        run = self._current_run()
        for _ in range(3):
            try:
                stored = self._writer.submit(self._validate_upload(caller, round_id, body, run))
                break
            except (Malformed, _StaleRun) as err:
                # The cached run may be stale (a replica started a newer one, maybe with another
                # model shape): re-read it, and decode again only if it did change.
                latest = self._current_run(refresh=True)
                if latest.run_id == run.run_id:
                    if isinstance(err, Malformed):
                        raise
                    raise Conflict(f"round {round_id} is not open", "round_not_open") from None
                run = latest
        else:
            raise Conflict("the current run keeps changing; retry", "round_not_open")
        # committed: the updates are acknowledged from here on
        self.metrics.updates_accepted.inc(len(stored.fresh))
        self.metrics.updates_duplicate.inc(len(stored.results) - len(stored.fresh))
        if stored.round_pk is None:
            return stored.results
        log.debug(
            "round %d: %d accepted, %d/%d received",
            round_id,
            len(stored.fresh),
            stored.received,
            stored.cohort_size,
        )
        if stored.fresh and stored.received >= stored.cohort_size:
            try:
                self.close_round(stored.round_pk)
            except Exception:  # the deadline task retries; the upload itself is committed
                log.exception("closing round %d after its last upload failed", round_id)
        return stored.results

    def _current_run(self, refresh: bool = False) -> _RunRef:
        """The newest run's id and model shape, cached (409 when no run was ever started).

        A run's config never changes, so the cache can only be stale by a newer run having been
        started, here (``start_run`` updates it) or by a replica. The latter is detected inside
        the upload's write transaction: the cached run then has no live round and is not the
        newest run any more (:class:`_StaleRun`), and the upload is decoded again.
        """
        with self._lock:
            cached = self._run_ref
        if cached is not None and not refresh:
            return cached
        with self.db.transaction() as s:
            run = Repository(s).latest_run()
            if run is None:
                raise Conflict("no run has been started", "round_not_open")
            ref = _RunRef(run.id, RunConfig.model_validate(run.config).model())
        with self._lock:
            if self._run_ref is None or self._run_ref.run_id <= ref.run_id:
                self._run_ref = ref
        return ref

    def _validate_upload(
        self, caller: Caller, round_id: int, body: bytes, run: _RunRef
    ) -> _PendingUpload:
        """Decode and check a body against the run's model, outside any transaction."""
        try:
            decoded = decode_updates(body, run.model)
        except WireError as err:
            raise Malformed(str(err), "malformed_update") from None
        _strict_metadata(body)
        if decoded.round_id != round_id:
            raise Malformed(
                f"body is for round {decoded.round_id}, path says {round_id}", "round_mismatch"
            )
        for u in decoded.updates:
            if u.client_id not in caller.client_ids:
                raise Forbidden(f"client {u.client_id} is not held by this token", "not_owned")
        # A validated one-update body is stored as sent: it decodes to exactly that update.
        blobs = (
            [body]
            if len(decoded.updates) == 1
            else [encode_updates(round_id, [u]) for u in decoded.updates]
        )
        return _PendingUpload(run.run_id, round_id, decoded.updates, decoded.digests, blobs)

    def _store_batch(self, uploads: Sequence[_PendingUpload]) -> list[_Stored | Exception]:
        """Check and store a batch of uploads in ONE transaction (the group commit's writer).

        Each upload is checked on its own, against the database and the batch's earlier
        uploads, as if it had a transaction of its own: a refused one writes nothing and gets
        its own error, the others are unaffected. :class:`GroupCommit` answers the requests
        only after this returns, i.e. after the commit.
        """
        now = self.clock()
        outcomes: list[_Stored | Exception] = []
        with self.db.transaction() as s:
            batch = _UploadBatch(Repository(s), now, uploads, self._open_rounds)
            for upload in uploads:
                try:
                    outcomes.append(self._store_upload(batch, upload))
                except (AggregatorError, _StaleRun) as err:
                    outcomes.append(err)
            batch.write()
        # committed: keep the decoded updates for the close (before any request is answered)
        with self._lock:
            for out in outcomes:
                if isinstance(out, _Stored) and out.round_pk is not None and out.fresh:
                    # one live round per run: anything else cached was closed (maybe by a replica)
                    for stale in [k for k in self._pending if k != out.round_pk]:
                        del self._pending[stale]
                    pending = self._pending.setdefault(out.round_pk, {})
                    for digest, u in out.fresh:
                        pending[u.client_id] = (digest, u)
        return outcomes

    def _store_upload(self, batch: _UploadBatch, up: _PendingUpload) -> _Stored:
        """Check one upload inside the batch transaction and queue its rows (all or nothing)."""
        run_id, round_id = up.run_id, up.round_id
        ids = [u.client_id for u in up.updates]
        live = batch.live_round(run_id, round_id)
        if isinstance(live, str):
            if batch.repo.latest_run_id() != run_id:
                raise _StaleRun
            # A lost answer retried after its round closed is still just a duplicate.
            known = [batch.digest(run_id, round_id, c) for c in ids]
            if known == up.digests:
                duplicates = [UploadResult(client_id=c, status="duplicate") for c in ids]
                return _Stored(duplicates, [], None, 0, 0)
            raise Conflict(f"round {round_id} is {live}", "round_not_open")
        for c in ids:
            if c not in live.cohort:
                raise Forbidden(
                    f"client {c} is not in the cohort of round {round_id} (attempt {live.attempt})",
                    "not_in_cohort",
                )
        results: list[UploadResult] = []
        fresh: list[tuple[str, Update, bytes]] = []
        for u, digest, blob in zip(up.updates, up.digests, up.blobs, strict=True):
            stored = batch.digest(run_id, round_id, u.client_id)
            if stored is not None:
                if stored != digest:
                    raise Conflict(
                        f"client {u.client_id} already sent a different update for round "
                        f"{round_id}",
                        "conflicting_update",
                    )
                results.append(UploadResult(client_id=u.client_id, status="duplicate"))
                continue
            results.append(UploadResult(client_id=u.client_id, status="accepted"))
            fresh.append((digest, u, blob))
        for digest, u, blob in fresh:  # every check passed: now queue the rows
            batch.add(live, run_id, round_id, u, digest, blob)
        return _Stored(
            results, [(d, u) for d, u, _ in fresh], live.pk, live.received, live.cohort_size
        )

    # ------------------------------------------------------------------ closing

    def tick(self) -> str | None:
        """Close the live round if it is complete or past its deadline (the background task)."""
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.active_run()
            if run is None or run.state != "running":
                return None
            live = repo.live_round(run.id)
            live_pk = None if live is None else live.id
            with self._lock:  # drop decoded updates of rounds closed elsewhere (a replica)
                for stale in [k for k in self._pending if k != live_pk]:
                    del self._pending[stale]
            if live is None or live.state != "open":
                return None
            complete = live.updates_received >= len(live.cohort)
            pk, expired = live.id, self.clock() >= live.deadline
        if complete or expired:
            return self.close_round(pk)
        return None

    def close_round(self, pk: int) -> str:
        """Close (or retry below quorum) a round attempt if it is due; exactly once.

        Returns "closed", "retried", "not_ready", "not_open" or "locked".
        """
        with self.db.transaction() as s:
            rnd = Repository(s).get_round(pk)
            if rnd is None or rnd.state != "open":
                return "not_open"
            run_id, round_id = rnd.run_id, rnd.round_id
        if self.bus is None:
            return self._close_round(pk)
        with self.bus.close_lock(run_id, round_id) as acquired:
            if not acquired:
                return "locked"
            return self._close_round(pk)

    def _close_round(self, pk: int) -> str:
        t0 = time.perf_counter()
        now = self.clock()
        try:
            with self.db.transaction() as s:
                repo = Repository(s)
                # The guard: only one transaction moves the round out of "open"; concurrent
                # uploads wait for it and are then refused as "round not open".
                if not repo.transition_round(pk, ["open"], "closing"):
                    return "not_open"
                rnd = repo.get_round(pk)
                assert rnd is not None
                run = repo.get_run(rnd.run_id)
                assert run is not None
                cfg = RunConfig.model_validate(run.config)
                meta = repo.update_meta(pk)
                m, n = len(rnd.cohort), len(meta)
                outcome: tuple[str, int | None, tuple[_ModelState, ModelBlob] | None]
                if n < m and now < rnd.deadline:
                    raise _NotReady
                if n == 0 or n < cfg.quorum_count(m):
                    outcome = self._retry(repo, run, cfg, rnd, now)
                else:
                    outcome = self._aggregate(repo, run, cfg, rnd, meta, now)
        except _NotReady:
            return "not_ready"
        kind, new_round, event = outcome
        with self._lock:
            self._pending.pop(pk, None)
            if event is not None:
                self._model, blob = event
                self._remember_blob(blob)
        if event is not None:
            self.storage.notify()
        if kind == "retried":
            self.metrics.rounds_retried.inc()
            log.warning(
                "round %d: %d of %d updates at the deadline, below quorum; attempt %s",
                rnd.round_id,
                n,
                m,
                new_round,
            )
            return kind
        self.metrics.rounds_closed.inc()
        self.metrics.round_duration.observe(max(0.0, (now - rnd.opened_at).total_seconds()))
        seconds = time.perf_counter() - t0
        self.metrics.close_seconds.observe(seconds)
        log.info(
            "round %d closed: %d/%d updates -> version %d in %.1f ms",
            rnd.round_id,
            n,
            m,
            rnd.base_version + 1,
            seconds * 1e3,
        )
        if self.bus is not None:
            try:
                self.bus.publish_version(rnd.run_id, rnd.base_version + 1, rnd.round_id)
            except Exception:
                log.exception("publishing version %d failed", rnd.base_version + 1)
        return kind

    def _retry(
        self, repo: Repository, run: Run, cfg: RunConfig, rnd: Round, now: datetime
    ) -> tuple[str, int | None, None]:
        """Fail the attempt, drop its updates, open attempt + 1 with a new cohort."""
        repo.delete_updates(rnd.id)
        rnd.state, rnd.closed_at, rnd.n_updates = "failed", now, 0
        nxt = self._open_round(
            repo, run.id, cfg, rnd.round_id, rnd.attempt + 1, rnd.base_version, None, now
        )
        return "retried", nxt.attempt, None

    def _aggregate(
        self,
        repo: Repository,
        run: Run,
        cfg: RunConfig,
        rnd: Round,
        meta: list[tuple[int, str]],
        now: datetime,
    ) -> tuple[str, int | None, tuple[_ModelState, ModelBlob]]:
        """strategy.round over the updates sorted by client id; persist version v+1."""
        mcfg = cfg.model()
        latest = repo.latest_version_number(run.id)
        if latest != rnd.base_version:
            raise RuntimeError(
                f"round {rnd.round_id} was opened on version {rnd.base_version}, latest is {latest}"
            )
        updates = self._round_updates(repo, rnd.id, meta, mcfg)
        base = self._model_state(repo, run.id, rnd.base_version, cfg)
        with self._lock:
            self._model = None  # stepped in place below; restored only after the commit
        params, strategy = base.params, base.strategy
        with torch.no_grad():
            strategy.round(params, updates)
        version = rnd.base_version + 1
        state = strategy.state_dict()
        blob = encode_model(mcfg, params, version)
        digest = hashlib.sha256(blob).hexdigest()
        loss = float(np.mean([u.loss for u in updates]))
        repo.add_version(
            run.id,
            version,
            rnd.round_id,
            blob,
            encode_state(state),
            digest,
            len(updates),
            loss,
            now,
        )
        rnd.state, rnd.closed_at = "closed", now
        rnd.n_updates, rnd.loss, rnd.model_version = len(updates), loss, version
        next_round: int | None = None
        if rnd.round_id < cfg.rounds and run.state == "running":
            next_round = self._open_round(
                repo, run.id, cfg, rnd.round_id + 1, 0, version, None, now
            ).round_id
        elif rnd.round_id >= cfg.rounds:
            run.state, run.active, run.finished_at = "finished", None, now
        cached = _ModelState(run.id, version, params, strategy)
        return "closed", next_round, (cached, ModelBlob(run.id, version, blob, digest))

    def _model_state(
        self, repo: Repository, run_id: int, version: int, cfg: RunConfig
    ) -> _ModelState:
        """Params and strategy of a version (cached; rebuilt from its version row)."""
        with self._lock:
            cached = self._model
        if cached is not None and (cached.run_id, cached.version) == (run_id, version):
            return cached
        row = repo.version_with_blobs(run_id, version)
        if row is None or row.params is None or row.optimizer_state is None:
            raise RuntimeError(f"model version {version} of run {run_id} is missing")
        stored_cfg, params, stored_version = decode_model(row.params)
        if stored_cfg != cfg.model() or stored_version != version:
            raise RuntimeError(f"model version {version} does not match its run's config")
        state, _ = decode_state(row.optimizer_state)
        strategy = make_strategy(cfg.optimizer, cfg.server_lr, cfg.weighting, cfg.clip)
        strategy.load_state_dict(state)
        built = _ModelState(run_id, version, params, strategy)
        with self._lock:
            self._model = built
        log.info("rebuilt model version %d of run %d from the database", version, run_id)
        return built

    def _round_updates(
        self, repo: Repository, pk: int, meta: list[tuple[int, str]], mcfg: ModelConfig
    ) -> list[Update]:
        """The round's updates in client-id order: from memory, else decoded from the DB."""
        with self._lock:
            pending = dict(self._pending.get(pk, {}))
        out: dict[int, Update] = {}
        missing = []
        for client_id, digest in meta:
            hit = pending.get(client_id)
            if hit is not None and hit[0] == digest:
                out[client_id] = hit[1]
            else:
                missing.append(client_id)
        if missing:
            for client_id, blob in repo.update_blobs(pk, missing).items():
                out[client_id] = decode_updates(blob, mcfg).updates[0]
            log.info("decoded %d stored updates of round attempt %d", len(missing), pk)
        return [out[c] for c, _ in meta]

    def warm(self) -> None:
        """After a (re)start: rebuild the model state and the open round's updates from the DB."""
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.active_run() or repo.latest_run()
            if run is None:
                return
            cfg = RunConfig.model_validate(run.config)
            mcfg = cfg.model()
            version = repo.latest_version_number(run.id)
            if version is not None:
                self._model_state(repo, run.id, version, cfg)
            live = repo.live_round(run.id)
            if live is None:
                return
            meta = repo.update_meta(live.id)
            updates = self._round_updates(repo, live.id, meta, mcfg)
        with self._lock:
            self._pending[live.id] = {
                u.client_id: (d, u) for (_, d), u in zip(meta, updates, strict=True)
            }
        log.info(
            "resumed run %d round %d with %d acknowledged updates",
            run.id,
            live.round_id,
            len(updates),
        )

    # ------------------------------------------------------------------ evaluation

    def report_evaluation(self, caller: Caller, req: EvaluationRequest) -> EvaluationAck:
        """Store a federated-evaluation report; complete coverage sets the version's metrics."""
        foreign = sorted(set(req.client_ids) - caller.client_ids)
        if foreign and not caller.operator:
            raise Forbidden(f"clients not held by this token: {foreign[:10]}", "not_owned")
        if req.count != len(req.client_ids):
            raise Malformed(
                f"count {req.count} != {len(req.client_ids)} client ids", "count_mismatch"
            )
        sums = {k: v for k, v in req.sums.items() if k != "count"}
        v = req.model_version
        with self.db.transaction() as s:
            repo = Repository(s)
            run = repo.latest_run()
            if run is None:
                raise NotFound("no run has been started", "no_run")
            # Reports of one version are serialized on its row: two concurrent reports that
            # together complete the coverage must not each miss the other's (uncommitted)
            # clients under READ COMMITTED and leave the metrics unset.
            row = repo.version_meta(run.id, v, for_update=True)
            if row is None:
                raise NotFound(f"model version {v} does not exist", "version_not_found")
            seen = repo.evaluated_clients(run.id, v, req.client_ids)
            if seen and len(seen) < len(req.client_ids):
                raise Conflict(
                    f"{len(seen)} of the {len(req.client_ids)} clients already reported for "
                    f"version {v}; report them separately",
                    "evaluation_overlap",
                )
            if seen:
                return EvaluationAck(
                    model_version=v, accepted=0, ignored=len(seen), complete=row.metrics is not None
                )
            repo.add_evaluation(run.id, v, sums, req.count, req.client_ids, self.clock())
            complete = row.metrics is not None
            if not complete and repo.count_evaluated(run.id, v) >= repo.count_clients():
                reports = repo.evaluation_reports(run.id, v)
                total = sum(r.count for r in reports)
                names = sorted({k for r in reports for k in r.sums})
                means = {k: sum(r.sums.get(k, 0.0) for r in reports) / total for k in names}
                complete = repo.set_version_metrics(run.id, v, means)
                if complete:
                    log.info("version %d evaluated over %d clients: %s", v, total, means)
        return EvaluationAck(
            model_version=v, accepted=len(req.client_ids), ignored=0, complete=complete
        )

    # ------------------------------------------------------------------ health

    def health(self) -> Health:
        """Ping the database (and Redis when configured)."""
        try:
            self.db.ping()
            database = "ok"
        except Exception as err:
            database = f"error: {type(err).__name__}"
        redis_state = "disabled"
        if self.bus is not None:
            try:
                self.bus.ping()
                redis_state = "ok"
            except Exception as err:
                redis_state = f"error: {type(err).__name__}"
        ok = database == "ok" and redis_state in ("ok", "disabled")
        return Health(status="ok" if ok else "error", database=database, redis=redis_state)
