"""Retry backoff with deterministic jitter (spec: clocks.md "Retry backoff").

The jitter is a hash of (queue id, job id, attempt), not a random draw, so
that the reference and this port compute the same delay for the same retry
and a test can pin it. Sampling is unbiased: a 64-bit hash value is accepted
only above the rejection threshold ``2**64 mod span``, with up to 64 counters
and a fixed midpoint fallback, exactly as the reference does.

The CLI never uses a policy (its ``retry`` is immediate or ``--after-seconds``);
this is library API. Pure code: no clocks, no I/O.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from steadqd.constants import DOMAIN_JITTER, I63_MAX, ID_BYTES, U32_MAX, U64_MAX
from steadqd.errors import InvalidInput

__all__ = ["RetryPolicy", "delay_ns_from_ms", "retry_deadline_ns", "retry_delay_ms"]

_JITTER_COUNTERS = 64
_NS_PER_MS = 1_000_000
_TWO_64 = 1 << 64


def _check_u64(what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= U64_MAX:
        raise InvalidInput(f"{what} must be an integer in 0..{U64_MAX}, got {value!r}")
    return value


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff ``base_ms × 2^(attempt−1)`` capped at ``min(cap_ms, max_delay_ms)``.

    Validated on construction (the reference validates before any use), so a
    policy object that exists is always usable.
    """

    base_ms: int
    cap_ms: int
    use_jitter: bool = True
    max_delay_ms: int | None = None

    def __post_init__(self) -> None:
        _check_u64("base_ms", self.base_ms)
        _check_u64("cap_ms", self.cap_ms)
        if self.max_delay_ms is not None:
            _check_u64("max_delay_ms", self.max_delay_ms)
        if not isinstance(self.use_jitter, bool):
            raise InvalidInput(f"use_jitter must be a bool, got {self.use_jitter!r}")
        if self.base_ms == 0:
            raise InvalidInput("retry policy base_ms must be > 0")
        if self.effective_cap_ms < self.base_ms:
            raise InvalidInput(
                f"retry policy cap ({self.effective_cap_ms} ms, min of cap_ms and max_delay_ms) "
                f"must be >= base_ms ({self.base_ms} ms)"
            )

    @property
    def effective_cap_ms(self) -> int:
        """``min(cap_ms, max_delay_ms)`` when max_delay_ms is set, else cap_ms."""
        if self.max_delay_ms is None:
            return self.cap_ms
        return min(self.cap_ms, self.max_delay_ms)


def retry_delay_ms(policy: RetryPolicy, queue_id: bytes, job_id: bytes, attempt: int) -> int:
    """Delay in ms before retrying the lease whose attempt number is ``attempt``.

    ``attempt`` 0 (never a real lease) yields 0, i.e. an immediate retry.
    """
    if not isinstance(policy, RetryPolicy):
        raise InvalidInput(f"policy must be a RetryPolicy, got {policy!r}")
    if not isinstance(queue_id, (bytes, bytearray)) or len(queue_id) != ID_BYTES:
        raise InvalidInput(f"queue_id must be {ID_BYTES} bytes, got {queue_id!r}")
    if not isinstance(job_id, (bytes, bytearray)) or len(job_id) != ID_BYTES:
        raise InvalidInput(f"job_id must be {ID_BYTES} bytes, got {job_id!r}")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 0 <= attempt <= U32_MAX:
        raise InvalidInput(f"attempt must be an integer in 0..{U32_MAX}, got {attempt!r}")
    if attempt == 0:
        return 0

    # Saturating doubling; beyond 64 doublings any base >= 1 saturates, and the
    # guard keeps us from building a 4-billion-bit integer.
    doubled = U64_MAX if attempt > 64 else min(policy.base_ms << (attempt - 1), U64_MAX)
    ceiling = min(policy.effective_cap_ms, doubled)
    if not policy.use_jitter:
        return ceiling

    lower = (ceiling + 1) // 2  # ceil(ceiling / 2)
    span = ceiling - lower + 1
    threshold = (_TWO_64 - span) % span
    prefix = DOMAIN_JITTER + bytes(queue_id) + bytes(job_id) + struct.pack(">I", attempt)
    for counter in range(_JITTER_COUNTERS):
        h = hashlib.sha256(prefix + struct.pack(">I", counter)).digest()
        x = int.from_bytes(h[:8], "big")
        if x >= threshold:
            return lower + x % span
    return lower + span // 2


def delay_ns_from_ms(delay_ms: int) -> int:
    """``delay_ms × 10^6``, checked against u64 (clocks.md) rather than silently growing."""
    delay_ns = _check_u64("delay_ms", delay_ms) * _NS_PER_MS
    if delay_ns > U64_MAX:
        raise InvalidInput(f"retry delay {delay_ms} ms overflows u64 nanoseconds")
    return delay_ns


def retry_deadline_ns(wall_floor_ns: int, delay_ns: int) -> int | None:
    """Wall deadline of a delayed retry, or None when the retry must be immediate.

    Shared by policy retries (``delay_ns_from_ms(retry_delay_ms(...))``) and
    ``retry_after(duration)``: the deadline ``wall_floor + delay_ns`` must not
    exceed ``2^63 − 1`` (else InvalidInput), and a deadline not after the wall
    floor (delay 0) means "retry now".
    """
    wall_floor_ns = _check_u64("wall_floor_ns", wall_floor_ns)
    delay_ns = _check_u64("delay_ns", delay_ns)
    deadline = wall_floor_ns + delay_ns
    if deadline > I63_MAX:
        raise InvalidInput(f"retry deadline {deadline} ns exceeds 2^63-1")
    if deadline <= wall_floor_ns:
        return None
    return deadline
