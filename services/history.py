"""A reader's copy of the current run's history (``GET /v1/runs/current/history``), kept up to
date a page at a time, never the whole history again: each refresh reads the rounds closed
after the newest one it holds; then, when the answer's ``evaluated_through`` (the newest
evaluated version) moved, the held rounds without metrics that it moved past (a version's
evaluation completes after its round closed). Versions complete in order, so a round without
metrics whose version is older than an evaluated one never gets any and is not read again.
The dashboard refreshes one on every poll, ``fedrec up`` while it shows the progress."""

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
        # round id -> model version of the rounds held without metrics that may still get
        # them: those after the newest evaluated version (``evaluated_through``) when read
        self._unsettled: dict[int, int] = {}
        # what changed when, for readers of this copy (the dashboard's pages): each round new
        # or changed takes the next revision; ``epoch`` names the run held in this process
        self._epoch = secrets.token_hex(4)
        self._rev = 0
        self._revs: dict[int, int] = {}

    @property
    def newest(self) -> int:
        """The id of the newest round held (0: none)."""
        return next(reversed(self._rounds), 0)

    def forget(self) -> None:
        """Hold nothing (the next refresh reads the run from its start); readers' tokens
        lapse, so they are given every round again."""
        self.run_id, self.about, self._rounds, self._unsettled = None, {}, {}, {}
        self._epoch, self._rev, self._revs = secrets.token_hex(4), 0, {}

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
            held = next(reversed(self._rounds), 0)
            after: int | None = held
            while after is not None:  # the rounds closed since, to the end
                page = yield after
                if page is None:
                    return False
                if not self._take(page, after):
                    break
                after = page.get("next_after")
            else:
                done = yield from self._reread(held)
                if done is not None:
                    return done
        return True

    def _reread(self, held: int) -> Generator[int, Page, bool | None]:
        """Read again the rounds up to ``held`` whose metrics came since they were read:
        those whose versions completed their evaluation since the last refresh (the answer's
        ``evaluated_through``). True when done, False when a read failed, None when another
        run replaced the one held."""
        if "evaluated_through" not in self.about:  # an aggregator that does not say
            first = next((rid for rid in self._unsettled if rid <= held), None)
            todo = [] if first is None else [first]
            through = None
        else:
            through = self.about["evaluated_through"]
            todo = [
                rid
                for rid, v in self._unsettled.items()
                if rid <= held and through is not None and v <= through
            ]
        after: int | None = todo[0] - 1 if todo else None
        while after is not None:
            page = yield after
            if page is None:
                return False
            if not self._take(page, after):
                return None
            after = page.get("next_after")
            if through is None or after is None or after >= todo[-1]:
                break  # one page when the aggregator does not say what completed
        if through is not None:  # metrics never come for versions before a completed one
            self._unsettled = {r: v for r, v in self._unsettled.items() if v > through}
        return True

    def _final(self, r: dict[str, Any]) -> bool:
        """Whether a round without metrics never gets any: its version is not newer than the
        newest evaluated one (versions complete their evaluation in order)."""
        through = self.about.get("evaluated_through")
        return through is not None and int(r.get("model_version", r["round_id"])) <= through

    def _take(self, page: dict[str, Any], after: int) -> bool:
        """Take one page in (read after round ``after``); False, holding nothing any more,
        when it is of another run and not its start."""
        if page.get("run_id") != self.run_id:
            self.forget()
            self.run_id = page.get("run_id")
            if after != 0:
                return False
        self.about = {k: v for k, v in page.items() if k not in ("run_id", "rounds", "next_after")}
        for r in page.get("rounds") or []:
            rid = int(r["round_id"])
            if self._rounds.get(rid) != r:
                self._rounds[rid] = r
                self._rev += 1
                self._revs[rid] = self._rev
            if r.get("metrics"):
                self._unsettled.pop(rid, None)
            elif rid not in self._unsettled and not self._final(r):
                self._unsettled[rid] = int(r.get("model_version", rid))
        return True
