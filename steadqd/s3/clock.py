"""Store time for protocol decisions: clock beacons, the floor, the watermark (time.md).

Why beacons: a participant's own clock is untrusted, so "now" is a proven
lower bound instead, the *floor*: create an empty ``meta/clock/<nonce>``,
read back the time the store gave it. The floor may then be raised to the
stored watermark's bucket start, and the watermark is raised (CAS) when the
floor has entered a later bucket, so a store whose clock runs back is seen
(the watermark is ahead of a fresh floor by more than the skew guard) and
wall-sensitive work stops: :class:`~steadqd.errors.StoreProfileViolation`
on P6, with a quarantine finding 0x0012, never an early delivery.

A floor is reused for ``staleness_s`` of this process's monotonic time:
floors are lower bounds, so a stale one only delays work.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from steadqd.errors import (
    AlreadyExists,
    CorruptRecord,
    NotCommitted,
    OutcomeUnknown,
    PreconditionFailed,
    StoreProfileViolation,
)
from steadqd.s3 import keys
from steadqd.s3.layout import Oversized, QueueLayout
from steadqd.s3.quarantine import flag
from steadqd.s3.records import QuarantineReason, WatermarkRecord
from steadqd.s3.store.base import ObjectMeta
from steadqd.s3.timemath import WatermarkWrite, advance_watermark, bucket_number
from steadqd.s3.verify import read_record

__all__ = ["BEACON_TRIES", "FloorClock", "WatermarkUnreadable", "beacon_floor", "establish_floor", "rebuild_watermark"]

# Beacons are content-free: after a lost or unknown create a fresh nonce is always right.
BEACON_TRIES = 3


def beacon_floor(layout: QueueLayout) -> int:
    """One fresh floor: the store time of a beacon created now (two store calls)."""
    last: Exception | None = None
    for _ in range(BEACON_TRIES):
        rel = keys.beacon_key(os.urandom(keys.NONCE_BYTES))
        try:
            layout.store.put_if_absent(layout.key(rel), b"")
            return layout.store_time(rel)
        except (AlreadyExists, NotCommitted, OutcomeUnknown) as exc:
            last = exc
    raise NotCommitted(f"no clock beacon could be created on {layout.store.location} ({last}); try again")


class WatermarkUnreadable(CorruptRecord):
    """``meta/watermark`` is there but is no watermark record: floors cannot be checked against it.

    Wall-sensitive work fails closed (time.md) until it is rebuilt; the
    message names the object and the command that rebuilds it. ``meta`` is
    the bad object's (its ETag is what the rebuild's CAS names).
    """

    def __init__(self, layout: QueueLayout, cause: CorruptRecord, meta: ObjectMeta) -> None:
        super().__init__(
            f"{layout.key(keys.WATERMARK_KEY)} in {layout.store.location} is not a watermark record "
            f"({cause.message}); delayed jobs "
            "and takeovers wait until it is rebuilt: steadq fsck --repair QUEUE",
            cause.reason,
            error_class=cause.error_class,
        )
        self.meta = meta


def _read_watermark(layout: QueueLayout) -> tuple[WatermarkRecord, str, int] | None:
    try:
        found = layout.get(keys.WATERMARK_KEY)
    except Oversized as exc:
        raise WatermarkUnreadable(layout, exc, exc.meta) from None
    if found is None:
        return None
    data, meta = found
    try:
        record = read_record(data, layout.queue_id, keys.WATERMARK_KEY, required_feature_bits=0)
    except CorruptRecord as exc:
        raise WatermarkUnreadable(layout, exc, meta) from None
    assert isinstance(record, WatermarkRecord)  # check_key_binding allows nothing else at meta/watermark
    return record, meta.etag, meta.store_time_ns


def rebuild_watermark(layout: QueueLayout, *, tries: int = 3) -> WatermarkRecord | None:
    """Replace an unreadable ``meta/watermark`` with one a fresh floor proves; None when it reads fine.

    Why this value: the watermark may only name a bucket the store has
    provably reached (time.md: it raises floors), and the bucket of a beacon
    created now is one; whatever higher bucket the bad object hid is lost,
    which only weakens the regression check until the watermark is raised
    again. The replacement is a CAS on the bad object's ETag, the write every
    participant makes, so a participant that replaced it meanwhile wins and
    its watermark stands. The bad object gets a quarantine finding first.
    """
    width = layout.format.delayed_bucket_width_ns
    for _ in range(tries):
        try:
            _read_watermark(layout)
            return None
        except WatermarkUnreadable as bad:
            flag(layout, keys.WATERMARK_KEY, bad.reason, bad.meta.store_time_ns, why=bad.message)
            record = WatermarkRecord(
                highest_observed_wall_bucket=bucket_number(beacon_floor(layout), width), sequence=0
            )
            try:
                layout.store.put_if_match(
                    layout.key(keys.WATERMARK_KEY), layout.encode(keys.WATERMARK_KEY, record), bad.meta.etag
                )
            except PreconditionFailed:
                continue  # replaced meanwhile: read what is there now
            except OutcomeUnknown:
                continue  # the read tells whether it happened
            return record
    raise NotCommitted(
        f"{layout.key(keys.WATERMARK_KEY)} in {layout.store.location} changed during each of {tries} rebuilds; run fsck --repair again"
    )


def _write_watermark(layout: QueueLayout, write: WatermarkWrite, bucket: int, sequence: int, etag: str | None) -> None:
    """Raise the stored watermark; losing the race means someone raised it further, which is as good."""
    record = WatermarkRecord(highest_observed_wall_bucket=bucket, sequence=sequence)
    body = layout.encode(keys.WATERMARK_KEY, record)
    key = layout.key(keys.WATERMARK_KEY)
    try:
        if write is WatermarkWrite.CREATE:
            layout.store.put_if_absent(key, body)
        elif write is WatermarkWrite.CAS and etag is not None:
            layout.store.put_if_match(key, body, etag)
    except (AlreadyExists, PreconditionFailed, NotCommitted, OutcomeUnknown):
        pass  # best effort: the floor just established stands either way


def establish_floor(layout: QueueLayout) -> int:
    """A fresh floor, raised by the watermark, with the watermark advanced; fails closed on a regression."""
    fresh = beacon_floor(layout)
    stored = _read_watermark(layout)
    width = layout.format.delayed_bucket_width_ns
    advance = advance_watermark(
        fresh,
        width,
        layout.skew_guard_ns,
        None if stored is None else (stored[0].highest_observed_wall_bucket, stored[0].sequence),
    )
    if advance.regression or advance.raised_floor_ns is None:
        assert stored is not None
        flag(
            layout,
            keys.WATERMARK_KEY,
            QuarantineReason.STORE_TIME_REGRESSION,
            stored[2],
            why=f"a fresh floor {fresh} ns is behind the watermark bucket {stored[0].highest_observed_wall_bucket}",
        )
        raise StoreProfileViolation(
            f"store time went back: a beacon created now got {fresh} ns, but the watermark of "
            f"{layout.location} proves bucket {stored[0].highest_observed_wall_bucket} (width {width} ns) was "
            "reached; delayed delivery and takeovers stop until the store's clock is right again",
            primitive="P6 store time",
        )
    if advance.write in (WatermarkWrite.CREATE, WatermarkWrite.CAS):
        assert advance.bucket is not None and advance.sequence is not None
        _write_watermark(layout, advance.write, advance.bucket, advance.sequence, None if stored is None else stored[1])
    return advance.raised_floor_ns


class FloorClock:
    """The floor one handle uses, re-established when older than ``staleness_s`` (or on demand)."""

    def __init__(
        self, layout: QueueLayout, *, staleness_s: float = 1.0, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._layout = layout
        self._staleness = staleness_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._floor = 0
        self._at: float | None = None

    def floor(self, *, fresh: bool = False) -> int:
        with self._lock:
            if not fresh and self._at is not None and self._monotonic() - self._at < self._staleness:
                return self._floor
        floor = establish_floor(self._layout)
        with self._lock:
            self._floor = max(self._floor, floor)  # two lower bounds: keep the higher
            self._at = self._monotonic()
            return self._floor

    def invalidate(self) -> None:
        with self._lock:
            self._at = None
