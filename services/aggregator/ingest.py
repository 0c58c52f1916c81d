"""Upload ingest: decode and check an upload body, store it durably, answer per client.

Bodies are decoded and checked outside any transaction; uploads that arrive together are
then checked against the database and stored in one transaction (:class:`GroupCommit`), each
still answered (or refused) on its own and only after that transaction committed. An upload
that completes its round's cohort closes the round before it is answered.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedrecgel.robust import check_values
from fedrecgel.upload_modes import Upload
from fedrecgel.wire import PARTIAL_FORMAT, UPDATES_FORMAT, WireError, body_format
from services.aggregator.auth import Caller
from services.aggregator.db import Database
from services.aggregator.errors import (
    AggregatorError,
    Conflict,
    Forbidden,
    Malformed,
    not_in_cohort,
    not_owned,
)
from services.aggregator.groupcommit import GroupCommit
from services.aggregator.metrics import AggregatorMetrics
from services.aggregator.models import Clock
from services.aggregator.pending import PendingUpdates
from services.aggregator.privacy import check_upload
from services.aggregator.repository import Repository
from services.aggregator.rounds import CloseOutcome
from services.aggregator.runs import NewestRun, RunRef
from services.aggregator.schemas import UploadResult
from services.aggregator.uploadbatch import LiveRound, PendingUpload, RoundRefusal, UploadBatch

log = logging.getLogger(__name__)

# Times an upload is decoded again when the newest run changed under it.
_RUN_CHANGE_RETRIES = 3
#: bounds of an update's metadata: its training-sample count (a 32-bit column) and its mean
#: training loss (a binary cross-entropy: never negative; far above any real run's)
MAX_SAMPLES = 2**31 - 1
MAX_LOSS = 1e6


@dataclass(frozen=True)
class Stored:
    """A committed upload: per-client results, its new updates, and its round's count after."""

    results: list[UploadResult]
    fresh: list[tuple[str, Upload]]
    round_pk: int | None  # None: a duplicate of a round that is not open any more
    received: int
    cohort_size: int


class StaleRun(Exception):
    """The upload was decoded for a run that is no longer the newest one: decode again."""


