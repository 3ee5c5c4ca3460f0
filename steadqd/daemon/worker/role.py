"""The worker role: lease jobs and run the configured command for each.

Wake-ups, never polling
    The role sleeps in the service loop. It is woken by the backend's ready
    watch (``Backend.ready_watch()``: on the filesystem an inotify watch on
    every ``ready/<S>/`` shard, fs/ready_watch.py), by its own jobs
    (output, end of output, exit, renew and timeout timers) and by one
    *safety rescan* timer every :data:`SAFETY_RESCAN` seconds. The rescan
    exists only to catch what the watch cannot report: a shard directory
    that was removed and recreated (its watch is gone), an event-queue
    overflow we handled badly, or a lease the last scan skipped because of a
    transient error. It is the only periodic queue scan an idle worker
    makes. Only a job becoming *ready* wakes the role, so its own claims and
    renewals never trigger a scan; while a claim or a settle runs the watch
    is not read at all (their renames would wake the loop once a job), but
    with their results or :data:`READY_DEFER` later. The watch also keeps the ready count of
    STATUS= current without listing directories every few seconds; the
    count is redone at each safety rescan and after an overflow (and not at
    all beyond 256 shards: "?").

The payload
    Before the command starts, the payload is copied with the backend's
    ``copy_payload`` into a private per-job temporary directory and made
    read-only (0400). The copy is verified against the payload digest, so a
    corrupt payload is quarantined by the backend and never reaches a
    command. ``input: file`` passes the copy's path in STEADQ_PAYLOAD_FILE;
    ``input: stdin`` opens the same copy read-only as the command's stdin
    (steadqd.daemon.worker.run.child). The directory is removed when the job ends.
    The claim (which hashes the payload) and the copy run in the
    :class:`~steadqd.daemon.worker.claim.Preparer` thread with a queue
    handle of its own, so a payload of gigabytes never delays the renewals
    and output of the jobs already running; the loop's handle is touched by
    the loop's thread only. The compiled spawn runs in the spawn pool's C
    threads (fastspawn.Pool), which never end (a command's death signal
    follows the thread that forked it), so the loop does not wait in vfork
    for each exec; a spawn in flight holds its slot, and the pool's
    descriptor, a loop reader, makes it a job. The fallback spawns from the
    loop's thread without waiting for its exec: ``steadq-exec``'s report
    pipe is a loop reader, and the job is ``started`` at its EOF. The first
    renewal counts from the claim or the copy's last renewal, not the spawn.

Settling
    By the exit policy (steadqd.daemon.worker.policy), applied by the
    :class:`~steadqd.daemon.worker.settle.Settler` thread with a handle of its own
    (group commit); its journal lines, the tally and the slot stay with the
    role (its settling side is settle.py's RoleSettling). A lease whose
    renewal (renew.py) failed with LeaseLost or OutcomeUnknown belongs to
    whoever claims the job next: it is logged loudly and never acknowledged
    or retried by us. A poisoned handle is closed and reopened (the tree is
    the truth).

Attempts
    SteadQ/1 counts an attempt when a job is *claimed*. When the daemon is
    stopped by force, running commands are killed and their leases given
    back with an immediate ``retry``: the interrupted run still used up its
    attempt, because that is the spec's (and the reference's) semantics. A
    normal SIGTERM drain lets running commands finish and loses nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from steadqd import progress
from steadqd.backend import Backend, LeaseHandle, PauseState, ReadyWatch
from steadqd.daemon import command_check, metrics, preflight, process
from steadqd.daemon.config import QueueSettings, WorkerConfig
from steadqd.daemon.environment import slot_environment
from steadqd.daemon.journal import INFO, Log, short_id
from steadqd.daemon.service import Loop, Timer, open_queue
from steadqd.daemon.worker import claim, payload, renew
from steadqd.daemon.worker.control import RoleControl
from steadqd.daemon.worker.hooks import Hooks
from steadqd.daemon.worker.policy import Verdict
from steadqd.daemon.worker.progress_watch import ProgressWatch
from steadqd.daemon.worker.run import _Job, exec_helper, fastspawn
from steadqd.daemon.worker.run.child import (
    EXIT_CHECK_RUNNING,
    Starting,
    command_argv,
    identity,
    launch,
    spawned,
    submit,
    terminate,
)
from steadqd.daemon.worker.run.escaped import SPAWN_PUT_OFF, SPAWN_WAIT, RoleSweep
from steadqd.daemon.worker.run.guard import process_guard
from steadqd.daemon.worker.run.hold import Hold, hand_back_unstarted
from steadqd.daemon.worker.run.slots import free_slot
from steadqd.daemon.worker.settle import (
    RoleSettling,
    Settler,
    Tally,
    ticket_text,
)
from steadqd.errors import ConfigError, ErrorKind, LeaseLost, NotCommitted, OutcomeUnknown, SteadQError
from steadqd.text import printable

__all__ = ["SAFETY_RESCAN", "WorkerRole"]


@dataclass(eq=False)
class _Spawning:
    """A job whose command the spawn pool is starting: its slot is held, it is not in ``jobs`` yet."""

    prepared: claim.Prepared
    slot: int
    starting: Starting
    cancel_heard: bool = False  # its lease left the store meanwhile: ask whether a cancel took it


SAFETY_RESCAN = 60.0  # s; the only periodic scan of an idle worker (see the module docstring)
BUSY_RETRY = 1.0  # s; re-lease after MAINTENANCE_BUSY
ERROR_RETRY = 5.0  # s; re-lease / reopen after other errors
READY_DEFER = 0.01  # s; the longest the ready watch goes unread while a claim or a settle runs (_defer_ready)
PREPARE_GRACE = 5.0  # s; how long a forced stop waits for a claim or copy in flight
# s; the longest the claiming or settling thread keeps the GIL once the loop's thread wants it back (CPython's
# default: 5 ms). The loop gives it up at every syscall, several times per job, and a late loop delays every
# running job's output and renewals and the next spawn.
LOOP_SWITCH_INTERVAL = 0.0005


class WorkerRole(RoleSettling, RoleControl, RoleSweep):
    """Runs ``worker.command`` for leased jobs, up to ``worker.concurrency`` at once."""

    name = "worker"

    def __init__(self, settings: QueueSettings, log: Log) -> None:
        if settings.worker is None:
            raise ValueError("WorkerRole needs a `worker:` section")
        self.settings = settings
        self.log = log
        self.loop: Loop | None = None
        self.q: Backend | None = None
        self.jobs: dict[int, _Job] = {}  # by pid
        # Spawns the pool's threads are doing (by token): each holds its slot until it is a job in ``jobs``.
        self._spawning: dict[int, _Spawning] = {}
        self._spawner: fastspawn.Pool | None = None  # None: the loop's thread spawns (the Popen fallback)
        self._sweep_put_off: float | None = None  # since when the escaped-process sweep waits for spawns
        self.draining = False
        self.closed = False
        self.tally = Tally()
        self._switch_interval: float | None = None  # the process's own, restored by close()
        self._ready: ReadyWatch | None = None
        self._prep: claim.Preparer | None = None
        self._fill_again = False  # a fill was asked for while a claim was in flight
        self._fill_timer: Timer | None = None
        # Loop callbacks asked for many times a job: made once for the role, not once a timer.
        self._fill_guarded = self._guarded(self._fill)
        self._hand_over_cb = self._guarded(self._hand_over)
        self._on_ready_cb = self._guarded(self._on_ready)
        self._ready_deferred: Timer | None = None  # the watch is not read while a claim or a settle runs
        self._ready_fd = -1  # the ready watch's descriptor, once it is made
        self._ready_read_at = 0.0  # when the deferred watch was last read (or deferred): READY_DEFER counts from it
        self._resume_ready_cb = self._guarded(self._resume_ready)
        self._rescan_timer: Timer | None = None
        self._reopen_timer: Timer | None = None
        self._sweep_timer: Timer | None = None  # the next look for escaped job processes (process.kill_escaped)
        self._settler: Settler | None = None  # settles finished runs with a handle of its own (daemon/worker/settle.py)
        self.progress: ProgressWatch | None = None  # reads $STEADQ_PROGRESS files, publishes their values
        self._hooks: Hooks | None = None  # running notification commands (on_bury, on_retry)
        self._hold: Hold | None = None  # no new leases while jobs cannot be started (daemon/worker/run/hold.py)
        self._launch_check = command_check.LaunchCheck()  # before each claim batch: can the command start at all?
        # The configuration whose command was last seen to start, unless a start failed since. Until one
        # has, a claim waits for the exec report before it; after, claims overlap the reports. A command
        # that is gone is found before the claim (_launch_check: no attempt used); one that fails to start
        # past that check (removed between the check and its exec) costs its claim's attempt, of one job
        # while unproven and of at most the free slots' jobs when proven, before the hold stops leasing.
        self._proven: WorkerConfig | None = None
        # The queue's pause as the last claim pass read it (steadqd.queue_control); shown in STATUS= and
        # logged when it starts and ends. A paused worker claims again on the ready watch's next news
        # (on a filesystem, the pause record's removal is such news) or at the safety rescan.
        self.paused: PauseState | None = None

    # -- Role protocol ------------------------------------------------------------

    def start(self, loop: Loop) -> None:
        self.loop = loop
        # An inherited SIG_IGN for SIGCHLD would make the kernel reap our children
        # itself, and exit statuses (hence acks) would be lost. No handler: default.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # A job's process that leaves its group (setsid) comes to us when its parent dies, not to init:
        # killed when its job has ended (_sweep_escaped). Without it (an old kernel) only a cgroup holds it.
        if not process.become_subreaper():
            self.log.warning("cannot become a child subreaper: a job's process that calls setsid outlives the job")
        # Before any lease: a command that cannot start would otherwise cost every job an attempt.
        problems = preflight.worker_problems(self.settings)
        fatal = [p for p in problems if not p.transient]
        if fatal:
            more = (
                f" (and {len(fatal) - 1} more: steadqd check-config --open {self.settings.name})" if fatal[1:] else ""
            )
            raise ConfigError(fatal[0].text + more)
        # A SteadQError refuses the start with its exit code; a bucket's store is certified first.
        self.q = open_queue(self.settings, certify=True)
        try:
            self._ready = self.q.ready_watch()
            # The claims and the payload copies have a handle of their own, in their own thread.
            self._prep = claim.Preparer(open_queue(self.settings), lambda: open_queue(self.settings))
            self._settler = Settler(open_queue(self.settings), lambda: open_queue(self.settings))
        except SteadQError:  # e.g. fs.inotify.max_user_instances reached
            self._close_watch()
            self._close_queue()
            raise
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, LOOP_SWITCH_INTERVAL))
        loop.add_reader(self._prep.fileno(), self._guarded(self._on_prepared))
        self._start_spawner(loop)
        loop.add_reader(self._settler.fileno(), self._guarded(self._on_settled))
        # One GIL release to make a copy's directory and files, one to remove them (run/spawn.c), where built.
        payload.use_compiled(fastspawn.remove_copy(), fastspawn.make_copy())
        stale = payload.remove_stale()
        if stale:
            self.log.notice(f"removed {len(stale)} payload copies left by a worker that was killed", count=len(stale))
        self._watch_shards()
        doorbell = getattr(self._ready, "doorbell_problem", None)  # a bucket's watch: why it only polls
        if doorbell:
            self.log.notice(f"{doorbell}: a new job is found by the next idle poll")
        self._ready_fd = self._ready.fileno()  # the watch's, for its life: asked at every deferral and resume
        loop.add_reader(self._ready_fd, self._on_ready_cb)
        self._ready.recount()
        self._rescan_timer = loop.call_later(SAFETY_RESCAN, self._guarded(self._safety_rescan))
        self._hold = Hold(
            loop, self.log, self._guarded, lambda: preflight.worker_problems(self.settings), self._resume_leasing
        )
        if problems:  # only transient ones left (a full TMPDIR): up, but leasing nothing yet
            self._hold.hold(problems[0].text)
        self._hooks = Hooks(loop, self.log, self._guarded)
        publisher, why = progress.Publisher.open(self.q.queue_id)
        if publisher is None:
            self.log.notice(f"job progress is not published ({why}): steadq show cannot show it")
        self.progress = ProgressWatch(publisher, self.log)
        metrics.attach(loop, self.settings, self.log, self.name)
        self._schedule_fill(0.0)  # the first scan runs once the service loop is up (after READY=1)

    def _start_spawner(self, loop: Loop) -> None:
        """The spawn pool, so that the loop does not wait in vfork for each command's exec (fastspawn.Pool)."""
        if not fastspawn.available():
            return
        try:
            self._spawner = fastspawn.pool()
        except OSError as e:
            self.log.warning(f"spawning from the loop's thread: {e}")
            return
        loop.add_reader(self._spawner.fileno(), self._guarded(self._on_spawned))

    @property
    def held(self) -> str | None:
        """Why no job is leased now (a broken environment), if so."""
        return None if self._hold is None else self._hold.reason

    def _resume_leasing(self) -> None:
        self._schedule_fill(0.0)

    @property
    def ready_estimate(self) -> int | None:
        """Ready jobs for STATUS=: listed at each safety rescan, kept current by the watch in between."""
        return None if self._ready is None else self._ready.ready_estimate

    def status(self) -> str:
        ready = "?" if self.ready_estimate is None else f"{self.ready_estimate:,}"
        t = self.tally
        text = f"{len(self.jobs)} running, {ready} ready, {t.done:,} done, {t.failed:,} failed"
        if t.retried:
            text += f", {t.retried:,} retried"
        if self.held is not None:
            text += f", not leasing: {self.held}"
        if self.paused is not None:
            text += f", {self.paused.summary()}"
        if self.draining:
            text += ", draining"
        return text

    def reload(self, settings: QueueSettings) -> str:
        if settings.worker is None:
            return "the new configuration has no `worker:` section; the worker keeps its settings"
        old = self.settings.worker
        self.settings = settings
        new = settings.worker
        assert old is not None
        if old != new:
            self.log.notice(
                "worker configuration reloaded; running jobs keep their settings",
                concurrency=new.concurrency,
                running=len(self.jobs),
            )
        if self._hold is not None:  # the operator may have fixed the cause: look now
            self._hold.check_soon()
        self._schedule_fill(0.0)  # a higher concurrency applies now
        return ""

    def drain(self) -> None:
        self.draining = True
        if self._fill_timer is not None:
            self._fill_timer.cancel()
            self._fill_timer = None

    def running_jobs(self) -> int:
        return len(self.jobs) + len(self._spawning)

    def drained(self) -> bool:
        busy = (self._prep is not None and self._prep.busy) or (self._hooks is not None and self._hooks.busy)
        return not self.jobs and not self._spawning and not busy

    def close(self) -> None:
        """Forced stop: kill what still runs and give its leases back right away."""
        if self.closed:
            return
        self.closed = True
        self.draining = True
        for t in (self._fill_timer, self._rescan_timer, self._reopen_timer, self._sweep_timer, self._ready_deferred):
            if t is not None:
                t.cancel()
        if self._hold is not None:
            self._hold.cancel()
        self._close_settler()  # what it did not start is still in self.jobs with its verdict: settled below
        self._close_preparer()
        self._await_spawns(PREPARE_GRACE)  # a command being started becomes a job, stopped with the others
        for j in list(self.jobs.values()):  # already exited (not yet noticed): settle by exit status
            if j.child.returncode is None and j.child.exited():
                j.child.read_report(wait=True)  # a failed exec is handed back as not started
                if not j.child.released:
                    j.child.reap()
        jobs = list(self.jobs.values())
        finished = {j.pid for j in jobs if j.child.returncode is not None}
        terminate([j.child for j in jobs if j.child.returncode is None])
        for j in jobs:
            try:
                self._shutdown_job(j, interrupted=j.pid not in finished)
            except Exception as e:  # one job must not keep the others' leases
                self.log.error(f"handing back job failed: {e!r}", **j.fields)
        self.jobs.clear()
        if self._hooks is not None:
            self._hooks.close()
        if self.progress is not None:
            self.progress.close()
        self._kill_all_escaped()
        self._close_watch()
        self._close_queue()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)

    def _close_settler(self) -> None:
        if self._settler is None:
            return
        settler, self._settler = self._settler, None
        if self.loop is not None:
            self.loop.remove_reader(settler.fileno())
        done, unstarted = settler.close(PREPARE_GRACE)
        for group in done:
            self._settled(group)
        for it in unstarted:
            cast(_Job, it.owner).settling = False
            payload.remove(it.tmpdir)
        for j in [j for j in self.jobs.values() if j.settling]:  # in a group still in its barriers
            self.log.error(f"settling still running after {PREPARE_GRACE:g}s: recovery decides its outcome", **j.fields)
            self._drop(j)

    def _await_spawns(self, wait: float) -> None:
        """close(): the spawns in flight end within moments (at the child's exec); each becomes a job."""
        spawner = self._spawner
        if spawner is None:
            return
        deadline = time.monotonic() + wait
        self._on_spawned()  # those a sweep read already are not on the descriptor any more
        while self._spawning and time.monotonic() < deadline:
            spawner.wait(deadline - time.monotonic())
            self._on_spawned()
        if self.loop is not None:
            self.loop.remove_reader(spawner.fileno())
        self._spawner = None
        for s in self._spawning.values():  # stuck before its exec (a working directory that hangs)
            lease = s.prepared.lease
            assert lease is not None
            self.log.error(
                f"a command still not started after {wait:g}s is abandoned: its lease expires and recovery returns"
                " the job; the worker's exit kills it (parent-death signal, guard)",
                job_id=lease.job_id,
            )
        self._spawning.clear()

    def _close_preparer(self) -> None:
        if self._prep is None:
            return
        if self.loop is not None:
            self.loop.remove_reader(self._prep.fileno())
        for done in self._prep.close(PREPARE_GRACE):
            try:
                self._hand_back(done)
            except Exception as e:  # one job must not keep the others' leases
                self.log.error(f"handing back job failed: {e!r}")
        if self._prep.stuck:
            self.log.warning(
                f"a claim still hashing a payload after {PREPARE_GRACE:g}s is abandoned; its lease expires"
                " and recovery returns the job"
            )
        self._prep = None

    # -- plumbing -------------------------------------------------------------

    def _guarded(self, fn: Callable[[], None], job: _Job | None = None) -> Callable[[], None]:
        """A loop callback that logs instead of raising: one bad job must not kill the daemon."""

        def run() -> None:
            try:
                fn()
            except Exception as e:
                fields = job.fields if job is not None else {}
                self.log.error(f"internal error in {getattr(fn, '__name__', 'callback')}: {e!r}", **fields)
                if job is not None:
                    self._abandon(job, f"internal error: {e!r}")

        return run

    def _schedule_fill(self, delay: float) -> None:
        if self.loop is None or self.draining:
            return
        # Now: at the end of this loop pass (a call_soon's time is -inf: before any), no clock reading.
        when = self.loop.now() + delay if delay > 0.0 else float("-inf")
        pending = self._fill_timer
        if pending is not None and not pending.cancelled:
            if pending.when <= when:
                return
            pending.cancel()
        if delay > 0.0:
            self._fill_timer = self.loop.call_at(when, self._fill_guarded)
        else:
            self._fill_timer = self.loop.call_soon(self._fill_guarded)

    # -- wake-ups ---------------------------------------------------------------

    def _watch_shards(self) -> None:
        assert self._ready is not None
        for failure in self._ready.watch_missing():
            self.log.warning(f"{failure}; the safety rescan retries")

    def _close_watch(self) -> None:
        if self._ready is not None:
            if self.loop is not None:
                self.loop.remove_reader(self._ready.fileno())
            self._ready.close()
            self._ready = None

    def _defer_ready(self) -> None:
        """Stop reading the ready watch while the claiming thread claims or the settling thread settles:
        their own renames into and out of ``ready/`` would wake the loop once or twice a batch, each time
        taking the GIL from that thread in the middle of its work. The events wait in the watch and are
        read with the results (:meth:`_ready_with_results`), or :data:`READY_DEFER` after the last read at
        the latest (a long copy, a slow barrier): a cancel or a pause is heard that late."""
        if self._ready_deferred is not None or self._ready is None or self.loop is None:
            return
        self.loop.remove_reader(self._ready_fd)
        self._ready_read_at = now = self.loop.now()
        self._ready_deferred = self.loop.call_at(now + READY_DEFER, self._resume_ready_cb)

    def _ready_with_results(self) -> None:
        """A claim's or a settle's results are in: once neither thread works in the tree any more, the
        watch goes back on the loop and what it gathered is read in this pass (:meth:`_defer_ready`);
        while one still does, it is read in this pass only if its deadline is half gone."""
        if self._ready_deferred is None:
            return
        if (self._prep is not None and self._prep.busy) or (self._settler is not None and self._settler.busy):
            # Not read at each result: its syscall hands the GIL to the thread still working (futex a job).
            # Read once half the deadline is gone, and the deadline restarted: its timer's own pass is rare.
            assert self.loop is not None and self._ready is not None
            now = self.loop.now()
            if now - self._ready_read_at >= READY_DEFER / 2:
                self._ready_read_at = now
                self._ready_deferred.cancel()
                self._ready_deferred = self.loop.call_at(now + READY_DEFER, self._resume_ready_cb)
                self._on_ready_cb()
            return
        self._resume_ready()

    def _resume_ready(self) -> None:
        """Read the ready watch again, and what it gathered meanwhile now (:meth:`_defer_ready`)."""
        if self._ready_deferred is None:
            return
        self._ready_deferred.cancel()
        self._ready_deferred = None
        if self._ready is None or self.loop is None:
            return
        self.loop.add_reader(self._ready_fd, self._on_ready_cb)
        self._on_ready_cb()

    def _on_ready(self) -> None:
        assert self._ready is not None
        news = self._ready.read()
        if news.overflowed:
            self.log.warning("inotify queue overflowed; rescanning")
        if news.appeared or news.overflowed:
            self._schedule_fill(0.0)
        if news.left:
            self._check_cancels(news.left)
        if news.rung:  # a bucket's doorbell: perhaps a same-host cancel wrote a request (s3/cancel.py)
            for job in list(self.jobs.values()):
                self._check_cancelled(job)
        if (news.left or news.rung) and self._spawning and self.q is not None:  # asked once they are jobs
            for s in self._spawning.values():
                lease = s.prepared.lease
                if news.rung or (lease is not None and self.q.lease_key(lease) in news.left):
                    s.cancel_heard = True

    def _safety_rescan(self) -> None:
        assert self.loop is not None
        self._rescan_timer = self.loop.call_later(SAFETY_RESCAN, self._guarded(self._safety_rescan))
        self._sweep_escaped()  # one that exited by itself is reaped here at the latest
        if self._ready is not None:
            self._watch_shards()
            self._ready.recount()
        self._schedule_fill(0.0)

    # -- leasing ------------------------------------------------------------------

    def _fill(self) -> None:
        """Ask the preparing thread for the next job; its answer arrives in :meth:`_on_prepared`."""
        self._fill_timer = None
        cfg = self.settings.worker
        assert cfg is not None
        busy = self._slots_taken()
        if self.draining or self.closed or self._prep is None or busy >= cfg.concurrency:
            return
        if self._hold is not None and self._hold.reason is not None:  # held (self.held): its own timer looks again
            return
        unproven = self._proven is not cfg and (self._spawning or any(j.child.starting for j in self.jobs.values()))
        if self._prep.busy or unproven:
            self._fill_again = True  # after the claim, or the exec report of an unproven command (see _proven)
            return
        if self.q is None:  # no handle to renew and settle with: claim nothing until it is back
            self._schedule_reopen()
            return
        self._fill_again = False
        try:
            credentials = identity(cfg)
        except (KeyError, ValueError) as e:  # a user or group that vanished since the config was read
            if self._hold is not None:
                self._hold.hold(f"cannot run jobs as the configured user or group: {e}")
            return
        if not self._launch_check.looks_startable(cfg):  # before the claim: a claim's attempt is never given back
            problems = preflight.worker_problems(self.settings)  # as the job's user: the line to hold on
            if problems and self._hold is not None:
                self._hold.hold(problems[0].text)
                return
        # A proven command's free slots are claimed together, under one barrier; an unproven one's one by one.
        free = cfg.concurrency - busy if self._proven is cfg else 1
        self._defer_ready()
        self._prep.submit(cfg, self.settings, credentials, free)

    def _slots_taken(self) -> int:
        """Jobs that count against ``concurrency``: all but those whose command ended and the settling
        thread holds. Their fsyncs then overlap the next jobs' claims and runs instead of keeping a slot;
        one that comes back unsettled (NotCommitted) takes its slot again while it waits to retry, so a
        disk that cannot settle does not let finished runs pile up."""
        return len(self._spawning) + sum(1 for j in self.jobs.values() if not j.settling)

    def _on_prepared(self) -> None:
        assert self._prep is not None
        for done in self._prep.collect():
            self._take(done)
        self._ready_with_results()
        if self._fill_again:
            self._schedule_fill(0.0)

    def _take(self, p: claim.Prepared) -> None:
        if p.poisoned is not None:
            self.log.error(f"queue handle poisoned ({p.poisoned}); a new one claims the next job")
        if p.lease_error is not None:
            self._fill_again = False  # the retry waits as _lease_failed says, whatever arrived
            self._lease_failed(p.lease_error)
            return
        if p.scan is not None:
            claim.report_scan(self.log, p.scan)
        lease = p.lease
        if lease is not None or p.error is None:
            self._note_pause(p.paused)
        if lease is None:
            if p.error is not None:
                self._fill_again = False
                self.log.error(f"internal error claiming a job: {p.error!r}")
                self._schedule_fill(ERROR_RETRY)
            return
        self._fill_again = True  # there was a job: there may be more
        if p.error is not None:
            self._prepare_failed(lease, p.cfg, p.error)
        else:
            self._start_job(p)

    def _lease_failed(self, e: SteadQError) -> None:
        if isinstance(e, NotCommitted) and e.kind is ErrorKind.MAINTENANCE_BUSY:
            self._schedule_fill(BUSY_RETRY)
            return
        self.log.error(f"lease failed: {e}", error=e.kind.label)
        self._schedule_fill(BUSY_RETRY if isinstance(e, OutcomeUnknown) else ERROR_RETRY)

    # -- starting a job -------------------------------------------------------------

    def _start_job(self, p: claim.Prepared) -> None:
        """Spawn the command; it counts as started once its exec is reported (:meth:`_on_report`)."""
        assert self.loop is not None and p.lease is not None
        lease, cfg = p.lease, p.cfg
        if self._cancelled(lease):  # cancelled while it was being claimed (a bucket's delayed job: when claimed)
            payload.remove(p.tmpdir)
            self.log.info(f"job {short_id(lease.job_id)} cancelled before its command started", job_id=lease.job_id)
            metrics.job_cancelled(0)
            self._schedule_fill(0.0)
            return
        slot = free_slot(self.jobs.values(), [s.slot for s in self._spawning.values()])
        p.env.update(slot_environment(cfg, slot))
        try:
            if self._spawner is not None:  # the pool's thread waits for the exec; the loop goes on
                starting = submit(self._spawner, cfg, p.env, p.payload_path, p.credentials)
                self._spawning[starting.token] = _Spawning(p, slot, starting)
                return
            proc, report = launch(cfg, p.env, p.payload_path, p.credentials)
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            payload.remove(p.tmpdir)
            self._start_failed(lease, cfg, f"cannot start the command {printable(command_argv(cfg)[0])!r}: {e}")
            return
        self._run_job(p, slot, proc, report)

    def _starting_pids(self) -> list[int] | None:
        if self._spawner is None or not self._spawning:
            self._sweep_put_off = None
            return []
        now = time.monotonic()
        if self._sweep_put_off is None:
            self._sweep_put_off = now
        if now - self._sweep_put_off < SPAWN_PUT_OFF:
            return None  # put off: the loop collects the spawns meanwhile
        pids = self._spawner.started_pids(SPAWN_WAIT)
        if pids is not None:
            self._sweep_put_off = None
        if self._spawner.uncollected and self.loop is not None:  # their tokens are read: the reader stays quiet
            self.loop.call_soon(self._guarded(self._on_spawned))
        return pids

    def _on_spawned(self) -> None:
        """The spawn pool has started commands (or failed to): each becomes a running job (or a start failure)."""
        if self._spawner is None:
            return
        for token, result in self._spawner.collect():
            s = self._spawning.pop(token, None)
            if s is None:  # not this role's (never, with one role per process): its command must not run on
                if isinstance(result, fastspawn.Spawned):
                    self._kill_stray(result)
                continue
            try:  # _guarded's rule without a wrapper made for each spawn: its line, the loop goes on
                self._spawn_done(s, result)
            except Exception as e:
                self.log.error(f"internal error in callback: {e!r}")

    def _kill_stray(self, proc: fastspawn.Spawned) -> None:
        """A command started for no job of ours (a spawn a stop gave up on): killed, its guard line taken back
        while its pid is still pinned, reaped."""
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        process_guard().failed(proc.pid)
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

    def _spawn_done(self, s: _Spawning, result: fastspawn.Spawned | OSError) -> None:
        p, cfg = s.prepared, s.prepared.cfg
        assert p.lease is not None
        try:
            proc = spawned(s.starting, result)
        except OSError as e:
            payload.remove(p.tmpdir)
            self._start_failed(p.lease, cfg, f"cannot start the command {printable(command_argv(cfg)[0])!r}: {e}")
            return
        job = self._run_job(p, s.slot, proc, None)
        if s.cancel_heard:
            self._check_cancelled(job)

    def _run_job(self, p: claim.Prepared, slot: int, proc: fastspawn.Process, report: int | None) -> _Job:
        """The command was spawned: follow it, renew its lease; it counts as started at its exec report."""
        assert self.loop is not None and p.lease is not None
        lease, cfg = p.lease, p.cfg
        job = _Job(self, lease, cfg, proc, p.tmpdir, report, slot, p.env, p.credentials)
        self.jobs[job.pid] = job
        job.child.start()
        if self.progress is not None:
            self.progress.start(job)
        # The claim and the copy took time: the first renewal is due an interval after the last (if past: now).
        job.timers.set_at("renew", p.renewed + cfg.renew_interval, lambda: self._renew(job))
        if report is None:
            self._on_report(job, b"")
        return job

    def _on_report(self, job: _Job, report: bytes) -> None:
        """The helper's report: the command runs (``job started``), or its exec failed (a start failure)."""
        lease, cfg = job.lease, job.cfg
        err = exec_helper.start_error(report, command_argv(cfg)[0]) if report else None  # b"": it runs
        if err is None:
            self._proven = cfg
            if self._hold is not None:
                self._hold.job_started()
            self.log.log(
                INFO,
                f"job {short_id(lease.job_id)} started (attempt {lease.attempt}/{lease.max_attempts}, pid {job.pid})",
                **job.fields,
                pid=job.pid,
                max_attempts=lease.max_attempts,
            )
            if self._fill_again:
                self._schedule_fill(0.0)
            return
        job.child.kill()  # the helper exits right after its report: reap it, close its pipes
        self._drop(job)  # the next fill finds the hold _start_failed sets
        payload.remove(job.tmpdir)
        self._start_failed(lease, cfg, f"cannot start the command {printable(command_argv(cfg)[0])!r}: {err}")

    def _prepare_failed(self, lease: LeaseHandle, cfg: WorkerConfig, e: BaseException) -> None:
        """The claimed job could not be made ready to run (its copy is already gone)."""
        fields = {"job_id": lease.job_id, "attempt": lease.attempt}
        if isinstance(e, (LeaseLost, OutcomeUnknown)):
            self.log.error(f"lost the job while preparing it: {e}", **fields)
        elif isinstance(e, SteadQError) and (getattr(e, "payload", False) or e.kind is ErrorKind.PAYLOAD_CORRUPT):
            self.tally.failed += 1
            # The claim verified it: it changed since, and is quarantined now or at its next claim.
            self.log.error(f"payload changed after its claim and is corrupt; the job is quarantined: {e}", **fields)
        else:
            self._start_failed(lease, cfg, f"cannot prepare the job: {e if isinstance(e, SteadQError) else repr(e)}")

    def _start_failed(self, lease: LeaseHandle, cfg: WorkerConfig, why: str) -> None:
        """The worker's fault, not the job's: the job goes back at once and leasing holds (daemon/worker/run/hold.py)."""
        self.log.error(f"job {short_id(lease.job_id)} not started: {why}", job_id=lease.job_id, attempt=lease.attempt)
        self._proven = None
        metrics.job_failed_to_start()
        unknown = hand_back_unstarted(self.q, lease, self.log)
        if unknown is not None:
            why = f"handing the job back: outcome unknown: {unknown}"
            self.log.error(why, job_id=lease.job_id, ticket=ticket_text(unknown))
            self._reopen(str(unknown))
        if self._hold is not None and not self.closed:
            self._hold.hold(why)

    def _hand_back(self, p: claim.Prepared) -> None:
        """close(): a job claimed but never started goes back at once (its attempt is counted)."""
        payload.remove(p.tmpdir)
        if p.lease is None:
            return
        if p.error is not None and not isinstance(p.error, claim.Stopped):
            self._prepare_failed(p.lease, p.cfg, p.error)
            return
        self.log.warning("job handed back on stop before its command started", job_id=p.lease.job_id)
        self._settle_simple(p.lease, p.cfg, Verdict.RETRY)

    # -- renewing -------------------------------------------------------------------

    def _renew(self, job: _Job) -> None:
        if job.lost is not None or job.pid not in self.jobs or job.settling:
            return
        if self.q is None:
            self._schedule_reopen()
        else:
            if self._check_cancelled(job):  # a bucket's holder hears of a cancel here (s3/cancel.py)
                return
            r = renew.renew(self.q, job.lease, job.cfg.lease)
            job.lease = r.lease  # the one to settle with: a bucket's renewal is a new generation (renew.py)
            if r.lost:
                if self._check_cancelled(job):
                    return
                self._lose(job, f"renewal: lease lost: {r.error}")
                return
            if r.unknown:  # the spawner takes it for lost: whoever claims the job next owns it
                self._lose(job, f"renewal outcome unknown: {r.error}")
                self._reopen(f"renew: {r.error}")
                return
            if r.error is not None:  # not committed: the lease is still ours; tried again one interval later
                self.log.warning(
                    f"lease renewal not committed; retrying in {job.cfg.renew_interval:g}s: {r.error}", **job.fields
                )
                if r.error.kind is ErrorKind.QUEUE_POISONED:
                    self._reopen(f"renew: {r.error}")
        job.timers.set("renew", job.cfg.renew_interval, lambda: self._renew(job))

    def _finish(self, job: _Job) -> None:
        """The command has ended: a cancelled job's is only reported (control.py), any other's settled."""
        if job.cancelled:
            self._finish_cancelled(job)
        else:
            super()._finish(job)

    def _lose(self, job: _Job, reason: str) -> None:
        job.lost = reason
        job.timers.cancel("renew")
        when = "while the command runs" if job.child.returncode is None else "before the run was settled"
        self.log.error(
            f"LEASE LOST {when}: the job may run again elsewhere; this run will not be settled",
            **job.fields,
            reason=reason,
        )

    def _drop(self, job: _Job, *, settled: bool = False) -> None:
        """Forget the job; its slot is free. ``settled``: a run the settling thread settled, whose progress
        stopped at its end (_finish) and whose slot was freed, and a fill asked for, when it was handed over
        (_settle; _slots_taken skips a settling job): neither is done again."""
        if self.progress is not None and not settled:
            self.progress.stop(job)
        job.timers.cancel_all()
        job.child.release()
        self.jobs.pop(job.pid, None)
        if not settled:
            self._schedule_fill(0.0)

    def _abandon(self, job: _Job, why: str) -> None:
        """After an internal error: make sure the job cannot hang the role forever."""
        if job.pid not in self.jobs or job.settling:  # the settling thread reports it
            return
        child = job.child
        with contextlib.suppress(Exception):
            if child.returncode is None and child.exited():
                child.reap()
        if child.returncode is not None and job.verdict is None:
            with contextlib.suppress(Exception):
                self._finish(job)
                return
        if child.returncode is None:  # still running: keep it; its timers and pipes still drive it
            if not child.timers and not job.timers:
                child.timers.set("exit", EXIT_CHECK_RUNNING, child.check_exit)
            return
        self.log.error(f"dropping the job after an internal error ({why}); the lease will expire", **job.fields)
        self._drop(job)

    def _shutdown_job(self, job: _Job, *, interrupted: bool) -> None:
        """close(): reap, then hand an interrupted job's lease back; settle a finished one."""
        if self.progress is not None:
            self.progress.stop(job)
        job.timers.cancel_all()
        job.child.kill()
        payload.remove(job.tmpdir)
        if job.lost is not None:
            return
        if self.q is None:
            self._reopen_now()
        if self.q is None:
            self.log.error("cannot hand the job back: queue not open; recovery returns it", **job.fields)
            return
        if not interrupted:
            if job.verdict is None:
                job.verdict = self._verdict(job)
            follow = self._apply(job.lease, job.cfg, job.verdict, job.child.ended)
            if job.run_fields:
                self._report_finished(job, follow)
            else:
                self._log_follow_up(job.lease, follow)
            return
        state = self.q.retry(job.lease)
        how = f"killed by {job.child.signal_name}" if job.child.signal_name else f"ended (exit {job.child.returncode})"
        self.log.warning(
            f"job handed back on stop: {state} (its attempt is counted) after a forced stop: "
            f"job {short_id(job.lease.job_id)} was {how}, attempt {job.lease.attempt}/{job.lease.max_attempts}",
            **job.fields,
            state=state,
        )

    # -- the queue handle -----------------------------------------------------------

    def _reopen(self, why: str) -> None:
        """A poisoned handle: close it and open a fresh one (the tree is the truth)."""
        self.log.error(f"queue handle poisoned ({why}); reopening the queue")
        self._close_queue()
        self._reopen_now()

    def _close_queue(self) -> None:
        """Drop the handle; closing a poisoned or failing one may fail too, and nothing depends on it."""
        if self.q is not None:
            with contextlib.suppress(SteadQError, OSError):
                self.q.close()
            self.q = None

    def _reopen_now(self) -> None:
        if self.q is not None or self.closed:
            return
        try:
            self.q = open_queue(self.settings)
        except SteadQError as e:
            self.log.error(f"cannot reopen the queue: {e}; trying again in {ERROR_RETRY:g}s")
            self._schedule_reopen()
            return
        self.log.notice("queue reopened")
        self._schedule_fill(0.0)

    def _schedule_reopen(self) -> None:
        if self.loop is None or (self._reopen_timer is not None and not self._reopen_timer.cancelled):
            return

        def again() -> None:
            self._reopen_timer = None
            self._reopen_now()

        self._reopen_timer = self.loop.call_later(ERROR_RETRY, self._guarded(again))
