"""The one retry policy of the services' client loops, on tenacity: exponential backoff with
jitter, the server's ``Retry-After`` honoured, bounded by a number of retries and a total
deadline.

The wait before retry ``n`` (1-based) is ``min(max_backoff_s, backoff_s * 2**(n-1))``, raised to
the server's ``Retry-After`` when the failure carried one (an exception's ``retry_after_s``),
then lengthened by a random fraction of up to ``jitter`` of itself, so that clients failing
together (an aggregator restarting, its database down) do not come back together. A retry
whose wait would end past ``give_up_after_s`` after the first attempt is not made: the last failure
is raised. Whether a failure is worth retrying is the exception's ``retryable`` unless the
caller says otherwise.

Users: the worker's requests to the aggregator (:mod:`services.client_sim.aggregator_client`),
the worker's loop (registration and steps, waiting with its waiter), the recommender's
subscription to version events and the aggregator's to credential announcements.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import tenacity

log = logging.getLogger(__name__)

T = TypeVar("T")


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header value asks to wait (delay-seconds or an HTTP date);
    None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def is_retryable(exc: BaseException) -> bool:
    """The default test: the exception says it is worth retrying (``retryable``)."""
    return bool(getattr(exc, "retryable", False))


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry (see the module's text). ``retries`` and
    ``give_up_after_s`` None: no such bound. ``sleep`` waits between attempts (a waiter's wait, an
    event's wait, or a recorder in tests)."""

    retries: int | None = 10
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    jitter: float = 0.5
    give_up_after_s: float | None = 60.0
    sleep: Callable[[float], Any] = field(default=time.sleep, compare=False)
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def with_sleep(self, sleep: Callable[[float], Any]) -> RetryPolicy:
        """This policy, waiting with ``sleep``."""
        return replace(self, sleep=sleep)

    def wait_s(self, state: tenacity.RetryCallState) -> float:
        """Seconds to wait after the failed attempt of ``state`` (a tenacity wait)."""
        exponential = tenacity.wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s)
        base = exponential(state)
        failure = state.outcome.exception() if state.outcome is not None else None
        after = getattr(failure, "retry_after_s", None)
        if after is not None:
            base = max(base, float(after))
        return base * (1.0 + self.jitter * self.rng.random())

    def _options(
        self,
        retryable: Callable[[BaseException], bool],
        until: threading.Event | None,
        what: str,
    ) -> dict[str, Any]:
        stops: list[tenacity.stop.stop_base] = []
        if self.retries is not None:
            stops.append(tenacity.stop_after_attempt(self.retries + 1))
        if self.give_up_after_s is not None:
            stops.append(tenacity.stop_before_delay(self.give_up_after_s))
        if until is not None:
            stops.append(tenacity.stop_when_event_set(until))
        bound = self.retries

        def before_sleep(state: tenacity.RetryCallState) -> None:
            failure = state.outcome.exception() if state.outcome is not None else None
            of = f"/{bound}" if bound is not None else ""
            log.warning(
                "%s%s; retry %d%s in %.2fs",
                f"{what}: " if what else "",
                failure,
                state.attempt_number,
                of,
                state.upcoming_sleep,
            )

        return {
            "stop": tenacity.stop_any(*stops) if stops else tenacity.stop_never,
            "wait": self.wait_s,
            "retry": tenacity.retry_if_exception(retryable),
            "before_sleep": before_sleep,
            "reraise": True,  # the last failure itself, not a RetryError
        }

    def retrying(
        self,
        retryable: Callable[[BaseException], bool] = is_retryable,
        *,
        until: threading.Event | None = None,
        what: str = "",
    ) -> tenacity.Retrying:
        """A tenacity ``Retrying`` of this policy: ``retrying(fn)`` or ``for attempt in``.
        ``until``: stop retrying once this event is set; ``what`` prefixes the log lines."""
        return tenacity.Retrying(sleep=self.sleep, **self._options(retryable, until, what))

    def async_retrying(
        self, retryable: Callable[[BaseException], bool] = is_retryable, *, what: str = ""
    ) -> tenacity.AsyncRetrying:
        """:meth:`retrying` for coroutines (waits with ``asyncio.sleep``)."""
        return tenacity.AsyncRetrying(**self._options(retryable, None, what))

    def call(
        self,
        fn: Callable[[], T],
        retryable: Callable[[BaseException], bool] = is_retryable,
        *,
        what: str = "",
    ) -> T:
        """``fn()``, retried by this policy; the last failure is raised when it gives up."""
        result: T = self.retrying(retryable, what=what)(fn)
        return result


def any_error(exc: BaseException) -> bool:
    """Retry every error (not cancellation, interrupts or exit)."""
    return isinstance(exc, Exception)


def restart_backoff(attempt: tenacity.AttemptManager) -> None:
    """Count the waits of a ``for attempt in retrying`` loop from the first again: a
    connection that was made (a subscription) and broke later starts a new series of
    failures, not the continuation of the one before it."""
    attempt.retry_state.attempt_number = 1