class Ingest:
    """Accepts upload bodies.

    Locking: request threads only meet in :class:`GroupCommit` (its condition variable) and in
    :class:`PendingUpdates`; ``open_rounds`` belongs to the batch being written, and only one
    batch is written at a time. The database's locks do the rest: each batch locks the round
    rows it writes to (``touch_open_round``), the same rows a close moves out of "open".
    """

    def __init__(
        self,
        db: Database,
        metrics: AggregatorMetrics,
        clock: Clock,
        newest: NewestRun,
        pending: PendingUpdates,
        close_round: Callable[[int], object],
    ) -> None:
        self.db = db
        self.metrics = metrics
        self.clock = clock
        self.newest = newest
        self.pending = pending
        self.close_round = close_round
        # Open attempts seen by upload batches (only the group commit's leader touches it).
        self.open_rounds: dict[tuple[int, int], LiveRound] = {}
        # Uploads arriving together are stored in one transaction (see GroupCommit).
        self.writer: GroupCommit[PendingUpload, Stored] = GroupCommit(self.store_batch)

    def accept(self, caller: Caller, round_id: int, body: bytes) -> list[UploadResult]:
        """Validate and durably store every update of an upload body (all or nothing)."""
        return self.accept_and_close(caller, round_id, body)[0]

    def accept_and_close(
        self, caller: Caller, round_id: int, body: bytes
    ) -> tuple[list[UploadResult], bool]:
        """:meth:`accept`, and whether the body completed the round and this call closed it."""
        try:
            return self._accept(caller, round_id, body)
        except AggregatorError as err:
            self.metrics.updates_refused.labels(reason=err.code).inc()
            raise

    def _accept(
        self, caller: Caller, round_id: int, body: bytes
    ) -> tuple[list[UploadResult], bool]:
        if not caller.client_ids:
            raise Forbidden("only clients upload updates", "not_owned")
        run = self.newest.get()
        if not run.mode.plain:
            raise Conflict(
                "this run aggregates securely: clients send masked inputs to "
                f"/v1/rounds/{round_id}/secagg/masked, never plain updates",
                "secure_run",
            )
        for _ in range(_RUN_CHANGE_RETRIES):
            try:
                stage = self.metrics.stage_seconds
                with stage.labels(stage="validate").time():
                    checked = self.validate(caller, round_id, body, run)
                with stage.labels(stage="commit").time():
                    stored = self.writer.submit(checked)
                break
            except (Malformed, StaleRun) as err:
                # The cached run may be stale (a replica started a newer one, maybe with another
                # model shape): re-read it, and decode again only if it did change.
                latest = self.newest.get(refresh=True)
                if latest.run_id == run.run_id:
                    if isinstance(err, Malformed):
                        raise
                    raise Conflict(f"round {round_id} is not open", "round_not_open") from None
                run = latest
        else:
            raise Conflict("the current run keeps changing; retry", "round_not_open")
        # committed: the updates are acknowledged from here on
        accepted = sum(1 for r in stored.results if r.status == "accepted")
        self.metrics.updates_accepted.inc(accepted)
        self.metrics.updates_duplicate.inc(len(stored.results) - accepted)
        if stored.round_pk is None:
            return stored.results, False
        log.debug(
            "round %d: %d accepted, %d/%d received",
            round_id,
            len(stored.fresh),
            stored.received,
            stored.cohort_size,
        )
        closed = False
        if stored.fresh and stored.received >= stored.cohort_size:
            try:
                closed = self.close_round(stored.round_pk) == CloseOutcome.CLOSED
            except Exception:  # the deadline task retries; the upload itself is committed
                log.exception("closing round %d after its last upload failed", round_id)
        return stored.results, closed

    def validate(self, caller: Caller, round_id: int, body: bytes, run: RunRef) -> PendingUpload:
        """Decode and check a body against the run's model, outside any transaction: the run's
        upload mode's format, shapes, finite values, every client it covers held by this token
        with its sample count, its loss within bounds (a DP run: its norm within the clipping
        bound); the cohort and duplicates are checked at commit."""
        mode = run.mode
        try:
            fmt = body_format(body)
        except WireError as err:
            raise Malformed(str(err), "malformed_update") from None
        if fmt in (UPDATES_FORMAT, PARTIAL_FORMAT) and fmt != mode.format:  # the other mode's
            raise Malformed(
                f"this run takes {mode.what} (upload_grouping={mode.grouping})",
                "wrong_upload_grouping",
            )
        try:
            decoded = mode.decode(body)
        except WireError as err:
            raise Malformed(str(err), "malformed_update") from None
        if decoded.round_id != round_id:
            raise Malformed(
                f"body is for round {decoded.round_id}, path says {round_id}", "round_mismatch"
            )
        for u in decoded.uploads:
            for c, n in zip(u.client_ids, u.sizes, strict=True):
                if c not in caller.client_ids:
                    raise not_owned(c)
                if not 1 <= n <= MAX_SAMPLES:
                    raise Malformed(
                        f"client {c}: n_samples {n} is outside 1..{MAX_SAMPLES}",
                        "invalid_update_metadata",
                    )
            k = len(u.client_ids)
            if not (math.isfinite(u.loss) and 0.0 <= u.loss <= MAX_LOSS * k):
                raise Malformed(
                    f"client {u.client_id}: loss {u.loss!r} is not a finite sum of {k} losses "
                    f"in [0, {MAX_LOSS:g}]",
                    "invalid_update_metadata",
                )
            try:
                check_values(u)
            except ValueError as err:
                raise Malformed(f"client {u.client_id}: {err}", "update_values_too_large") from None
            check_upload(u, run.config, 1, run.model)  # a DP run: within the clipping norm
        return PendingUpload(run.run_id, round_id, decoded.uploads, decoded.digests, decoded.blobs)

    def store_batch(self, uploads: Sequence[PendingUpload]) -> list[Stored | Exception]:
        """Check and store a batch of uploads in ONE transaction (the group commit's writer).

        Each upload is checked on its own, against the database and the batch's earlier
        uploads, as if it had a transaction of its own: a refused one writes nothing and gets
        its own error, the others are unaffected. :class:`GroupCommit` answers the requests
        only after this returns, i.e. after the commit.
        """
        now = self.clock()
        outcomes: list[Stored | Exception] = []
        with self.db.transaction() as s:
            batch = UploadBatch(Repository(s), now, uploads, self.open_rounds)
            for upload in uploads:
                try:
                    outcomes.append(self._store_upload(batch, upload))
                except (AggregatorError, StaleRun) as err:
                    outcomes.append(err)
            batch.write()
        # committed: keep the decoded updates for the close (before any request is answered)
        for out in outcomes:
            if isinstance(out, Stored) and out.round_pk is not None and out.fresh:
                self.pending.add(out.round_pk, out.fresh)
        return outcomes

    def _store_upload(self, batch: UploadBatch, up: PendingUpload) -> Stored:
        """Check one upload body inside the batch transaction and queue a row per client each
        of its uploads covers (all or nothing; an upload's body filed under its first client,
        its digest on every row).

        An upload whose clients all hold its digest already is a duplicate (a retry); one of
        whose clients another upload counted already is a 409."""
        run_id, round_id = up.run_id, up.round_id
        ids = up.client_ids
        digests = [d for u, d in zip(up.uploads, up.digests, strict=True) for _ in u.client_ids]
        live = batch.live_round(run_id, round_id)
        if isinstance(live, RoundRefusal):
            if batch.repo.latest_run_id() != run_id:
                raise StaleRun
            # A lost answer retried after its round closed is still just a duplicate.
            known = [batch.digest(run_id, round_id, c) for c in ids]
            if known == digests:
                duplicates = [UploadResult(client_id=c, status="duplicate") for c in ids]
                return Stored(duplicates, [], None, 0, 0)
            raise Conflict(f"round {round_id} is {live.value}", "round_not_open")
        for c in ids:
            if c not in live.cohort:
                raise not_in_cohort(c, round_id, live.attempt)
        results: list[UploadResult] = []
        fresh: list[tuple[str, Upload, bytes]] = []
        for u, digest, blob in zip(up.uploads, up.digests, up.blobs, strict=True):
            known = [batch.digest(run_id, round_id, c) for c in u.client_ids]
            if all(k == digest for k in known):
                results += [UploadResult(client_id=c, status="duplicate") for c in u.client_ids]
                continue
            counted = [c for c, k in zip(u.client_ids, known, strict=True) if k is not None]
            if counted:
                raise Conflict(
                    f"clients {counted[:5]} already sent a different upload for round {round_id}",
                    "conflicting_update",
                )
            results += [UploadResult(client_id=c, status="accepted") for c in u.client_ids]
            fresh.append((digest, u, blob))
        for digest, u, blob in fresh:  # every check passed: now queue the rows
            mean_loss = u.loss / len(u.client_ids)
            for i, (c, n) in enumerate(zip(u.client_ids, u.sizes, strict=True)):
                batch.add_row(
                    live, run_id, round_id, c, n, mean_loss, digest, blob if i == 0 else None
                )
        return Stored(
            results, [(d, u) for d, u, _ in fresh], live.pk, live.received, live.cohort_size
        )
