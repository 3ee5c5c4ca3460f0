"""Clock readings a lease or a recovery pass must not take at their word.

Two readings can be right for this process and wrong for every other one:

* **A time namespace** (Linux 5.6+, ``unshare --time``) offsets this process's
  CLOCK_BOOTTIME and CLOCK_MONOTONIC. SteadQ/1 writes boottime deadlines into
  lease names and judges them against the boot's one boottime clock
  (clocks.md), so such a process would write deadlines the host's sweeper
  misreads, or reap another process's live lease. It may still use the queue,
  but not for what writes or judges a boottime deadline: claim, renew, and the
  recovery phases that compare boottimes (reaping, temp cleanup).
  CLOCK_MONOTONIC is never stored, so its offset alone is harmless.

* **A wall watermark ahead of this host's clock.** The watermark only rises;
  that is how a clock stepped back is kept from delivering jobs early. But
  one process whose clock runs ahead (faketime, a wrong RTC) raises it for
  everyone, and recovery would then promote, expire and bury by that clock.
  Recovery therefore judges by ``min(wall floor, CLOCK_REALTIME + max skew)``:
  never earlier than the spec's rule, later only while the watermark leads
  by more than the bound, and it says so.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from steadqd.constants import NS_PER_SECOND, TIMENS_OFFSETS_PATH, U64_MAX
from steadqd.durations import format_duration
from steadqd.errors import InvalidInput
from steadqd.fs import linux

_OFFSET_LINE = re.compile(r"(monotonic|boottime|1|7)\s+(-?[0-9]{1,20})\s+([0-9]{1,9})")
# The kernel prints clock names; it accepts the clock ids when written.
_CLOCK_NAMES = {"monotonic": "monotonic", "boottime": "boottime", "1": "monotonic", "7": "boottime"}


@dataclass(frozen=True)
class TimeOffsets:
    """A time namespace's offsets from the host's clocks, in nanoseconds."""

    monotonic_ns: int = 0
    boottime_ns: int = 0


def checked_seconds_ns(what: str, seconds: object, *, maximum: int = U64_MAX) -> int:
    """Seconds given by a caller as nanoseconds, refused with InvalidInput
    (naming ``what``) unless finite, non-negative and at most ``maximum`` ns:
    ``round(inf * 1e9)`` would escape as a bare OverflowError."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(f"{what} must be a finite, non-negative number of seconds, got {seconds!r}")
    ns = round(seconds * NS_PER_SECOND) if seconds <= maximum / NS_PER_SECOND else maximum + 1
    if ns > maximum:
        raise InvalidInput(f"{what} {seconds!r} s is too large: at most {maximum / NS_PER_SECOND:g} s")
    return ns


# --- time namespaces -----------------------------------------------------------


def parse_time_offsets(text: str) -> TimeOffsets:
    """The offsets of ``/proc/self/timens_offsets`` text; ValueError naming the bad line."""
    found: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _OFFSET_LINE.fullmatch(line.strip())
        if m is None:
            raise ValueError(f"line {number}: expected '<clock> <seconds> <nanoseconds>', got {line!r}")
        clock = _CLOCK_NAMES[m.group(1)]
        if clock in found:
            raise ValueError(f"line {number}: {clock} is given twice")
        found[clock] = int(m.group(2)) * NS_PER_SECOND + int(m.group(3))
    return TimeOffsets(found.get("monotonic", 0), found.get("boottime", 0))


def read_time_offsets(path: str | None = None) -> TimeOffsets:
    """This process's offsets; none when the kernel has no time namespaces (no file)."""
    path = path or TIMENS_OFFSETS_PATH
    try:
        fd = linux.open_at(linux.AT_FDCWD, path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return TimeOffsets()
    try:
        raw = linux.pread(fd, 4096, 0)
    finally:
        linux.close(fd)
    return parse_time_offsets(raw.decode("ascii"))


def boottime_problem(path: str | None = None) -> str | None:
    """Why this process must not write or judge boottime deadlines, or None.

    Read once per open handle: a process cannot change its own time
    namespace (``setns`` and ``unshare --time`` only affect children).
    """
    path = path or TIMENS_OFFSETS_PATH
    try:
        offsets = read_time_offsets(path)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return f"cannot tell whether a time namespace offsets CLOCK_BOOTTIME ({path}: {reason})"
    if offsets.boottime_ns == 0:
        return None
    return (
        f"this process runs in a time namespace that offsets CLOCK_BOOTTIME by {_signed(offsets.boottime_ns)} "
        f"({path}: monotonic {_signed(offsets.monotonic_ns)}, boottime {_signed(offsets.boottime_ns)}), so the "
        "lease deadlines it would write or judge mean nothing to the other processes of this boot; "
        "run it in the host's time namespace (not under `unshare --time`)"
    )


def refuse_boottime(problem: str | None, what: str) -> None:
    """Refuse ``what`` (claim, renew) in a process whose boottime is offset."""
    if problem is not None:
        raise InvalidInput(f"{what} refused: {problem}")


def _signed(ns: int) -> str:
    return f"{ns / NS_PER_SECOND:+g} s"


# --- the wall watermark ahead of the local clock -----------------------------------


def trusted_wall(floor_ns: int, local_ns: int, max_skew_ns: int) -> tuple[int, str | None]:
    """The wall time recovery may act on, and a warning when the watermark
    leads this host's CLOCK_REALTIME by more than ``max_skew_ns``.

    The result is never above the floor, so nothing is promoted, expired or
    buried earlier than clocks.md allows; the watermark itself is untouched.
    """
    limit = local_ns + max_skew_ns
    if floor_ns <= limit:
        return floor_ns, None
    lead = (floor_ns - local_ns) / NS_PER_SECOND
    bound = format_duration(max_skew_ns / NS_PER_SECOND)
    return limit, (
        f"the wall watermark is {format_duration(lead)} ahead of this host's clock (queue wall floor "
        f"{_instant(floor_ns)}, local clock {_instant(local_ns)}), more than max_clock_skew {bound}: "
        f"promotion, receipt and dead-letter retention and reap-to-dead go by the local clock + {bound} "
        "until the two agree (a process with its clock set ahead advanced the watermark; check the producers' clocks)"
    )


def _instant(ns: int) -> str:
    try:
        return datetime.fromtimestamp(ns // NS_PER_SECOND, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns since the epoch"
