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

from steadqd.errors import AlreadyExists, NotCommitted, OutcomeUnknown, PreconditionFailed, StoreProfileViolation
from steadqd.s3 import keys
from steadqd.s3.layout import QueueLayout
from steadqd.s3.quarantine import flag
from steadqd.s3.records import QuarantineReason, WatermarkRecord
from steadqd.s3.timemath import WatermarkWrite, advance_watermark
from steadqd.s3.verify import read_record

__all__ = ["BEACON_TRIES", "FloorClock", "beacon_floor", "establish_floor"]

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


def _read_watermark(layout: QueueLayout) -> tuple[WatermarkRecord, str, int] | None:
    found = layout.get(keys.WATERMARK_KEY)
    if found is None:
        return None
    data, meta = found
    record = read_record(data, layout.queue_id, keys.WATERMARK_KEY, required_feature_bits=0)
    assert isinstance(record, WatermarkRecord)  # check_key_binding allows nothing else at meta/watermark
    return record, meta.etag, meta.store_time_ns


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
