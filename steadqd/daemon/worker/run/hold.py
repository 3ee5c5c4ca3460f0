"""A job the worker could not start: handed back at once, and no new leases while the cause lasts.

A command that cannot start is normally found before any claim: the worker
checks it before each claim batch (``preflight.LaunchCheck``; issue 33 #9)
and holds without leasing, so no attempt is used at all. SteadQ/1 counts
the attempt at the claim and no operation lowers it (retry keeps it), so
this check is the only way to spend none. What it cannot see starts and
fails after a claim: the command removed between the check and its exec
(the claim and the payload copy lie between), a permission only the job's
user is refused, a payload copy that meets a full disk, the job's user
removed. Such a job failed through no fault of its own, and the next job
would fail the same way. Leasing on would burn an attempt of every job in
the backlog, so the worker holds instead: it leases nothing, says why once per
cause (journal and STATUS=), and re-runs its start checks after a wait that
doubles from :data:`HOLD_FIRST` to :data:`HOLD_MAX`. When they pass it leases
again; the wait is reset only by a job that really started, so a cause the
checks cannot see (a broken interpreter line) still backs off. The job
itself goes straight back to ready (:func:`hand_back_unstarted`): its claim
counted the one attempt the spec counts, and nothing more is spent on it (a
job on its last attempt goes to dead, reason 0x0004, the spec's retry rule).
"""

from __future__ import annotations

from collections.abc import Callable

from steadqd.backend import Backend, LeaseHandle
from steadqd.daemon.journal import Log, short_id
from steadqd.daemon.preflight import Problem
from steadqd.daemon.service import Loop, Timer
from steadqd.errors import OutcomeUnknown, SteadQError

__all__ = ["HOLD_FIRST", "HOLD_MAX", "Hold", "hand_back_unstarted"]

HOLD_FIRST = 5.0  # s; first wait before the checks run again
HOLD_MAX = 300.0  # s; the longest wait between two checks of a broken environment

Guard = Callable[[Callable[[], None]], Callable[[], None]]


class Hold:
    """Why leasing is held (``reason``, None when it is not) and when it is looked at again."""

    def __init__(
        self, loop: Loop, log: Log, guard: Guard, check: Callable[[], list[Problem]], resume: Callable[[], None]
    ) -> None:
        self._loop = loop
        self._log = log
        self._guard = guard
        self._check = check
        self._resume = resume
        self.reason: str | None = None
        self._delay = 0.0
        self._timer: Timer | None = None

    def hold(self, why: str) -> None:
        """Lease nothing until the checks pass; logged once per cause."""
        if self.reason != why:
            self._log.error(f"not leasing jobs: {why}", held=True)
        self.reason = why
        self._delay = min(HOLD_MAX, max(HOLD_FIRST, self._delay * 2))
        self._schedule(self._delay)

    def job_started(self) -> None:
        """A command started: the environment works, the next hold starts from the first wait."""
        self._delay = 0.0

    def check_soon(self) -> None:
        """The operator may have fixed the cause (a reload): look now rather than at the timer."""
        if self.reason is not None:
            self._schedule(0.0)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self, delay: float) -> None:
        self.cancel()
        self._timer = self._loop.call_later(delay, self._guard(self._recheck))

    def _recheck(self) -> None:
        self._timer = None
        if self.reason is None:
            return
        problems = self._check()
        if problems:
            self.hold(problems[0].text)
            return
        self._log.notice(f"leasing jobs again: the checks pass (was: {self.reason})", held=False)
        self.reason = None
        self._resume()


def hand_back_unstarted(q: Backend | None, lease: LeaseHandle, log: Log) -> OutcomeUnknown | None:
    """Give a claimed job whose command never ran back, ready at once; an OutcomeUnknown is the caller's
    (its handle is poisoned), any other failure leaves the lease to expire and recovery to return it."""
    if q is None:
        log.error("handing the job back failed (queue not open); recovery returns it", job_id=lease.job_id)
        return None
    try:
        state = q.retry(lease, delay=0.0)
    except OutcomeUnknown as e:
        return e
    except SteadQError as e:
        log.error(f"handing the job back failed; its lease expires and recovery returns it: {e}", job_id=lease.job_id)
        return None
    log.warning(
        f"job {short_id(lease.job_id)} handed back: {state} (attempt {lease.attempt}/{lease.max_attempts})",
        job_id=lease.job_id,
        attempt=lease.attempt,
        state=state,
    )
    return None
