"""Read-only transactions on SQLite read a WAL snapshot: a poll or a download never waits for
an upload's or a close's commit, and a connection opened while one is in progress does not
either."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session

from harness.aggregator import AggregatorFactory
from services.aggregator.db import Database
from tests.support.aggregator import (
    bearer,
    current_cohort,
    post_run,
    register,
    service_of,
    sqlite_url,
)

# Long enough for a reader to finish many times over; it fails the test only when a read waits
# for the writer (which holds its transaction until the reader is done or this runs out).
_PATIENCE_S = 10.0


@contextmanager
def writer_holding_the_lock(db: Database) -> Iterator[threading.Event]:
    """A thread inside a write transaction (one uncommitted insert into ``t``) until the
    yielded event is set; committed when the block ends."""
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.transaction() as s:
            s.execute(text("INSERT INTO t VALUES (2)"))
            inside.set()
            release.wait(_PATIENCE_S)

    thread = threading.Thread(target=hold)
    thread.start()
    assert inside.wait(_PATIENCE_S)
    try:
        yield release
    finally:
        release.set()
        thread.join()


def read_in_thread(read: Callable[[], object], release: threading.Event) -> list[object]:
    """Run ``read`` in a thread and release the writer once it returned; what it returned
    (empty when it did not return while the writer still held its transaction)."""
    out: list[object] = []

    def run() -> None:
        out.append(read())
        release.set()

    reader = threading.Thread(target=run)
    reader.start()
    reader.join(_PATIENCE_S)
    finished_first = bool(out)
    release.set()
    reader.join()
    return out if finished_first else []


def count_rows(s: Session) -> int:
    return int(s.execute(text("SELECT count(*) FROM t")).scalar_one())


def test_a_read_takes_a_snapshot_instead_of_waiting_for_a_writer(tmp_path: Path) -> None:
    db = Database(sqlite_url(tmp_path))
    with db.transaction() as s:
        s.execute(text("CREATE TABLE t (x INTEGER)"))
        s.execute(text("INSERT INTO t VALUES (1)"))

    def read() -> int:
        # the pool holds one connection, the writer's: this opens a new one
        with db.read() as s:
            return count_rows(s)

    with writer_holding_the_lock(db) as release:
        seen = read_in_thread(read, release)
    assert seen == [1], "the read waited for the writer's commit"
    with db.read() as s:
        assert count_rows(s) == 2  # the commit is visible to the next read
        # a fresh file still gets incremental auto-vacuum (compaction depends on it)
        assert int(s.execute(text("PRAGMA auto_vacuum")).scalar_one()) == 2


def test_a_write_transaction_still_waits_for_the_writer(tmp_path: Path) -> None:
    db = Database(sqlite_url(tmp_path))
    with db.transaction() as s:
        s.execute(text("CREATE TABLE t (x INTEGER)"))

    def write() -> int:
        with db.transaction() as s:
            return count_rows(s)

    done: list[object] = []
    with writer_holding_the_lock(db) as release:
        thread = threading.Thread(target=lambda: done.append(write()))
        thread.start()
        thread.join(0.5)
        assert not done, "a write transaction began while another held the write lock"
        release.set()
    thread.join()
    assert done == [1]


def test_polls_and_downloads_answer_while_a_round_commits(aggregator: AggregatorFactory) -> None:
    client = aggregator()
    token = register(client, list(range(40)))
    post_run(client, {"n_items": 50, "rounds": 2, "fraction": 0.5, "seed": 0})
    db = service_of(client).db
    with db.transaction() as s:
        s.execute(text("CREATE TABLE t (x INTEGER)"))

    def poll_and_download() -> tuple[int, int]:
        cohort = current_cohort(client, bearer(token))
        model = client.get("/v1/models/latest", headers=bearer(token))
        return len(cohort), model.status_code

    with writer_holding_the_lock(db) as release:
        seen = read_in_thread(poll_and_download, release)
    assert seen == [(20, 200)], "a poll or a download waited for a commit"


def test_a_new_file_gets_large_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    def pages(db: Database) -> tuple[int, int]:
        with db.read() as s:
            size = int(s.execute(text("PRAGMA page_size")).scalar_one())
            checkpoint = int(s.execute(text("PRAGMA wal_autocheckpoint")).scalar_one())
        return size, checkpoint

    new = Database(sqlite_url(tmp_path))
    with new.transaction() as s:
        s.execute(text("CREATE TABLE t (x BLOB)"))
        s.execute(text("INSERT INTO t VALUES (zeroblob(300000))"))
    # the WAL is checkpointed after about 16 MB whatever the page size
    assert pages(new) == (65536, 256)
    with sqlite3.connect(tmp_path / "old.db") as raw:  # made with SQLite's defaults
        raw.execute("CREATE TABLE t (x INTEGER)")
    old = Database(sqlite_url(tmp_path, "old.db"))
    assert pages(old) == (4096, 4096)
    with old.transaction() as s:
        s.execute(text("INSERT INTO t VALUES (1)"))
    with old.read() as s:
        assert count_rows(s) == 1


def test_a_new_sqlite_file_and_its_wal_are_owner_only(tmp_path: Path) -> None:
    """The upload rows reveal users' items: the aggregator's files are not world-readable."""
    import stat

    path = tmp_path / "agg.db"
    db = Database(f"sqlite:///{path}")
    db.migrate()
    with db.transaction() as s:
        s.execute(text("SELECT 1"))
    for f in [path, *tmp_path.glob("agg.db-*")]:
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, (f, oct(f.stat().st_mode))
    db.dispose()
