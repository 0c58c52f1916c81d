"""Every query of secure aggregation over HTTP (the phase of a round attempt, the protocol's
messages, the running sum of the masked inputs), on one session: the service owns the
transactions, as for :class:`~services.aggregator.repository.Repository`."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from services.aggregator.models import Round, SecAggMessage, SecAggTotal
from services.aggregator.repository import LIVE_ROUND_STATES, chunks, digests_by_client


class SecAggRepository:
    """Queries over ``secagg_messages``, ``secagg_totals``, ``rounds.secagg_phase`` and
    ``rounds.secagg_union``; ``inst``: the protocol instance ("a", or a sparse round's
    "b")."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def advance_phase(
        self,
        pk: int,
        from_phase: str,
        to_phase: str,
        deadline: datetime,
        union: list[int] | None = None,
    ) -> bool:
        """Move an open attempt from one phase to the next with a fresh deadline, once (the
        conditional UPDATE is the guard, as for closing a round): True if this call did it.
        ``union``: a sparse attempt's union, stored with the move to its update instance."""
        values: dict[str, object] = {"secagg_phase": to_phase, "deadline": deadline}
        if union is not None:
            values["secagg_union"] = union
        stmt = (
            update(Round)
            .where(Round.id == pk, Round.state == "open", Round.secagg_phase == from_phase)
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        result = self.session.execute(stmt)
        assert isinstance(result, CursorResult)
        return result.rowcount == 1

    def union(self, pk: int) -> list[int] | None:
        """A sparse attempt's union (None before its counts were unmasked)."""
        return self.session.scalar(select(Round.secagg_union).where(Round.id == pk))

    def add_message(
        self, round_pk: int, step: str, client_id: int, digest: str, body: bytes, inst: str = "a"
    ) -> None:
        """Store one client's message of one step (of protocol instance ``inst``)."""
        self.session.add(
            SecAggMessage(
                round_pk=round_pk,
                instance=inst,
                step=step,
                client_id=client_id,
                digest=digest,
                body=body,
            )
        )

    def digests(
        self, round_pk: int, step: str, client_ids: Iterable[int], inst: str = "a"
    ) -> dict[int, str]:
        """Digests of the stored messages of some clients in one step: client -> digest."""
        return digests_by_client(
            self.session,
            SecAggMessage,
            client_ids,
            *self._of(round_pk, step, inst),
        )

    @staticmethod
    def _of(round_pk: int, step: str, inst: str) -> tuple[Any, ...]:
        return (
            SecAggMessage.round_pk == round_pk,
            SecAggMessage.instance == inst,
            SecAggMessage.step == step,
        )

    def bodies(
        self, round_pk: int, step: str, client_ids: Iterable[int] | None = None, inst: str = "a"
    ) -> dict[int, bytes]:
        """Stored messages of one step (of some clients, or of all): client -> body."""
        base = select(SecAggMessage.client_id, SecAggMessage.body).where(
            *self._of(round_pk, step, inst)
        )
        if client_ids is None:
            return {int(c): b for c, b in self.session.execute(base)}
        out: dict[int, bytes] = {}
        for part in chunks(client_ids):
            stmt = base.where(SecAggMessage.client_id.in_(part))
            out.update((int(c), b) for c, b in self.session.execute(stmt))
        return out

    def senders(self, round_pk: int, step: str, inst: str = "a") -> list[int]:
        """The clients that sent a message of one step, ascending."""
        stmt = (
            select(SecAggMessage.client_id)
            .where(*self._of(round_pk, step, inst))
            .order_by(SecAggMessage.client_id)
        )
        return [int(c) for c in self.session.scalars(stmt)]

    def count(self, round_pk: int, step: str, inst: str = "a") -> int:
        """How many clients sent a message of one step."""
        stmt = (
            select(func.count()).select_from(SecAggMessage).where(*self._of(round_pk, step, inst))
        )
        return int(self.session.scalar(stmt) or 0)

    def total(self, round_pk: int, inst: str = "a") -> bytes | None:
        """The running sum of an attempt's masked inputs (None before the first)."""
        return self.session.scalar(
            select(SecAggTotal.total).where(
                SecAggTotal.round_pk == round_pk, SecAggTotal.instance == inst
            )
        )

    def set_total(self, round_pk: int, total: bytes, inst: str = "a") -> None:
        """Write the running sum (inserted the first time)."""
        row = self.session.get(SecAggTotal, (round_pk, inst))
        if row is None:
            self.session.add(SecAggTotal(round_pk=round_pk, instance=inst, total=total))
        else:
            row.total = total
        self.session.flush()

    def delete_round(self, round_pk: int) -> None:
        """Drop everything secure aggregation kept of an attempt (it is over)."""
        self.session.execute(delete(SecAggMessage).where(SecAggMessage.round_pk == round_pk))
        self.session.execute(delete(SecAggTotal).where(SecAggTotal.round_pk == round_pk))

    def release_finished(self) -> int:
        """Drop the messages and sums of every attempt that is over (closed, failed, aborted);
        returns how many rows were deleted."""
        finished = select(Round.id).where(Round.state.not_in(LIVE_ROUND_STATES))
        n = 0
        for table in (SecAggMessage, SecAggTotal):
            result = self.session.execute(
                delete(table)
                .where(table.round_pk.in_(finished))
                .execution_options(synchronize_session=False)
            )
            assert isinstance(result, CursorResult)
            n += int(result.rowcount)
        return n
