"""The authenticated wall floor (clocks.md): wall time that never goes back.

Every wall-clock decision (created_at, delayed-vs-ready, terminal buckets,
retry deadlines, promotion) uses ``max(CLOCK_REALTIME, watermark)``. The
watermark is a durable record in ``control/wall-watermark`` advanced at most
once per delayed-bucket width, so a clock stepped back cannot deliver a
delayed job early or move receipts into an older bucket.

Unlike the reference, the exclusive watermark lock is taken only when the
record must actually be replaced (allowed by clocks.md); reading needs no
lock because the record is replaced atomically by rename.
"""

from __future__ import annotations

import errno
import os
import threading
import time

from steadqd.constants import (
    PRIVATE_MODES,
    WATERMARK_ADVANCE_TMP_PREFIX,
    WATERMARK_FILE,
    WATERMARK_LOCK,
    WATERMARK_SIZE,
    Modes,
)
from steadqd.errors import InvalidInput, MaintenanceBusy, QueueCorrupt, StateExhausted
from steadqd.fs import linux
from steadqd.fs.owner import give_to_owner
from steadqd.fs.records import Watermark

# Attempts back to back (clocks.md's 8) before a reader starts to wait.
_READ_ATTEMPTS = 8
# How long a reader waits out a replacement in progress, pausing between
# attempts from _FIRST_PAUSE_S doubling up to _LAST_PAUSE_S. Same bound as an
# advancer's wait for the lock holder, whose rename is what is being waited for.
_READ_BUDGET_NS = 2_000_000_000
_FIRST_PAUSE_S = 0.0002
_LAST_PAUSE_S = 0.01
# How long a handle trusts its cached watermark before re-reading it. Keeps
# processes within ~1 s of each other after a clock rollback, at the cost of a
# few cheap syscalls per second.
_CACHE_NS = 1_000_000_000
_BUSY_WAIT_NS = 2_000_000_000


def read_watermark(control_fd: int) -> Watermark:
    """Read and authenticate the record, waiting (bounded) while it is being replaced.

    clocks.md retries 8 times, which presumes a replacement is an instant. On
    ext4 it is not: rename(2) drops the old inode's last link, then updates it
    and the orphan list in the journal (waiting whenever a commit is writing
    those blocks), and only then moves the name, so for milliseconds under
    fsync load every open of the name returns an unlinked inode. Eight
    attempts back to back last ~100 µs and turned that into MaintenanceBusy
    for every producer and consumer reading at a bucket boundary (issue 20).
    The replacement finishes on its own, so after the spec's 8 attempts the
    reader pauses and retries for up to _READ_BUDGET_NS (a port may retry
    longer); only a record that stays unstable that long is MaintenanceBusy.
    What is returned is still only ever a complete, authenticated record that
    was the named one when it was read.
    """
    pause = _FIRST_PAUSE_S
    deadline: int | None = None
    attempt = 0
    while True:
        record = _read_stable(control_fd)
        if record is not None:
            return record
        attempt += 1
        if attempt < _READ_ATTEMPTS:
            continue
        now = linux.monotonic_ns()
        if deadline is None:
            deadline = now + _READ_BUDGET_NS
        elif now > deadline:
            raise MaintenanceBusy(
                f"wall watermark kept changing while being read: control/{WATERMARK_FILE} was still being "
                f"replaced after {_READ_BUDGET_NS // 1_000_000_000} s; retry the operation"
            )
        time.sleep(pause)
        pause = min(pause * 2, _LAST_PAUSE_S)


def _read_stable(control_fd: int) -> Watermark | None:
    """One attempt: the record, or None if a replacement was seen in progress."""
    try:
        fd, st = linux.open_regular(control_fd, WATERMARK_FILE, os.O_RDONLY, label=f"control/{WATERMARK_FILE}")
    except linux.NotRegularFile as e:
        raise QueueCorrupt(str(e)) from e
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise QueueCorrupt("wall watermark missing (control/wall-watermark)") from e
        raise
    try:
        if st.st_nlink == 0:
            return None  # unlinked by a rename that has not moved the name yet
        if st.st_nlink > 1:
            raise QueueCorrupt("control/wall-watermark has extra hard links")
        if st.st_size < WATERMARK_SIZE:
            raise QueueCorrupt("control/wall-watermark is truncated")
        if st.st_size > WATERMARK_SIZE:
            raise QueueCorrupt("control/wall-watermark is larger than 64 bytes")
        data = linux.pread(fd, WATERMARK_SIZE, 0)
        if len(data) != WATERMARK_SIZE:
            raise QueueCorrupt("control/wall-watermark is truncated")
        record = Watermark.decode(data)
        try:
            again = linux.stat_at(control_fd, WATERMARK_FILE)
        except OSError:
            return None
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):
            return None  # replaced between the open and now
        return record
    finally:
        linux.close(fd)


