"""Durations given in seconds become nanoseconds without escaping as OverflowError (issue 15, point 10's kind).

``round(float("inf") * 1e9)`` raises OverflowError, and ``1e300 * 1e9`` is
infinite: every seconds-to-nanoseconds conversion of the library's API is
checked, so a bad value is InvalidInput naming the argument (NotCommitted with
that kind from a queue operation), and nothing is written. A negative
retention or TTL, which would make recovery delete receipts or live temp files
at once, is refused the same way.
"""

from __future__ import annotations

import math
import os

import pytest

from steadqd import ErrorKind, NotCommitted, Queue
from steadqd.constants import U64_MAX
from steadqd.errors import InvalidInput
from steadqd.fs.clock import checked_seconds_ns

HUGE = [math.inf, 1e300, -math.inf, math.nan]


def files_under(root: str, top: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, top)) for f in fs)


@pytest.mark.parametrize("duration", HUGE)
def test_lease_refuses_an_unrepresentable_duration(queue: Queue, queue_path: str, duration: float) -> None:
    queue.enqueue(b"x")
    before = files_under(queue_path, "ready")
    with pytest.raises(NotCommitted) as info:
        queue.lease(duration=duration)
    assert info.value.kind is ErrorKind.INVALID_INPUT and "lease duration" in str(info.value), info.value
    assert files_under(queue_path, "ready") == before and queue.poisoned is None


@pytest.mark.parametrize("duration", HUGE)
def test_renew_refuses_an_unrepresentable_duration(queue: Queue, duration: float) -> None:
    queue.enqueue(b"x")
    lease = queue.lease(duration=30)
    assert lease is not None
    with pytest.raises(NotCommitted) as info:
        queue.renew(lease, duration)
    assert info.value.kind is ErrorKind.INVALID_INPUT and "lease duration" in str(info.value), info.value
    queue.renew(lease, 30)  # the lease is intact


@pytest.mark.parametrize(("valid", "invalid"), [(1, True), (1.0, True), (30.0, "30")])
def test_lease_refuses_a_duration_equal_to_one_it_took(queue: Queue, valid: float, invalid: object) -> None:
    """Queue.lease memoises the conversion of an exact float or int (lease.plain_duration_ns): a bool or
    a string never reaches the memo, where a bool would hit the entry of the number it equals."""
    queue.enqueue(b"x")
    lease = queue.lease(duration=valid)
    assert lease is not None
    with pytest.raises(NotCommitted) as info:
        queue.lease(duration=invalid)  # type: ignore[arg-type]
    assert info.value.kind is ErrorKind.INVALID_INPUT and "lease duration" in str(info.value), info.value


def test_lease_refuses_a_wait_too_long_to_count(queue: Queue) -> None:
    with pytest.raises(NotCommitted) as info:
        queue.lease(wait=1e300)
    assert info.value.kind is ErrorKind.INVALID_INPUT and "wait" in str(info.value), info.value


@pytest.mark.parametrize("option", ["receipt_retention", "temp_ttl", "max_clock_skew"])
@pytest.mark.parametrize("value", [math.inf, 1e300, math.nan, -1, True, "7d"])
def test_open_refuses_a_bad_duration_option(queue: Queue, queue_path: str, option: str, value: object) -> None:
    with pytest.raises(InvalidInput, match=option):
        Queue.open(queue_path, **{option: value})  # type: ignore[arg-type]


def test_the_conversion_is_exact_up_to_its_maximum() -> None:
    assert checked_seconds_ns("d", 0) == 0
    assert checked_seconds_ns("d", 1.5) == 1_500_000_000
    assert checked_seconds_ns("d", 10, maximum=10_000_000_000) == 10_000_000_000
    with pytest.raises(InvalidInput, match="d 10.5 s is too large"):
        checked_seconds_ns("d", 10.5, maximum=10_000_000_000)
    assert checked_seconds_ns("d", U64_MAX // 10**9) <= U64_MAX
    with pytest.raises(InvalidInput, match="too large"):
        checked_seconds_ns("d", U64_MAX)


# Found by the same audit: enqueue's and retry's delays were converted with a bare
# round(delay * 1e9), so inf or 1e300 escaped as OverflowError.


@pytest.mark.parametrize("delay", [math.inf, 1e300])
def test_enqueue_refuses_an_unrepresentable_delay(queue: Queue, queue_path: str, delay: float) -> None:
    with pytest.raises(NotCommitted) as info:
        queue.enqueue(b"x", delay=delay)
    assert info.value.kind is ErrorKind.INVALID_INPUT and "delay" in str(info.value), info.value
    assert files_under(queue_path, "delayed") == files_under(queue_path, "ready") == []


@pytest.mark.parametrize("delay", [math.inf, 1e300])
def test_retry_refuses_an_unrepresentable_delay(queue: Queue, delay: float) -> None:
    queue.enqueue(b"x")
    lease = queue.lease(duration=30)
    assert lease is not None
    with pytest.raises(NotCommitted) as info:
        queue.retry(lease, delay)
    assert info.value.kind is ErrorKind.INVALID_INPUT and "delay" in str(info.value), info.value
    queue.renew(lease, 30)  # nothing moved: the lease is intact
