"""The settle step: what settling a verdict does to a lease, the words the journal says about it, and the thread that does it.

What settling does
    :func:`apply_verdict` acks, buries or retries a lease by the verdict of
    the exit policy (policy.py). It is the one home of the lines a person
    reads about it ("job 3d1f6a0c finished: ack (exit 0, 1.0 s, attempt
    1/3)", "... buried: exit 100 (consumer_rejected)"), which
    docs/operations.md and the system tests quote. The role (role.py)
    decides *when* a run is settled: group commit, trying again after
    NotCommitted, giving up on a lost lease.

Why a thread
    An ack, retry or bury ends in directory fsyncs, and on a journaled disk
    those are most of a short job's cost. On the loop's thread they stall
    every other job's output, renewals and spawns, and the worker runs jobs
    one fsync at a time however high its concurrency. So the loop hands each
    finished run to one :class:`Settler` thread and goes on. The thread
    settles whatever has accumulated under one ``q.batch()``: while one
    group's barriers run, the next group accumulates, so the fsyncs are
    shared by as many runs as finish during them (the spec's barriers are
    per directory, and a batch still renames each job at once).

What stays with the loop
    Everything a person reads and everything the role counts: the journal's
    lines about a settle (their texts are this module's functions), the
    tally, freeing the slot, retrying after NotCommitted. The thread only
    applies verdicts and reports each one's outcome through a pipe the loop
    watches, as the claim step's Preparer does. A lease handed to the thread
    is not renewed meanwhile (a renewal and the ack would race on one lease);
    the loop resumes renewals when a NotCommitted settle comes back.

Its handle
    Nothing but this thread touches its queue handle. An OutcomeUnknown
    poisons that handle only: the thread closes it and opens a new one for
    its next group; the loop's handle and the Preparer's go on.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from steadqd.backend import Backend, LeaseHandle
from steadqd.backoff import RetryPolicy
from steadqd.constants import DeadReason
from steadqd.daemon import metrics
from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.journal import INFO, WARNING, reason_name, short_id
from steadqd.daemon.worker import claim, payload
from steadqd.daemon.worker.policy import Verdict, verdict
from steadqd.daemon.worker.run import _Job
from steadqd.errors import ErrorKind, LeaseLost, NotCommitted, OutcomeUnknown, SteadQError

if TYPE_CHECKING:
    from steadqd.daemon.journal import Log
    from steadqd.daemon.service import Loop
    from steadqd.daemon.worker.hooks import Hooks
    from steadqd.daemon.worker.progress_watch import ProgressWatch

__all__ = [
    "FollowUp",
    "Group",
    "RoleSettling",
    "Settlement",
    "Settler",
    "Tally",
    "apply_verdict",
    "retry_policy",
    "run_story",
    "ticket_text",
]

FollowUp = tuple[int, str, dict[str, object]] | None  # (priority, message, fields) of a line to log


@dataclass
class Tally:
    """The worker's counts for STATUS=: jobs acknowledged, dead-lettered, and given back."""

    done: int = 0
    failed: int = 0
    retried: int = 0


def retry_policy(cfg: WorkerConfig) -> RetryPolicy:
    r = cfg.retry
    base = max(1, round(r.backoff_base * 1000))
    return RetryPolicy(base_ms=base, cap_ms=max(base, round(r.backoff_max * 1000)), use_jitter=r.jitter)


