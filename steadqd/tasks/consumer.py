"""One worker thread's lease: its own handle and ready watch, and the queue's pause read before every lease.

Apart from :class:`~steadqd.tasks.worker.Worker` so that how a thread waits for work (a watch, a scan, a
pause) reads on its own; the worker gives it the stop, the poll and how to report a failure of the queue.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from steadqd.backend import Backend, LeaseHandle, ReadyWatch, is_bucket_url
from steadqd.errors import SteadQError
from steadqd.queue_control import PAUSED_BUCKET_LOOK
from steadqd.tasks.journal import log
from steadqd.text import printable

if TYPE_CHECKING:
    from steadqd.tasks.worker import Worker

# An idle consumer whose watch covers the whole queue scans only when the watch
# has news, and at least this often (the daemon worker's safety rescan): on a
# bucket a scan LISTs every shard, which one poll a second would repeat.
QUIET_RESCAN = 60.0


class Consumer:
    """One worker thread's handle and its ready watch.

    It leases without waiting and then waits on its own watch, rather than
    ``lease(wait=)``, so that what the scan quarantined is read from
    ``last_scan`` before a later rescan replaces it. The watch is set up
    before the first scan: a job published after that scan wakes it.
    """

    def __init__(self, worker: Worker) -> None:
        self.w = worker
        self.q: Backend | None = None
        self.watch: ReadyWatch | None = None
        self._whole = False  # the watch reports every job that becomes claimable: a quiet wait needs no scan
        self._rescan_at = 0.0  # monotonic time of the next scan when nothing is news

    def lease(self) -> LeaseHandle | None:
        if self.q is None and not self._open():
            return None
        assert self.q is not None
        if self._whole and self.watch is not None and time.monotonic() < self._rescan_at:
            if not self.watch.wait(self.w.poll):
                return None  # nothing new: the caller checks for a stop and asks again
        if self._paused():
            return None
        try:
            lease = self.q.lease(wait=0.0, duration=self.w.lease_s)
        except SteadQError as e:
            if not self.w._after_error(self.q, "lease", e):
                self.close()
            return None
        self.w._report_scan(self.q)
        if lease is None:
            self._rescan_at = time.monotonic() + QUIET_RESCAN
            if self.watch is not None:
                self.watch.wait(self.w.poll)
            else:
                self.w._stop.wait(self.w.poll)
        return lease

    def _paused(self) -> bool:
        """Read the queue's pause before a lease; while it stands, wait for news or the next look, and say so."""
        assert self.q is not None
        try:
            state = self.q.pause_state()
        except SteadQError as e:  # a failure of the queue: no lease this time
            if not self.w._after_error(self.q, "read the pause", e):
                self.close()
            return True
        self.w._note_pause(state)
        if state is None:
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

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        if self.q is not None:
            self.q.close()
            self.q = None
