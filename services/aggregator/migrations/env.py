"""Alembic environment: uses the connection handed over by ``db.run_migrations`` when given,
else ``sqlalchemy.url`` (or ``FEDREC_AGG_DATABASE_URL``) for the ``alembic`` command line."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from services.aggregator.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it."""
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("FEDREC_AGG_DATABASE_URL")
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against the given connection, or a fresh engine from the configured URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from services.aggregator.db import make_engine

    url = config.get_main_option("sqlalchemy.url") or os.environ.get(
        "FEDREC_AGG_DATABASE_URL", "sqlite:///./aggregator.db"
    )
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
