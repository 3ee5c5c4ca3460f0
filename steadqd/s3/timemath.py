"""StowQ/1 time arithmetic: buckets, floors, deadlines, lease expiry, admissibility, the watermark.

Spec: ``time.md`` and ``records.md`` (Claim, Admissibility); the
reference's ``stowq-math`` crate pins the edges, and ``vectors/math.json``
replays them.

Every number here is store time in nanoseconds as an unsigned 64-bit
integer: the store is the only clock, so there are no seconds, no floats
and no local clock reads. Python integers never wrap, which is the danger:
a sum that the reference refuses (or saturates) would silently grow past
2^64 - 1 here and then fail to encode, or worse, compare as "later than
everything". So each function states which of the two rules it follows,
exactly as the reference does: *checked* arithmetic raises
:class:`StateExhausted` where the reference returns no value, *saturating*
arithmetic clamps at 2^64 - 1 where the reference saturates. A zero bucket
width cannot come from a valid FORMAT and is refused as :class:`InvalidInput`.
Pure code: no clocks, no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from steadqd.constants import I63_MAX, U64_MAX
from steadqd.errors import InvalidInput, StateExhausted

__all__ = [
    "WatermarkAdvance",
    "WatermarkWrite",
    "advance_watermark",
    "bucket_end_ns",
    "bucket_number",
    "bucket_start_ns",
    "ceiling_bucket",
    "check_uint",
    "continuation_admissible",
    "effective_floor",
    "eligibility",
    "expiry_ns",
    "is_expired",
    "retry_not_before",
    "saturating_add",
    "takeover_admissible",
    "tail_is_expired",
]


def check_uint(what: str, value: object, maximum: int = U64_MAX) -> int:
    """``value`` if it is an int in ``0..maximum``; else InvalidInput naming ``what``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= maximum:
        raise InvalidInput(f"{what} must be an integer in 0..{maximum}, got {value!r}")
    return value


def _width(what: str, width_ns: int) -> int:
    if check_uint(what, width_ns) == 0:
        raise InvalidInput(f"{what} must be at least 1 ns (a FORMAT never has a zero bucket width), got 0")
    return width_ns


def _checked(what: str, value: int) -> int:
    if value > U64_MAX:
        raise StateExhausted(f"{what} overflows u64 nanoseconds ({value})")
    return value


def saturating_add(*terms: int) -> int:
    """The sum of u64 ``terms``, clamped at 2^64 - 1 as the reference's saturating adds are."""
    return min(sum(check_uint("addend", t) for t in terms), U64_MAX)


# --- Buckets ---


def bucket_number(timestamp_ns: int, width_ns: int) -> int:
    """``floor(timestamp / width)``: the bucket a store time falls in."""
    return check_uint("timestamp_ns", timestamp_ns) // _width("bucket width_ns", width_ns)


