"""The Python worker API: a handler per job, with the lease work done for you.

Users of huey and rq write a function and expect the queue to call it. Here::

    from steadqd import task, Bury

    @task("/var/lib/steadq/thumbs")
    def thumbnail(path: str, size: int = 256) -> None:
        if not path.endswith(".jpg"):
            raise Bury(f"not a JPEG: {path}")      # dead-lettered, never retried
        make_thumbnail(path, size)                  # an exception retries with backoff

    thumbnail.enqueue("/srv/in/a.jpg", size=128)    # producer side: a JSON job
    thumbnail.schedule(args=("/srv/in/b.jpg",), delay=30)
    thumbnail.work(concurrency=4)                   # consumer side: until SIGTERM

or, without the decorator, ``work(queue, handler)`` with ``handler(job: Job)``;
``await work_async(queue, handler)`` takes a coroutine function.

What it does for each job, in the order the queue's guarantees need:

* lease (``lease`` seconds), then read the payload *verified*: a corrupt job
  is quarantined by the queue and never reaches the handler;
* renew in the background every ``renew_every`` (default a third of the
  lease) from a handle of its own, so a long handler never loses its lease
  to recovery and a slow payload read never delays another job's renewal;
* the handler returns: ack. It raises :class:`Bury`: dead-letter with the
  application's reason code. It raises :class:`Retry`: give the job back
  after its delay. Any other exception: give it back with the exponential
  backoff (``retry``), and dead-letter when the attempts are used up;
* a lease lost meanwhile (the handler outran its renewals, the machine
  slept) is never settled: the job's new owner decides, and it is logged.

Stopping: SIGTERM or SIGINT (or :meth:`Worker.stop`) stops leasing and lets
running handlers finish (the drain); a second signal, or ``drain_timeout``,
hands the running jobs' leases back at once (a handler thread cannot be
killed; it runs on, and its late result is dropped: the lease is no longer
its own). Leases, not threads, are the unit of safety: whatever happens to
this process, a job is run again only after its lease expired or was handed back.

Pausing: ``steadq pause`` (``Backend.pause``) is read before every lease
(one open on a filesystem, one GET on a bucket; the lease's scan costs
more), so no claim starts after the pause is visible, and running handlers
finish and settle as usual. A paused consumer waits for news: a filesystem
queue's ready watch hears the pause record go (inotify on ``control/``), so
the resume is taken up at once; a bucket sends no event, so its consumers
read the pause again every ``PAUSED_BUCKET_LOOK`` seconds, as the worker
daemon does (a resume on this host also rings the doorbell).

The worker opens its own handles (one per thread, one for renewals) with
:func:`steadqd.backend.open_queue`, so the same API drives any backend.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from steadqd import progress as progress_mod
from steadqd.backend import Backend, LeaseHandle, PauseState, ReadyWatch, init_queue, is_bucket_url, open_queue
from steadqd.backoff import RetryPolicy
from steadqd.constants import DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_MAX_S, DeadReason
from steadqd.daemon.journal import journal_connected
from steadqd.daemon.worker.renew import Renewal, interval, renew
from steadqd.errors import InvalidInput, LeaseLost, OutcomeUnknown, SteadQError
from steadqd.queue_control import PAUSED_BUCKET_LOOK
from steadqd.text import printable

__all__ = ["BadPayload", "Bury", "Job", "Retry", "Task", "WorkStats", "Worker", "task", "work", "work_async"]

log = logging.getLogger("steadqd.tasks")

DEFAULT_RETRY = RetryPolicy(base_ms=round(DEFAULT_BACKOFF_BASE_S * 1000), cap_ms=round(DEFAULT_BACKOFF_MAX_S * 1000))
ERROR_PAUSE = 1.0  # s between attempts when the queue itself fails (not one job)
# An idle consumer whose watch covers the whole queue scans only when the watch
# has news, and at least this often (the daemon worker's safety rescan): on a
# bucket a scan LISTs every shard, which one poll a second would repeat.
QUIET_RESCAN = 60.0
JSON_TYPE = "application/json"


def _journal_send(message: str, **fields: str) -> None:
    """One native journal entry (python-systemd); replaced in tests."""
    from systemd import journal

    journal.send(message, **fields)


class _JournalHandler(logging.Handler):
    """The worker's records as journal entries with their fields, so ``steadq show`` finds a job's
    sentences (its ``Bury`` message above all) by ``STEADQ_JOB_ID``.

    Installed by :meth:`Worker.run` only when stderr is the journal and nothing configures logging:
    the bare stderr line Python would print then carries no field and reaches no ``show``."""

    def __init__(self, queue: str) -> None:
        super().__init__(logging.INFO)
        self.queue = queue

    def emit(self, record: logging.LogRecord) -> None:
        fields = {"PRIORITY": str(_PRIORITY.get(record.levelno, 6)), "SYSLOG_IDENTIFIER": "steadqd",
                  "STEADQ_QUEUE": self.queue, "STEADQ_ROLE": "task"}  # fmt: skip
        job = getattr(record, "STEADQ_JOB_ID", None)
        if job is not None:
            fields["STEADQ_JOB_ID"] = str(job)
        try:
            _journal_send(record.getMessage(), **fields)
        except Exception:  # noqa: BLE001 - a log line must never stop the worker
            self.handleError(record)


_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def _about(job_id: str) -> dict[str, str]:
    """``extra=`` of a record about one job: a journal handler (ours, python-systemd's) sends it as a field."""
    return {"STEADQ_JOB_ID": job_id}


class Bury(Exception):
    """Raised by a handler: the job is dead-lettered with ``reason`` and not retried.

    ``reason`` is a dead-letter reason code (reasons.md): the registry's
    0x0001 consumer_rejected by default, or the application's own in
    0x0100-0x7fff, which ``steadq ls dead`` and ``admin dead-inspect`` show.
    """

    def __init__(self, message: str = "", reason: int = DeadReason.CONSUMER_REJECTED) -> None:
        if isinstance(reason, bool) or not isinstance(reason, int) or not 0 <= reason <= 0xFFFF:
            raise InvalidInput(f"Bury reason must be a u16 dead-letter reason code, got {reason!r}")
        super().__init__(message)
        self.reason = int(reason)


class BadPayload(Bury, ValueError):
    """The payload cannot be decoded (not JSON, not UTF-8, nested deeper than the decoder goes).

    No retry can make it readable, so, uncaught, it buries the job at once
    as an unsupported content type rather than burning every attempt; a
    ValueError too, for the handlers that catch the one ``json.loads`` raises.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, DeadReason.UNSUPPORTED_CONTENT_TYPE)


class Retry(Exception):
    """Raised by a handler: give the job back now, or after ``delay`` seconds,
    instead of after the backoff (it still uses up the attempt)."""

    def __init__(self, message: str = "", delay: float | None = None) -> None:
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int | float) or not delay >= 0):
            raise InvalidInput(f"Retry delay must be a non-negative number of seconds, got {delay!r}")
        super().__init__(message)
        self.delay = delay


@dataclass(frozen=True)
class Job:
    """What a handler gets: the verified payload and the job's facts."""

    id: str
    attempt: int
    max_attempts: int
    content_type: str
    metadata: Mapping[str, bool | int | str | bytes]
    payload: bytes
    _lost: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    _progress: list[tuple[float, str]] = field(default_factory=list, repr=False, compare=False)

    def json(self) -> Any:
        """The payload as JSON; :class:`BadPayload` (a ValueError) if the decoder cannot read it."""
        try:
            return json.loads(self.payload)
        except (ValueError, RecursionError) as e:  # RecursionError: arrays nested ~100k deep
            raise BadPayload(f"job {self.id} has a bad payload, not JSON: {e}") from e

    def text(self) -> str:
        return self.payload.decode()

    def progress(self, percent: float, text: str = "") -> None:
        """Report progress (0–100, and a short text) for ``steadq show``/``ls`` on this host.

        Cheap to call often: the latest value is published by the worker's
        renewing thread, at most once a second (steadqd/progress.py), and
        removed when the job ends.
        """
        if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 <= percent <= 100:
            raise InvalidInput(f"progress must be a number from 0 to 100, got {percent!r}")
        if not isinstance(text, str):
            raise InvalidInput(f"progress text must be a string, got {type(text).__name__}")
        self._progress[:] = [(float(percent), text[: progress_mod.MAX_TEXT])]  # one item: replaced atomically

    @property
    def lease_lost(self) -> bool:
        """True once the lease is gone: a long handler may check it and stop early."""
        return self._lost.is_set()


@dataclass
class WorkStats:
    """What :meth:`Worker.run` did, for the caller's own logs and tests."""

    acked: int = 0
    retried: int = 0
    buried: int = 0
    lost: int = 0  # leases lost before the handler's result could settle them
    handed_back: int = 0  # running at a forced stop, leases returned
    quarantined: int = 0  # corrupt jobs the queue isolated (at the lease scan or the payload check) instead


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


class _Consumer:
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
        if journal_connected() and not logging.getLogger().handlers and not log.handlers:
            journal = _JournalHandler(self.queue)
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
        workers = [
            threading.Thread(target=self._work_loop, args=(call,), name=f"steadqd-work-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        renewer.start()
        for t in workers:
            t.start()
        self._stop.wait()
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
        self._done.set()
        self._wake_renewer.set()
        renewer.join()
        return self.stats

    # -- one worker thread -----------------------------------------------------------------

    def _work_loop(self, call: Call) -> None:
        c = _Consumer(self)
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

    def _one_job(self, q: Backend, lease: LeaseHandle, call: Call) -> Backend | None:
        try:
            payload = q.read_payload(lease)
        except LeaseLost as e:
            self._count("lost")
            log.warning("job %s lost its lease before its payload was read: %s", lease.job_id, e)
            return q
        except SteadQError as e:
            if getattr(e, "payload", False):
                self._count("quarantined")
                log.error("job %s has a corrupt payload; the queue quarantined it: %s", lease.job_id, e)
                return q
            return q if self._after_error(q, f"read the payload of {lease.job_id}", e) else None
        job = Job(lease.job_id, lease.attempt, lease.max_attempts, lease.content_type, lease.metadata, payload)
        running = _Running(lease, job, time.monotonic() + self.renew_s)
        with self._lock:
            self._running[job.id] = running
        self._wake_renewer.set()
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

    def _settle(self, q: Backend, lease: LeaseHandle, outcome: BaseException | None) -> Backend | None:
        job_id = lease.job_id
        try:
            if outcome is None:
                q.ack(lease)
                self._count("acked")
                log.info("job %s finished: ack (attempt %d/%d)", job_id, lease.attempt, lease.max_attempts,
                         extra=_about(job_id))  # fmt: skip
            elif isinstance(outcome, Bury):
                q.bury(lease, outcome.reason)
                self._count("buried")
                log.warning("job %s buried (reason 0x%04x): %s", job_id, outcome.reason, printable(str(outcome)),
                            extra=_about(job_id))  # fmt: skip
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
                    extra=_about(job_id),
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
                self._wake_renewer.wait(max(0.0, min(1.0, upcoming - time.monotonic())))
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


# -- the decorator ----------------------------------------------------------------------------


class Task:
    """A function bound to a queue: ``enqueue`` makes a JSON job of its arguments, ``work`` runs them.

    A job's payload is ``{"task": NAME, "args": [...], "kwargs": {...}}``
    (``application/json``), with ``task=NAME`` in its metadata so that
    ``steadq ls`` and the journal tell tasks apart; a worker of one task
    buries (consumer_rejected) a job meant for another, since it could
    only fail on every attempt.
    """

    __name__: str  # and the wrapped function's other attributes: functools.update_wrapper copies them

    def __init__(
        self,
        fn: Callable[..., object],
        queue: str,
        *,
        name: str | None = None,
        max_attempts: int = 3,
        open_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.queue = queue
        self.name = name or f"{_module_name(fn)}.{fn.__qualname__}"
        self.max_attempts = max_attempts
        self.open_options = dict(open_options or {})
        self._producer: Backend | None = None
        self._producer_lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> object:
        """A direct call runs the function here, as if it were not a task."""
        return self.fn(*args, **kwargs)

    def enqueue(self, *args: Any, **kwargs: Any) -> str:
        """Publish a job calling the function with these arguments; returns the job id."""
        return self.schedule(args=args, kwargs=kwargs)

    delay = enqueue  # the name celery users reach for

    def schedule(
        self,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        delay: float = 0.0,
        metadata: Mapping[str, bool | int | str | bytes] | None = None,
        max_attempts: int | None = None,
    ) -> str:
        """Publish with options: run no earlier than ``delay`` s from now, extra metadata."""
        try:
            body = json.dumps({"task": self.name, "args": list(args), "kwargs": dict(kwargs or {})})
        except (TypeError, ValueError) as e:
            raise InvalidInput(f"the arguments of task {self.name} are not JSON-serialisable: {e}") from e
        meta = {"task": self.name, **(metadata or {})}
        with self._producer_lock:
            if self._producer is None:
                self._producer = open_queue(self.queue, **self.open_options)
            return self._producer.enqueue(
                body.encode(),
                content_type=JSON_TYPE,
                metadata=meta,
                max_attempts=self.max_attempts if max_attempts is None else max_attempts,
                delay=delay,
            )

    def close(self) -> None:
        """Close the producer handle (it is reopened by the next enqueue)."""
        with self._producer_lock:
            if self._producer is not None:
                self._producer.close()
                self._producer = None

    def worker(self, **options: Any) -> Worker:
        options.setdefault("open_options", self.open_options)
        handler = self._run_async if asyncio.iscoroutinefunction(self.fn) else self._run
        return Worker(self.queue, handler, **options)

    def work(self, **options: Any) -> WorkStats:
        """Run this task's jobs until SIGTERM/SIGINT; options as :class:`Worker`."""
        return self.worker(**options).run()

    async def work_async(self, **options: Any) -> WorkStats:
        return await self.worker(**options).run_async()

    def _arguments(self, job: Job) -> tuple[list[Any], dict[str, Any]]:
        body = job.json()  # BadPayload buries what cannot be decoded
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("args"), list)
            or not isinstance(body.get("kwargs"), dict)
        ):
            raise Bury(f"job {job.id} is not a task call (task, args, kwargs)", DeadReason.UNSUPPORTED_CONTENT_TYPE)
        if body.get("task") != self.name:
            raise Bury(f"job {job.id} is for task {body.get('task')!r}, this worker runs {self.name!r}")
        return body["args"], body["kwargs"]

    def _run(self, job: Job) -> object:
        args, kwargs = self._arguments(job)
        return self.fn(*args, **kwargs)

    async def _run_async(self, job: Job) -> object:
        args, kwargs = self._arguments(job)
        result = self.fn(*args, **kwargs)
        return await result if asyncio.iscoroutine(result) else result


def _module_name(fn: Callable[..., object]) -> str:
    """The module a task's name begins with, the same whether its file is run or imported.

    Run as a script a function's module is ``__main__``, so a worker that
    imports the file would know the task by another name and bury its jobs.
    ``python -m pkg.mod`` says its name (``__spec__``); a file run by its path
    is named as an import finds it: its stem, under each enclosing directory
    that is a package (has ``__init__.py``). Without a file (an interactive
    session, ``python -c``) there is no name to derive: ``name=`` is required."""
    module = fn.__module__
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return str(spec.name).removesuffix(".__main__")
    path = getattr(main, "__file__", None)
    if not path:
        raise InvalidInput(
            f"task {getattr(fn, '__qualname__', fn)!r} is defined in __main__ with no file to name it by: "
            "give the task a name: @task(queue, name=...) (the producer and the worker must agree on it)"
        )
    directory, file = os.path.split(os.path.abspath(path))
    parts = [os.path.splitext(file)[0]]
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        parts.insert(0, package)
    return ".".join(parts)


def task(
    queue: str, *, name: str | None = None, max_attempts: int = 3, **open_options: Any
) -> Callable[[Callable[..., object]], Task]:
    """Decorator: make a function a :class:`Task` of ``queue``."""

    def wrap(fn: Callable[..., object]) -> Task:
        return Task(fn, queue, name=name, max_attempts=max_attempts, open_options=open_options)

    return wrap
