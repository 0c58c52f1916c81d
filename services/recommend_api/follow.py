"""Following the aggregator: ETag polling, and Redis version events when configured."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import httpx

from services.recommend_api.ranking import ModelHolder
from services.retry import RetryPolicy, any_error, restart_backoff

log = logging.getLogger(__name__)

#: re-subscribing to version events: 0.5 s doubling to 10 s with jitter, without end (the
#: poll catches what is missed meanwhile)
EVENTS_RETRY = RetryPolicy(retries=None, give_up_after_s=None, backoff_s=0.5, max_backoff_s=10.0)


class ModelFollower:
    """Downloads new model versions from the aggregator and swaps them into a holder.

    Without Redis it polls ``GET /v1/models/latest`` with ``If-None-Match`` every
    ``poll_interval_s`` (a 304 costs no download). With Redis a version event on
    ``channel`` triggers the download at once, and the poll runs ``redis_poll_factor`` times
    slower to catch events missed while disconnected.
    """

    def __init__(
        self,
        holder: ModelHolder,
        client: httpx.AsyncClient,
        poll_interval_s: float,
        redis: Any | None = None,
        channel: str = "fedrec:versions",
        redis_poll_factor: float = 15.0,
    ) -> None:
        self.holder = holder
        self.client = client
        self.redis = redis
        self.channel = channel
        self.interval = poll_interval_s * (redis_poll_factor if redis is not None else 1.0)
        self.wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_problem: str | None = None

    def _problem(self, message: str) -> None:
        """A failed refresh: a warning when it differs from the previous one, debug when it
        repeats it (before the first run, or while the aggregator is down, every poll fails
        the same way)."""
        level = logging.DEBUG if message == self._last_problem else logging.WARNING
        log.log(level, "%s", message)
        self._last_problem = message

    def start(self) -> None:
        """Start the poll loop (and the Redis listener when configured)."""
        self._tasks.append(asyncio.create_task(self._poll_loop(), name="model-poll"))
        if self.redis is not None:
            self._tasks.append(asyncio.create_task(self._listen(), name="model-events"))

    async def stop(self) -> None:
        """Cancel the background tasks and wait for them."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()

    async def refresh(self) -> bool:
        """Fetch the latest version if it changed and swap it in; True when swapped."""
        snap = self.holder.snapshot
        headers = {"If-None-Match": snap.etag} if snap is not None and snap.etag else {}
        try:
            resp = await self.client.get("/v1/models/latest", headers=headers)
        except httpx.HTTPError as err:
            self._problem(f"aggregator unreachable ({err}); serving version {self.holder.version}")
            return False
        if resp.status_code != 200 and resp.status_code != 304:
            self._problem(f"model download answered {resp.status_code}: {resp.text[:200]}")
            return False
        self._last_problem = None  # answered: the next failure is news again
        if resp.status_code == 304:
            return False
        etag = resp.headers.get("ETag")
        announced = resp.headers.get("X-Model-Version")
        if snap is not None and announced == str(snap.version) and snap.etag == etag:
            return False
        try:
            new = await asyncio.to_thread(self.holder.build_from_bytes, resp.content, etag)
        except Exception as err:  # keep serving the old model on any load failure
            self.holder.record_failure(f"model version {announced}", err)
            return False
        self.holder.swap(new)
        return True

    async def _poll_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # never let the loop die
                log.exception("model refresh failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.interval)
            self.wake.clear()

    async def _listen(self) -> None:
        """Follow version events; a subscription that fails or breaks is made again by
        :data:`EVENTS_RETRY` (its waits counted from the first again once one was made)."""
        async for attempt in EVENTS_RETRY.async_retrying(any_error, what="redis version events"):
            with attempt:
                pubsub = self.redis.pubsub()  # type: ignore[union-attr]
                try:
                    await pubsub.subscribe(self.channel)
                    restart_backoff(attempt)
                    self.wake.set()  # catch up on anything published while not subscribed
                    async for msg in pubsub.listen():
                        if msg.get("type") != "message":
                            continue
                        version = _event_version(msg.get("data"))
                        if version is None or version != self.holder.version:
                            self.wake.set()
                    raise ConnectionError("the subscription ended")  # subscribe again
                finally:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()


def _event_version(data: Any) -> int | None:
    """The version of a ``fedrec:versions`` event, or None if it cannot be read."""
    try:
        if isinstance(data, bytes):
            data = data.decode()
        return int(json.loads(data)["version"])
    except (ValueError, KeyError, TypeError):
        return None
