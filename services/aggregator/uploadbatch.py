"""The state of one group-commit transaction of uploads: which round attempts it locked,
which digests it knows, which rows it will insert."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fedrecgel.upload_modes import Upload
from services.aggregator.repository import Repository

# Open attempts remembered across batches before the memory is emptied (refilled on demand).
_OPEN_ROUNDS_KEPT = 16


@dataclass(frozen=True)
class PendingUpload:
    """A decoded, validated upload body waiting for the group commit."""

    run_id: int
    round_id: int
    uploads: list[Upload]
    digests: list[str]
    blobs: list[bytes]  # what is stored per upload: a body of that upload alone

    @property
    def client_ids(self) -> list[int]:
        """The clients the body's uploads cover."""
        return [c for u in self.uploads for c in u.client_ids]


class RoundRefusal(enum.StrEnum):
    """Why a batch cannot write to a round (the value reads in the 409's detail)."""

    PAUSED = "paused"
    NOT_OPEN = "not open"


@dataclass
class LiveRound:
    """The open round attempt a batch writes to (locked for its transaction)."""

    pk: int
    attempt: int
    cohort: frozenset[int]
    received: int  # stored updates, counting the batch's own so far

    @property
    def cohort_size(self) -> int:
        """How many clients the attempt waits for."""
        return len(self.cohort)


class UploadBatch:
    """The state of one group-commit transaction: locked rounds, known digests, rows to add.

    ``open_rounds`` remembers, across batches, the open attempt of each (run, round) seen: an
    attempt's pk, number and cohort never change, so the next batch only needs the locking
    UPDATE (which also proves it is still open) instead of querying the live round again. Only
    the group commit's leader thread runs a batch, one at a time, so ``open_rounds`` needs no
    lock of its own.
    """

    def __init__(
        self,
        repo: Repository,
        now: datetime,
        uploads: Sequence[PendingUpload],
        open_rounds: dict[tuple[int, int], LiveRound],
    ) -> None:
        self.repo = repo
        self.now = now
        self._open_rounds = open_rounds
        self._rounds: dict[tuple[int, int], LiveRound | RoundRefusal] = {}
        # the clients of each round the batch may touch: their digests are read in one query
        self._wanted: dict[tuple[int, int], set[int]] = {}
        for up in uploads:
            self._wanted.setdefault((up.run_id, up.round_id), set()).update(up.client_ids)
        self._digests: dict[tuple[int, int], dict[int, str]] = {}
        self._rows: list[dict[str, Any]] = []
        self._added: dict[int, int] = {}

    def live_round(self, run_id: int, round_id: int) -> LiveRound | RoundRefusal:
        """The round's open attempt, locked; else why it cannot take uploads."""
        key = (run_id, round_id)
        if key not in self._rounds:
            self._rounds[key] = self._lock_round(run_id, round_id)
        return self._rounds[key]

    def _lock_round(self, run_id: int, round_id: int) -> LiveRound | RoundRefusal:
        key = (run_id, round_id)
        known = self._open_rounds.get(key)
        if known is not None:
            received = self.repo.touch_open_round(known.pk, self.now)
            if received is not None:
                return LiveRound(known.pk, known.attempt, known.cohort, received)
            del self._open_rounds[key]
        live = self.repo.live_round(run_id)
        if live is not None and live.round_id == round_id:
            received = self.repo.touch_open_round(live.id, self.now)
            if received is not None:
                if len(self._open_rounds) > _OPEN_ROUNDS_KEPT:
                    self._open_rounds.clear()
                found = LiveRound(live.id, live.attempt, frozenset(live.cohort), received)
                self._open_rounds[key] = found
                return LiveRound(found.pk, found.attempt, found.cohort, received)
        if live is not None and live.state == "paused":
            return RoundRefusal.PAUSED
        return RoundRefusal.NOT_OPEN

    def digest(self, run_id: int, round_id: int, client_id: int) -> str | None:
        """The digest of the client's stored (or batched) update of the round, if any.

        Read after :meth:`live_round` locked the round, so a replica's concurrent upload of the
        same client has committed (PostgreSQL row lock) or waits for this transaction.
        """
        key = (run_id, round_id)
        if key not in self._digests:
            self._digests[key] = self.repo.update_digests(run_id, round_id, self._wanted[key])
        return self._digests[key].get(client_id)

    def add_row(
        self,
        live: LiveRound,
        run_id: int,
        round_id: int,
        client_id: int,
        n_samples: int,
        loss: float,
        digest: str,
        blob: bytes | None,
    ) -> None:
        """Queue one client's row (``blob`` None: a client of an upload filed under another
        of its clients); later checks of the batch see it."""
        self._rows.append(
            {
                "round_pk": live.pk,
                "run_id": run_id,
                "round_id": round_id,
                "client_id": client_id,
                "digest": digest,
                "n_samples": n_samples,
                "loss": loss,
                "blob": blob,
                "created_at": self.now,
            }
        )
        self._digests[(run_id, round_id)][client_id] = digest
        self._added[live.pk] = self._added.get(live.pk, 0) + 1
        live.received += 1

    def write(self) -> None:
        """Insert the queued rows and count them on their rounds (same transaction)."""
        self.repo.add_updates(self._rows)
        for pk, n in self._added.items():
            self.repo.add_received(pk, n)
