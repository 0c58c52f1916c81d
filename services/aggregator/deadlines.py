"""A round's deadline counts only time an aggregator was running.

While an attempt is open, every aggregator's deadline task marks it alive
(``rounds.touched_at``, which accepted uploads also set) at least every :data:`HEARTBEAT_S`.
An aggregator that starts (:meth:`RoundCloser.warm <services.aggregator.rounds.RoundCloser.warm>`,
before it serves a request) and finds the live attempt open and unmarked for longer than
:func:`down_after_s` knows that no aggregator ran meanwhile: it moves the attempt's deadline
later by that gap, so that a crash followed by a restart after longer than the deadline
continues the same attempt with the same cohort. A replica that restarts while another one
runs finds the mark fresh and moves nothing; of replicas starting together after an outage,
one moves it (the update is conditional on the mark it read).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import CursorResult, or_, update
from sqlalchemy.orm import Session

from services.aggregator.models import Round

log = logging.getLogger(__name__)

#: how often the deadline task marks an open attempt alive (at most; each tick at most once)
HEARTBEAT_S = 1.0


def down_after_s(poll_s: float) -> float:
    """A gap in the marks longer than this means no aggregator ran (a few missed ticks are
    not an outage)."""
    return max(5.0, 3 * max(poll_s, HEARTBEAT_S))


def last_alive(rnd: Round) -> datetime:
    """When an aggregator last marked ``rnd`` alive (its opening when never since)."""
    return rnd.touched_at or rnd.opened_at


def _mark(session: Session, rnd: Round, now: datetime, **values: datetime) -> bool:
    """Set the attempt's mark to ``now`` (and ``values``) unless it changed since read."""
    seen = rnd.touched_at
    stmt = (
        update(Round)
        .where(Round.id == rnd.id, Round.state == "open")
        .where(Round.touched_at.is_(None) if seen is None else Round.touched_at <= seen)
        .values(touched_at=now, **values)
        .execution_options(synchronize_session=False)
    )
    result = session.execute(stmt)
    assert isinstance(result, CursorResult)
    return result.rowcount == 1


def heartbeat(session: Session, rnd: Round, now: datetime) -> None:
    """The deadline task's mark: ``rnd`` is open and an aggregator is running."""
    if now - last_alive(rnd) >= timedelta(seconds=HEARTBEAT_S):
        stmt = (
            update(Round)
            .where(Round.id == rnd.id, Round.state == "open")
            .where(or_(Round.touched_at.is_(None), Round.touched_at < now))
            .values(touched_at=now)
            .execution_options(synchronize_session=False)
        )
        session.execute(stmt)


def resume_after_downtime(
    session: Session, rnd: Round, now: datetime, poll_s: float
) -> timedelta | None:
    """At an aggregator's start: move the open attempt ``rnd``'s deadline later by the time no
    aggregator ran (the gap since its last mark), when that is longer than
    :func:`down_after_s`; the gap moved, None when nothing was."""
    if rnd.state != "open":
        return None
    gap = now - last_alive(rnd)
    if gap <= timedelta(seconds=down_after_s(poll_s)):
        return None
    deadline = rnd.deadline + gap
    if not _mark(session, rnd, now, deadline=deadline):
        return None
    log.warning(
        "round %d attempt %d: no aggregator ran for %.1f s; its deadline moves to %s",
        rnd.round_id,
        rnd.attempt,
        gap.total_seconds(),
        deadline.isoformat(),
    )
    return gap
