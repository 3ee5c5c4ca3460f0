"""The promoter role: delayed jobs go to ``ready/`` when they are due, without polling.

A delayed job lives in ``delayed/<B>/<S>/`` where ``B`` is its eligibility
bucket; it is due once ``B × delayed_width ≤ wall floor`` (clocks.md). So
the promoter only needs the earliest *non-empty* bucket: it sleeps on a
CLOCK_MONOTONIC loop timer until that bucket is due (at most ``max_sleep``),
and inotify tells it about newly delayed jobs that are due sooner:

* ``delayed/`` is watched for new bucket directories (IN_CREATE/IN_MOVED_TO);
* every bucket that is not yet known to be empty is watched for new shard
  directories, and each of its shard directories for jobs arriving or
  leaving (a bucket gets all its shard directories when it is created, but
  the watch may be added in between).

A new watch is always followed by a listing of what it covers, so a job that
arrived before the watch existed is still seen. Past buckets found empty are
remembered and unwatched (delayed buckets are never removed, and new delayed
jobs only land in future buckets), which keeps both the rescans and the
number of watches proportional to the future buckets, not to the queue's age.

Promotion itself is a recovery pass restricted to the ``promote_delayed``
phase (same validation, quarantine and barriers as the sweeper's), budgeted
like the sweeper's passes; a pass that runs out of budget is followed by
another one at once.

Wall-clock jumps: the timer is monotonic, and every wakeup re-reads the wall
floor. Stepped back: the job is simply not due yet and the timer is re-armed
(the floor never goes below the watermark, so nothing is delivered early).
Stepped forward: the job is promoted at the next wakeup, at most ``max_sleep``
later, which also bounds the cost of a missed inotify event.
"""

from __future__ import annotations

import errno
import os

import inotify_simple

from steadqd.constants import DELAYED_DIR, JOB_EXT
from steadqd.daemon.config import QueueSettings
from steadqd.daemon.journal import Log
from steadqd.daemon.service import Loop, Timer, open_queue
from steadqd.daemon.sweeper import ErrorDigest
from steadqd.errors import SteadQError
from steadqd.fs.handle import Queue
from steadqd.fs.names import parse_bucket_dir, parse_shard_dir, shard_dir
from steadqd.fs.recovery import RecoveryReport

__all__ = ["PromoterRole"]

_F = inotify_simple.flags
# DONT_FOLLOW: a symlink planted as a directory is never watched through.
_TOP_MASK = _F.CREATE | _F.MOVED_TO | _F.ONLYDIR | _F.DONT_FOLLOW
_BUCKET_MASK = _F.CREATE | _F.MOVED_TO | _F.ONLYDIR | _F.DONT_FOLLOW
_SHARD_MASK = _F.CREATE | _F.MOVED_TO | _F.MOVED_FROM | _F.DELETE | _F.ONLYDIR | _F.DONT_FOLLOW
_ARRIVED = _F.CREATE | _F.MOVED_TO
_KNOWN_EMPTY_TTL = 3600.0  # forget which past buckets were empty this often (clock oddities elsewhere)
_STUCK_BACKOFF_MIN = 1.0


