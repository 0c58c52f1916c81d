"""model versions' params and optimizer states in their own table

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

SQLite writes a whole row again on every update of it, overflow pages included: writing a
version's metrics rewrote its params and optimizer state (about 5 MB for FilmTrust, twice that
in the WAL), and so did freeing the optimizer state of the version before. The blobs move to
``version_blobs`` (one row per version and kind); a freed blob is a deleted row. Upgrading
copies each blob twice (once into a staging table), once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

KINDS = ("params", "optimizer_state")
#: where the blobs wait while SQLite rebuilds ``model_versions`` without them (a rebuild drops
#: the table, which the foreign key of ``version_blobs`` would refuse)
STAGING = "version_blobs_moving"


def upgrade() -> None:
    """Move the blobs to ``version_blobs`` (through a staging table), drop the two columns."""
    op.create_table(
        STAGING,
        sa.Column("version_pk", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
    )
    for kind in KINDS:  # column names from the constant above, never from input
        op.execute(
            f"INSERT INTO {STAGING} (version_pk, kind, blob) SELECT id, '{kind}', {kind} "
            f"FROM model_versions WHERE {kind} IS NOT NULL"
        )
    with op.batch_alter_table("model_versions") as batch:
        for kind in KINDS:
            batch.drop_column(kind)
    op.create_table(
        "version_blobs",
        sa.Column("version_pk", sa.Integer(), sa.ForeignKey("model_versions.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("version_pk", "kind"),
    )
    op.execute(
        f"INSERT INTO version_blobs (version_pk, kind, blob) "
        f"SELECT version_pk, kind, blob FROM {STAGING}"
    )
    op.drop_table(STAGING)


def downgrade() -> None:
    """The blobs back into their columns (NULL where freed); ``version_blobs`` dropped."""
    with op.batch_alter_table("model_versions") as batch:
        for kind in KINDS:
            batch.add_column(sa.Column(kind, sa.LargeBinary(), nullable=True))
    for kind in KINDS:
        op.execute(
            f"UPDATE model_versions SET {kind} = (SELECT b.blob FROM version_blobs b "
            f"WHERE b.version_pk = model_versions.id AND b.kind = '{kind}')"
        )
    op.drop_table("version_blobs")
