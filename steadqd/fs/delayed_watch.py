"""Knowing when the next delayed job is due, without polling: inotify on ``delayed/``.

A delayed job lives in ``delayed/<B>/<S>/`` where ``B = ceil(not_before /
width)`` (clocks.md). Recovery promotes it once its own ``not_before`` has
passed (steadqd.fs.recovery.promote looks into the current bucket), so a
promoter needs the earliest ``not_before``: it is in the earliest *non-empty*
bucket, whose names are read for it (a name is a hint, never verified here),
and inotify tells it about newly delayed jobs that are due sooner:

* ``delayed/`` is watched for new bucket directories (IN_CREATE/IN_MOVED_TO);
* every bucket that is not yet known to be empty is watched for new shard
  directories, and each of its shard directories for jobs arriving or
  leaving (a bucket gets all its shard directories when it is created, but
  the watch may be added in between).

A new watch is always followed by a listing of what it covers, so a job that
arrived before the watch existed is still seen. Past buckets found empty are
remembered and unwatched (new delayed jobs only land in future buckets, and
recovery removes an empty past bucket only an hour after it was due), which
keeps both the rescans and the number of watches proportional to the future
buckets, not to the queue's age.

This is the filesystem's way to wake a promoter; the promoter's timers,
budgets and back-off (steadqd.daemon.promoter) work the same over a backend
that polls behind steadqd.backend.DelayedWatch.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import inotify_simple

from steadqd.constants import DELAYED_DIR, JOB_EXT, State
from steadqd.errors import CorruptObject
from steadqd.fs.names import bucket_dir, parse_bucket_dir, parse_name, parse_shard_dir, shard_dir

__all__ = ["DelayedNews", "DelayedWatch"]

_F = inotify_simple.flags
# DONT_FOLLOW: a symlink planted as a directory is never watched through.
_TOP_MASK = _F.CREATE | _F.MOVED_TO | _F.ONLYDIR | _F.DONT_FOLLOW
_BUCKET_MASK = _F.CREATE | _F.MOVED_TO | _F.ONLYDIR | _F.DONT_FOLLOW
_SHARD_MASK = _F.CREATE | _F.MOVED_TO | _F.MOVED_FROM | _F.DELETE | _F.ONLYDIR | _F.DONT_FOLLOW
_ARRIVED = _F.CREATE | _F.MOVED_TO
_KNOWN_EMPTY_TTL = 3600.0  # forget which past buckets were empty this often (clock oddities elsewhere)

_Where = tuple[int | None, int | None]  # (bucket, shard) a watch covers; (None, None) = delayed/ itself


@dataclass(frozen=True)
class DelayedNews:
    """What one read of the watch found."""

    rescan: bool  # events were lost or could not be followed: scan() again
    earlier: bool  # a job arrived that is due before the earliest one known


class DelayedWatch:
    """The watches on one queue's ``delayed/``, the earliest non-empty bucket and the count.

    ``report(code, message)`` receives each problem met on the way; the
    code ``watch_limit`` means the inotify watch limit was reached, so new
    jobs in some buckets are seen only by the next scan.
    """

    def __init__(self, root: str, shard_count: int, width_ns: int, report: Callable[[str, str], None]) -> None:
        self._path = os.path.join(root, DELAYED_DIR)
        self._shard_count = shard_count
        self._width = width_ns
        self._report = report
        self._ino = inotify_simple.INotify(nonblocking=True)
        try:
            top = self._ino.add_watch(self._path, _TOP_MASK)
        except OSError:
            self._ino.close()
            raise
        self._wds: dict[int, _Where] = {top: (None, None)}
        self._bucket_wds: dict[int, list[int]] = {}
        self._known_empty: set[int] = set()
        self._known_empty_since = time.monotonic()
        self._target: int | None = None  # earliest non-empty bucket
        self._next_due: int | None = None  # earliest due instant (ns) of the jobs known in it
        self.count = 0  # delayed jobs as of the last scan, adjusted by events since

    def fileno(self) -> int:
        return self._ino.fileno()

    @property
    def next_due_ns(self) -> int | None:
        """The wall time at which the earliest delayed job known becomes due; None if none is known."""
        return None if self._target is None else self._next_due

    @property
    def earliest(self) -> str | None:
        """Where the earliest delayed jobs are, for messages."""
        return None if self._target is None else f"{DELAYED_DIR}/{bucket_dir(self._target)}"

    def forget(self) -> None:
        """A scan failed, or its answer could not be used: nothing is known to be due until the next."""
        self._target = self._next_due = None

    def close(self) -> None:
        self._ino.close()
        self._wds, self._bucket_wds = {}, {}

    # -- watches ------------------------------------------------------------------

    def _add_watch(self, path: str, mask: int, where: _Where) -> int | None:
        try:
            wd = self._ino.add_watch(path, mask)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                self._report("watch_limit", f"cannot watch {path}: {e.strerror}")
            elif e.errno != errno.ENOENT:
                self._report("watch", f"cannot watch {path}: {e.strerror}")
            return None
        self._wds[wd] = where
        if where[0] is not None:
            wds = self._bucket_wds.setdefault(where[0], [])
            if wd not in wds:
                wds.append(wd)
        return wd

    def _watch_bucket(self, bucket: int) -> None:
        """Watch a bucket directory and its shard directories (idempotent)."""
        if bucket in self._bucket_wds:
            return
        base = os.path.join(self._path, bucket_dir(bucket))
        self._add_watch(base, _BUCKET_MASK, (bucket, None))
        for s in range(self._shard_count):
            self._add_watch(os.path.join(base, shard_dir(s)), _SHARD_MASK, (bucket, s))

    def _unwatch_bucket(self, bucket: int) -> None:
        for wd in self._bucket_wds.pop(bucket, []):
            self._wds.pop(wd, None)
            try:
                self._ino.rm_watch(wd)
            except OSError:
                pass  # already gone (directory removed)

    def _due_of(self, bucket: int, name: str) -> int:
        """When recovery will promote the job ``name`` in ``bucket``: at its own not_before, which
        must lie in the bucket's span ``((B-1)·w, B·w]`` (recovery opens no bucket sooner, and a name
        that does not parse is promoted, or quarantined, only with its whole bucket)."""
        end = bucket * self._width
        try:
            nb = parse_name(State.DELAYED, name).not_before
        except CorruptObject:
            return end
        if nb is None:
            return end
        return min(end, max(nb, end - self._width + 1))

    def _jobs_in(self, bucket: int, shard: int | None = None, *, dues: bool = True) -> tuple[int, int | None]:
        """Delayed job files in a bucket (or one of its shard directories) and the earliest of their
        due instants (None if there are none, or ``dues`` is False: only the count is needed)."""
        base = os.path.join(self._path, bucket_dir(bucket))
        shards = range(self._shard_count) if shard is None else (shard,)
        n = 0
        first: int | None = None
        for s in shards:
            try:
                names = os.listdir(os.path.join(base, shard_dir(s)))
            except FileNotFoundError:
                continue
            for name in names:
                if not name.endswith(JOB_EXT):
                    continue
                n += 1
                if dues:
                    due = self._due_of(bucket, name)
                    first = due if first is None else min(first, due)
        return n, first

    # -- scanning -----------------------------------------------------------------

    def scan(self, wall_floor_ns: int) -> None:
        """Find the earliest non-empty bucket and count the delayed jobs (OSError if delayed/ cannot be read)."""
        now = time.monotonic()
        if now - self._known_empty_since > _KNOWN_EMPTY_TTL:
            self._known_empty.clear()
            self._known_empty_since = now
        due = wall_floor_ns // self._width  # buckets up to this one are eligible now (clocks.md)
        buckets = sorted(b for b in (parse_bucket_dir(n) for n in os.listdir(self._path)) if b is not None)
        target: int | None = None
        next_due: int | None = None
        count = 0
        for b in buckets:
            if b in self._known_empty:
                continue
            self._watch_bucket(b)  # before listing: nothing can slip in between
            n, first = self._jobs_in(b, dues=target is None)
            if n:
                count += n
                if target is None:
                    target, next_due = b, first
            elif b <= due:
                self._known_empty.add(b)  # nothing new lands in a past bucket
                self._unwatch_bucket(b)
        for b in [b for b in self._bucket_wds if b not in buckets]:
            self._unwatch_bucket(b)
        self._target, self._next_due, self.count = target, next_due, count

    # -- events -------------------------------------------------------------------

    def read(self) -> DelayedNews:
        """Follow the events waiting: new buckets and shards get watched, arrivals and departures counted."""
        try:
            events = self._ino.read(timeout=0)
        except BlockingIOError:
            return DelayedNews(rescan=False, earlier=False)
        rescan = earlier = False
        for ev in events:
            if ev.mask & _F.Q_OVERFLOW:
                rescan = True
                continue
            if ev.mask & _F.IGNORED:
                self._forget_watch(ev.wd)
                continue
            where = self._wds.get(ev.wd)
            if where is None:
                continue
            try:
                arrived = self._arrivals(where, ev.name, ev.mask)
            except OSError as e:
                self._report("scan", str(e))
                rescan = True
                continue
            if arrived is None:
                continue
            b, n, due = arrived
            if n:
                self.count += n
                if self._target is None or b < self._target:
                    self._target = b
                if due is not None and (self._next_due is None or due < self._next_due):
                    self._next_due = due
                    earlier = True
        return DelayedNews(rescan=rescan, earlier=earlier)

    def _forget_watch(self, wd: int) -> None:
        where = self._wds.pop(wd, None)
        if where is not None and where[0] is not None:
            wds = self._bucket_wds.get(where[0], [])
            if wd in wds:
                wds.remove(wd)

    def _arrivals(self, where: _Where, name: str, mask: int) -> tuple[int, int, int | None] | None:
        """(bucket, jobs that arrived in it, the earliest one's due instant) for one event, or None
        if it adds no job."""
        bucket, shard = where
        if bucket is None:  # a new bucket directory
            b = parse_bucket_dir(name)
            if b is None:
                return None
            self._known_empty.discard(b)
            self._watch_bucket(b)
            return b, *self._jobs_in(b)
        if shard is None:  # a shard directory appeared in a watched bucket
            s = parse_shard_dir(name, self._shard_count)
            if s is None:
                return None
            self._add_watch(os.path.join(self._path, bucket_dir(bucket), name), _SHARD_MASK, (bucket, s))
            return bucket, *self._jobs_in(bucket, s)
        # a job arrived in or left a shard directory
        if not name.endswith(JOB_EXT):
            return None
        if not mask & _ARRIVED:
            self.count = max(0, self.count - 1)
            return None
        return bucket, 1, self._due_of(bucket, name)
