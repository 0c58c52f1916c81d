"""initial schema: runs, clients, rounds, updates, model versions, evaluations

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create every table."""
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.UniqueConstraint("active", name="uq_runs_active"),
    )
    op.create_table(
        "clients",
        sa.Column("client_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_clients_token_hash", "clients", ["token_hash"])
    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("cohort", sa.JSON(), nullable=False),
        sa.Column("base_version", sa.Integer(), nullable=False),
        sa.Column("opened_at", TS, nullable=False),
        sa.Column("deadline", TS, nullable=False),
        sa.Column("closed_at", TS, nullable=True),
        sa.Column("touched_at", TS, nullable=True),
        sa.Column("n_updates", sa.Integer(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("model_version", sa.Integer(), nullable=True),
        sa.UniqueConstraint("run_id", "round_id", "attempt", name="uq_rounds_attempt"),
    )
    op.create_index("ix_rounds_run_id", "rounds", ["run_id"])
    op.create_table(
        "updates",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("round_pk", sa.Integer(), sa.ForeignKey("rounds.id"), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("client_id", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("run_id", "round_id", "client_id", name="uq_updates_client"),
    )
    op.create_index("ix_updates_round_pk", "updates", ["round_pk"])
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("params", sa.LargeBinary(), nullable=False),
        sa.Column("optimizer_state", sa.LargeBinary(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("n_updates", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("run_id", "version", name="uq_model_versions_version"),
    )
    op.create_index("ix_model_versions_run_id", "model_versions", ["run_id"])
    op.create_table(
        "evaluation_reports",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sums", sa.JSON(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_evaluation_reports_run_id", "evaluation_reports", ["run_id"])
    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("client_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "report_id", sa.Integer(), sa.ForeignKey("evaluation_reports.id"), nullable=False
        ),
        sa.UniqueConstraint("run_id", "version", "client_id", name="uq_evaluations_client"),
    )


def downgrade() -> None:
    """Drop every table."""
    op.drop_table("evaluations")
    op.drop_table("evaluation_reports")
    op.drop_index("ix_model_versions_run_id", table_name="model_versions")
    op.drop_table("model_versions")
    op.drop_index("ix_updates_round_pk", table_name="updates")
    op.drop_table("updates")
    op.drop_index("ix_rounds_run_id", table_name="rounds")
    op.drop_table("rounds")
    op.drop_index("ix_clients_token_hash", table_name="clients")
    op.drop_table("clients")
    op.drop_table("runs")