def ceiling_bucket(timestamp_ns: int, width_ns: int) -> int:
    """``ceil(timestamp / width)``: the first bucket that starts at or after a time."""
    return -(-check_uint("timestamp_ns", timestamp_ns) // _width("bucket width_ns", width_ns))


def eligibility(requested_ns: int, width_ns: int) -> tuple[int, int]:
    """``(bucket, bucket × width)`` for a delayed job: rounded up, so it is never delivered early.

    Checked: the bucket's start must itself be a u64 time.
    """
    bucket = ceiling_bucket(requested_ns, width_ns)
    return bucket, _checked(f"eligibility bucket {bucket} × width {width_ns}", bucket * width_ns)


def bucket_start_ns(bucket: int, width_ns: int) -> int:
    """``bucket × width`` (checked)."""
    product = check_uint("bucket", bucket) * check_uint("bucket width_ns", width_ns)
    return _checked(f"start of bucket {bucket} (width {width_ns})", product)


def bucket_end_ns(bucket: int, width_ns: int) -> int:
    """``bucket × width + width`` (checked): the exclusive end of a bucket."""
    return _checked(f"end of bucket {bucket} (width {width_ns})", bucket_start_ns(bucket, width_ns) + width_ns)


# --- Floors and deadlines ---


def effective_floor(floor_ns: int, watermark_bucket: int, width_ns: int) -> int:
    """``max(floor, watermark_bucket × width)``: the watermark can raise a proven floor, never lower it.

    Checked, and the width must be non-zero even when the floor would win.
    """
    watermark_ns = bucket_start_ns(watermark_bucket, _width("watermark width_ns", width_ns))
    return max(check_uint("floor_ns", floor_ns), watermark_ns)


def retry_not_before(floor_ns: int, delay_ns: int) -> int:
    """``floor + delay``, which must not exceed 2^63 - 1 so it survives signed time domains."""
    deadline = check_uint("floor_ns", floor_ns) + check_uint("delay_ns", delay_ns)
    if deadline > I63_MAX:
        raise StateExhausted(f"retry deadline {floor_ns} + {delay_ns} ns exceeds 2^63-1")
    return deadline


# --- Leases ---


def expiry_ns(store_time_ns: int, lease_duration_ns: int, skew_guard_ns: int = 0) -> int:
    """When a claim's lease ends, with the skew guard added (saturating, like the reference)."""
    return saturating_add(store_time_ns, lease_duration_ns, skew_guard_ns)


def is_expired(floor_ns: int, store_time_ns: int, lease_duration_ns: int, skew_guard_ns: int) -> bool:
    """``floor ≥ claim_store_time + lease_duration + skew_guard`` (time.md, Expiry semantics).

    The floor is a proven lower bound on store time, so "expired" is never
    claimed early; a saturated expiry is reached only by a floor of 2^64 - 1.
    """
    return check_uint("floor_ns", floor_ns) >= expiry_ns(store_time_ns, lease_duration_ns, skew_guard_ns)


def tail_is_expired(floor_ns: int, tail: tuple[int, int] | None, skew_guard_ns: int) -> bool:
    """Whether the tail of a claim chain no longer holds the job.

    ``tail`` is the tail claim's ``(store_time_ns, lease_duration_ns)``, or
    None when the chain is empty (tail generation 0): a job nobody has claimed
    is claimable without any expiry check.
    """
    if tail is None:
        check_uint("floor_ns", floor_ns)
        return True
    return is_expired(floor_ns, tail[0], tail[1], skew_guard_ns)


# --- Admissibility (records.md, Admissibility) ---


def takeover_admissible(
    prev_store_time_ns: int,
    prev_duration_ns: int,
    observed_watermark_ns: int,
    *,
    predecessor_store_time_ns: int,
    predecessor_lease_duration_ns: int,
) -> bool:
    """Whether a takeover's basis proves generation g-1 had expired when it was written.

    The basis must name the predecessor exactly (its store time and lease
    duration, as read from the store), and the claimant's floor must have
    reached the predecessor's expiry. The skew guard is not part of this
    check (records.md states it without one, and the vectors pin that): it
    belongs to the claimant's own expiry test, which is stricter.
    """
    if (prev_store_time_ns, prev_duration_ns) != (predecessor_store_time_ns, predecessor_lease_duration_ns):
        return False
    return saturating_add(prev_store_time_ns, prev_duration_ns) <= check_uint(
        "observed_watermark_ns", observed_watermark_ns
    )


def continuation_admissible(
    worker_id: str, prev_token: bytes, *, predecessor_worker_id: str, predecessor_worker_token: bytes
) -> bool:
    """Whether a continuation proves custody: same worker, and the predecessor's secret token."""
    return worker_id == predecessor_worker_id and bytes(prev_token) == bytes(predecessor_worker_token)


# --- Watermark (time.md, Watermark) ---


class WatermarkWrite(enum.Enum):
    """How ``meta/watermark`` must be written after a fresh floor."""

    NONE = "none"
    CREATE = "create-if-absent"
    CAS = "cas"


@dataclass(frozen=True)
class WatermarkAdvance:
    """What a fresh beacon floor means for the watermark.

    ``regression`` is True when the stored watermark starts later than the
    fresh floor plus the skew guard: store time went backwards (or the store
    misreports it), so wall-sensitive work must fail closed and the finding
    is quarantine-flagged; every other field is then None. Otherwise
    ``raised_floor_ns`` is the floor to use, and ``write`` says whether to
    create or CAS the record with ``bucket`` and ``sequence``.
    """

    regression: bool
    floor_bucket: int
    raised_floor_ns: int | None
    write: WatermarkWrite | None
    bucket: int | None = None
    sequence: int | None = None


def advance_watermark(
    fresh_floor_ns: int,
    width_ns: int,
    skew_guard_ns: int,
    stored: tuple[int, int] | None,
) -> WatermarkAdvance:
    """Compare a fresh floor with the stored watermark ``(bucket, sequence)`` (None when absent).

    ``width_ns`` is the delayed bucket width (the reference's choice; no spec
    text names it). Regression is judged on the fresh floor *before* any
    raise, so raising never hides a regression, and the raise is bounded by
    the skew guard because a watermark further ahead is a regression.
    """
    floor_bucket = bucket_number(fresh_floor_ns, width_ns)
    if stored is None:
        return WatermarkAdvance(False, floor_bucket, fresh_floor_ns, WatermarkWrite.CREATE, floor_bucket, 0)
    stored_bucket, stored_sequence = stored
    check_uint("stored watermark sequence", stored_sequence)
    if bucket_start_ns(stored_bucket, width_ns) > saturating_add(fresh_floor_ns, skew_guard_ns):
        return WatermarkAdvance(True, floor_bucket, None, None)
    raised = effective_floor(fresh_floor_ns, stored_bucket, width_ns)
    if floor_bucket <= stored_bucket:
        return WatermarkAdvance(False, floor_bucket, raised, WatermarkWrite.NONE)
    if stored_sequence == U64_MAX:
        raise StateExhausted("watermark sequence would pass 2^64-1")
    return WatermarkAdvance(False, floor_bucket, raised, WatermarkWrite.CAS, floor_bucket, stored_sequence + 1)
