"""Secure aggregation over HTTP: the phase of a round attempt, the protocol's messages, and
the running sum of the masked inputs

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add ``rounds.secagg_phase`` (NULL on plain rounds) and the two tables."""
    op.add_column("rounds", sa.Column("secagg_phase", sa.String(16), nullable=True))
    op.create_table(
        "secagg_messages",
        sa.Column("round_pk", sa.Integer, sa.ForeignKey("rounds.id"), primary_key=True),
        sa.Column("step", sa.String(8), primary_key=True),
        sa.Column("client_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "secagg_totals",
        sa.Column("round_pk", sa.Integer, sa.ForeignKey("rounds.id"), primary_key=True),
        sa.Column("total", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    """Drop the tables and the column."""
    op.drop_table("secagg_totals")
    op.drop_table("secagg_messages")
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("secagg_phase")
