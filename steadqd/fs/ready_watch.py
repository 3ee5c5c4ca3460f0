"""Waking a consumer when a job becomes ready: inotify on every ``ready/<S>/`` shard.

A job becomes ready by a name appearing in its shard directory (IN_CREATE
for a published link, IN_MOVED_TO for a rename: a retry, a promotion, a
reaped lease), so a watch on the shards lets a consumer sleep until there
is something to claim instead of listing directories on a timer. This is
the filesystem's way to wake a consumer; a backend without such events
polls behind the same interface (steadqd.backend.ReadyWatch).

Only a *ready* name counts: the leased names that claims and renewals
create in the same directories are recognised and ignored, so a claim
never wakes its own consumer. Ready names leaving (IN_MOVED_FROM,
IN_DELETE) only keep the ready count current between listings. The
watches are IN_ONLYDIR | IN_DONT_FOLLOW: a symlink planted as a shard is
never watched through. A shard directory that is removed and recreated
loses its watch; :meth:`ReadyWatch.watch_missing` puts it back, which is
why every user of a watch also rescans now and then.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import time
from dataclasses import dataclass

import inotify_simple

from steadqd.constants import CONTROL_DIR, JOB_EXT, READY_DIR, State
from steadqd.errors import SteadQError, kind_for_errno
from steadqd.fs.control import PAUSE_FILE
from steadqd.fs.names import READY_DOTS, is_name, looks_ready, shard_dir

__all__ = ["READY_COUNT_SHARDS", "ReadyNews", "ReadyWatch", "is_ready_name"]

READY_COUNT_SHARDS = 256  # count ready names by listing only up to this many shards
READ_BYTES = 65536  # one read's buffer: whole events (each at most 16 + NAME_MAX + 1 bytes), as many as fit
_F = inotify_simple.flags
_FLAGS = _F.CREATE | _F.MOVED_TO | _F.MOVED_FROM | _F.DELETE | _F.ONLYDIR | _F.DONT_FOLLOW
_APPEAR = int(_F.CREATE | _F.MOVED_TO)
_VANISH = int(_F.MOVED_FROM | _F.DELETE)
_Q_OVERFLOW, _IGNORED = int(_F.Q_OVERFLOW), int(_F.IGNORED)


def is_ready_name(name: str) -> bool:
    """A ready job name (not a colocated leased name, not a stray file)."""
    return looks_ready(name) and _parses_as_ready(name)


def _parses_as_ready(name: str) -> bool:
    return is_name(State.READY, name)


_EVENT = struct.Struct("iIII")  # struct inotify_event's header: wd, mask, cookie, len; its name follows
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()  # os.fsdecode's


def parse_events(data: bytes) -> list[tuple[int, int, int, str]]:
    """``inotify_simple.parse_events``: each event's (wd, mask, cookie, name), the name decoded as
    ``os.fsdecode`` does, as a plain tuple (not its namedtuple) and with four calls an event, not ten."""
    events = []
    pos, end = 0, len(data)
    unpack = _EVENT.unpack_from
    while pos < end:
        wd, mask, cookie, size = unpack(data, pos)
        pos += 16 + size
        # The name is NUL-padded to its size (and has no NUL of its own): cut at the first NUL.
        name = data[pos - size : pos].partition(b"\0")[0]
        events.append((wd, mask, cookie, name.decode(_FS_ENCODING, _FS_ERRORS)))
    return events


@dataclass(frozen=True)
class ReadyNews:
    """What one read of the watch found."""

    appeared: bool  # a ready name appeared: a claim may succeed now
    overflowed: bool  # the kernel dropped events: anything may have happened
    left: tuple[str, ...] = ()  # leased names moved away or deleted: a holder checks for a cancel (fs/cancel.py)
    rung: bool = False  # no doorbell on a filesystem: ``left`` says it at once


class ReadyWatch:
    """The inotify watch on one queue's ready shards, and its estimate of the ready jobs."""

    def __init__(self, root: str, shard_count: int) -> None:
        try:
            self._ino = inotify_simple.INotify(nonblocking=True)
        except OSError as e:  # e.g. fs.inotify.max_user_instances reached
            raise SteadQError(f"cannot create an inotify instance: {e.strerror}", kind_for_errno(e.errno or 0)) from e
        self._base = os.path.join(root, READY_DIR)
        self._shard_count = shard_count
        self._watched: dict[int, str] = {}  # wd -> shard path
        # control/: a pause record appearing or going (steadqd.fs.control) is news too, so that a paused
        # worker learns of a resume at once, and of a pause without waiting for its next claim.
        self._control = os.path.join(root, CONTROL_DIR)
        self._control_wd: int | None = None
        self._counting = False
        # Ready names as of the last listing, kept current by the events since;
        # None until recount() and beyond READY_COUNT_SHARDS shards.
        self.ready_estimate: int | None = None

    def fileno(self) -> int:
        return self._ino.fileno()

    def watch_missing(self) -> list[str]:
        """Watch every shard not watched yet; returns why each one that could not be failed."""
        failures: list[str] = []
        if self._control_wd is None:
            try:
                self._control_wd = self._ino.add_watch(self._control, _FLAGS)
            except OSError as e:
                failures.append(f"cannot watch {self._control}: {e.strerror}")
        if len(self._watched) >= self._shard_count:
            return failures
        for s in range(self._shard_count):
            path = os.path.join(self._base, shard_dir(s))
            try:
                wd = self._ino.add_watch(path, _FLAGS)
            except OSError as e:
                failures.append(f"cannot watch {path}: {e.strerror}")
                continue
            self._watched[wd] = path
        return failures

    def recount(self) -> None:
        """List the shards for :attr:`ready_estimate` (and keep it current from now on)."""
        self._counting = True
        if self._shard_count > READY_COUNT_SHARDS:
            self.ready_estimate = None
            return
        n = 0
        for s in range(self._shard_count):
            try:
                with os.scandir(os.path.join(self._base, shard_dir(s))) as it:
                    n += sum(1 for e in it if looks_ready(e.name))
            except OSError:
                continue
        self.ready_estimate = n

    def read(self, timeout_ms: int = 0) -> ReadyNews:
        """The events waiting (or arriving within ``timeout_ms``), applied to the estimate in order."""
        appeared = overflowed = False
        left: list[str] = []
        for wd, mask, _cookie, name in self._events(timeout_ms):
            if mask & _Q_OVERFLOW:
                overflowed = True
                if self._counting:
                    self.recount()
                continue
            if mask & _IGNORED:  # the shard dir went away
                self._watched.pop(wd, None)
                if wd == self._control_wd:
                    self._control_wd = None
                continue
            if wd == self._control_wd:
                if name == PAUSE_FILE:  # paused or resumed: the consumer looks again (a claim may succeed)
                    appeared = True
                continue
            # is_ready_name, its looks_ready inline (a worker reads some three events a job: the claim's
            # rename in and out of its name, the settle's): a job name that is not a ready one is a leased
            # one (claims and renewals), one that is no job name a temp or a stray. A leased name leaving
            # is how a holder hears of a cancel at once; matching it against its own leases is the holder's.
            if not name.endswith(JOB_EXT):
                continue
            if name.count(".") != READY_DOTS or not _parses_as_ready(name):
                if mask & _VANISH:
                    left.append(name)
                continue
            if mask & _APPEAR:
                appeared = True
                if self.ready_estimate is not None:
                    self.ready_estimate += 1
            elif mask & _VANISH and self.ready_estimate is not None:
                self.ready_estimate = max(0, self.ready_estimate - 1)
        return ReadyNews(appeared, overflowed, tuple(left))

    def _events(self, timeout_ms: int) -> list[tuple[int, int, int, str]]:
        """The events waiting: without a wait, one read of the non-blocking descriptor (whole events, up to
        :data:`READ_BYTES`; the rest wakes the loop again), where inotify_simple's asks FIONREAD first: an
        ``ioctl`` fewer each time a claim or a settle of the worker's own wakes its loop."""
        if timeout_ms != 0:
            return self._ino.read(timeout=timeout_ms)
        try:
            data = os.read(self._ino.fileno(), READ_BYTES)
        except BlockingIOError:
            return []
        return parse_events(data)

    def wait(self, seconds: float) -> bool:
        """Sleep until a ready name appears or events were lost, at most ``seconds``; True if so."""
        deadline = time.monotonic() + seconds
        while True:
            news = self.read(max(1, round((deadline - time.monotonic()) * 1000)))
            if news.appeared or news.overflowed:
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._ino.close()
        self._watched.clear()
