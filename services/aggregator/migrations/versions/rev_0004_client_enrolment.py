"""clients.enrolled_by: the shard credential (``<shard>/<shards>``) that registered a client

Revision ID: 0004
Revises: 0003
Create Date: 2025-01-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the column; clients registered before enrolment existed keep NULL (no shard may
    re-register them)."""
    op.add_column("clients", sa.Column("enrolled_by", sa.String(32), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("clients") as batch:
        batch.drop_column("enrolled_by")
