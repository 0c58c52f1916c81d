"""PostgreSQL stores the blob columns out of line without compressing them

The blobs are float tensors, which do not compress: PostgreSQL's default TOAST storage tried
pglz on every upload and model version anyway, which tripled an upload batch's insert time
(60 FilmTrust client uploads of 0.3 MB: 0.68 s with the attempt, 0.21 s without). SQLite has
no such setting.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

#: (table, column) of every blob column
BLOB_COLUMNS = (
    ("update_blobs", "blob"),
    ("version_blobs", "blob"),
    ("secagg_messages", "body"),
    ("secagg_totals", "total"),
)


def _set_storage(storage: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in BLOB_COLUMNS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE {storage}")


def upgrade() -> None:
    """EXTERNAL: out of line, never compressed (rows stored before keep their form)."""
    _set_storage("EXTERNAL")


def downgrade() -> None:
    """Back to PostgreSQL's default for bytea."""
    _set_storage("EXTENDED")
