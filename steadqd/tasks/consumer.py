"""How a worker waits for work and claims it: a handle and its ready watch, and the queue's pause read before claiming.

Apart from :class:`~steadqd.tasks.worker.Worker` so that how it waits for work (a watch, a scan, a
pause) reads on its own; the worker gives it the stop, the poll and how to report a failure of the queue.
On a filesystem queue each worker thread has its own consumer; on a bucket queue one consumer claims
for all of them (``shared``): its handle is the one every thread settles with, and is kept through
failures (a bucket handle is never poisoned: steadqd.s3.handle).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from steadqd.backend import Backend, BatchLeasing, LeaseHandle, ReadyWatch, is_bucket_url
from steadqd.errors import SteadQError
from steadqd.queue_control import PAUSE_RECHECK, PAUSED_BUCKET_LOOK
from steadqd.tasks.journal import log
from steadqd.text import printable

if TYPE_CHECKING:
    from steadqd.tasks.worker import Worker

# An idle consumer whose watch covers the whole queue scans only when the watch
# has news, and at least this often (the daemon worker's safety rescan): on a
# bucket a scan LISTs every shard, which one poll a second would repeat.
QUIET_RESCAN = 60.0
# While a consumer keeps claiming, its bucket watch makes no LIST (BucketReadyWatch.hold) for this long after
# each round that claimed: its news is read only after a round that found nothing, which ends the hold.
BUSY_HOLD = 1.0


class Consumer:
    """A handle and its ready watch, which claim jobs for one worker thread or (``shared``) for all of them.

    It leases without waiting and then waits on its own watch, rather than
    ``lease(wait=)``, so that what the scan quarantined is read from
    ``last_scan`` before a later rescan replaces it. The watch is set up
    before the first scan: a job published after that scan wakes it.
    """

    def __init__(self, worker: Worker, *, shared: bool = False) -> None:
        self.w = worker
        self.shared = shared
        self.q: Backend | None = None
        self.watch: ReadyWatch | None = None
        self._whole = False  # the watch reports every job that becomes claimable: a quiet wait needs no scan
        self._rescan_at = 0.0  # monotonic time of the next scan when nothing is news
        self._unpaused_at: float | None = None  # when a pause read last said "not paused" (shared: see _paused)

    def lease(self) -> LeaseHandle | None:
        got = self.lease_many(1)
        return got[0] if got else None

    def lease_many(self, n: int) -> list[LeaseHandle]:
        """Up to ``n`` claims (one round of ``lease_many`` where the handle has it); empty after a wait for news."""
        if self.q is None and not self._open():
            return []
        assert self.q is not None
        if self._whole and self.watch is not None and time.monotonic() < self._rescan_at:
            if not self.watch.wait(self.w.poll):
                return []  # nothing new: the caller checks for a stop and asks again
        if self._paused():
            return []
        try:
            if n > 1 and isinstance(self.q, BatchLeasing):
                leases = list(self.q.lease_many(n, duration=self.w.lease_s))
            else:
                lease = self.q.lease(wait=0.0, duration=self.w.lease_s)
                leases = [] if lease is None else [lease]
        except SteadQError as e:
            self._unpaused_at = None
            if not self.w._after_error(self.q, "lease", e):
                self._drop()
            return []
        self.w._report_scan(self.q)
        hold = getattr(self.watch, "hold", None)  # a bucket's watch: no LIST while its news would go unread
        if leases:
            # Busy: the next round claims at once. Waiting for news again would stall a burst put after a
            # quiet spell, as the watch reports each job once (as it appears), not each job left to claim.
            self._rescan_at = 0.0
            if hold is not None:
                hold(BUSY_HOLD)
        else:
            if hold is not None:
                hold(0.0)
            self._unpaused_at = None  # news after a quiet wait is claimed only after a fresh pause read
            self._rescan_at = time.monotonic() + QUIET_RESCAN
            if self.watch is not None:
                self.watch.wait(self.w.poll)
            else:
                self.w._stop.wait(self.w.poll)
        return leases

    def _paused(self) -> bool:
        """Read the queue's pause before a lease; while it stands, wait for news or the next look, and say so.

        A shared consumer that keeps finding jobs reads it again only once
        :data:`PAUSE_RECHECK` has passed since it last said "not paused" (the
        daemon worker's rule: no claim starts later than that after a pause
        is visible), instead of one GET per claim round; after a round that
        found nothing it reads it before the next claim whatever the time.
        """
        assert self.q is not None
        now = time.monotonic()
        if self.shared and self._unpaused_at is not None and now - self._unpaused_at < PAUSE_RECHECK:
            return False
        self._unpaused_at = None
        try:
            state = self.q.pause_state()
        except SteadQError as e:  # a failure of the queue: no lease this time
            if not self.w._after_error(self.q, "read the pause", e):
                self._drop()
            return True
        self.w._note_pause(state)
        if state is None:
            self._unpaused_at = now
            return False
        # Jobs put meanwhile wake the watch and are slept through here: after the resume, scan at once.
        self._rescan_at = 0.0
        self._wait_news(PAUSED_BUCKET_LOOK if is_bucket_url(self.w.queue) else self.w.poll)
        return True

    def _wait_news(self, seconds: float) -> None:
        """Until the watch has news (a filesystem's includes the pause record coming or going), a stop,
        or ``seconds``; a stop is seen within ``poll``."""
        deadline = time.monotonic() + seconds
        while not self.w._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.watch is None:
                self.w._stop.wait(min(left, self.w.poll))
            elif self.watch.wait(min(left, self.w.poll)):
                return

    def _open(self) -> bool:
        self.q = self.w._open("lease")
        if self.q is None:
            return False
        try:
            self.watch = self.q.ready_watch()
            failures = self.watch.watch_missing()
        except SteadQError as e:  # e.g. no inotify instance left: poll instead
            log.warning("cannot watch the queue for new jobs (%s); polling every %gs", e, self.w.poll)
            self.watch = None
            return True
        for why in failures:
            log.warning("%s; polling that shard every %gs", printable(why), self.w.poll)
        # Only a watch that also reports jobs becoming due (a bucket's watches its delayed and
        # lease indexes) may replace the scans: a filesystem scan is what finds due jobs there.
        self._whole = not failures and bool(getattr(self.watch, "reports_due_jobs", False))
        return True

    def _drop(self) -> None:
        """After a failure that poisoned the handle: a new one next time. A shared handle is kept, as the
        threads settle with it; a bucket handle is never poisoned (an unknown outcome is resolved)."""
        if not self.shared:
            self.close()

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        if self.q is not None:
            self.q.close()
            self.q = None
