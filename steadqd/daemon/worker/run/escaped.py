"""The processes a job left outside its process group (it called setsid), killed once the job has ended.

The worker is their child subreaper (steadqd.daemon.process.become_subreaper), so they come to it when
their parent dies. A part of :class:`~steadqd.daemon.worker.role.WorkerRole` (a base class), kept with
the run step because it finishes what killing a job's group began; the names below are the role's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from steadqd.daemon import process
from steadqd.daemon.journal import Log
from steadqd.daemon.worker.run.guard import guard_pid

if TYPE_CHECKING:
    from collections.abc import Callable

    from steadqd.daemon.service import Loop, Timer
    from steadqd.daemon.worker.hooks import Hooks
    from steadqd.daemon.worker.run import _Job

__all__ = ["ESCAPED_SWEEP", "SPAWN_PUT_OFF", "SPAWN_RETRY", "SPAWN_WAIT", "RoleSweep"]

ESCAPED_SWEEP = 0.5  # s; after a job's end, when its killed group's escaped descendants have come to us
SPAWN_RETRY = 0.01  # s; a sweep put off while a spawn is in flight (it ends at the child's exec) looks again then
SPAWN_PUT_OFF = 0.5  # s; put off that long, a sweep waits for the spawns in flight instead (the loop waits)
SPAWN_WAIT = 0.05  # s; how long it waits for them before it is put off again


class RoleSweep:
    """The worker role's sweep for escaped job processes, on the loop's thread."""

    _sweep_this_pass = False  # a look is due at the end of this loop pass (_sweep_after_job)
    _sweep_due: float | None = None  # when the pending look is due: its timer's time, or later (postponed)
    _every_thread_at = float("-inf")  # loop time of the last look at every thread's children (_sweep_escaped)

    if TYPE_CHECKING:
        loop: Loop | None
        log: Log
        jobs: dict[int, _Job]
        closed: bool
        _hooks: Hooks | None
        _sweep_timer: Timer | None

        def _guarded(self, fn: Callable[[], None], job: _Job | None = None) -> Callable[[], None]: ...

    def _starting_pids(self) -> list[int] | None:
        """The commands the spawn pool started that are not jobs yet; None while one is still being spawned
        (its pid unknown). The role's answer; without a pool, none."""
        return []

    def _kill_all_escaped(self) -> None:
        """At the stop no job runs: every escaped process goes, in a few bounded rounds (each takes a generation)."""
        for _ in range(10):
            killed, reaped = process.kill_escaped(())
            if not (killed or reaped):
                return
            time.sleep(0.05)

    def _sweep_escaped(self) -> None:
        """Kill what ended jobs left outside their process groups, reap it, and look again soon if there was any.

        A command the spawn pool is starting is in a session of its own before the loop knows its pid, and
        would be taken for an escaped process: while a spawn is in flight the sweep is put off by
        :data:`SPAWN_RETRY` (spawns end at the child's exec); put off for :data:`SPAWN_PUT_OFF`, it waits
        for them instead (so a steady stream of spawns cannot keep it off). The commands the pool started
        that are no jobs yet count as leaders.

        The look reads the main thread's children, where the kernel re-parents an orphan
        (process.children), and every thread's when the last such look is :data:`ESCAPED_SWEEP` old: so
        even a kernel that re-parented elsewhere has its escaped processes killed that soon after their
        job, and a busy worker reads one ``/proc`` file per look instead of one per thread (7).
        """
        starting = self._starting_pids()
        if starting is None:
            self._schedule_sweep(SPAWN_RETRY)
            return
        leaders = [j.pid for j in self.jobs.values() if j.child.returncode is None] + starting
        if self._hooks is not None:  # a notification command runs in a session of its own, and is ours to reap
            leaders += list(self._hooks.running)
        guard = guard_pid()  # in our session: nothing to judge, its stat not read
        now = time.monotonic()
        every_thread = now - self._every_thread_at >= ESCAPED_SWEEP
        if every_thread:
            self._every_thread_at = now
        killed, reaped = process.kill_escaped(leaders, () if guard is None else (guard,), every_thread=every_thread)
        if killed:
            what = "1 process" if killed == 1 else f"{killed} processes"
            self.log.warning(f"killed {what} that ended jobs left outside their process groups", count=killed)
        if killed or reaped:  # their own children come to us as they die
            self._schedule_sweep(0.1)

    def _on_sweep_timer(self) -> None:
        self._sweep_timer = None
        assert self.loop is not None
        due = self._sweep_due
        if due is not None and due > self.loop.now():  # postponed since the timer was set: wait until then
            self._sweep_timer = self.loop.call_at(due, self._guarded(self._on_sweep_timer))
            return
        self._sweep_due = None
        self._sweep_escaped()

    def _schedule_sweep(self, delay: float, *, postpone: bool = False) -> None:
        """One pending look, ``delay`` from now: a later one is moved up; an earlier one stays, or with
        ``postpone`` is moved to then.

        A look moved later keeps its timer, which re-arms itself for the new time when it fires
        (:meth:`_on_sweep_timer`): every job's end postpones the look, and a new timer each time would
        leave one cancelled timer a job in the loop's heap."""
        if self.loop is None or self.closed:
            return
        when = self.loop.now() + delay
        pending = self._sweep_timer
        if pending is not None and not pending.cancelled:
            due = pending.when if self._sweep_due is None else self._sweep_due
            if due == when or (due < when and not postpone):
                return
            if when > pending.when:
                self._sweep_due = when
                return
            pending.cancel()
        self._sweep_due = when
        self._sweep_timer = self.loop.call_at(when, self._guarded(self._on_sweep_timer))

    def _sweep_after_job(self) -> None:
        """A job has ended: kill what it left outside its group now, and look again once their parents are gone.

        That later look is :data:`ESCAPED_SWEEP` after the last job's end: a look pending for an earlier
        job is postponed to it (this sweep finds what that one would have found so far), so jobs ending
        in a row share one look instead of each adding a full sweep of ``/proc``. The look "now" is made
        at the end of the loop pass in which the job ended, once for all the jobs that ended in it
        (each look reads every thread's children list).
        """
        self._schedule_sweep(ESCAPED_SWEEP, postpone=True)
        if not self._sweep_this_pass and self.loop is not None and not self.closed:
            self._sweep_this_pass = True
            self.loop.call_soon(self._guarded(self._sweep_at_pass_end))

    def _sweep_at_pass_end(self) -> None:
        self._sweep_this_pass = False
        self._sweep_escaped()  # something found: the look comes after 0.1 s instead
