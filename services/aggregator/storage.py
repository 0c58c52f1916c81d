"""Bounded storage: what the aggregator keeps once a round is closed, and compaction.

Once a round's model version is committed its updates are needed as metadata only (client,
digest, ``n_samples``, loss: enough to answer a retried upload), and old model versions are
pruned by :class:`RetentionPolicy`. :class:`StorageKeeper` frees both in a background thread,
woken when a round closes (and every poll interval, for rounds that a replica closed): never
in the closing transaction, whose time is on the critical path of the run (freeing a round's
blobs costs SQLite a walk over every overflow page). The freed space is reused by the next
rounds' rows at once; :class:`Compactor` also hands it back to the file system.

Nothing here is needed for correctness: a crash before a pass only leaves blobs that the next
pass (after the restart) frees.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import text

from services.aggregator.db import Database
from services.aggregator.evaluation_repository import EvaluationRepository
from services.aggregator.models import utcnow
from services.aggregator.repository import Repository
from services.aggregator.secagg_repository import SecAggRepository
from services.priority import lower_thread_priority

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionPolicy:
    """Which model versions keep their params: the newest ``keep_latest`` ones and every
    multiple of ``keep_every`` (0: no such extra versions). The newest version is always kept
    (``keep_latest >= 1``), and it alone keeps the server-optimizer state."""

    keep_latest: int = 5
    keep_every: int = 10
    #: runs whose versions keep params: the newest ``keep_runs``; every version of an older run
    #: is pruned (its rows stay: its history, metrics and version numbers; reading it is 410)
    keep_runs: int = 10

    def __post_init__(self) -> None:
        if self.keep_latest < 1:
            raise ValueError("keep_latest must be >= 1: the newest version is always kept")
        if self.keep_every < 0:
            raise ValueError("keep_every must be >= 0")
        if self.keep_runs < 1:
            raise ValueError("keep_runs must be >= 1: the newest run is always kept")

    def old_runs(self, run_ids: Iterable[int]) -> set[int]:
        """The runs of ``run_ids`` past the newest ``keep_runs`` (run ids grow with time)."""
        return set(sorted(run_ids, reverse=True)[self.keep_runs :])

    def keeps(self, version: int, latest: int) -> bool:
        """Whether ``version`` keeps its params while ``latest`` is the newest version."""
        if version > latest - self.keep_latest:
            return True
        return self.keep_every > 0 and version % self.keep_every == 0


class Compactor:
    """Hands space freed by pruning back to the file system, at most every ``interval_s``.

    SQLite: the database runs with ``auto_vacuum=INCREMENTAL`` (see ``db.make_engine``), so
    ``PRAGMA incremental_vacuum`` truncates the file by its free pages, and a ``TRUNCATE``
    checkpoint resets the WAL file; free pages are reused by new rows anyway, so this runs at
    most every ``interval_s`` (it moves pages under the write lock). PostgreSQL: a plain
    ``VACUUM`` of the tables a pass frees rows of (it locks no reader or writer out) makes the
    freed TOAST space reusable and gives trailing empty pages back; until it runs, deleted
    bodies keep their space, so it runs after every pass that freed something. Thread-safe;
    only one compaction runs at a time.
    """

    #: every table a pass deletes rows from or updates: update bodies (their own table since
    #: bounded storage), secure-aggregation messages and totals, versions' params and states
    #: (pruned, or older than the newest) and rows (marked pruned), evaluated versions' coverage
    TABLES = (
        "update_blobs",
        "secagg_messages",
        "secagg_totals",
        "version_blobs",
        "model_versions",
        "evaluations",
    )

    def __init__(self, db: Database, interval_s: float) -> None:
        self.db = db
        self.interval_s = interval_s
        self._lock = threading.Lock()  # guards _due and _last
        self._running = threading.Lock()
        self._due = False
        self._last = time.monotonic()  # the first compaction comes an interval after start

    def mark_due(self) -> None:
        """Something was freed (a round closed): compact at the next chance."""
        with self._lock:
            self._due = True

    def run_if_due(self) -> bool:
        """Compact when something was freed and the interval has passed (on PostgreSQL at
        once: there freed space is reused only after a VACUUM); whether it ran."""
        now = time.monotonic()
        interval = 0.0 if self.db.engine.dialect.name == "postgresql" else self.interval_s
        with self._lock:
            if not self._due or now - self._last < interval:
                return False
            self._due, self._last = False, now
        self.run()
        return True

    def run(self) -> None:
        """Compact now (blocks while another compaction runs)."""
        with self._running:
            t0 = time.perf_counter()
            if self.db.engine.dialect.name == "sqlite":
                self._sqlite()
            elif self.db.engine.dialect.name == "postgresql":
                self._postgres()
            log.info("storage compacted in %.1f ms", (time.perf_counter() - t0) * 1e3)

    def _sqlite(self) -> None:
        with self.db.engine.connect() as conn:
            # On the driver's connection: outside the engine's BEGIN IMMEDIATE hook (the
            # checkpoint must not run inside a transaction), each pragma its own statement.
            raw = conn.connection.driver_connection
            assert raw is not None
            # Each step of this pragma frees one page, and ``execute`` steps a statement that
            # returns no rows only once; ``executescript`` steps it to the end.
            raw.executescript("PRAGMA incremental_vacuum;")
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def _postgres(self) -> None:
        with self.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in self.TABLES:
                conn.execute(text(f"VACUUM {table}"))


PrunedHook = Callable[[int, list[int]], None]


#: least seconds between two background passes. Each pass costs the aggregator a few
#: milliseconds of queries whatever it frees; rounds that close several times a second
#: share one, at the price of at most this long of their garbage kept.
PASS_GAP_S = 1.0


class StorageKeeper:
    """Frees the blobs of finished rounds and prunes model versions, off the request path.

    ``notify`` (after a round closed) wakes the background thread started by ``start`` (at
    most one pass every ``min_gap_s``); the thread also wakes every ``poll_s``. Each pass is
    one transaction (:meth:`free`), then a compaction when one is due. ``on_pruned(run_id,
    versions)`` is told what was pruned, after the commit (the model cache drops them).
    Passes never overlap (one lock).
    """

    def __init__(
        self,
        db: Database,
        policy: RetentionPolicy,
        compact_interval_s: float,
        on_pruned: PrunedHook | None = None,
    ) -> None:
        self.db = db
        self.policy = policy
        self.compactor = Compactor(db, compact_interval_s)
        self.on_pruned = on_pruned
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pass = threading.Lock()  # one pass at a time
        self._thread: threading.Thread | None = None

    def notify(self) -> None:
        """A round closed here: run a pass now."""
        self._wake.set()

    def free(self) -> dict[int, list[int]]:
        """One transaction: release the blobs of every finished round attempt, prune the
        versions of every run that the policy no longer keeps and drop the per-client
        evaluation rows of every version whose metrics are written; run -> pruned versions."""
        now = utcnow()
        with self._pass, self.db.transaction() as s:
            repo = Repository(s)
            released = repo.release_finished_update_blobs()
            released += SecAggRepository(s).release_finished()
            pruned = {}
            evals, dropped = EvaluationRepository(s), 0
            latest_of = repo.latest_versions()
            old = self.policy.old_runs(latest_of)
            for run_id, latest in latest_of.items():
                # an old run resumes no more: its newest version's optimizer state goes too
                repo.drop_old_optimizer_states(run_id, latest + (run_id in old))
                dropped += evals.drop_coverage_of_evaluated(run_id)
                doomed = [
                    v
                    for v in repo.unpruned_versions(run_id)
                    if run_id in old or not self.policy.keeps(v, latest)
                ]
                if doomed:
                    repo.prune_versions(run_id, doomed, now)
                    pruned[run_id] = doomed
        if released or pruned or dropped:
            self.compactor.mark_due()
            log.debug(
                "released %d update blobs and %d evaluation rows; pruned versions %s",
                released,
                dropped,
                pruned,
            )
        if self.on_pruned is not None:
            for run_id, versions in pruned.items():
                self.on_pruned(run_id, versions)
        return pruned

    def maintain(self) -> bool:
        """A pass: :meth:`free`, then compact if due; whether it compacted."""
        self.free()
        return self.compactor.run_if_due()

    def start(self, poll_s: float, min_gap_s: float = PASS_GAP_S) -> None:
        """Run passes in a daemon thread until :meth:`stop` (one pass at once, at least
        ``min_gap_s`` apart: the closes in between are freed by one pass)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._wake.set()

        def loop() -> None:
            lower_thread_priority()  # a pass can wait; the round's close and uploads cannot
            while not self._stop.is_set():
                self._wake.wait(poll_s)
                self._wake.clear()
                if self._stop.is_set():
                    break
                try:
                    self.maintain()
                except Exception:
                    log.exception("storage pass failed")
                self._stop.wait(min_gap_s)

        self._thread = threading.Thread(target=loop, name="aggregator-storage", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the thread (a running pass ends first)."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self._thread = None
