"""rounds.updates_received: a per-attempt counter of stored updates

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the counter and fill it from the updates already stored."""
    op.add_column(
        "rounds",
        sa.Column("updates_received", sa.Integer(), nullable=False, server_default="0"),
    )
    op.execute(
        "UPDATE rounds SET updates_received = "
        "(SELECT COUNT(*) FROM updates WHERE updates.round_pk = rounds.id)"
    )


def downgrade() -> None:
    """Drop the counter."""
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("updates_received")
