"""Sparse secure aggregation over HTTP: a protocol instance per secure-aggregation message and
running sum, and the union of a sparse round attempt

A sparse round runs two protocol instances (``a``: the item counts, ``b``: the update on the
union's rows), each with its own keys, shares, masked inputs, reveals and running sum: the
instance joins the primary key of ``secagg_messages`` and ``secagg_totals`` (the rows kept
are instance ``a``, the only one of a dense round). ``rounds.secagg_union`` holds the union
once the counts are unmasked, so a restarted aggregator goes on with the update instance.

The two tables are rebuilt (a new table, the rows copied, the old one dropped) on every
backend alike, since SQLite cannot change a primary key in place; PostgreSQL gets back the
EXTERNAL storage of their blob columns (revision 0008). The downgrade drops instance ``b``'s
rows (a sparse attempt in progress cannot go on without them; it fails at its deadline).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None

#: the columns of each table besides the instance, the primary key's first
COLUMNS = {
    "secagg_messages": ("round_pk", "step", "client_id", "digest", "body"),
    "secagg_totals": ("round_pk", "total"),
}
BLOBS = {"secagg_messages": "body", "secagg_totals": "total"}


def _columns(table: str, instance: bool) -> list[sa.Column]:  # type: ignore[type-arg]
    fk = sa.ForeignKey("rounds.id")
    cols: list[sa.Column] = [sa.Column("round_pk", sa.Integer, fk, primary_key=True)]  # type: ignore[type-arg]
    if instance:
        cols.append(sa.Column("instance", sa.String(1), primary_key=True))
    if table == "secagg_messages":
        cols += [
            sa.Column("step", sa.String(8), primary_key=True),
            sa.Column("client_id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("digest", sa.String(64), nullable=False),
            sa.Column("body", sa.LargeBinary, nullable=False),
        ]
    else:
        cols.append(sa.Column("total", sa.LargeBinary, nullable=False))
    return cols


def _rebuild(table: str, instance: bool) -> None:
    """Rebuild ``table`` with (or without) the instance column, copying its rows (without
    it: instance ``a``'s only)."""
    new = f"{table}_rebuilt"
    op.create_table(new, *_columns(table, instance))
    cols = ", ".join(COLUMNS[table])
    if instance:
        op.execute(f"INSERT INTO {new} ({cols}, instance) SELECT {cols}, 'a' FROM {table}")
    else:
        op.execute(f"INSERT INTO {new} ({cols}) SELECT {cols} FROM {table} WHERE instance = 'a'")
    op.drop_table(table)
    op.rename_table(new, table)
    if op.get_bind().dialect.name == "postgresql":
        for suffix in ("pkey", "round_pk_fkey"):
            op.execute(f"ALTER TABLE {table} RENAME CONSTRAINT {new}_{suffix} TO {table}_{suffix}")
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {BLOBS[table]} SET STORAGE EXTERNAL")


def upgrade() -> None:
    """The instance columns (rows kept: instance ``a``) and ``rounds.secagg_union``."""
    for table in COLUMNS:
        _rebuild(table, instance=True)
    op.add_column("rounds", sa.Column("secagg_union", sa.JSON, nullable=True))


def downgrade() -> None:
    """Back to one instance: instance ``b``'s rows and the union are dropped."""
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("secagg_union")
    for table in COLUMNS:
        _rebuild(table, instance=False)
