"""Which shards a round attempt is waiting for: its cohort members without a stored update,
counted by the shard credential that enrolled them (SQL beside :mod:`.repository`'s)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.aggregator.models import Client, StoredUpdate
from services.aggregator.repository import chunks


def missing_by_shard(session: Session, round_pk: int, cohort: Sequence[int]) -> dict[str, int]:
    """The cohort members of a round attempt without a stored update, counted by the shard
    credential that enrolled them (``"<shard>/<shards>"``; ``"none"`` for clients registered
    without one), in shard order."""
    stmt = select(StoredUpdate.client_id).where(StoredUpdate.round_pk == round_pk)
    uploaded = {int(c) for c in session.scalars(stmt)}
    counts: Counter[str] = Counter()
    for part in chunks(c for c in cohort if c not in uploaded):
        shards = select(Client.enrolled_by).where(Client.client_id.in_(part))
        counts.update(shard or "none" for shard in session.scalars(shards))
    return {k: counts[k] for k in sorted(counts, key=_shard_order)}


def _shard_order(key: str) -> tuple[int, str]:
    """``"<shard>/<shards>"`` keys by shard number, any other key last."""
    head = key.split("/", 1)[0]
    return (int(head) if head.isdigit() else 1 << 62, key)