def apply_verdict(
    q: Backend, lease: LeaseHandle, cfg: WorkerConfig, outcome: Verdict, tally: Tally, ended: str | None = None
) -> FollowUp:
    """Ack, bury or retry the lease; returns the line that tells what followed (logged after ``job finished``).

    ``ended`` is how the command ended ("exit 100"), when it ran. The
    queue's errors pass through: the caller knows whether to try again.
    """
    if outcome is Verdict.ACK:
        q.ack(lease)
        tally.done += 1
        return None
    if outcome is Verdict.BURY:
        reason = cfg.exit_status.bury_reason
        q.bury(lease, reason=reason)
        tally.failed += 1
        why = f"{ended} ({reason_name(reason)})" if ended else reason_name(reason)
        return WARNING, f"job {short_id(lease.job_id)} buried: {why}", {"reason": f"0x{reason:04x}"}
    state = q.retry(lease, policy=retry_policy(cfg))
    if state == "dead":
        tally.failed += 1
        text = (
            f"job {short_id(lease.job_id)} buried: no attempts left"
            f" ({lease.attempt}/{lease.max_attempts}, {reason_name(DeadReason.ATTEMPTS_EXHAUSTED)})"
        )
        return WARNING, text, {"reason": f"0x{DeadReason.ATTEMPTS_EXHAUSTED:04x}"}
    tally.retried += 1
    return INFO, f"job {short_id(lease.job_id)} retried: {state}", {"state": state}


def run_story(lease: LeaseHandle, ended: str, *, timed_out: bool, duration_ms: object) -> str:
    """How the run ended, for a person: ``exit 0, 1.0 s, attempt 1/3``."""
    how = f"timed out, {ended}" if timed_out else ended
    seconds = duration_ms / 1000 if isinstance(duration_ms, int) else 0.0
    return f"{how}, {seconds:.1f} s, attempt {lease.attempt}/{lease.max_attempts}"


def ticket_text(e: OutcomeUnknown) -> str | None:
    """The outcome-unknown ticket as one journal field, so an operator can resolve it by hand."""
    t = getattr(e, "ticket", None)
    if t is None:
        return None
    for attr in ("to_json", "encode"):
        fn = getattr(t, attr, None)
        if callable(fn):
            with contextlib.suppress(Exception):
                out = fn()
                return out.hex() if isinstance(out, bytes) else str(out)
    return repr(t)


# -- the settling thread ------------------------------------------------------------


@dataclass(eq=False)
class Settlement:
    """One finished run to settle; the thread fills in the second half.

    ``owner`` is the loop's own record of the job, carried back untouched:
    the thread reads only the values given here, which nothing changes
    while it holds them.
    """

    owner: object
    lease: LeaseHandle
    cfg: WorkerConfig
    verdict: Verdict
    ended: str | None
    tmpdir: str = ""  # the payload copy, removed by the thread once the verdict is applied
    follow: FollowUp = None  # what followed from the verdict (apply_verdict)
    tally: Tally = field(default_factory=Tally)  # what it adds to the role's counts
    applied: bool = False  # the verdict's rename happened (its barrier: see Group.unknown)
    error: BaseException | None = None  # why it was not applied: the backend's error, or an internal one


@dataclass(eq=False)
class Group:
    """The settlements of one pass of the thread, reported together once their barriers are done."""

    items: list[Settlement]
    together: bool = False  # settled under one q.batch()
    unknown: SteadQError | None = None  # the group's barrier failed: every applied verdict's outcome is unknown
    poisoned: str | None = None  # the thread's handle was poisoned and closed; its next group opens a new one


# What the loop hands over at once: runs to settle and payload directories to remove (an abandoned
# run's), in the order they came; or None: "stop".
_Request = list[Settlement | str] | None


