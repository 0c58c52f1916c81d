"""the popularity prior: item count reports, the clients they cover, each run's summed counts

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create the three tables (runs before them simply have no prior)."""
    op.create_table(
        "item_count_reports",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("items", sa.JSON(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_item_count_reports_run_id", "item_count_reports", ["run_id"])
    op.create_table(
        "item_count_clients",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("client_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "report_id", sa.Integer(), sa.ForeignKey("item_count_reports.id"), nullable=False
        ),
        sa.UniqueConstraint("run_id", "client_id", name="uq_item_count_clients"),
    )
    op.create_table(
        "run_priors",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), primary_key=True),
        sa.Column("counts", sa.LargeBinary(), nullable=False),
        sa.Column("clients", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_table("run_priors")
    op.drop_table("item_count_clients")
    op.drop_index("ix_item_count_reports_run_id", table_name="item_count_reports")
    op.drop_table("item_count_reports")
