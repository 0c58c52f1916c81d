"""Group commit: concurrent requests share one write transaction, hence one fsync.

Storing an upload is cheap; making it durable is not: with SQLite ``synchronous=FULL`` every
COMMIT waits for an fsync of the WAL (PostgreSQL flushes its WAL at COMMIT too), and SQLite
serialises writers anyway. :class:`GroupCommit` lets the request threads that are waiting to
write at the same moment hand their work to one of them, which commits all of it in a single
transaction and then answers each of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class _Ticket(Generic[T, R]):
    """One submitted item and, once its batch is done, its outcome."""

    item: T
    done: bool = False
    outcome: R | Exception | None = field(default=None)


class GroupCommit(Generic[T, R]):
    """Runs ``commit_batch`` over items submitted by concurrent threads, one batch at a time.

    Leader/follower, no background thread: a thread that submits while no batch is being
    written becomes the leader, takes every item queued so far (its own included) and calls
    ``commit_batch(items)``; the others wait. Items that arrive during that call queue up and
    form the next batch, led by one of their own threads. A lone request therefore never waits
    for company, and under load the batch grows to whatever arrived during one commit (bounded
    by the number of request threads).

    ``commit_batch`` must write all the items it is given in ONE transaction and return, in
    order, one outcome per item: the item's result, or an exception refusing that item alone
    (its checks ran inside the transaction and it wrote nothing). Raising instead means the
    transaction was rolled back; every item of a larger batch is then retried in a batch of its
    own, so a failure caused by one request fails only that request.

    Durability argument: :meth:`submit` returns an item's result only after ``commit_batch``
    returned for a batch holding it, i.e. after the single transaction that stored it has
    committed (and therefore been fsynced). The caller acknowledges its request only then, so
    "acknowledged implies durably stored" holds exactly as with one transaction per request:
    batching changes how many requests share a commit, never the order of commit and reply.
    Per-request checks (round open, cohort, idempotency) run inside that same transaction,
    under the same locks as before, so they see every earlier commit and the batch's own
    earlier items.
    """

    def __init__(self, commit_batch: Callable[[Sequence[T]], list[R | Exception]]) -> None:
        self._commit_batch = commit_batch
        self._cond = threading.Condition()
        self._queue: list[_Ticket[T, R]] = []
        self._busy = False
        self.batches = 0  # batches committed (statistics for tests and logs)
        self.items = 0

    def submit(self, item: T) -> R:
        """Store ``item`` (possibly together with others); its result once committed.

        Raises the item's own exception when it was refused or its transaction failed.
        """
        ticket: _Ticket[T, R] = _Ticket(item)
        with self._cond:
            self._queue.append(ticket)
            while not ticket.done and self._busy:
                self._cond.wait()
            batch: list[_Ticket[T, R]] | None = None
            if not ticket.done:  # nobody is writing: lead the batch of everything queued
                self._busy = True
                batch, self._queue = self._queue, []
        if batch is not None:
            self._lead(batch)
        return self._result(ticket)

    def _lead(self, batch: list[_Ticket[T, R]]) -> None:
        """Commit ``batch`` (this thread's own ticket is in it) and wake its submitters."""
        outcomes: list[R | Exception] = []
        try:
            outcomes = self._run([t.item for t in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"{len(outcomes)} outcomes for a batch of {len(batch)}")
        except Exception as err:  # a bug in commit_batch: refuse the whole batch, hang no one
            outcomes = [err] * len(batch)
        finally:
            with self._cond:
                for i, ticket in enumerate(batch):
                    # fewer outcomes only when a BaseException interrupted the leader
                    ticket.outcome = (
                        outcomes[i] if i < len(outcomes) else RuntimeError("commit interrupted")
                    )
                    ticket.done = True
                self._busy = False
                self.batches += 1
                self.items += len(batch)
                self._cond.notify_all()

    def _run(self, items: list[T]) -> list[R | Exception]:
        """One transaction for the batch; each item alone when that transaction failed."""
        try:
            return self._commit_batch(items)
        except Exception as err:
            if len(items) == 1:
                return [err]
        out: list[R | Exception] = []
        for item in items:
            try:
                out.extend(self._commit_batch([item]))
            except Exception as err:
                out.append(err)
        return out

    @staticmethod
    def _result(ticket: _Ticket[T, R]) -> R:
        outcome = ticket.outcome
        if isinstance(outcome, Exception):
            raise outcome
        return outcome  # type: ignore[return-value]
