"""Redis, when configured: version events (pub/sub) and the round-closing lock."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import LockError

log = logging.getLogger(__name__)

VERSIONS_CHANNEL = "fedrec:versions"


def close_lock_name(run_id: int, round_id: int) -> str:
    """Key of the lock held while a round is being closed."""
    return f"fedrec:lock:close:{run_id}:{round_id}"


class RedisBus:
    """A synchronous Redis client used from worker threads."""

    def __init__(self, url: str, lock_timeout_s: float = 60.0, lock_wait_s: float = 10.0) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self.lock_timeout_s = lock_timeout_s
        self.lock_wait_s = lock_wait_s

    def ping(self) -> None:
        """Round-trip to Redis (raises when it is unreachable)."""
        self.client.ping()

    @contextmanager
    def close_lock(self, run_id: int, round_id: int) -> Iterator[bool]:
        """Hold the closing lock of a round; yields False when another holder kept it."""
        lock = self.client.lock(
            close_lock_name(run_id, round_id),
            timeout=self.lock_timeout_s,
            blocking_timeout=self.lock_wait_s,
        )
        acquired = bool(lock.acquire())
        try:
            yield acquired
        finally:
            if acquired:
                try:
                    lock.release()
                except LockError:
                    log.warning(
                        "closing lock of run %d round %d expired while held", run_id, round_id
                    )

    def publish_version(self, run_id: int, version: int, round_id: int) -> None:
        """Announce a new model version on ``fedrec:versions``."""
        payload = json.dumps({"run_id": run_id, "version": version, "round_id": round_id})
        self.client.publish(VERSIONS_CHANNEL, payload)

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()
