"""the popularity prior of sparse secure runs: their rounds' item counts, summed until fixed

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create the table (runs before it simply have no such counts)."""
    op.create_table(
        "round_item_counts",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("counts", sa.LargeBinary(), nullable=False),
        sa.Column("exposure", sa.LargeBinary(), nullable=False),
        sa.Column("counted", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    """Drop it."""
    op.drop_table("round_item_counts")
