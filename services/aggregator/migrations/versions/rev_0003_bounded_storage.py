"""bounded storage: update bodies in their own table, prunable model versions

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03

Update bodies move from ``updates.blob`` to ``update_blobs``, only for the attempts that are
still live (open or paused): the others never need them again. Model versions may lose their
params (pruned by the retention policy, ``pruned_at`` set) and their optimizer state (kept on
each run's newest version only, dropped here for the others). Downgrade cannot bring freed data
back: it drops pruned versions and stores empty blobs where the data was freed (the older code
never reads either).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

LIVE = "(SELECT id FROM rounds WHERE state IN ('open', 'paused'))"


def upgrade() -> None:
    """Create ``update_blobs``, move the live bodies there, free what is no longer needed."""
    op.create_table(
        "update_blobs",
        sa.Column("round_pk", sa.Integer(), sa.ForeignKey("rounds.id"), nullable=False),
        sa.Column("client_id", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("round_pk", "client_id"),
    )
    op.execute(
        "INSERT INTO update_blobs (round_pk, client_id, blob) "
        f"SELECT round_pk, client_id, blob FROM updates WHERE round_pk IN {LIVE}"
    )
    with op.batch_alter_table("updates") as batch:
        batch.drop_column("blob")
    with op.batch_alter_table("model_versions") as batch:
        batch.alter_column("params", existing_type=sa.LargeBinary(), nullable=True)
        batch.alter_column("optimizer_state", existing_type=sa.LargeBinary(), nullable=True)
        batch.add_column(sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE model_versions SET optimizer_state = NULL WHERE version < "
        "(SELECT MAX(m.version) FROM model_versions m WHERE m.run_id = model_versions.run_id)"
    )


def downgrade() -> None:
    """Bodies back into ``updates.blob`` (empty where freed); pruned versions dropped."""
    op.execute("DELETE FROM model_versions WHERE params IS NULL")
    empty = sa.literal(b"", sa.LargeBinary())
    versions = sa.table("model_versions", sa.column("optimizer_state", sa.LargeBinary()))
    op.execute(
        sa.update(versions).where(versions.c.optimizer_state.is_(None)).values(optimizer_state=empty)
    )
    with op.batch_alter_table("model_versions") as batch:
        batch.drop_column("pruned_at")
        batch.alter_column("optimizer_state", existing_type=sa.LargeBinary(), nullable=False)
        batch.alter_column("params", existing_type=sa.LargeBinary(), nullable=False)
    op.add_column("updates", sa.Column("blob", sa.LargeBinary(), nullable=True))
    op.execute(
        "UPDATE updates SET blob = (SELECT b.blob FROM update_blobs b "
        "WHERE b.round_pk = updates.round_pk AND b.client_id = updates.client_id)"
    )
    updates = sa.table("updates", sa.column("blob", sa.LargeBinary()))
    op.execute(sa.update(updates).where(updates.c.blob.is_(None)).values(blob=empty))
    with op.batch_alter_table("updates") as batch:
        batch.alter_column("blob", existing_type=sa.LargeBinary(), nullable=False)
    op.drop_table("update_blobs")
