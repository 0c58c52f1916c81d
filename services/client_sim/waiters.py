"""How a worker waits between polls: plain sleeps, or until a version event on Redis."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

VERSIONS_CHANNEL = "fedrec:versions"


class Waiter(Protocol):
    """Waits between polls; may return early when something happened."""

    def wait(self, seconds: float) -> None:
        """Block for at most ``seconds``."""

    def close(self) -> None:
        """Release resources."""


class SleepWaiter:
    """Plain polling: sleep the whole interval."""

    def __init__(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self._sleep = sleep

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``."""
        self._sleep(seconds)

    def close(self) -> None:
        """Nothing to release."""


class RedisWaiter:
    """Wakes up on a version event on ``fedrec:versions`` (or after the timeout)."""

    def __init__(self, url: str, channel: str = VERSIONS_CHANNEL) -> None:
        import redis

        self._redis = redis.Redis.from_url(url)
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(channel)
        self._error = redis.RedisError

    def wait(self, seconds: float) -> None:
        """Return on the first version event, or after ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            while (left := deadline - time.monotonic()) > 0:
                msg = self._pubsub.get_message(timeout=left)
                if msg is not None and msg.get("type") == "message":
                    log.debug("version event %r", msg.get("data"))
                    # drain what else is queued: one poll answers them all
                    while self._pubsub.get_message(timeout=0) is not None:
                        pass
                    return
        except self._error as err:
            log.warning("redis unavailable (%s); polling instead", err)
            time.sleep(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Unsubscribe and close the connection."""
        try:
            self._pubsub.close()
            self._redis.close()
        except self._error:  # pragma: no cover - closing a dead connection
            pass
