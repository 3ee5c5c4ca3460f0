"""What the worker hears of ``steadq cancel`` and ``steadq pause`` (steadqd.queue_control): a running job's
command stopped when a cancel ended its lease, and the pause a claim pass read, logged and shown.

A part of :class:`~steadqd.daemon.worker.role.WorkerRole` (a base class, as settle.py's RoleSettling),
kept apart because these are the queue's operator's requests, not a step of a job; the names below are
the role's. The cancel is written by fs/cancel.py and s3/cancel.py; the worker hears of it when the
lease leaves the store (the ready watch), at the bucket's doorbell, at a renewal or before a start.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from steadqd.backend import Backend, LeaseHandle, PauseState, is_bucket_url
from steadqd.daemon import metrics
from steadqd.daemon.journal import Log, short_id
from steadqd.daemon.worker import payload
from steadqd.errors import SteadQError
from steadqd.queue_control import PAUSED_BUCKET_LOOK

if TYPE_CHECKING:
    from steadqd.daemon.config import QueueSettings
    from steadqd.daemon.service import Loop
    from steadqd.daemon.worker.run import _Job

__all__ = ["RoleControl"]


class RoleControl:
    """The worker role's side of a cancel and a pause, on the loop's thread."""

    if TYPE_CHECKING:
        loop: Loop | None
        log: Log
        q: Backend | None
        settings: QueueSettings
        jobs: dict[int, _Job]
        paused: PauseState | None

        def _drop(self, job: _Job) -> None: ...
        def _schedule_fill(self, delay: float) -> None: ...
        def _sweep_after_job(self) -> None: ...

    def _note_pause(self, paused: PauseState | None) -> None:
        """Log a pause when a claim pass first finds it, and the resume when one claims again."""
        if paused is None and self.paused is None:  # not paused, as before (every claim): nothing changes
            return
        was, self.paused = self.paused, paused
        if paused is not None and (was is None or was != paused):
            self.log.notice(
                f"queue {paused.summary()}; running jobs finish, no new job is claimed",
                paused_since_ns=paused.since_ns,
                paused_by=paused.by,
                paused_reason=paused.reason,
            )
        elif paused is None and was is not None:
            self.log.notice("queue resumed; claiming again")
        metrics.queue_paused(paused is not None)
        if paused is not None and is_bucket_url(self.settings.queue):
            # A bucket sends no event when another host resumes: look again (one GET) every so often.
            self._schedule_fill(PAUSED_BUCKET_LOOK)

    def _cancelled(self, lease: LeaseHandle) -> bool:
        """Did a cancel end this lease? A failure to tell is logged and taken for no: renewals look again."""
        if self.q is None:
            return False
        try:
            return self.q.was_cancelled(lease)
        except (SteadQError, OSError) as e:
            self.log.warning(
                f"cannot tell whether job {short_id(lease.job_id)} was cancelled: {e}", job_id=lease.job_id
            )
            return False

    def _check_cancels(self, keys: Collection[str]) -> None:
        """Leased objects left the store: if one was a running job's, ask whether a cancel took it."""
        for job in list(self.jobs.values()):
            if self.q is not None and self.q.lease_key(job.lease) in keys:
                self._check_cancelled(job)

    def _check_cancelled(self, job: _Job) -> bool:
        """Stop the job's command if a cancel ended its lease; True if so (nothing is settled: it is dead)."""
        if job.cancelled or job.lost is not None or job.settling or job.child.returncode is not None:
            return job.cancelled
        if not self._cancelled(job.lease):
            return False
        job.cancelled = True
        job.lost = "cancelled"
        job.timers.cancel("renew")
        self.log.warning(
            f"job {short_id(job.lease.job_id)} cancelled: stopping its command (SIGTERM to its process group, "
            f"SIGKILL after {job.cfg.kill_grace:g}s)",
            **job.fields,
            pid=job.pid,
        )
        job.child.stop()
        return True

    def _finish_cancelled(self, job: _Job) -> None:
        """A cancelled job's command has ended: its job is already dead, so only report it."""
        assert self.loop is not None
        job.child.timers.cancel("kill")
        job.child.timers.cancel("timeout")
        self._sweep_after_job()
        duration_ms = round((self.loop.now() - job.started) * 1000)
        self.log.info(
            f"job {short_id(job.lease.job_id)} cancelled ({job.child.ended} after {duration_ms} ms)",
            **job.fields,
            verdict="cancelled",
            signal=job.child.signal_name,
            duration_ms=duration_ms,
        )
        metrics.job_cancelled(duration_ms)
        payload.remove(job.tmpdir)
        self._drop(job)
