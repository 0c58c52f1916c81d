"""A database under Alembic's hand, for the tests of one migration: a connection in one
transaction with the Alembic config bound to it, optionally at an old revision with a run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, create_engine, text

from services.aggregator.db import alembic_config


@contextlib.contextmanager
def alembic_connection(url: str) -> Iterator[tuple[Connection, Config]]:
    """A connection to ``url`` (one transaction, committed at the end of the block) and the
    Alembic config that upgrades or downgrades through it."""
    engine = create_engine(url)
    cfg = alembic_config()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            yield conn, cfg
    finally:
        engine.dispose()


@contextlib.contextmanager
def at_revision(url: str, revision: str) -> Iterator[tuple[Connection, Config]]:
    """:func:`alembic_connection` on a new database at ``revision``, holding one running run
    (id 1) for the rows a test adds."""
    with alembic_connection(url) as (conn, cfg):
        command.upgrade(cfg, revision)
        conn.execute(
            text(
                "INSERT INTO runs (id, config, state, active, created_at) "
                "VALUES (1, '{}', 'running', 1, '2025-01-01')"
            )
        )
        yield conn, cfg
