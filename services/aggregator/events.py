"""Redis, when configured: version events (pub/sub), the round-closing lock, and the
announcement that client credentials changed (so that every replica forgets the credentials
it keeps in memory).

Redis is optional for progress: when it does not answer, a round is closed without the lock
(the database's conditional update still makes each close happen exactly once; the lock only
spares replicas aggregating the same round in parallel) and no version event is published
(followers poll). After a failure Redis is left alone for :data:`RETRY_AFTER_S` seconds, so
closes do not wait on its timeouts.

Credential changes (the operator's release, a registration) are announced on
``fedrec:credentials``; every replica follows that channel in a thread and empties its cache
of credentials on each message, and whenever it (re)subscribes (it may have missed some while
Redis was away; it subscribes again by the services' retry policy, :mod:`services.retry`). Without Redis the caches expire on their own (``auth._TOKEN_CACHE_TTL_S``).

The closing lock expires ``lock_timeout_s`` after it was last renewed, and a close renews it
every third of that while it runs: a replica that dies inside a close (SIGKILL, a lost
machine) holds the round up for at most that long, however long a live close takes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import LockError, RedisError
from redis.lock import Lock

from services.retry import RetryPolicy, any_error, restart_backoff

log = logging.getLogger(__name__)

VERSIONS_CHANNEL = "fedrec:versions"
#: announces that client credentials changed (the message itself says nothing more)
CREDENTIALS_CHANNEL = "fedrec:credentials"
#: seconds Redis is not tried again after it failed
RETRY_AFTER_S = 5.0
#: following a channel again after Redis failed: 0.5 s doubling to RETRY_AFTER_S, with jitter
FOLLOW_RETRY = RetryPolicy(
    retries=None, give_up_after_s=None, backoff_s=0.5, max_backoff_s=RETRY_AFTER_S
)


def close_lock_name(run_id: int, round_id: int) -> str:
    """Key of the lock held while a round is being closed."""
    return f"fedrec:lock:close:{run_id}:{round_id}"


class RedisBus:
    """A synchronous Redis client used from worker threads."""

    def __init__(self, url: str, lock_timeout_s: float = 10.0, lock_wait_s: float = 10.0) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self.lock_timeout_s = lock_timeout_s
        self.lock_wait_s = lock_wait_s
        # Locking: ``_lock`` guards ``_down_until`` (monotonic time before which Redis is not
        # tried again) only.
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._followers: list[_Follower] = []

    def ping(self) -> None:
        """Round-trip to Redis (raises when it is unreachable)."""
        self.client.ping()

    def available(self) -> bool:
        """False while Redis is being left alone after a failure."""
        with self._lock:
            return time.monotonic() >= self._down_until

    def _failed(self, what: str, err: Exception) -> None:
        with self._lock:
            self._down_until = time.monotonic() + RETRY_AFTER_S
        log.warning("redis unavailable (%s: %s); going on without it", what, err)

    @contextmanager
    def close_lock(self, run_id: int, round_id: int) -> Iterator[bool]:
        """Hold the closing lock of a round; yields False when another holder kept it, True
        (without a lock) when Redis does not answer: the database's guard suffices."""
        if not self.available():
            yield True
            return
        lock = self.client.lock(
            close_lock_name(run_id, round_id),
            timeout=self.lock_timeout_s,
            blocking_timeout=self.lock_wait_s,
            thread_local=False,  # renewed from another thread (its token must be seen there)
        )
        try:
            acquired = bool(lock.acquire())
        except RedisError as err:
            self._failed("closing lock", err)
            acquired, held = True, False
        else:
            held = acquired
        renewal = _Renewal(lock, self.lock_timeout_s / 3, self._failed) if held else None
        try:
            yield acquired
        finally:
            if renewal is not None:
                renewal.stop()
            if held:
                try:
                    lock.release()
                except LockError:
                    log.warning(
                        "closing lock of run %d round %d expired while held", run_id, round_id
                    )
                except RedisError as err:
                    self._failed("releasing the closing lock", err)

    def publish_version(self, run_id: int, version: int, round_id: int) -> bool:
        """Announce a new model version on ``fedrec:versions``; False when Redis does not
        answer (followers find the version by polling)."""
        if not self.available():
            return False
        payload = json.dumps({"run_id": run_id, "version": version, "round_id": round_id})
        try:
            self.client.publish(VERSIONS_CHANNEL, payload)
        except RedisError as err:
            self._failed("publishing a version", err)
            return False
        return True

    def publish_credentials_changed(self) -> bool:
        """Tell every replica that client credentials changed (they forget their cached
        ones); False when Redis does not answer (they forget them within the cache's
        lifetime)."""
        if not self.available():
            return False
        try:
            self.client.publish(CREDENTIALS_CHANNEL, b"changed")
        except RedisError as err:
            self._failed("announcing a credentials change", err)
            return False
        return True

    def follow_credentials(self, changed: Callable[[], None]) -> None:
        """Call ``changed`` (from a daemon thread) on every credentials announcement, and
        whenever the subscription is made or made again, until :meth:`close`."""
        self._followers.append(_Follower(self.client, CREDENTIALS_CHANNEL, changed))

    def close(self) -> None:
        """Stop following channels; close the connection pool."""
        for follower in self._followers:
            follower.stop()
        self._followers.clear()
        self.client.close()


class _Follower:
    """Follows one pub/sub channel in a daemon thread: ``changed()`` on each message and on
    each (re)subscription; a subscription that fails or breaks is made again by
    :data:`FOLLOW_RETRY` (its waits counted from the first again once one was made)."""

    def __init__(self, client: redis.Redis, channel: str, changed: Callable[[], None]) -> None:
        self._client = client
        self._channel = channel
        self._changed = changed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"follow-{channel}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        retrying = FOLLOW_RETRY.with_sleep(self._stop.wait).retrying(
            any_error, until=self._stop, what=f"following {self._channel}"
        )
        try:
            for attempt in retrying:
                with attempt, self._client.pubsub() as pubsub:
                    pubsub.subscribe(self._channel)
                    restart_backoff(attempt)
                    while not self._stop.is_set():
                        if pubsub.get_message(timeout=0.5) is not None:
                            self._changed()  # a message, or the subscription's confirmation
        except Exception as err:  # stopped while Redis was away
            log.debug("stopped following %s (%s)", self._channel, err)

    def stop(self) -> None:
        """End the thread (within the half second of a pending read)."""
        self._stop.set()
        self._thread.join(5.0)


class _Renewal:
    """Renews a held lock every ``every_s`` seconds in a daemon thread until :meth:`stop`
    (a lock lost meanwhile, or Redis failing, ends the renewals: the database's guard still
    makes the close happen once)."""

    def __init__(
        self, lock: Lock, every_s: float, failed: Callable[[str, Exception], None]
    ) -> None:
        self._lock = lock
        self._every_s = every_s
        self._failed = failed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="close-lock-renewal", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self._lock.reacquire()
            except LockError:
                log.warning("the closing lock %s expired before it was renewed", self._lock.name)
                return
            except RedisError as err:
                self._failed("renewing the closing lock", err)
                return
            except Exception:
                log.exception("renewing the closing lock %s failed", self._lock.name)
                return

    def stop(self) -> None:
        """No more renewals (waits for one in progress)."""
        self._stop.set()
        self._thread.join()
