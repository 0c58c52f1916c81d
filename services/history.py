"""A reader's copy of the current run's history (``GET /v1/runs/current/history``), kept up to
date a page at a time: each refresh reads the rounds closed after the newest one it holds, and
one page from the oldest held round still without its metrics (a version's evaluation
completes after its round closed), never the whole history again. The dashboard refreshes
one on every poll, ``fedrec up`` while it shows the progress."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Generator
from typing import Any

#: a page of the history, or None when it could not be read (the copy is kept as it is)
Page = dict[str, Any] | None


class HistoryCopy:
    """The closed rounds of the newest run, from pages of the aggregator's history."""

    def __init__(self) -> None:
        self.run_id: int | None = None
        self.about: dict[str, Any] = {}  # the answer's other fields (planned_rounds, delta...)
        self._rounds: dict[int, dict[str, Any]] = {}  # round id -> round, in round order
        # what changed when, for readers of this copy (the dashboard's pages): each round new
        # or changed takes the next revision; ``epoch`` names the run held in this process
        self._epoch = secrets.token_hex(4)
        self._rev = 0
        self._revs: dict[int, int] = {}

    @property
    def token(self) -> str:
        """Where a reader of this copy is once it took in the rounds given with it."""
        return f"{self._epoch}:{self._rev}"

    def since(self, token: str | None) -> tuple[list[dict[str, Any]], bool]:
        """The rounds new or changed since ``token`` (a :attr:`token` given before), and
        False; or every round and True when the token is not one of this run's copy."""
        epoch, _, rev = (token or "").partition(":")
        if epoch == self._epoch and rev.isdigit() and int(rev) <= self._rev:
            after = int(rev)
            return [self._rounds[rid] for rid, v in self._revs.items() if v > after], False
        return self.rounds, True

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """The rounds held, in round order."""
        return list(self._rounds.values())

    def body(self) -> dict[str, Any]:
        """The whole history, as one unpaged answer would be."""
        return {**self.about, "run_id": self.run_id, "rounds": self.rounds, "next_after": None}

    def refresh(self, read: Callable[[int], Page]) -> bool:
        """Bring the copy up to date, ``read(after)`` giving one page; False when a read
        failed (what was read until then is kept)."""
        steps = self._reads()
        try:
            after = next(steps)
            while True:
                after = steps.send(read(after))
        except StopIteration as done:
            return bool(done.value)

    async def arefresh(self, read: Callable[[int], Awaitable[Page]]) -> bool:
        """:meth:`refresh` with an asynchronous ``read``."""
        steps = self._reads()
        try:
            after = next(steps)
            while True:
                after = steps.send(await read(after))
        except StopIteration as done:
            return bool(done.value)

    def _reads(self) -> Generator[int, Page, bool]:
        """The reads of one refresh: yields where each starts (``after``) and is sent its
        page; returns False when one failed."""
        for _ in range(2):  # once more from the start when another run replaced the one held
            replaced = False
            for i, start in enumerate(self._starts()):
                after: int | None = start
                while after is not None and not replaced:
                    page = yield after
                    if page is None:
                        return False
                    replaced = not self._take(page, after)
                    # to the end after the newest round; one page for the missing metrics
                    after = page.get("next_after") if i == 0 else None
            if not replaced:
                return True
        return True

    def _starts(self) -> list[int]:
        """After the newest round held; and before the oldest held without metrics, if any."""
        newest = next(reversed(self._rounds), 0)
        missing = next((rid for rid, r in self._rounds.items() if not r.get("metrics")), None)
        return [newest] if missing is None else [newest, missing - 1]

    def _take(self, page: dict[str, Any], after: int) -> bool:
        """Take one page in (read after round ``after``); False, holding nothing any more,
        when it is of another run and not its start."""
        if page.get("run_id") != self.run_id:
            self.run_id, self.about, self._rounds = page.get("run_id"), {}, {}
            self._epoch, self._rev, self._revs = secrets.token_hex(4), 0, {}
            if after != 0:
                return False
        self.about = {k: v for k, v in page.items() if k not in ("run_id", "rounds", "next_after")}
        for r in page.get("rounds") or []:
            rid = int(r["round_id"])
            if self._rounds.get(rid) != r:
                self._rounds[rid] = r
                self._rev += 1
                self._revs[rid] = self._rev
        return True
