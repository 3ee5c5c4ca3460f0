"""The worker's side of job progress: read each running job's ``$STEADQ_PROGRESS`` file, publish the latest value.

The file and its checks are steadqd/progress.py's; this module only paces
the reads (one per :data:`~steadqd.progress.READ_EVERY` per job, on the
loop's timers: a read is a few non-blocking syscalls) and keeps what was
published in step with the jobs: a value is published when it changes and
removed when the job's command ends.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from steadqd import progress
from steadqd.daemon import metrics
from steadqd.daemon.journal import Log, short_id

if TYPE_CHECKING:
    from steadqd.daemon.worker.run import _Job

__all__ = ["ProgressWatch"]


class ProgressWatch:
    """Per job: the held directory descriptor and the last value read. Without a publisher (no
    runtime directory) the values still reach the metrics gauge (by slot)."""

    def __init__(self, publisher: progress.Publisher | None, log: Log) -> None:
        self._pub = publisher
        self._log = log
        self._jobs: dict[int, tuple[int, set[int]]] = {}  # by pid: (directory fd, owners the file may have)
        self._last: dict[int, tuple[float, str] | None] = {}
        self._euid = os.geteuid()  # the owner of a job's file when it runs as the daemon's user (asked once)

    def start(self, job: _Job) -> None:
        if not job.tmpdir:
            return
        try:
            fd = os.open(job.tmpdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        owners = {job.credentials["user"]} if "user" in job.credentials else {self._euid}
        self._jobs[job.pid] = (fd, owners)
        self._last[job.pid] = None
        job.timers.set("progress", progress.READ_EVERY, lambda: self._read(job))

    def _read(self, job: _Job) -> None:
        held = self._jobs.get(job.pid)
        if held is None or job.child.returncode is not None:
            return
        try:
            value = progress.read_file(held[0], "progress", held[1])
        except progress.Refused as e:
            self._log.warning(
                f"progress file of job {short_id(job.lease.job_id)} refused: {e}; its progress is not shown",
                **job.fields,
            )
            self.stop(job)
            return
        if value is not None and value != self._last.get(job.pid):
            self._last[job.pid] = value
            metrics.job_progress(job.slot, value[0])
            pub = self._pub
            if pub is not None:
                try:
                    pub.publish(job.lease.job_id, *value)
                except OSError as e:
                    self._log.warning(f"cannot publish progress in {pub.path}: {e}", **job.fields)
        job.timers.set("progress", progress.READ_EVERY, lambda: self._read(job))

    def stop(self, job: _Job) -> None:
        """The job's command has ended (or its file was refused): no more reads, its value is removed."""
        held = self._jobs.pop(job.pid, None)
        if held is None:  # a job whose progress is not read has no timer for it (the end's second call)
            return
        job.timers.cancel("progress")
        os.close(held[0])
        if self._last.pop(job.pid, None) is not None:
            metrics.job_progress(job.slot, None)
            if self._pub is not None:
                self._pub.remove(job.lease.job_id)

    def close(self) -> None:
        for fd, _ in self._jobs.values():
            os.close(fd)
        self._jobs.clear()
        if self._pub is not None:
            self._pub.close()
            self._pub = None
