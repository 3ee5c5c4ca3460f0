"""StowQ/1 retry backoff: the delay a nack records, and the deadline it becomes.

Spec: ``records.md`` (Renewal, retry, bury: "the delay is drawn from the upper
half of the exponential ceiling"); the hash and the rejection sampler exist
only in the reference's ``stowq-math`` crate, and ``vectors/math.json`` pins
every draw of them.

The policy and its exponential ceiling are SteadQ/1's (``steadqd.backoff``):
the two formats define them identically, so the policy is validated in one
place and a YAML ``retry:`` section means the same on either backend. What
differs is the jitter: StowQ hashes under its own domain string and draws the
*upper half* of the ceiling, ``[ceil(c/2), c]``, so a retry never comes
sooner than half the nominal backoff. The draw is a hash, not a random
number, so every implementation computes the same delay for the same retry
(and two workers racing to nack the same attempt write the same deadline).
Pure code: no clocks, no I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass

from steadqd.backoff import RetryPolicy, delay_ns_from_ms
from steadqd.backoff import retry_delay_ms as _steadq_delay_ms
from steadqd.constants import ID_BYTES, U32_MAX
from steadqd.errors import InvalidInput
from steadqd.s3.timemath import bucket_number, check_uint, retry_not_before

__all__ = [
    "DOMAIN_JITTER",
    "JITTER_DRAWS",
    "NackDeadline",
    "RetryPolicy",
    "ceiling_ms",
    "jitter_sample",
    "jitter_window",
    "nack_deadline",
    "reject_threshold",
    "retry_delay_ms",
    "sample_offset",
]

DOMAIN_JITTER = b"StowQ-1-jitter\0"
# Rejected draws before the sampler settles for the middle of the span.
JITTER_DRAWS = 64

_TWO_64 = 1 << 64


def _check_id(what: str, value: bytes) -> bytes:
    if not isinstance(value, bytes | bytearray) or len(value) != ID_BYTES:
        raise InvalidInput(f"{what} must be {ID_BYTES} bytes, got {value!r}")
    return bytes(value)


def ceiling_ms(policy: RetryPolicy, attempt: int) -> int:
    """``min(effective cap, base × 2^(attempt-1))``, saturating; 0 for attempt 0.

    The same ceiling as SteadQ/1's unjittered delay, so it is computed there.
    """
    unjittered = dataclasses.replace(policy, use_jitter=False)
    return _steadq_delay_ms(unjittered, bytes(ID_BYTES), bytes(ID_BYTES), attempt)


def jitter_window(ceiling: int) -> tuple[int, int]:
    """``(lower, span)`` of the upper half ``[ceil(c/2), c]`` of a ceiling ``c``."""
    lower = -(-check_uint("ceiling_ms", ceiling) // 2)
    return lower, ceiling - lower + 1


def reject_threshold(span: int) -> int:
    """``2^64 mod span``: samples below it would bias ``sample mod span``, so they are redrawn."""
    if check_uint("span", span) == 0:
        raise InvalidInput("jitter span must be at least 1")
    return (_TWO_64 - span) % span


def jitter_sample(queue_id: bytes, job_id: bytes, attempt: int, counter: int) -> int:
    """Draw ``counter`` for a retry: the first 8 bytes, big-endian, of the domain-separated hash."""
    data = (
        DOMAIN_JITTER
        + _check_id("queue_id", queue_id)
        + _check_id("job_id", job_id)
        + struct.pack(">II", check_uint("attempt", attempt, U32_MAX), check_uint("counter", counter, U32_MAX))
    )
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def sample_offset(span: int, draw: Callable[[int], int]) -> int:
    """An unbiased offset in ``[0, span)`` from ``draw(0)``, ``draw(1)``, ...

    The first draw at or above the rejection threshold wins; after
    :data:`JITTER_DRAWS` rejections the midpoint is used (a fixed, equally
    unbiased answer that keeps the loop bounded).
    """
    threshold = reject_threshold(span)
    for counter in range(JITTER_DRAWS):
        sample = draw(counter)
        if sample >= threshold:
            return sample % span
    return span // 2


def retry_delay_ms(policy: RetryPolicy, queue_id: bytes, job_id: bytes, attempt: int) -> int:
    """Delay in ms before the job may be taken over after attempt ``attempt`` failed (0 gives 0)."""
    if not isinstance(policy, RetryPolicy):
        raise InvalidInput(f"policy must be a RetryPolicy, got {policy!r}")
    ceiling = ceiling_ms(policy, attempt)
    if not policy.use_jitter or attempt == 0:
        return ceiling
    lower, span = jitter_window(ceiling)
    return lower + sample_offset(span, lambda counter: jitter_sample(queue_id, job_id, attempt, counter))


@dataclass(frozen=True)
class NackDeadline:
    """What a nack writes: the fail record's ``retry_not_before`` and its ``delayed/`` index bucket."""

    delay_ms: int
    retry_not_before_ns: int
    delay_index_bucket: int


def nack_deadline(
    policy: RetryPolicy,
    queue_id: bytes,
    job_id: bytes,
    attempt: int,
    *,
    floor_ns: int,
    delayed_width_ns: int,
) -> NackDeadline:
    """The deadline of a retry after ``attempt``, measured from the nacking worker's store-time floor.

    The index bucket is the floor bucket of the deadline, so a delayed sweep
    reaches it no later than the deadline's own bucket; the takeover still
    checks ``retry_not_before`` itself.
    """
    delay_ms = retry_delay_ms(policy, queue_id, job_id, attempt)
    deadline = retry_not_before(floor_ns, delay_ns_from_ms(delay_ms))
    return NackDeadline(delay_ms, deadline, bucket_number(deadline, delayed_width_ns))
