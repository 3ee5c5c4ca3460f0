"""The sweeper role: the recovery pass at start and on an interval.

Liveness of a SteadQ/1 queue depends on somebody running recovery
(recovery.md): expired leases of a crashed worker go back to ``ready/``,
due delayed jobs are promoted, abandoned temps disappear, receipts are
compacted and expired, and (only with ``sweeper.dead_retention`` set) dead
letters past their retention are deleted. The sweeper is that somebody. It is a loop timer, not
a thread: each pass is bounded by the configured work budget
(``budget_ops``/``budget_ms``) so the service loop stays responsive to
signals, and a pass that runs out of budget is followed by the next one at
once (a backlog drains at full speed without waiting an interval, yet a
SIGTERM is still seen between two passes).

Logging is deliberately quiet: an idle queue writes nothing, a pass that
changed something writes one NOTICE with the counts, and each recorded error
code is a WARNING at most once per ``ERROR_LOG_WINDOW`` with the number of
occurrences (``journal.ErrorDigest``), so a persistent problem (a busy lock, an unreadable directory)
cannot flood the journal every 30 seconds.
"""

from __future__ import annotations

import time

from steadqd.backend import Backend, RecoveryReport
from steadqd.daemon import metrics
from steadqd.daemon.config import QueueSettings
from steadqd.daemon.journal import Log
from steadqd.daemon.service import Loop, PassRole, open_queue
from steadqd.errors import NotSupportedHere, SteadQError

__all__ = ["SweeperRole", "summarize"]

# (report attribute, log field, status word) in the order a person reads them.
_COUNTS = (
    ("leases_reaped", "reaped", "reaped"),
    ("leases_to_dead", "to_dead", "to dead"),
    ("delayed_promoted", "promoted", "promoted"),
    ("temp_files_deleted", "temp_deleted", "temps deleted"),
    ("receipts_compacted", "compacted", "compacted"),
    ("receipts_deleted", "expired", "receipts expired"),
    ("dead_deleted", "dead_deleted", "dead letters deleted"),
    ("quarantined", "quarantined", "quarantined"),
)
_BUCKET_COUNTS = (
    ("index_entries_pruned", "index entries pruned"),
    ("indexes_regenerated", "index entries regenerated"),
    ("beacons_deleted", "clock beacons deleted"),
)


def _open(settings: QueueSettings) -> Backend:
    sw = settings.sweeper
    if settings.bucket:  # its clock is the store's: no host skew to bound (config refuses max_clock_skew)
        return open_queue(
            settings, receipt_retention=sw.receipt_retention, temp_ttl=sw.temp_ttl, dead_retention=sw.dead_retention
        )
    return open_queue(
        settings,
        receipt_retention=sw.receipt_retention,
        temp_ttl=sw.temp_ttl,
        dead_retention=sw.dead_retention,
        max_clock_skew=sw.max_clock_skew,
    )


_OpenKey = tuple[str, bool, float, float, float | None, float]


def _open_key(settings: QueueSettings) -> _OpenKey:
    """What the open handle depends on: a reload that changes it reopens
    (retentions are per-handle options, fixed at open)."""
    sw = settings.sweeper
    return (
        settings.queue,
        settings.allow_unsupported_fs,
        sw.receipt_retention,
        sw.temp_ttl,
        sw.dead_retention,
        sw.max_clock_skew,
    )


def summarize(report: RecoveryReport) -> str:
    """Non-zero counts such as "reaped 3, compacted 40", or "nothing to do"."""
    parts = [f"{word} {getattr(report, attr)}" for attr, _, word in _COUNTS if getattr(report, attr)]
    # What only a bucket queue's pass does (steadqd/s3/recovery/sweep.py); a filesystem report has none of them.
    parts += [f"{word} {n}" for attr, word in _BUCKET_COUNTS if (n := getattr(report, attr, 0))]
    if report.directories_removed:
        parts.append(f"dirs removed {report.directories_removed}")
    return ", ".join(parts) if parts else "nothing to do"