class Settler:
    """The settling thread. The loop calls :meth:`submit` (and :meth:`discard`) for each run as it ends,
    :meth:`hand_over` once its pass is done, watches :meth:`fileno` and calls :meth:`collect`.

    Runs are handed over in one piece per loop pass, not one by one: a
    thread woken for each would take the GIL at the loop's next syscall in
    the middle of its pass and make it wait for it back (a contended GIL
    hand-off, several ``futex`` calls), and would settle the pass's runs in
    more groups than one. Woken once, after the pass, it finds the GIL free.
    """

    def __init__(self, q: Backend, reopen: Callable[[], Backend]) -> None:
        self._q: Backend | None = q
        self._reopen = reopen
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._held: list[Settlement | str] = []  # submitted this loop pass, not handed over yet (loop side)
        self._held_runs = 0  # the Settlements among _held (loop side): runs_held
        self._in_flight = 0  # runs handed over whose group has not been collected (loop side): busy
        self._results: list[Group] = []
        self._lock = threading.Lock()  # guards _results
        self._stopping = False
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="steadqd-settle", daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        return self._r

    def submit(self, item: Settlement) -> bool:
        """Settle ``item`` once handed over; True if it is the first since the last :meth:`hand_over`
        (the caller arranges one hand-over at the end of its pass)."""
        self._held.append(item)
        self._held_runs += 1
        return len(self._held) == 1

    def discard(self, directory: str) -> bool:
        """Remove a payload directory on the thread (an abandoned run's: nothing to settle); as :meth:`submit`."""
        if not directory:
            return False
        self._held.append(directory)
        return len(self._held) == 1

    def hand_over(self) -> None:
        """Give the thread what :meth:`submit` and :meth:`discard` took since the last call, in one piece."""
        if self._held:
            held, self._held = self._held, []
            self._in_flight += self._held_runs
            self._held_runs = 0
            self._requests.put(held)

    @property
    def runs_held(self) -> bool:
        """The next :meth:`hand_over` gives the thread runs to settle (not only directories to remove)."""
        return self._held_runs > 0

    @property
    def busy(self) -> bool:
        """Runs handed over are being settled: the thread renames in the queue tree until they are collected."""
        return self._in_flight > 0

    def collect(self) -> list[Group]:
        claim.drain_wakeups(self._r)
        with self._lock:
            done, self._results = self._results, []
        for group in done:
            self._in_flight -= len(group.items)
        return done

    def close(self, wait: float) -> tuple[list[Group], list[Settlement]]:
        """Stop after the group in progress; returns what was settled and what was never started.

        A group still in its barriers after ``wait`` seconds is left to the
        process's exit: its outcomes are the tree's (recovery decides); its
        runs are neither in what is returned nor settled by the caller.
        """
        self._stopping = True
        self._requests.put(None)
        self._thread.join(wait)
        unstarted: list[Settlement] = []
        requests: list[Settlement | str] = []
        while True:  # the thread takes nothing more once it is stopping: the rest is the caller's
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                break
            requests += request or ()
        requests += self._held  # never handed over: the caller's too
        self._held, self._held_runs = [], 0
        for r in requests:
            if isinstance(r, Settlement):
                unstarted.append(r)
            else:
                payload.remove(r)
        done = self.collect()
        if not self._thread.is_alive():
            claim.close_owned(self._q, self._r, self._w)
            self._q = None
        return done, unstarted

    # -- the thread ----------------------------------------------------------------

    def _run(self) -> None:
        claim.name_thread(self._thread.name)
        while not self._stopping:
            request = self._requests.get()
            items, directories = self._take(request)
            group = Group(items)
            try:
                if items:
                    self._settle(group)
            except BaseException as e:  # reported to the loop, which logs it: the thread must go on
                for it in items:
                    if not it.applied and it.error is None:
                        it.error = e
            if items:
                with self._lock:
                    self._results.append(group)
                with contextlib.suppress(BlockingIOError):
                    os.write(self._w, b"\0")
            for d in directories:  # after the report: the verdicts do not wait for the removals
                payload.remove(d)

    def _take(self, first: _Request) -> tuple[list[Settlement], list[str]]:
        """Everything that accumulated since the last group, without waiting for more."""
        items: list[Settlement] = []
        directories: list[str] = []
        request = first
        while True:
            if request is None:
                self._stopping = True
            else:
                for r in request:
                    if isinstance(r, str):
                        directories.append(r)
                    else:
                        items.append(r)
                        if r.tmpdir:
                            directories.append(r.tmpdir)
            if self._stopping:
                return items, directories
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return items, directories

    def _settle(self, group: Group) -> None:
        if self._q is None:
            try:
                self._q = self._reopen()
            except SteadQError as e:
                for it in group.items:
                    it.error = NotCommitted(f"queue is not open: {e}", ErrorKind.IO_FAILURE)
                return
        q = self._q
        try:
            if len(group.items) < 2:  # alone: strict, as a single settle always was
                for it in group.items:
                    self._apply(q, it)
                return
            group.together = True
            try:
                with q.batch():
                    for it in group.items:  # _apply written out: every run of a group comes here
                        try:
                            it.follow = apply_verdict(q, it.lease, it.cfg, it.verdict, it.tally, it.ended)
                            it.applied = True
                        except Exception as e:  # one run must not leave the others of its group unsettled
                            it.error = e
            except SteadQError as e:
                group.unknown = e
        finally:
            if q.poisoned is not None or group.unknown is not None:
                group.poisoned = q.poisoned or str(group.unknown)
                with contextlib.suppress(SteadQError, OSError):
                    q.close()
                self._q = None

    @staticmethod
    def _apply(q: Backend, it: Settlement) -> None:
        try:
            it.follow = apply_verdict(q, it.lease, it.cfg, it.verdict, it.tally, it.ended)
            it.applied = True
        except Exception as e:  # one run must not leave the others of its group unsettled
            it.error = e


