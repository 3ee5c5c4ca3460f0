"""The promoter role: delayed jobs go to ``ready/`` when they are due, without polling.

A delayed job is due once the wall reaches its own not_before (recovery
looks into the current bucket, not only at whole buckets past their end, so
``--delay 2s`` means 2 s, not the next 10 s boundary). So the promoter only
needs the earliest not_before of the jobs delayed: it sleeps on a
CLOCK_MONOTONIC loop timer until then (at most ``max_sleep``), and the
backend's delayed watch (``Backend.delayed_watch()``; on the filesystem
inotify on ``delayed/``, fs/delayed_watch.py) wakes it when a job is delayed
to a sooner time, and keeps the count of STATUS=.

"The wall" is the one recovery judges by: the queue's wall floor, but never
more than ``sweeper.max_clock_skew`` ahead of this host's clock (a watermark
raised by a producer whose clock runs ahead is not trusted further). Judging
by the raw floor would take a job as due that the pass then leaves alone, and
the promoter would back off towards ``max_sleep`` and promote it late.

Promotion itself is a recovery pass restricted to the ``promote_delayed``
phase (same validation, quarantine and barriers as the sweeper's), budgeted
like the sweeper's passes; a pass that runs out of budget is followed by
another one at once. A due job that a pass does not move (another process
holds the lock, an entry keeps failing) is retried with a growing pause.

Wall-clock jumps: the timer is monotonic, and every wakeup re-reads the wall
floor. Stepped back: the job is simply not due yet and the timer is re-armed
(the floor never goes below the watermark, so nothing is delivered early).
Stepped forward: the job is promoted at the next wakeup, at most ``max_sleep``
later, which also bounds the cost of a missed event.
"""

from __future__ import annotations

from steadqd.backend import DelayedWatch
from steadqd.constants import DELAYED_DIR, NS_PER_SECOND
from steadqd.daemon import metrics
from steadqd.daemon.config import QueueSettings
from steadqd.daemon.journal import Log
from steadqd.daemon.service import Loop, PassRole, open_queue
from steadqd.errors import SteadQError

__all__ = ["PromoterRole"]

_STUCK_BACKOFF_MIN = 1.0


