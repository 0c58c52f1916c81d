"""The services' retry policy (services/retry.py): exponential backoff with jitter, the
server's Retry-After honoured, bounded by retries and by a total deadline."""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from services.retry import RetryPolicy, retry_after_seconds


class Unavailable(Exception):
    """A retryable failure, with the server's Retry-After when it sent one."""

    retryable = True

    def __init__(self, retry_after_s: float | None = None) -> None:
        super().__init__("unavailable")
        self.retry_after_s = retry_after_s


class Refused(Exception):
    retryable = False


class Script:
    """Raises the queued failures, then returns ``"done"``; counts its calls."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


def _policy(waits: list[float], **kw: Any) -> RetryPolicy:
    opts: dict[str, Any] = {"retries": 5, "backoff_s": 0.1, "max_backoff_s": 1.0, **kw}
    return RetryPolicy(sleep=waits.append, rng=random.Random(0), **opts)


def test_waits_grow_exponentially_up_to_the_cap_each_lengthened_at_random() -> None:
    waits: list[float] = []
    fn = Script(*[Unavailable() for _ in range(5)])
    assert _policy(waits).call(fn) == "done"
    bases = [0.1, 0.2, 0.4, 0.8, 1.0]
    assert len(waits) == 5 and fn.calls == 6
    for wait, base in zip(waits, bases, strict=True):
        assert base <= wait <= 1.5 * base
    assert [w / b for w, b in zip(waits, bases, strict=True)] != [1.0] * 5


def test_jitter_spreads_clients_that_failed_together() -> None:
    """Many clients failing at the same moment wait different times (no herd)."""
    firsts = []
    for seed in range(50):
        waits: list[float] = []
        RetryPolicy(retries=1, backoff_s=1.0, sleep=waits.append, rng=random.Random(seed)).call(
            Script(Unavailable())
        )
        firsts.append(waits[0])
    assert min(firsts) >= 1.0 and max(firsts) <= 1.5
    assert max(firsts) - min(firsts) > 0.2
    assert len(set(firsts)) == 50


def test_retry_after_is_honoured_and_still_jittered() -> None:
    waits: list[float] = []
    fn = Script(Unavailable(retry_after_s=5.0), Unavailable(retry_after_s=5.0), Unavailable())
    assert _policy(waits).call(fn) == "done"
    # the server's 5 s, far above the 0.1 s and 0.2 s backoffs, then the backoff (0.4 s)
    assert 5.0 <= waits[0] <= 7.5 and 5.0 <= waits[1] <= 7.5 and waits[0] != waits[1]
    assert 0.4 <= waits[2] <= 0.6


def test_a_retry_after_shorter_than_the_backoff_does_not_shorten_it() -> None:
    waits: list[float] = []
    _policy(waits, backoff_s=2.0, max_backoff_s=2.0).call(Script(Unavailable(retry_after_s=0.5)))
    assert 2.0 <= waits[0] <= 3.0


def test_a_refusal_is_not_retried() -> None:
    waits: list[float] = []
    fn = Script(Refused())
    with pytest.raises(Refused):
        _policy(waits).call(fn)
    assert fn.calls == 1 and waits == []


def test_retries_bound_the_attempts_and_the_last_failure_is_raised() -> None:
    waits: list[float] = []
    last = Unavailable()
    fn = Script(Unavailable(), Unavailable(), last, Unavailable())
    with pytest.raises(Unavailable) as info:
        _policy(waits, retries=2).call(fn)
    assert info.value is last and fn.calls == 3 and len(waits) == 2


def test_the_deadline_bounds_the_total_time() -> None:
    """A retry whose wait would end past the deadline is not made (real sleeps)."""
    fn = Script(*[Unavailable() for _ in range(100)])
    policy = RetryPolicy(retries=None, backoff_s=0.05, max_backoff_s=0.1, give_up_after_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(Unavailable):
        policy.call(fn)
    took = time.monotonic() - t0
    assert took < 0.5 + 0.3 and 3 <= fn.calls < 100  # (the last sleep may overrun a little)


def test_a_retry_after_past_the_deadline_gives_up_at_once() -> None:
    waits: list[float] = []
    fn = Script(Unavailable(retry_after_s=30.0))
    with pytest.raises(Unavailable):
        _policy(waits, give_up_after_s=10.0).call(fn)
    assert fn.calls == 1 and waits == []


def test_an_event_stops_the_retries() -> None:
    stop = threading.Event()
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        stop.set()

    fn = Script(*[Unavailable() for _ in range(10)])
    retrying = RetryPolicy(retries=None, give_up_after_s=None, sleep=sleep).retrying(until=stop)
    with pytest.raises(Unavailable):
        retrying(fn)
    assert fn.calls == 2 and len(waits) == 1


def test_retry_after_header_values() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds("5") == 5.0
    assert retry_after_seconds(" 120 ") == 120.0
    later = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert retry_after_seconds(later, now=now) == 30.0
    earlier = format_datetime(now - timedelta(seconds=30), usegmt=True)
    assert retry_after_seconds(earlier, now=now) == 0.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds("-3") is None