# -- the role's side: when a run is settled, and what the journal says ------------------------

SETTLE_RETRY = 1.0  # s; first wait before settling again after NotCommitted (then doubling)
SETTLE_RETRY_MAX = 30.0  # s; the longest wait between two tries while the lease is still ours


class RoleSettling:
    """The worker role's settling, on the loop's thread: judge a run, hand it to the :class:`Settler`,
    report what came back, try again after NotCommitted, give up on a lost lease.

    A part of :class:`~steadqd.daemon.worker.role.WorkerRole` (its base class), kept with the
    thread and the wording it drives; the names below are the role's.
    """

    if TYPE_CHECKING:
        loop: Loop | None
        log: Log
        q: Backend | None
        tally: Tally
        closed: bool
        _settler: Settler | None
        _hooks: Hooks | None
        progress: ProgressWatch | None

        _hand_over_cb: Callable[[], None]  # _hand_over, guarded: made once by the role

        def _defer_ready(self) -> None: ...
        def _ready_with_results(self) -> None: ...
        def _drop(self, job: _Job, *, settled: bool = False) -> None: ...
        def _schedule_fill(self, delay: float) -> None: ...
        def _renew(self, job: _Job) -> None: ...
        def _reopen(self, why: str) -> None: ...
        def _sweep_after_job(self) -> None: ...
        def _guarded(self, fn: Callable[[], None], job: _Job | None = None) -> Callable[[], None]: ...

    def _finish(self, job: _Job) -> None:
        """The command has ended: judge the run, then settle it with this loop pass's others."""
        assert self.loop is not None
        code = job.child.returncode  # reaped (Child.reap or kill): its timeout and kill timers went with it
        assert code is not None
        outcome = job.verdict = self._verdict(job)
        if self.progress is not None:  # its command has ended: no more progress
            self.progress.stop(job)
        self._sweep_after_job()
        job.run_fields = {
            "exit_status": code if code >= 0 else None,
            "signal": job.child.signal_name if code < 0 else None,
            "verdict": outcome,
            "duration_ms": round((self.loop.now() - job.started) * 1000),
            "timed_out": "true" if job.child.timed_out else None,
        }
        if outcome is Verdict.ABANDON:
            if self._settler is not None:
                if self._settler.discard(job.tmpdir):
                    self.loop.call_soon(self._hand_over_cb)
            else:
                payload.remove(job.tmpdir)
            self._report_finished(job, None)
            self._drop(job)
            return
        self._settle(job)

    def _report_finished(self, job: _Job, follow: FollowUp) -> None:
        """``job finished: <verdict>``, logged once the verdict took effect, then what followed from it."""
        outcome = job.verdict
        self.log.log(
            INFO if outcome is Verdict.ACK else WARNING,
            f"job {short_id(job.lease.job_id)} finished: {outcome} ({self._run_story(job)})",
            **job.fields,
            **job.run_fields,
        )
        dead = bool(follow and "reason" in follow[2])
        metrics.job_finished(str(outcome), job.run_fields.get("duration_ms"), dead=dead)
        if follow is not None:  # an ack has no follow-up line and no notification command
            self._log_follow_up(job.lease, follow)
            self._notify(job, follow, dead)

    def _notify(self, job: _Job, follow: FollowUp, dead: bool) -> None:
        """Start ``on_bury`` for a buried job, ``on_retry`` for a retried one (daemon/worker/hooks.py)."""
        if follow is None or self._hooks is None or self.closed:
            return
        if dead:
            which, argv, reason = "on_bury", job.cfg.on_bury, str(follow[2]["reason"])
            with contextlib.suppress(ValueError):
                reason = reason_name(int(reason, 16))
        elif "state" in follow[2]:
            which, argv, reason = "on_retry", job.cfg.on_retry, "retry"
        else:
            return
        if not argv:
            return
        code = job.child.returncode
        env = {
            **job.env,
            "STEADQ_REASON": reason,
            "STEADQ_EXIT_STATUS": str(code) if code is not None and code >= 0 else "",
            "STEADQ_ENDED": job.child.ended,
        }
        if job.child.signal_name:
            env["STEADQ_SIGNAL"] = job.child.signal_name
        self._hooks.run(
            which,
            argv,
            env,
            timeout=job.cfg.notify_timeout,
            stderr_lines=job.child.stderr_tail,
            credentials=job.credentials,
            fields=job.fields,
        )

    @staticmethod
    def _run_story(job: _Job) -> str:
        return run_story(
            job.lease, job.child.ended, timed_out=job.child.timed_out, duration_ms=job.run_fields.get("duration_ms")
        )

    def _report_unsettled(self, job: _Job, why: str, **extra: object) -> None:
        """The run ended but its verdict did not take effect: never logged as ``job finished: <verdict>``."""
        self.log.error(
            f"job {short_id(job.lease.job_id)} finished ({self._run_story(job)}), but its {job.verdict} {why}",
            **job.fields,
            **job.run_fields,
            **extra,
        )

    @staticmethod
    def _verdict(job: _Job) -> Verdict:
        assert job.child.returncode is not None
        return verdict(
            job.child.returncode,
            timed_out=job.child.timed_out,
            lease_lost=job.lost is not None,
            policy=job.cfg.exit_status,
        )

    def _settle(self, job: _Job) -> None:
        """Hand ``job.verdict`` to the settling thread; its outcome comes back in :meth:`_settled`.

        A full disk must not throw a finished run away: after NotCommitted
        the renewals resume and the settle is tried again for as long as the
        lease is ours (even past its deadline it can still be settled until
        recovery reaps it: protocol.md, validating a lease source checks the
        file, not the clock). The run is given up only when the lease is lost.
        """
        if job.lost is not None:
            if job.verdict is not Verdict.ABANDON:
                self._report_unsettled(job, f"failed: the lease was lost ({job.lost}); the job may run again")
            self._drop(job)
            return
        if self._settler is None:  # closed: close() settles what is left
            return
        job.settle_tries += 1
        job.timers.cancel("renew")  # a renewal and the settle would race on the lease
        job.settling = True
        verdict_ = job.verdict or Verdict.RETRY
        if self._settler.submit(Settlement(job, job.lease, job.cfg, verdict_, job.child.ended, job.tmpdir)):
            assert self.loop is not None
            self.loop.call_soon(self._hand_over_cb)  # after this pass's other callbacks
        job.tmpdir = ""  # the thread removes it
        self._schedule_fill(0.0)  # its slot is free: _slots_taken

    def _hand_over(self) -> None:
        """The end of a loop pass in which runs were submitted: the settling thread gets them all at once."""
        if self._settler is not None:
            if self._settler.runs_held:  # its renames out of ready/ are read with its results (role.py)
                self._defer_ready()  # before: the thread, woken, would take the GIL at the epoll_ctl
            self._settler.hand_over()

    def _on_settled(self) -> None:
        assert self._settler is not None
        for group in self._settler.collect():
            self._settled(group)
        self._ready_with_results()

    def _settled(self, group: Group) -> None:
        """Report a group in the order the journal always told it: failures, then the group, then the acks."""
        for it in group.items:
            job: _Job = it.owner  # type: ignore[assignment]  # the role's own (typing.cast: a call a job)
            job.settling = False
            self.tally.done += it.tally.done
            self.tally.failed += it.tally.failed
            self.tally.retried += it.tally.retried
            if it.error is not None:
                self._settle_failed(job, it.error)
        applied = [it for it in group.items if it.applied]
        if group.unknown is not None:
            self.log.error(
                f"settling outcome unknown for {len(group.items)} jobs settled together (recovery decides):"
                f" {group.unknown}",
                job_ids=",".join(it.lease.job_id for it in group.items),
            )
        for it in applied:
            job = it.owner  # type: ignore[assignment]
            if group.unknown is not None:
                self._report_unsettled(job, "may or may not have taken effect (recovery decides)")
            else:
                self._report_finished(job, it.follow)
            self._drop(job, settled=True)  # its slot was free from its hand-over on (_settle asked for a fill then)
        if group.poisoned is not None:
            self.log.error(f"queue handle poisoned (settle: {group.poisoned}); reopening the queue")

    def _settle_failed(self, job: _Job, e: BaseException) -> None:
        if isinstance(e, NotCommitted):
            delay = min(SETTLE_RETRY * 2 ** min(job.settle_tries - 1, 16), SETTLE_RETRY_MAX)
            self.log.warning(
                f"settling not committed, retrying in {delay:g}s (try {job.settle_tries}): {e}",
                **job.fields,
                verdict=job.verdict,
            )
            job.timers.set("renew", 0.0, lambda: self._renew(job))  # the lease is ours again
            job.timers.set("settle", delay, lambda: self._settle(job))
            return
        if isinstance(e, LeaseLost):
            self._report_unsettled(job, f"failed: the lease was lost ({e}); the job may run again")
        elif isinstance(e, OutcomeUnknown):
            why = f"may or may not have taken effect (recovery decides): {e}"
            self._report_unsettled(job, why, ticket=ticket_text(e))
        elif isinstance(e, SteadQError):
            self._report_unsettled(job, f"failed: {e}")
        else:
            self.log.error(f"internal error settling a job: {e!r}", **job.fields)
        self._drop(job)

    def _apply(self, lease: LeaseHandle, cfg: WorkerConfig, outcome: Verdict, ended: str | None = None) -> FollowUp:
        assert self.q is not None
        return apply_verdict(self.q, lease, cfg, outcome, self.tally, ended)

    def _log_follow_up(self, lease: LeaseHandle, follow: FollowUp) -> None:
        if follow is not None:
            priority, message, fields = follow
            self.log.log(priority, message, job_id=lease.job_id, attempt=lease.attempt, **fields)

    def _settle_simple(self, lease: LeaseHandle, cfg: WorkerConfig, outcome: Verdict) -> None:
        """Settle a lease whose command never ran (preparation or spawn failed)."""
        try:
            if self.q is None:
                raise NotCommitted("queue is not open", ErrorKind.IO_FAILURE)
            self._log_follow_up(lease, self._apply(lease, cfg, outcome))
        except OutcomeUnknown as e:
            self.log.error(f"settling outcome unknown: {e}", job_id=lease.job_id, ticket=ticket_text(e))
            self._reopen(str(e))
        except SteadQError as e:
            self.log.error(f"settling failed; the lease expires and recovery returns the job: {e}", job_id=lease.job_id)
