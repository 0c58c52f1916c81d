"""Decoded updates of the live round attempt, kept in memory so that closing it does not
decode them again from their stored bodies."""

from __future__ import annotations

import threading

from fedrecgel.upload_modes import Upload


class PendingUpdates:
    """Round attempt pk -> client id -> (digest, decoded update), for live attempts only (a
    partial sum under its first client).

    Filled after the transaction that stored the updates committed (and before any request of
    that transaction is answered); read and dropped by the close. A run has one live attempt
    at a time, so keeping one attempt drops every other (closed here or by a replica).

    Locking: ``_lock`` guards ``_rounds``; it is held only for dictionary work.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds: dict[int, dict[int, tuple[str, Upload]]] = {}

    def add(self, round_pk: int, fresh: list[tuple[str, Upload]]) -> None:
        """Keep the committed updates of a live attempt (forgetting every other attempt)."""
        with self._lock:
            for stale in [k for k in self._rounds if k != round_pk]:
                del self._rounds[stale]
            pending = self._rounds.setdefault(round_pk, {})
            for digest, u in fresh:
                pending[u.client_id] = (digest, u)

    def replace(self, round_pk: int, updates: dict[int, tuple[str, Upload]]) -> None:
        """Set an attempt's updates (after a restart rebuilt them from the database)."""
        with self._lock:
            self._rounds[round_pk] = dict(updates)

    def snapshot(self, round_pk: int) -> dict[int, tuple[str, Upload]]:
        """A copy of an attempt's updates: client id -> (digest, update)."""
        with self._lock:
            return dict(self._rounds.get(round_pk, {}))

    def drop(self, round_pk: int) -> None:
        """Forget an attempt (closed, retried or aborted)."""
        with self._lock:
            self._rounds.pop(round_pk, None)

    def keep_only(self, live_pk: int | None) -> None:
        """Forget every attempt but ``live_pk`` (the others were closed, maybe by a replica)."""
        with self._lock:
            for stale in [k for k in self._rounds if k != live_pk]:
                del self._rounds[stale]
