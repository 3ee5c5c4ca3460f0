"""The worker: its consumer threads run handlers on leased jobs, its renewing thread keeps their leases
and publishes their progress, and a stop drains them or hands them back. On a bucket queue one claiming
thread leases for all the others (steadqd.tasks.feeder)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from steadqd import progress as progress_mod
from steadqd.backend import Backend, LeaseHandle, PauseState, init_queue, is_bucket_url, open_queue
from steadqd.backoff import RetryPolicy
from steadqd.constants import DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_MAX_S
from steadqd.daemon.worker.renew import Renewal, interval, renew
from steadqd.errors import InvalidInput, LeaseLost, OutcomeUnknown, SteadQError
from steadqd.tasks import journal as journal_mod
from steadqd.tasks.consumer import Consumer
from steadqd.tasks.feeder import Feeder
from steadqd.tasks.job import Bury, Job, Retry, WorkStats
from steadqd.tasks.journal import JournalHandler, about, log
from steadqd.text import printable

DEFAULT_RETRY = RetryPolicy(base_ms=round(DEFAULT_BACKOFF_BASE_S * 1000), cap_ms=round(DEFAULT_BACKOFF_MAX_S * 1000))
ERROR_PAUSE = 1.0  # s between attempts when the queue itself fails (not one job)


@dataclass(eq=False)
class _Running:
    """One job between its lease and its settlement; ``lock`` orders renewals against the settle."""

    lease: LeaseHandle
    job: Job
    next_renew: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    settling: bool = False  # the handler returned: no more renewals
    published: tuple[float, str] | None = None  # the progress last published (Job.progress)
    cancel: Callable[[], object] | None = None  # the async form cancels the handler's task

    def lose(self, why: str) -> None:
        if not self.job.lease_lost:
            self.job._lost.set()
            log.warning("job %s lost its lease: %s", self.job.id, printable(why))


Call = Callable[[Job], object]  # runs the handler, returns its result or raises what it raised


class Worker:
    """Leases jobs from ``queue`` and runs ``handler`` on them, ``concurrency`` at a time."""

    def __init__(
        self,
        queue: str,
        handler: Callable[[Job], object],
        *,
        concurrency: int = 1,
        lease: float = 30.0,
        renew_every: float | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        poll: float = 1.0,
        drain_timeout: float | None = None,
        open_options: Mapping[str, Any] | None = None,
        create: bool = False,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInput(f"concurrency must be a positive integer, got {concurrency!r}")
        for name, value in (("lease", lease), ("poll", poll)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidInput(f"{name} must be a positive number of seconds, got {value!r}")
        renew = interval(lease, renew_every)
        if isinstance(renew, bool) or not isinstance(renew, int | float) or not 0 < renew < lease:
            raise InvalidInput(f"renew_every must be positive and shorter than the lease ({lease:g}s), got {renew!r}")
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.lease_s = float(lease)
        self.renew_s = float(renew)
        self.retry = retry
        self.poll = float(poll)
        self.drain_timeout = drain_timeout
        self.open_options = dict(open_options or {})
        self.create = create
        self.stats = WorkStats()
        self.paused: PauseState | None = None  # the queue's pause as a consumer last read it (steadq pause)
        self._stop = threading.Event()
        self._abandon = threading.Event()  # hand running leases back now
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()  # guards _running and stats
        self._wake_renewer = threading.Event()
        self._renewer_wakes_at = 0.0  # monotonic end of the renewer's current wait (under _lock)
        self._done = threading.Event()  # workers joined (or abandoned): the renewer ends
        self._publisher: progress_mod.Publisher | None = None  # Job.progress's (renewing thread only)
        self._publisher_failed = False

    # -- running -----------------------------------------------------------------------

    def run(self) -> WorkStats:
        """Serve until SIGTERM/SIGINT or :meth:`stop`; the signals are taken only in the main thread."""
        restore: list[tuple[int, Any]] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                restore.append((sig, signal.signal(sig, self._on_signal)))
        try:
            return self._serve(self._call_sync)
        finally:
            for signum, old in restore:
                signal.signal(signum, old)

    async def run_async(self) -> WorkStats:
        """The asyncio form: ``handler`` is a coroutine function run on this event loop.

        The queue's calls are blocking syscalls; they run in the worker's own
        threads, and only the handlers run on the loop.
        """
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._signalled)
                installed.append(sig)
        try:
            return await asyncio.to_thread(self._serve, functools.partial(self._call_async, loop))
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)

    def stop(self) -> None:
        """Stop leasing; running handlers finish (or are handed back after ``drain_timeout``)."""
        self._stop.set()

    def abandon(self) -> None:
        """Stop now: hand the running jobs' leases back without waiting for their handlers."""
        self._stop.set()
        self._abandon.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signalled()

    def _signalled(self) -> None:
        if self._stop.is_set():
            log.warning("second stop signal: handing the running jobs back now")
            self.abandon()
        else:
            log.info("stopping: draining %d running jobs (signal again to hand them back now)", len(self._running))
            self.stop()

    def _serve(self, call: Call) -> WorkStats:
        self._check_queue()
        journal = None
        if journal_mod.journal_connected() and not logging.getLogger().handlers and not log.handlers:
            journal = JournalHandler(self.queue)
            log.addHandler(journal)
        try:
            return self._serve_checked(call)
        finally:
            if journal is not None:
                log.removeHandler(journal)

    def _check_queue(self) -> None:
        """Open the queue once before serving. One that cannot be opened at all (a typo, never made) is
        one error raised to the caller: every later failure is retried (a queue that was working is
        worth waiting for), but this one would print the same line every second forever. With
        ``create`` a missing queue is made first, as rq and huey make theirs."""
        try:
            open_queue(self.queue, **self.open_options).close()
            return
        except SteadQError as e:
            if not self.create:
                log.error("cannot open the queue %s: %s (create it with `steadq init %s`, or give create=True)",
                          printable(self.queue), e, printable(self.queue))  # fmt: skip
                raise
            cause = e
        try:
            init_queue(self.queue, **self.open_options).close()
            log.info("created the queue %s", printable(self.queue))
        except SteadQError as e:
            try:  # made meanwhile by another worker: that one is fine
                open_queue(self.queue, **self.open_options).close()
            except SteadQError:
                log.error("cannot open the queue %s (%s), nor create it: %s", printable(self.queue), cause, e)
                raise e from cause

    def _serve_checked(self, call: Call) -> WorkStats:
        renewer = threading.Thread(target=self._renew_loop, name="steadqd-renew", daemon=True)
        feeder = Feeder(self) if is_bucket_url(self.queue) else None
        loop = self._work_loop if feeder is None else feeder.run_loop
        workers = [
            threading.Thread(target=loop, args=(call,), name=f"steadqd-work-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        claimer = None
        if feeder is not None:
            claimer = threading.Thread(target=feeder.feed_loop, name="steadqd-claim", daemon=True)
        renewer.start()
        for t in workers:
            t.start()
        if claimer is not None:
            claimer.start()
        self._stop.wait()
        if claimer is not None:
            claimer.join()  # no claim after this; one made as the stop came went back at once
        deadline = None if self.drain_timeout is None else time.monotonic() + self.drain_timeout
        for t in workers:
            while t.is_alive() and not self._abandon.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    log.warning("drain timeout: handing the running jobs back")
                    self._abandon.set()
                    break
                t.join(0.1)
        if self._abandon.is_set():
            self._hand_back()
        if feeder is not None:
            feeder.release_unstarted()
            if not any(t.is_alive() for t in workers):  # an abandoned handler's thread may still hold it
                feeder.close()
        self._done.set()
        self._wake_renewer.set()
        renewer.join()
        return self.stats

    # -- one worker thread -----------------------------------------------------------------

    def _work_loop(self, call: Call) -> None:
        c = Consumer(self)
        try:
            while not self._stop.is_set():
                lease = c.lease()
                if lease is None:
                    continue
                if self._stop.is_set():
                    assert c.q is not None
                    self._give_back(c.q, lease, "the worker is stopping")
                    continue
                assert c.q is not None
                if self._one_job(c.q, lease, call) is None:
                    c.close()  # the handle can no longer be trusted: a new one next time
        finally:
            c.close()

    def _claimed(self, lease: LeaseHandle) -> _Running:
        """A job claimed for a thread that has not started it (steadqd.tasks.feeder): renewed from now on
        like a running one, and given back by a forced stop; its Job gets the payload when a thread reads it."""
        job = Job(lease.job_id, lease.attempt, lease.max_attempts, lease.content_type, lease.metadata, b"")
        running = _Running(lease, job, time.monotonic() + self.renew_s)
        self._register(running)
        return running

    def _register(self, running: _Running) -> None:
        """Hand a job to the renewing thread; woken only if the job is due before it wakes anyway.

        Why not wake it for every job: on a bucket each wake is two thread
        switches and a GIL hand-off per job, to learn of a renewal due a
        third of a lease later. The renewer sets its wake time under the
        same lock as it reads the jobs, so a job it did not see is compared
        with the wait it is in.
        """
        with self._lock:
            self._running[running.job.id] = running
            wake = running.next_renew < self._renewer_wakes_at
        if wake:
            self._wake_renewer.set()

    def _forget(self, running: _Running) -> None:
        with self._lock:
            if self._running.get(running.job.id) is running:
                del self._running[running.job.id]

    def _one_job(self, q: Backend, lease: LeaseHandle, call: Call, claimed: _Running | None = None) -> Backend | None:
        """Read, run and settle one job; ``claimed``: registered at its claim (``_claimed``), whose lease
        may have been renewed, or lost, since. None when the handle can no longer be trusted."""
        if claimed is not None:
            with claimed.lock:
                lease, lost = claimed.lease, claimed.job.lease_lost
            if lost:
                self._forget(claimed)
                self._count("lost")
                log.warning("job %s lost its lease before it was started", lease.job_id)
                return q
        try:
            payload = q.read_payload(lease)
        except LeaseLost as e:
            self._count("lost")
            log.warning("job %s lost its lease before its payload was read: %s", lease.job_id, e)
            return self._unclaim(claimed, q)
        except SteadQError as e:
            if getattr(e, "payload", False):
                self._count("quarantined")
                log.error("job %s has a corrupt payload; the queue quarantined it: %s", lease.job_id, e)
                return self._unclaim(claimed, q)
            self._unclaim(claimed, q)  # not renewed any more: the lease expires and the job is taken again
            return q if self._after_error(q, f"read the payload of {lease.job_id}", e) else None
        if claimed is None:
            job = Job(lease.job_id, lease.attempt, lease.max_attempts, lease.content_type, lease.metadata, payload)
            running = _Running(lease, job, time.monotonic() + self.renew_s)
            self._register(running)
        else:
            running = claimed
            with running.lock:
                was = running.job
                job = Job(
                    was.id, was.attempt, was.max_attempts, was.content_type, was.metadata, payload, _lost=was._lost
                )
                running.job = job
        outcome: BaseException | None = None
        try:
            call(job)
        except BaseException as e:  # noqa: BLE001 - every handler failure becomes a settle
            outcome = e
        with running.lock:
            running.settling = True
            lease = running.lease
            self._unpublish(running)
        with self._lock:
            self._running.pop(job.id, None)
        if job.lease_lost:
            self._count("lost")
            log.warning("job %s finished after its lease was lost; not settled (its new owner decides)", job.id)
            return q
        if outcome is not None and not isinstance(outcome, Exception):
            # SystemExit or KeyboardInterrupt from a handler: retried like a failure, and
            # the whole worker stops (raising it would only end this thread).
            log.warning("job %s raised %s; stopping the worker", job.id, type(outcome).__name__)
            self.stop()
        return self._settle(q, lease, outcome)

    def _unclaim(self, claimed: _Running | None, q: Backend) -> Backend:
        if claimed is not None:
            with claimed.lock:
                claimed.settling = True
            self._forget(claimed)
        return q

    def _settle(self, q: Backend, lease: LeaseHandle, outcome: BaseException | None) -> Backend | None:
        job_id = lease.job_id
        try:
            if outcome is None:
                q.ack(lease)
                self._count("acked")
                log.info("job %s finished: ack (attempt %d/%d)", job_id, lease.attempt, lease.max_attempts,
                         extra=about(job_id))  # fmt: skip
            elif isinstance(outcome, Bury):
                q.bury(lease, outcome.reason)
                self._count("buried")
                log.warning("job %s buried (reason 0x%04x): %s", job_id, outcome.reason, printable(str(outcome)),
                            extra=about(job_id))  # fmt: skip
            else:
                if isinstance(outcome, Retry):
                    state = q.retry(lease, outcome.delay)
                else:
                    state = q.retry(lease, policy=self.retry)
                self._count("buried" if state == "dead" else "retried")
                what = "buried: attempts exhausted" if state == "dead" else f"retry ({state})"
                log.warning(
                    "job %s failed on attempt %d/%d, %s: %s",
                    job_id,
                    lease.attempt,
                    lease.max_attempts,
                    what,
                    printable(f"{type(outcome).__name__}: {outcome}"),
                    extra=about(job_id),
                )
        except LeaseLost as e:
            self._count("lost")
            log.warning("job %s: settling failed, the lease was lost: %s", job_id, e)
        except SteadQError as e:
            return q if self._after_error(q, f"settle {job_id}", e) else None
        return q

    # -- renewals --------------------------------------------------------------------------

    def _renew_loop(self) -> None:
        q: Backend | None = None
        try:
            while not self._done.is_set():
                now = time.monotonic()
                with self._lock:
                    due = [r for r in self._running.values() if r.next_renew <= now]
                for r in due:
                    if q is None:
                        q = self._open("renew")
                    if q is not None:
                        q = self._renew(q, r)
                self._publish_progress()
                with self._lock:
                    upcoming = min((r.next_renew for r in self._running.values()), default=now + 1.0)
                    self._renewer_wakes_at = wakes_at = min(time.monotonic() + 1.0, upcoming)
                self._wake_renewer.wait(max(0.0, wakes_at - time.monotonic()))
                self._wake_renewer.clear()
        finally:
            if q is not None:
                q.close()
            if self._publisher is not None:
                self._publisher.close()
                self._publisher = None

    def _publish_progress(self) -> None:
        """Publish each running job's latest :meth:`Job.progress` if it changed (at most once a loop, ≤ 1/s)."""
        with self._lock:
            running = [r for r in self._running.values() if r.job._progress]
        for r in running:
            with r.lock:
                value = r.job._progress[-1] if r.job._progress else None
                if r.settling or value is None or value == r.published:
                    continue
                pub = self._progress_publisher()
                if pub is None:
                    return
                try:
                    pub.publish(r.job.id, *value)
                    r.published = value
                except OSError as e:
                    log.warning("cannot publish the progress of job %s: %s", r.job.id, e)

    def _progress_publisher(self) -> progress_mod.Publisher | None:
        if self._publisher is None and not self._publisher_failed:
            queue_id = self._queue_id()
            if queue_id is not None:
                self._publisher, why = progress_mod.Publisher.open(queue_id)
                if self._publisher is None:
                    log.info("job progress is not published (%s)", printable(why or ""))
            self._publisher_failed = self._publisher is None
        return self._publisher

    def _queue_id(self) -> str | None:
        q = self._open("progress")
        if q is None:
            return None
        try:
            return q.queue_id
        finally:
            q.close()

    def _unpublish(self, r: _Running) -> None:
        """The job has ended: its progress goes (called once ``settling`` is set, under its lock)."""
        if r.published is not None and self._publisher is not None:
            self._publisher.remove(r.job.id)

    def _renew(self, q: Backend, r: _Running) -> Backend | None:
        with r.lock:
            if r.settling or r.job.lease_lost:
                return q
            try:
                renewal = renew(q, r.lease, self.lease_s)
            except SteadQError as e:  # not a renewal's outcome: a failure of the queue, handled alike
                renewal = Renewal(r.lease, e)
            r.lease = renewal.lease  # a bucket's renewal is a new generation (steadqd.daemon.worker.renew)
            if renewal.error is None:
                r.next_renew = time.monotonic() + self.renew_s
            elif renewal.lost:
                r.lose(str(renewal.error))
                self._cancel(r)
            else:  # not committed, or unknown: a new handle (if poisoned) tries again soon
                r.next_renew = time.monotonic() + min(ERROR_PAUSE, self.renew_s)
                if not self._after_error(q, f"renew {r.job.id}", renewal.error):
                    q.close()
                    return None
        return q

    def _hand_back(self) -> None:
        """Forced stop: every running job's lease goes back now (the attempt stays used)."""
        with self._lock:
            running = list(self._running.values())
        if not running:
            return
        q = self._open("hand back")
        try:
            for r in running:
                with r.lock:
                    if r.settling or r.job.lease_lost:
                        continue
                    r.job._lost.set()  # its handler's result, if it ever comes, is not ours to settle
                    self._cancel(r)
                    if q is not None:
                        self._give_back(q, r.lease, "forced stop")
                        self._count("handed_back")
        finally:
            if q is not None:
                q.close()

    @staticmethod
    def _cancel(r: _Running) -> None:
        if r.cancel is not None:
            r.cancel()

    # -- calling the handler ---------------------------------------------------------------

    def _call_sync(self, job: Job) -> object:
        return self.handler(job)

    def _call_async(self, loop: asyncio.AbstractEventLoop, job: Job) -> object:
        coro = self.handler(job)
        if not asyncio.iscoroutine(coro):
            return coro  # a plain function works too
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
        with self._lock:
            r = self._running.get(job.id)
            if r is not None:
                r.cancel = fut.cancel
        try:
            return fut.result()
        except concurrent.futures.CancelledError as e:
            raise Retry("the handler was cancelled (lease lost or handed back)") from e

    # -- plumbing --------------------------------------------------------------------------

    def _open(self, what: str) -> Backend | None:
        try:
            return open_queue(self.queue, **self.open_options)
        except SteadQError as e:
            log.error("cannot open the queue %s to %s: %s", printable(self.queue), what, e)
            self._stop.wait(ERROR_PAUSE)
            return None

    def _after_error(self, q: Backend, what: str, e: SteadQError) -> bool:
        """A failure of the queue, not of a job: log it and pause; False when the
        handle can no longer be trusted (an unknown outcome poisoned it) and the
        caller must close it and open a new one."""
        log.error("%s failed: %s", what, e)
        self._stop.wait(ERROR_PAUSE)
        return not (isinstance(e, OutcomeUnknown) or q.poisoned is not None)

    def _note_pause(self, state: PauseState | None) -> None:
        """Keep the pause a consumer read; log it when it starts or changes, and the resume, once per worker."""
        with self._lock:
            was, self.paused = self.paused, state
        if state is not None and state != was:
            log.warning(
                "queue %s %s; running handlers finish, no new job is claimed", printable(self.queue), state.summary()
            )
        elif state is None and was is not None:
            log.info("queue %s resumed; claiming again", printable(self.queue))

    def _give_back(self, q: Backend, lease: LeaseHandle, why: str) -> None:
        try:
            q.retry(lease, 0.0)
            log.info("job %s handed back: %s", lease.job_id, why)
        except SteadQError as e:
            log.warning("handing job %s back failed (%s); its lease expires: %s", lease.job_id, why, e)

    def _report_scan(self, q: Backend) -> None:
        scan = q.last_scan
        if scan is None:
            return
        for path, reason, _qname in scan.quarantined:
            self._count("quarantined")
            log.warning("quarantined a corrupt object %s (reason 0x%04x)", printable(path), reason)

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)


def work(queue: str, handler: Callable[[Job], object], **options: Any) -> WorkStats:
    """Serve ``queue`` with ``handler(job)`` until SIGTERM/SIGINT; options as :class:`Worker`."""
    return Worker(queue, handler, **options).run()


async def work_async(queue: str, handler: Callable[[Job], Awaitable[object]], **options: Any) -> WorkStats:
    """Serve ``queue`` with the coroutine function ``handler(job)`` on the running event loop."""
    return await Worker(queue, handler, **options).run_async()
