"""The run step: start a job's command and follow it until it ends.

- :class:`_Job` (here): a leased job whose command was started, the lease's side of a :class:`Child`;
- child.py: the command's process (spawn, output, exit, timeout, kill);
- fastspawn.py and spawn.c: the compiled spawn, one vfork and one exec per job (cffi), in a pool of C threads;
- exec_helper.py and exec_helper.c: ``steadq-exec``, which lets Popen vfork and reports the exec (the fallback);
- guard.py: the process that kills the groups a SIGKILLed worker leaves;
- hold.py: no new leases while jobs cannot be started;
- slots.py: which STEADQ_SLOT a starting command gets;
- escaped.py: the processes a job left outside its group, killed once it has ended.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from steadqd.backend import LeaseHandle
from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.service import Timers
from steadqd.daemon.worker.policy import Verdict
from steadqd.daemon.worker.run.child import Child
from steadqd.daemon.worker.run.fastspawn import Process

if TYPE_CHECKING:
    from steadqd.daemon.worker.role import WorkerRole

__all__ = ["_Job"]


class _Job:
    """A leased job whose command was started: the lease's side of a :class:`Child`."""

    def __init__(
        self,
        role: WorkerRole,
        lease: LeaseHandle,
        cfg: WorkerConfig,
        proc: Process,
        tmpdir: str,
        report_fd: int | None = None,
        slot: int = 0,
        env: dict[str, str] | None = None,
        credentials: dict[str, Any] | None = None,
    ) -> None:
        assert role.loop is not None
        self.lease = lease
        self.cfg = cfg  # the configuration it started with: a reload does not change a running job
        self.tmpdir = tmpdir
        self.slot = slot  # STEADQ_SLOT: held while the command runs (run/slots.py)
        self.env = env or {}  # the command's environment, which a notification command gets too (hooks.py)
        self.credentials = credentials or {}
        self.started = role.loop.now()
        self.lost: str | None = None  # why the lease is no longer ours
        self.cancelled = False  # `steadq cancel` made it dead: its command is stopped, nothing is settled
        self.verdict: Verdict | None = None
        self.settle_tries = 0
        self.settling = False  # handed to the settling thread: not renewed until it reports back
        self.fields: dict[str, object] = {"job_id": lease.job_id, "attempt": lease.attempt}
        self.run_fields: dict[str, object] = {}  # how the command ended, for the `job finished` line

        def guard(fn: Callable[[], None]) -> Callable[[], None]:
            return role._guarded(fn, self)

        self.timers = Timers(role.loop, guard)  # "renew", "settle"
        self.child = Child(
            proc,
            cfg,
            loop=role.loop,
            log=role.log,
            fields=self.fields,
            guard=guard,
            on_exit=functools.partial(role._finish, self),  # a partial: no Python frame of its own (once a job)
            report_fd=report_fd,
            on_report=lambda report: role._on_report(self, report),
        )
        self.pid: int = self.child.pid  # the role's key for it in ``jobs``