class PromoterRole:
    """Sleeps until the earliest delayed bucket is due, then promotes it."""

    name = "promoter"

    def __init__(self, settings: QueueSettings, log: Log) -> None:
        self.settings = settings
        self.log = log
        self.queue: Queue | None = None
        self.loop: Loop | None = None
        self._ino: inotify_simple.INotify | None = None
        self._delayed_path = ""
        self._wds: dict[int, tuple[int | None, int | None]] = {}  # wd -> (bucket, shard); (None, None) = delayed/
        self._bucket_wds: dict[int, list[int]] = {}
        self._known_empty: set[int] = set()
        self._known_empty_since = 0.0
        self._watch_limit_logged = False
        self._target: int | None = None  # earliest non-empty bucket
        self._delayed = 0  # delayed jobs as of the last scan, adjusted by events since
        self._timer: Timer | None = None
        self._due_at: float | None = None  # loop time the target is expected to be due
        self._stuck = 0.0  # back-off while a due bucket cannot be emptied
        self._draining = False
        self.promoted = 0
        self.passes = 0
        self._errors = ErrorDigest(log, "promotion")

    # -- Role protocol -------------------------------------------------------

    def start(self, loop: Loop) -> None:
        self.loop = loop
        self._open(self.settings)
        self.log.info(
            f"promoting delayed jobs (re-check at least every {self.settings.promoter.max_sleep:g}s)",
            path=self.settings.queue,
        )
        self._rescan_and_arm()

    def status(self) -> str:
        if self.queue is None:
            return "queue not open"
        if not self.settings.promoter.enabled:
            return "disabled by configuration"
        count = f"{self._delayed} delayed"
        if self._target is None or self._due_at is None:
            return "nothing delayed" if not self._delayed else f"nothing due, {count}"
        due_in = self._due_at - Loop.now()
        if due_in <= 0:
            return f"promoting, {count}"
        return f"next due in {due_in:.0f}s, {count}"

    def reload(self, settings: QueueSettings) -> None:
        old = self.settings
        self.settings = settings
        if settings.queue != old.queue:
            try:
                self._open(settings)
            except (SteadQError, OSError) as e:
                self.log.error(f"cannot open the new queue path, keeping the old one: {e}", path=settings.queue)
                self.settings = old
                return
        if settings.promoter != old.promoter or settings.queue != old.queue:
            self._rescan_and_arm()

    def drain(self) -> None:
        # A promotion pass is short and every move in it is atomic.
        self._draining = True
        self._cancel()

    def drained(self) -> bool:
        return True

    def close(self) -> None:
        self._cancel()
        self._close_watches()
        if self.queue is not None:
            q, self.queue = self.queue, None
            try:
                q.close()
            except (SteadQError, OSError) as e:
                self.log.warning(f"closing the queue handle failed: {e}")

    # -- queue and watches -----------------------------------------------------

    def _open(self, settings: QueueSettings) -> None:
        """(Re)open the queue and start watching its delayed/ from scratch."""
        q = open_queue(settings)
        ino = inotify_simple.INotify(nonblocking=True)
        path = os.path.join(settings.queue, DELAYED_DIR)
        try:
            top = ino.add_watch(path, _TOP_MASK)
        except OSError:
            ino.close()
            q.close()
            raise
        self.close()  # the old handle and watches, if any
        self.queue, self._ino, self._delayed_path = q, ino, path
        self._wds = {top: (None, None)}
        self._bucket_wds = {}
        self._known_empty = set()
        self._known_empty_since = Loop.now()
        if self.loop is not None:
            self.loop.add_reader(ino.fileno(), self._on_events)

    def _close_watches(self) -> None:
        if self._ino is not None:
            if self.loop is not None:
                self.loop.remove_reader(self._ino.fileno())
            self._ino.close()
            self._ino = None
        self._wds, self._bucket_wds = {}, {}

    def _add_watch(self, path: str, mask: int, where: tuple[int | None, int | None]) -> int | None:
        assert self._ino is not None
        try:
            wd = self._ino.add_watch(path, mask)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return None
            if e.errno == errno.ENOSPC and not self._watch_limit_logged:
                self._watch_limit_logged = True
                self.log.warning(
                    "inotify watch limit reached (fs.inotify.max_user_watches); new delayed jobs in some "
                    f"buckets are noticed only at the next re-check (at most {self.settings.promoter.max_sleep:g}s)"
                )
            elif e.errno != errno.ENOSPC:
                self._errors.record([("watch", f"cannot watch {path}: {e.strerror}")])
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
        base = os.path.join(self._delayed_path, f"{bucket:016x}")
        self._add_watch(base, _BUCKET_MASK, (bucket, None))
        assert self.queue is not None
        for s in range(self.queue.shard_count):
            self._add_watch(os.path.join(base, shard_dir(s)), _SHARD_MASK, (bucket, s))

    def _unwatch_bucket(self, bucket: int) -> None:
        for wd in self._bucket_wds.pop(bucket, []):
            self._wds.pop(wd, None)
            if self._ino is not None:
                try:
                    self._ino.rm_watch(wd)
                except OSError:
                    pass  # already gone (directory removed)

    def _jobs_in(self, bucket: int, shard: int | None = None) -> int:
        """Delayed job files in a bucket (or one of its shard directories)."""
        assert self.queue is not None
        base = os.path.join(self._delayed_path, f"{bucket:016x}")
        shards = range(self.queue.shard_count) if shard is None else (shard,)
        n = 0
        for s in shards:
            try:
                names = os.listdir(os.path.join(base, shard_dir(s)))
            except FileNotFoundError:
                continue
            n += sum(1 for name in names if name.endswith(JOB_EXT))
        return n

    # -- deciding when ----------------------------------------------------------

    def _width(self) -> int:
        assert self.queue is not None
        return self.queue.format.delayed_width_ns

    def _due_bucket(self) -> int:
        """Buckets up to this one are eligible now (clocks.md)."""
        assert self.queue is not None
        return self.queue.wall_floor_ns() // self._width()

    def _scan(self) -> None:
        """Find the earliest non-empty bucket and count the delayed jobs."""
        assert self.queue is not None
        now = Loop.now()
        if now - self._known_empty_since > _KNOWN_EMPTY_TTL:
            self._known_empty.clear()
            self._known_empty_since = now
        due = self._due_bucket()
        buckets = sorted(b for b in (parse_bucket_dir(n) for n in os.listdir(self._delayed_path)) if b is not None)
        target: int | None = None
        count = 0
        for b in buckets:
            if b in self._known_empty:
                continue
            self._watch_bucket(b)  # before listing: nothing can slip in between
            n = self._jobs_in(b)
            if n:
                count += n
                if target is None:
                    target = b
            elif b <= due:
                self._known_empty.add(b)  # nothing new lands in a past bucket
                self._unwatch_bucket(b)
        for b in [b for b in self._bucket_wds if b not in buckets]:
            self._unwatch_bucket(b)
        self._target, self._delayed = target, count

    def _rescan_and_arm(self) -> None:
        self._cancel()
        if self._draining or self.queue is None or not self.settings.promoter.enabled:
            return
        try:
            self._scan()
        except (SteadQError, OSError) as e:
            self._errors.record([("scan", f"cannot scan {DELAYED_DIR}/: {e}")])
            self._target = None
        self._arm()

    def _arm(self) -> None:
        """Set the timer for the earliest due instant, at most max_sleep away."""
        self._cancel()
        if self._draining or self.loop is None or self.queue is None or not self.settings.promoter.enabled:
            return
        max_sleep = self.settings.promoter.max_sleep
        self._due_at = None
        delay = max_sleep
        if self._target is not None:
            try:
                due_in = (self._target * self._width() - self.queue.wall_floor_ns()) / 1e9
            except (SteadQError, OSError) as e:
                self._errors.record([("wall_floor", str(e))])
                due_in = max_sleep
            self._due_at = Loop.now() + max(0.0, due_in)
            delay = self._stuck if due_in <= 0 else due_in
        self._timer = self.loop.call_later(min(max(0.0, delay), max_sleep), self._on_timer)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- events -------------------------------------------------------------------

    def _on_events(self) -> None:
        if self._ino is None:
            return
        try:
            events = self._ino.read(timeout=0)
        except BlockingIOError:
            return
        rescan = False
        earlier = False
        for ev in events:
            if ev.mask & _F.Q_OVERFLOW:
                rescan = True
                continue
            if ev.mask & _F.IGNORED:
                where = self._wds.pop(ev.wd, None)
                if where is not None and where[0] is not None:
                    wds = self._bucket_wds.get(where[0], [])
                    if ev.wd in wds:
                        wds.remove(ev.wd)
                continue
            where = self._wds.get(ev.wd)
            if where is None:
                continue
            bucket, shard = where
            try:
                if bucket is None:  # a new bucket directory
                    b = parse_bucket_dir(ev.name)
                    if b is None:
                        continue
                    self._known_empty.discard(b)
                    self._watch_bucket(b)
                    n = self._jobs_in(b)
                elif shard is None:  # a shard directory appeared in a watched bucket
                    s = parse_shard_dir(ev.name, self.queue.shard_count if self.queue else 0)
                    if s is None:
                        continue
                    self._add_watch(
                        os.path.join(self._delayed_path, f"{bucket:016x}", ev.name), _SHARD_MASK, (bucket, s)
                    )
                    b, n = bucket, self._jobs_in(bucket, s)
                else:  # a job arrived in or left a shard directory
                    if not ev.name.endswith(JOB_EXT):
                        continue
                    if not ev.mask & _ARRIVED:
                        self._delayed = max(0, self._delayed - 1)
                        continue
                    b, n = bucket, 1
            except OSError as e:
                self._errors.record([("scan", str(e))])
                rescan = True
                continue
            if n:
                self._delayed += n
                if self._target is None or b < self._target:
                    self._target = b
                    earlier = True
        if rescan:
            self._rescan_and_arm()
        elif earlier:
            self._arm()

    def _on_timer(self) -> None:
        self._timer = None
        if self._draining or not self.settings.promoter.enabled:
            return
        if self.queue is not None and self.queue.poisoned is not None:
            self.log.warning(f"queue handle is poisoned ({self.queue.poisoned}); reopening")
            try:
                self._open(self.settings)
            except (SteadQError, OSError) as e:
                self._errors.record([("queue_open", str(e))])
                self._timer = (
                    self.loop.call_later(self.settings.promoter.max_sleep, self._on_timer) if self.loop else None
                )
                return
        try:
            due = self._target is not None and self._target <= self._due_bucket()
        except (SteadQError, OSError) as e:
            self._errors.record([("wall_floor", str(e))])
            due = False
        if due:
            self._promote()
        else:
            # Not due (the wall clock went back, or a max_sleep re-check):
            # look again, which also catches anything inotify could not tell.
            self._rescan_and_arm()

    # -- promotion ------------------------------------------------------------------

    def _promote(self) -> None:
        assert self.queue is not None
        sw = self.settings.sweeper
        try:
            report = self.queue.recover(sw.budget_ops, sw.budget_ms, phases=("promote_delayed",))
        except (SteadQError, OSError) as e:
            report = RecoveryReport(errors=[("promote_failed", str(e))])
        self.passes += 1
        self._log_report(report)
        if report.budget_exhausted:
            self._stuck = 0.0
            self._cancel()
            assert self.loop is not None
            self._timer = self.loop.call_later(0.0, self._promote_more)
            return
        self._rescan_and_arm_after(report)

    def _promote_more(self) -> None:
        self._timer = None
        if not self._draining and self.queue is not None:
            self._promote()

    def _rescan_and_arm_after(self, report: RecoveryReport) -> None:
        """Rescan; if a due bucket is still not empty and nothing moved, back off."""
        try:
            self._scan()
            still_due = self._target is not None and self._target <= self._due_bucket()
        except (SteadQError, OSError) as e:
            self._errors.record([("scan", f"cannot scan {DELAYED_DIR}/: {e}")])
            self._target, still_due = None, False
        if still_due and not report.delayed_promoted and not report.quarantined:
            # Another process's pass holds the lock, or an entry keeps failing:
            # retry with a growing pause instead of spinning.
            self._stuck = min(max(_STUCK_BACKOFF_MIN, self._stuck * 2), self.settings.promoter.max_sleep)
            if not report.errors and self._target is not None:
                # Nothing recorded, nothing moved: names recovery skips (not delayed names).
                self._errors.record(
                    [("promote_stuck", f"{DELAYED_DIR}/{self._target:016x} is due but nothing in it was promoted")]
                )
        else:
            self._stuck = 0.0
        self._arm()

    def _log_report(self, report: RecoveryReport) -> None:
        self.promoted += report.delayed_promoted
        if report.delayed_promoted or report.quarantined:
            self.log.notice(
                f"promoted {report.delayed_promoted} delayed jobs"
                + (f", quarantined {report.quarantined}" if report.quarantined else ""),
                promoted=report.delayed_promoted,
                quarantined=report.quarantined or None,
                ops=report.operations_attempted,
                more=True if report.budget_exhausted else None,
            )
        if report.errors:
            self._errors.record(report.errors)
