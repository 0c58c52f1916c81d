"""rounds.bounded: the clients whose upload the robust screen bounded when the round closed

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the column; rounds closed before it existed keep NULL (none was bounded)."""
    op.add_column("rounds", sa.Column("bounded", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("bounded")