class PromoterRole(PassRole):
    """Sleeps until the earliest delayed job is due, then promotes it."""

    name = "promoter"

    def __init__(self, settings: QueueSettings, log: Log) -> None:
        super().__init__(settings, log, "promotion")
        self._watch: DelayedWatch | None = None
        self._watch_limit_logged = False
        self._due_at: float | None = None  # loop time the earliest job is expected to be due
        self._stuck = 0.0  # back-off while a due job cannot be promoted
        self.promoted = 0

    # -- Role protocol -------------------------------------------------------

    def start(self, loop: Loop) -> None:
        self.loop = loop
        self._open(self.settings)
        metrics.attach(loop, self.settings, self.log, self.name)
        self.log.info(
            f"promoting delayed jobs (re-check at least every {self.settings.promoter.max_sleep:g}s)",
            path=self.settings.queue,
        )
        self._rescan_and_arm()

    def status(self) -> str:
        if self.queue is None or self._watch is None:
            return "queue not open"
        if not self.settings.promoter.enabled:
            return "disabled by configuration"
        delayed = self._watch.count
        count = f"{delayed} delayed"
        if self._watch.next_due_ns is None or self._due_at is None:
            return "nothing delayed" if not delayed else f"nothing due, {count}"
        due_in = self._due_at - Loop.now()
        if due_in <= 0:
            return f"promoting, {count}"
        return f"next due in {due_in:.0f}s, {count}"

    def reload(self, settings: QueueSettings) -> str:
        old = self.settings
        self.settings = settings  # never a new queue: the service refuses such a reload
        if settings.sweeper.max_clock_skew != old.sweeper.max_clock_skew:
            try:
                self._open(settings)  # the bound is fixed when the handle opens
            except (SteadQError, OSError) as e:
                self._errors.record([("queue_open", str(e))])
                self._rescan_and_arm()
                return f"the new sweeper.max_clock_skew: cannot reopen the queue ({e})"
            self._rescan_and_arm()
        elif settings.promoter != old.promoter:
            self._rescan_and_arm()
        return ""

    def close(self) -> None:
        self._cancel()
        self._close_watch()
        self._close_queue()

    # -- queue and watch -------------------------------------------------------

    def _open(self, settings: QueueSettings) -> None:
        """(Re)open the queue and start watching its delayed jobs from scratch."""
        q = open_queue(settings, max_clock_skew=settings.sweeper.max_clock_skew)
        try:
            watch = q.delayed_watch(self._watch_problem)
        except BaseException:
            q.close()
            raise
        self.close()  # the old handle and watch, if any
        self.queue, self._watch = q, watch
        if self.loop is not None:
            self.loop.add_reader(watch.fileno(), self._on_events)

    def _close_watch(self) -> None:
        if self._watch is not None:
            if self.loop is not None:
                self.loop.remove_reader(self._watch.fileno())
            self._watch.close()
            self._watch = None

    def _watch_problem(self, code: str, message: str) -> None:
        if code != "watch_limit":
            self._errors.record([(code, message)])
        elif not self._watch_limit_logged:
            self._watch_limit_logged = True
            self.log.warning(
                "inotify watch limit reached (fs.inotify.max_user_watches); new delayed jobs in some "
                f"buckets are noticed only at the next re-check (at most {self.settings.promoter.max_sleep:g}s)"
            )

    # -- deciding when ----------------------------------------------------------

    def _wall_ns(self) -> int:
        """The wall recovery will judge by: the floor, bounded by this host's clock + max_clock_skew,
        the bound the handle was opened with."""
        assert self.queue is not None
        return self.queue.trusted_wall_ns()

    def _due_now(self) -> bool:
        """Is the earliest delayed job known due by the wall now?"""
        assert self._watch is not None
        due_ns = self._watch.next_due_ns
        return due_ns is not None and due_ns <= self._wall_ns()

    def _scan(self) -> None:
        """Find the earliest delayed job and count them; on failure nothing is known to be due."""
        assert self.queue is not None and self._watch is not None
        try:
            self._watch.scan(self.queue.wall_floor_ns())
        except (SteadQError, OSError) as e:
            self._errors.record([("scan", f"cannot scan {DELAYED_DIR}/: {e}")])
            self._watch.forget()

    def _rescan_and_arm(self) -> None:
        self._cancel()
        if self._draining or self.queue is None or not self.settings.promoter.enabled:
            return
        self._scan()
        self._arm()

    def _arm(self) -> None:
        """Set the timer for the earliest due instant, at most max_sleep away."""
        self._cancel()
        if self._draining or self.loop is None or self.queue is None or not self.settings.promoter.enabled:
            return
        assert self._watch is not None
        max_sleep = self.settings.promoter.max_sleep
        self._due_at = None
        delay = max_sleep
        due_ns = self._watch.next_due_ns
        if due_ns is not None:
            try:
                due_in = (due_ns - self._wall_ns()) / NS_PER_SECOND
            except (SteadQError, OSError) as e:
                self._errors.record([("wall_floor", str(e))])
                due_in = max_sleep
            self._due_at = Loop.now() + max(0.0, due_in)
            delay = self._stuck if due_in <= 0 else due_in
        self._timer = self.loop.call_later(min(max(0.0, delay), max_sleep), self._on_timer)

    # -- events -------------------------------------------------------------------

    def _on_events(self) -> None:
        if self._watch is None:
            return
        news = self._watch.read()
        if news.rescan:
            self._rescan_and_arm()
        elif news.earlier:
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
            due = self._due_now()
        except (SteadQError, OSError) as e:
            self._errors.record([("wall_floor", str(e))])
            due = False
        if due:
            self._promote()
        else:
            # Not due (the wall clock went back, or a max_sleep re-check):
            # look again, which also catches anything the watch could not tell.
            self._rescan_and_arm()

    # -- promotion ------------------------------------------------------------------

    def _promote(self) -> None:
        assert self.queue is not None
        sw = self.settings.sweeper
        self.passes += 1
        try:
            report = self.queue.recover(sw.budget_ops, sw.budget_ms, phases=("promote_delayed",))
        except (SteadQError, OSError) as e:
            self._errors.record([("promote_failed", str(e))])
            self._rescan_and_arm_after(moved=False, errors=True)
            return
        self.promoted += report.delayed_promoted
        metrics.recovered(report)
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
        if report.budget_exhausted:
            self._stuck = 0.0
            self._cancel()
            assert self.loop is not None
            self._timer = self.loop.call_later(0.0, self._promote_more)
            return
        self._rescan_and_arm_after(
            moved=bool(report.delayed_promoted or report.quarantined), errors=bool(report.errors)
        )

    def _promote_more(self) -> None:
        self._timer = None
        if not self._draining and self.queue is not None:
            self._promote()

    def _rescan_and_arm_after(self, *, moved: bool, errors: bool) -> None:
        """Rescan; if a due job is still there and nothing moved, back off."""
        assert self._watch is not None
        self._scan()
        try:
            still_due = self._due_now()
        except (SteadQError, OSError) as e:
            self._errors.record([("scan", f"cannot scan {DELAYED_DIR}/: {e}")])
            self._watch.forget()
            still_due = False
        if still_due and not moved:
            # Another process's pass holds the lock, or an entry keeps failing:
            # retry with a growing pause instead of spinning.
            self._stuck = min(max(_STUCK_BACKOFF_MIN, self._stuck * 2), self.settings.promoter.max_sleep)
            if not errors and self._watch.earliest is not None:
                # Nothing recorded, nothing moved: names recovery skips (not delayed names).
                self._errors.record(
                    [("promote_stuck", f"{self._watch.earliest} is due but nothing in it was promoted")]
                )
        else:
            self._stuck = 0.0
        self._arm()
