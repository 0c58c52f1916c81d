"""Following the aggregator: ETag polling, and Redis version events when configured.

Each poll refreshes the model (``GET /v1/models/latest``), then the popularity prior
(``GET /v1/runs/current/prior``, its own ETag): a changed prior is swapped in with the serving
model (:meth:`~services.recommend_api.ranking.ModelHolder.set_prior`, no model decoded again);
a 404 (no run, or an aggregator without the route) means no prior; any other failure keeps the
current serving state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import httpx
from pydantic import ValidationError

from services.recommend_api.prior import PriorBody, PublishedPrior, publish
from services.recommend_api.ranking import ModelHolder
from services.retry import RetryPolicy, any_error, restart_backoff

log = logging.getLogger(__name__)

#: re-subscribing to version events: 0.5 s doubling to 10 s with jitter, without end (the
#: poll catches what is missed meanwhile)
EVENTS_RETRY = RetryPolicy(retries=None, give_up_after_s=None, backoff_s=0.5, max_backoff_s=10.0)

#: the aggregator's popularity prior of the current run
PRIOR_PATH = "/v1/runs/current/prior"


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
        self._last_problem: dict[str, str | None] = {"model": None, "prior": None}

    def _problem(self, message: str, what: str = "model") -> None:
        """A failed refresh of ``what`` (model or prior): a warning when it differs from the
        previous one, debug when it repeats it (before the first run, or while the aggregator is
        down, every poll fails the same way)."""
        level = logging.DEBUG if message == self._last_problem[what] else logging.WARNING
        log.log(level, "%s", message)
        self._last_problem[what] = message

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
        self._last_problem["model"] = None  # answered: the next failure is news again
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

    async def refresh_prior(self) -> bool:
        """Fetch the prior if it changed and swap the serving model in with it (or without it,
        on a 404); True when a snapshot was swapped. A failure keeps the serving state."""
        published = self.holder.published_prior  # its ETag: that of the body it came from
        etag = None if published is None else published.etag
        headers = {"If-None-Match": etag} if etag else {}
        try:
            resp = await self.client.get(PRIOR_PATH, headers=headers)
        except httpx.HTTPError as err:
            self._problem(f"prior: aggregator unreachable ({err}); prior unchanged", "prior")
            return False
        if resp.status_code == 404:  # no run yet, or an aggregator without the route
            published = None
        elif resp.status_code == 200:
            try:
                published = await asyncio.to_thread(self._parse_prior, resp, published)
            except (ValidationError, ValueError, OverflowError) as err:
                self._problem(f"prior: malformed body ({_short(err)}); prior unchanged", "prior")
                return False
        elif resp.status_code != 304:
            self._problem(
                f"prior answered {resp.status_code}: {resp.text[:200]}; prior unchanged", "prior"
            )
            return False
        # also after a 304: a version swapped in since may have been built with an older prior
        try:
            swapped = await asyncio.to_thread(self.holder.set_prior, published)
        except Exception as err:  # e.g. no memory for the index: the serving state stays
            self._problem(f"prior: could not be applied ({err}); prior unchanged", "prior")
            return False
        self._last_problem["prior"] = None  # answered and applied: a failure is news again
        return swapped

    @staticmethod
    def _parse_prior(resp: httpx.Response, previous: PublishedPrior | None) -> PublishedPrior:
        """The prior of a 200 body (validated; log-prior computed unless the counts repeat)."""
        body = PriorBody.model_validate_json(resp.content)
        return publish(body, resp.headers.get("ETag"), previous)

    async def poll_once(self) -> None:
        """One poll: the model, then the prior (each failure contained and logged)."""
        try:
            await self.refresh()
        except Exception:  # never let the loop die
            log.exception("model refresh failed")
        try:
            await self.refresh_prior()
        except Exception:  # nor a prior: the model keeps serving as it was
            log.exception("prior refresh failed")

    async def _poll_loop(self) -> None:
        while True:
            await self.poll_once()
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


def _short(err: Exception) -> str:
    """The first line of an error, at most 200 characters (a body's values are not echoed)."""
    if isinstance(err, ValidationError):
        first = err.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{err.error_count()} error(s), first at {where or 'the body'}: {first['msg']}"
    return str(err).splitlines()[0][:200] if str(err) else type(err).__name__


def _event_version(data: Any) -> int | None:
    """The version of a ``fedrec:versions`` event, or None if it cannot be read."""
    try:
        if isinstance(data, bytes):
            data = data.decode()
        return int(json.loads(data)["version"])
    except (ValueError, KeyError, TypeError):
        return None
