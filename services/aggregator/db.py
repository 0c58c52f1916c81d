"""Engine, sessions and migrations (SQLite by default, PostgreSQL via ``postgresql+psycopg``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Arbitrary key of the PostgreSQL advisory lock that serialises concurrent migrations.
_MIGRATION_LOCK_KEY = 0x0FEDEC


# Execution option marking the connections of read-only transactions (Database.read).
_READ_ONLY = "fedrec_read_only"

# Bytes of WAL file SQLite keeps after a checkpoint reset it (larger transactions grow it).
_SQLITE_WAL_KEEP_BYTES = 16 * 1024 * 1024

#: Page size of a new SQLite file (SQLite's largest). A round writes megabytes of blobs (a
#: model version, its optimizer state, the partial sums), which SQLite keeps in chains of
#: overflow pages, each one its own WAL frame: 64 KB pages write them with a sixteenth of
#: the frames and page handling of 4 KB ones. A file made with another size keeps it.
SQLITE_PAGE_SIZE = 65536
# WAL bytes after which a commit checkpoints.
_SQLITE_CHECKPOINT_BYTES = 16 * 1024 * 1024


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, full sync, a busy timeout, BEGIN IMMEDIATE,
    incremental auto-vacuum (a new file; :func:`ensure_incremental_vacuum` converts old ones),
    ``secure_delete=FAST`` and, in a new file, 64 KB pages."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        return create_engine(u, pool_pre_ping=True)
    if u.database and u.database != ":memory:" and not u.database.startswith("file:"):
        # Owner-only: the upload rows reveal users' items. SQLite creates the -wal and -shm
        # files with the database file's mode.
        path = Path(u.database)
        if not path.exists() and path.parent.is_dir():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    engine = create_engine(u, connect_args={"timeout": 30.0, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below open transactions, not the driver.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if int(cur.execute("PRAGMA page_count").fetchone()[0]) == 0:  # a new, empty file
            cur.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
        page_size = int(cur.execute("PRAGMA page_size").fetchone()[0])
        # Only takes effect on a file without tables (or at the next VACUUM): first. Setting it
        # takes the write lock even when it is already set, so a connection opened while a
        # round commits would wait for that commit: only a file not yet incremental sets it.
        if int(cur.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2:
            cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        for pragma in (
            "PRAGMA journal_mode=WAL",
            "PRAGMA synchronous=FULL",
            # Python's SQLite is built with secure_delete on: every page a freed blob leaves
            # (a released update, the previous optimizer state, a pruned version: megabytes a
            # round) would be zeroed and written through the WAL again. FAST zeroes only where
            # that costs no extra write; freed pages are reused or compacted away instead.
            "PRAGMA secure_delete=FAST",
            "PRAGMA foreign_keys=ON",
            "PRAGMA busy_timeout=30000",
            f"PRAGMA journal_size_limit={_SQLITE_WAL_KEEP_BYTES}",
            # a checkpoint after 16 MB of WAL whatever the page size (SQLite's default,
            # 1,000 pages, is 64 MB with 64 KB pages)
            f"PRAGMA wal_autocheckpoint={_SQLITE_CHECKPOINT_BYTES // page_size}",
        ):
            cur.execute(pragma)
        cur.close()

    @event.listens_for(engine, "begin")
    def _sqlite_begin(conn: Any) -> None:
        # A transaction that may write takes the write lock up front: it never has to upgrade
        # a shared lock (SQLite's deadlock case), and the round-closing guard serialises. A
        # read-only one (Database.read) takes a WAL snapshot instead and waits for no writer.
        if conn.get_execution_options().get(_READ_ONLY):
            conn.exec_driver_sql("BEGIN DEFERRED")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def alembic_config() -> Config:
    """Alembic configuration pointing at this package's migrations (no ini file needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    return cfg


class ForeignDatabase(RuntimeError):
    """The database holds tables but no aggregator schema: another service's database."""


def run_migrations(engine: Engine) -> None:
    """``alembic upgrade head`` on ``engine`` (serialised across processes on PostgreSQL).
    A database that holds tables but no Alembic version (a worker's store, say) is refused
    with :class:`ForeignDatabase`, untouched."""
    cfg = alembic_config()
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        tables = set(inspect(conn).get_table_names())
        if tables and "alembic_version" not in tables:
            raise ForeignDatabase(
                f"{engine.url.render_as_string(hide_password=True)} is not an aggregator "
                f"database: it holds the tables {sorted(tables)[:5]} and no aggregator schema; "
                "point FEDREC_AGG_DATABASE_URL at an empty database or the aggregator's own"
            )
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    log.info("database schema at head (%s)", engine.dialect.name)


def ensure_incremental_vacuum(engine: Engine) -> None:
    """SQLite files created without incremental auto-vacuum are converted by one VACUUM
    (a rewrite of the file, once), so that compaction can shrink them afterwards."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        (mode,) = raw.execute("PRAGMA auto_vacuum").fetchone()
        if int(mode) == 2:
            return
        log.info("converting the SQLite file to incremental auto-vacuum (one VACUUM)")
        raw.execute("PRAGMA auto_vacuum=INCREMENTAL")
        raw.execute("VACUUM")


class Database:
    """The engine and session factory of one app instance."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        reader = self.engine.execution_options(**{_READ_ONLY: True})
        self._read_sessions = sessionmaker(reader, expire_on_commit=False)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session in one transaction: commits on success, rolls back on any error."""
        with self._sessions() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session in one read-only transaction. On SQLite it reads a WAL snapshot
        (``BEGIN DEFERRED``) instead of taking the write lock, so polls and downloads never
        queue behind an upload's or a close's commit (its COMMIT writes nothing). Only for
        code that writes nothing: a write inside would have to upgrade the lock and may fail
        as busy."""
        with self._read_sessions() as session, session.begin():
            yield session

    def ping(self) -> None:
        """Round-trip to the database (raises when it is unreachable)."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def migrate(self) -> None:
        """Bring the schema to the latest revision (and SQLite to incremental auto-vacuum)."""
        run_migrations(self.engine)
        ensure_incremental_vacuum(self.engine)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