def publish_watermark(control_fd: int, record: Watermark, tmp_prefix: str, modes: Modes = PRIVATE_MODES) -> None:
    """Write a temp, fsync it, rename it over the record, fsync control/."""
    name = tmp_prefix + linux.getrandom(16).hex()
    fd = linux.open_at(control_fd, name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, modes.file)
    try:
        try:
            if modes.owner is not None:
                give_to_owner(fd, modes.owner)
            if modes.enforce:
                linux.fchmod(fd, modes.file)
            linux.write_all(fd, record.encode())
            linux.fsync(fd)
        finally:
            linux.close(fd)
        linux.rename_replace(control_fd, name, control_fd, WATERMARK_FILE)
    except BaseException:
        try:
            linux.unlink_at(control_fd, name)
        except OSError:
            pass
        raise
    linux.fsync(control_fd)


class WallFloor:
    """Per-handle wall floor, kept monotone and backed by the watermark."""

    def __init__(self, control_fd: int, delayed_width_ns: int, *, modes: Modes = PRIVATE_MODES) -> None:
        self._control_fd = control_fd
        self._modes = modes
        self._width = delayed_width_ns
        self._bucket: int | None = None  # highest watermark bucket known durable
        self._read_at = 0
        self._last = 0
        self._lock = threading.Lock()

    def _stored_bucket(self, *, fresh: bool, now: int | None = None) -> int:
        if now is None:
            now = linux.monotonic_ns()
        if fresh or self._bucket is None or now - self._read_at > _CACHE_NS:
            record = read_watermark(self._control_fd)
            self._bucket = max(self._bucket or 0, record.bucket)
            self._read_at = now
        return self._bucket

    def _raw_floor(self, bucket: int) -> int:
        realtime = linux.realtime_ns()
        if realtime < 0:
            raise InvalidInput("CLOCK_REALTIME reads before the Unix epoch")
        start = bucket * self._width
        if start > (1 << 64) - 1:
            raise StateExhausted("watermark bucket start overflows u64")
        return max(realtime, start, self._last)

    def for_mutation(self) -> int:
        """The floor to stamp a mutation with; advances the watermark first
        when the clock has moved into a later bucket, so the value used is
        never ahead of what a crash would preserve."""
        lock = self._lock  # acquire/release, not ``with`` (tree.py's _LOCK_NOTE): every enqueue, claim and ack
        lock.acquire()
        try:
            # _stored_bucket's cached case inlined (same clock read first): every enqueue, claim and ack.
            now = linux.monotonic_ns()
            bucket = self._bucket
            if bucket is None or now - self._read_at > _CACHE_NS:
                bucket = self._stored_bucket(fresh=True, now=now)
            # _raw_floor inlined too, with its checks in the same order
            realtime = linux.realtime_ns()
            if realtime < 0:
                raise InvalidInput("CLOCK_REALTIME reads before the Unix epoch")
            width = self._width
            start = bucket * width
            if start > (1 << 64) - 1:
                raise StateExhausted("watermark bucket start overflows u64")
            # max(realtime, start, self._last) as two comparisons (ints: the same value), without its call
            floor = realtime if realtime >= start else start
            last = self._last
            if last > floor:
                floor = last
            # floor // width > bucket exactly when floor reaches the next bucket's start (width > 0): the
            # division, a long division of 64-bit ints (~1,000 instructions), only when it does
            if floor >= start + width:
                self._advance(floor // width)
            self._last = floor
            return floor
        finally:
            lock.release()

    def peek(self) -> int:
        """The floor without advancing anything (read-only callers)."""
        with self._lock:
            return self._raw_floor(self._stored_bucket(fresh=False))

    def _advance(self, wanted: int) -> None:
        try:
            # No fstat here: a FIFO opens at once (O_NONBLOCK) and locks like a
            # file, and Queue.open refuses one; other non-files fail the open.
            lock_fd = linux.open_at(self._control_fd, WATERMARK_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            special = linux.not_regular(self._control_fd, WATERMARK_LOCK)
            if special is not None:
                raise QueueCorrupt(str(linux.NotRegularFile(f"control/{WATERMARK_LOCK}", special.st_mode))) from e
            if e.errno not in (errno.ENOENT, errno.ELOOP):
                raise  # an I/O error is IoFailure/ResourceExhausted, not corruption (errors.md)
            raise QueueCorrupt(f"cannot open control/{WATERMARK_LOCK}: {e.strerror}") from e
        try:
            # The holder needs two fsyncs; wait for it briefly rather than
            # failing every concurrent producer at each bucket boundary.
            deadline = linux.monotonic_ns() + _BUSY_WAIT_NS
            while not linux.ofd_lock(lock_fd, exclusive=True):
                current = read_watermark(self._control_fd)
                if current.bucket >= wanted:
                    self._bucket = max(self._bucket or 0, current.bucket)
                    return
                if linux.monotonic_ns() > deadline:
                    raise MaintenanceBusy("wall watermark is being advanced by another process")
                time.sleep(0.001)
            current = read_watermark(self._control_fd)
            if current.bucket >= wanted:
                self._bucket = max(self._bucket or 0, current.bucket)
                return
            if current.sequence >= (1 << 64) - 1:
                raise StateExhausted("watermark sequence overflows u64")
            new = Watermark(bucket=wanted, sequence=current.sequence + 1)
            publish_watermark(self._control_fd, new, WATERMARK_ADVANCE_TMP_PREFIX, self._modes)
            self._bucket = wanted
            self._read_at = linux.monotonic_ns()
        finally:
            linux.close(lock_fd)