class SweeperRole(PassRole):
    """Periodic, budgeted recovery passes over one queue."""

    name = "sweeper"

    def __init__(self, settings: QueueSettings, log: Log) -> None:
        super().__init__(settings, log, "recovery")
        self._opened_with: _OpenKey | None = None
        self._timer_soon = False  # the pending timer is a "more to do" pass, not an interval one
        self._last_pass_end: float | None = None
        self.last_report: RecoveryReport | None = None
        self._unsupported: str | None = None  # why this backend runs no recovery
        self._last_count: float | None = None  # when the queue was last counted for the metrics file

    # -- Role protocol -------------------------------------------------------

    def start(self, loop: Loop) -> None:
        self.loop = loop
        self.queue = _open(self.settings)  # a queue that cannot be opened refuses the start
        self._opened_with = _open_key(self.settings)
        sw = self.settings.sweeper
        # Said once at start: deleting dead letters is permanent, so an
        # operator reading the journal should see whether this sweeper does it.
        dead = "kept forever" if sw.dead_retention is None else f"deleted after {sw.dead_retention:g}s"
        self.log.info(
            f"sweeping every {sw.interval:g}s (budget {sw.budget_ops} ops / {sw.budget_ms} ms per pass; "
            f"dead letters {dead})",
            path=self.settings.queue,
        )
        metrics.attach(loop, self.settings, self.log, self.name)
        self._schedule(0.0, soon=True)

    def status(self) -> str:
        if self.queue is None:
            return "queue not open"
        if self._unsupported is not None:
            return "idle: this queue's backend has no recovery in this version"
        if self.last_report is None or self._last_pass_end is None:
            return "no pass yet"
        ago = max(0.0, Loop.now() - self._last_pass_end)
        text = f"last pass {ago:.0f}s ago: {summarize(self.last_report)}"
        if self.last_report.errors:
            text += f", {len(self.last_report.errors)} errors"
        if self.last_report.budget_exhausted:
            text += ", more to do"
        return text

    def reload(self, settings: QueueSettings) -> str:
        not_applied = ""
        old_interval = self.settings.sweeper.interval
        self.settings = settings
        key = _open_key(settings)
        if key != self._opened_with:
            try:
                fresh = _open(settings)
            except SteadQError as e:
                # Keep sweeping with the old handle: stopping recovery would be worse.
                not_applied = f"cannot reopen the queue with the new settings, keeping the old handle: {e}"
            else:
                self._close_queue()
                self.queue, self._opened_with = fresh, key
        if settings.sweeper.interval != old_interval and self._timer is not None and not self._timer_soon:
            since = Loop.now() - (self._last_pass_end or Loop.now())
            self._schedule(max(0.0, settings.sweeper.interval - since))
        return not_applied

    def close(self) -> None:
        self._cancel()
        self._close_queue()

    # -- passes --------------------------------------------------------------

    def _schedule(self, delay: float, *, soon: bool = False) -> None:
        self._cancel()
        if self._draining or self.loop is None:
            return
        self._timer_soon = soon
        self._timer = self.loop.call_later(delay, self._run_pass)

    def _usable_queue(self) -> Backend | None:
        """The handle, reopened if an indeterminate failure poisoned it."""
        if self.queue is not None and self.queue.poisoned is None:
            return self.queue
        if self.queue is not None:
            self.log.warning(f"queue handle is poisoned ({self.queue.poisoned}); reopening")
            self._close_queue()
        try:
            self.queue = _open(self.settings)
            self._opened_with = _open_key(self.settings)
        except SteadQError as e:
            self._errors.record([("queue_open", str(e))])
            return None
        return self.queue

    def _count(self, q: Backend) -> None:
        """Count the queue for the metrics file's gauges, at most every COUNT_INTERVAL (a count lists
        every state, so it is not done at each pass of a short interval) and only when a file is written."""
        if self.settings.metrics_textfile is None:
            return
        now = Loop.now()
        if self._last_count is not None and now - self._last_count < metrics.COUNT_INTERVAL:
            return
        self._last_count = now
        try:
            metrics.counted(q.stats())
        except (OSError, SteadQError) as e:
            self._errors.record([("count_failed", f"cannot count the queue for the metrics file: {e}")])

    def _run_pass(self) -> None:
        self._timer = None
        if self._draining:
            return
        sw = self.settings.sweeper
        q = self._usable_queue()
        if q is None:
            self._schedule(sw.interval)
            return
        try:
            report = q.recover(budget_ops=sw.budget_ops, budget_ms=sw.budget_ms)
        except NotSupportedHere as e:  # a backend without recovery: said once, and no pass is tried again
            self.log.warning(f"no recovery passes: {e}; the sweeper stays up and idle", path=self.settings.queue)
            self._unsupported = str(e)
            return
        except SteadQError as e:  # NotCommitted (poisoned, bad budget) or OutcomeUnknown
            self._errors.record([("recover_failed", str(e))])
            self._last_pass_end = Loop.now()
            self._schedule(sw.interval)
            return
        self.passes += 1
        self._last_pass_end = Loop.now()
        self.last_report = report
        metrics.recovered(report)
        metrics.swept(time.time())
        self._count(q)
        if report.changed:
            fields = {field: getattr(report, attr) for attr, field, _ in _COUNTS}
            self.log.notice(
                f"recovery pass: {summarize(report)}",
                ops=report.operations_attempted,
                dirs_removed=report.directories_removed or None,
                more=True if report.budget_exhausted else None,
                **fields,
            )
        for job in report.reaped_jobs:  # one entry per job, found by `journalctl STEADQ_JOB_ID=...`
            self.log.notice(f"recovery: job {job[:8]} reaped: its lease expired", job_id=job)
        if report.errors:
            self._errors.record(report.errors)
        if q.poisoned is not None:
            self._usable_queue()  # reopen now rather than at the next pass
        # Out of budget: more work is waiting, run again right after the
        # loop has looked at signals and other roles' events.
        if report.budget_exhausted:
            self._schedule(0.0, soon=True)
        else:
            self._schedule(sw.interval)
