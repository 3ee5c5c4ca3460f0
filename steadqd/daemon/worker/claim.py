"""The claim step: claim jobs and copy their payloads off the service loop.

Off the loop
    Claiming a job hashes its whole payload (protocol.md, "Claim"), and the
    copy a command reads is hashed again as it is written. For a payload of
    gigabytes that is seconds to minutes of reading, and the service loop
    must meanwhile renew the leases of the jobs already running: a late
    renewal lets recovery hand a running job to someone else. So the claim
    and the copy run in one :class:`Preparer` thread, with a queue handle of
    its own that no other thread touches, and the loop only learns the
    outcome (through a pipe it watches). A corrupt payload is found by the
    claim's hash, quarantined there and never read a second time. While a
    copy is being written, the thread renews that job's lease itself; the
    lease becomes the loop's once the outcome is handed over.

The copies themselves (where, who may read them, removing them) are payload.py's.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from steadqd.backend import Backend, LeaseHandle, PauseState, ScanReport
from steadqd.daemon import process
from steadqd.daemon.config import QueueSettings, WorkerConfig
from steadqd.daemon.environment import build_environment
from steadqd.daemon.journal import Log
from steadqd.daemon.worker import payload, renew
from steadqd.errors import SteadQError
from steadqd.queue_control import PAUSE_RECHECK


@dataclass
class Prepared:
    """What the :class:`Preparer` hands the loop for one request: a job ready to start, or why not.

    ``lease`` is None when the queue was empty or the claim failed
    (``lease_error``). With a lease and an ``error`` the job could not be
    prepared; its copy is already removed and the lease is the loop's to settle.
    """

    cfg: WorkerConfig
    credentials: dict[str, Any]
    lease: LeaseHandle | None = None
    renewed: float = 0.0  # time.monotonic() of the claim or of the thread's last renewal
    scan: ScanReport | None = None
    lease_error: SteadQError | None = None
    error: BaseException | None = None
    poisoned: str | None = None  # the thread's handle was poisoned; it opens a new one for the next claim
    paused: PauseState | None = None  # the queue is paused: nothing was claimed (``lease`` is None)
    tmpdir: str = ""
    payload_path: str = ""
    env: dict[str, str] = field(default_factory=dict)


def _failed(job: Prepared, e: BaseException) -> None:
    """The job cannot be started: the loop settles its lease (if any) by ``error``; its copy is gone."""
    job.error = e
    if job.tmpdir:
        payload.remove(job.tmpdir)
        job.tmpdir = ""


def report_scan(log: Log, report: ScanReport | None) -> None:
    """Log what a claim's scan did on its way (corrupt objects quarantined, exhausted jobs dead-lettered)."""
    if report is None:
        return
    for path, reason, qname in report.quarantined:
        log.warning("quarantined a corrupt object", path=path, reason=f"0x{reason:04x}", quarantine=qname)
    for path in report.dead_lettered:
        log.warning("dead-lettered a job with no attempts left", path=path)
    for err in report.errors:
        log.warning(f"scan: {err}")


class Stopped(Exception):
    """The worker is stopping: the copy in progress is abandoned (never leaves this module's callers)."""


def renew_due(q: Backend, jobs: Sequence[Prepared]) -> None:
    """Renew each claimed, not yet started job whose renewal is due (a long copy must not expire them)."""
    now = time.monotonic()
    for job in jobs:
        if job.lease is not None and job.error is None and now - job.renewed >= job.cfg.renew_interval:
            r = renew.renew(q, job.lease, job.cfg.lease)
            if r.error is not None and not r.not_committed:
                raise r.error  # lost or unknown: the copy in progress fails, as the loop's renewal would
            job.lease = r.lease  # a bucket's is a new generation; not committed: tried again one interval later
            job.renewed = now


class _RenewingWriter:
    """The copy's file, renewing the leases of the claims waiting on it between chunks of a long copy."""

    def __init__(self, out: BinaryIO, q: Backend, jobs: Sequence[Prepared], stop: threading.Event) -> None:
        self._out, self._q, self._jobs, self._stop = out, q, jobs, stop

    def write(self, chunk: bytes) -> int:
        if self._stop.is_set():
            raise Stopped("the worker is stopping")
        renew_due(self._q, self._jobs)
        return self._out.write(chunk)


PR_SET_NAME = 15


def name_thread(name: str) -> None:
    """Name the calling thread in the kernel (its ``comm``, at most 15 bytes: ``top -H``, ``ps -L``,
    ``/proc/PID/task/TID/stat``), so that what each of the worker's threads costs can be read there."""
    buf = ctypes.create_string_buffer(name.encode()[:15])
    process.prctl(PR_SET_NAME, ctypes.addressof(buf))


def drain_wakeups(fd: int) -> None:
    """Empty a helper thread's wake-up pipe (non-blocking): one read, unless that read filled its buffer
    (a shorter read has taken everything; a byte written after it wakes the loop again)."""
    try:  # at every hand-back of the claiming and the settling thread: no context manager's calls
        while len(os.read(fd, 64)) == 64:
            pass
    except BlockingIOError:
        pass


def close_owned(q: Backend | None, r: int, w: int) -> None:
    """What a helper thread that has ended owned: its queue handle and the pipe that woke the loop.

    Closing a poisoned or failing handle may fail too, and nothing depends on it.
    """
    if q is not None:
        with contextlib.suppress(SteadQError, OSError):
            q.close()
    os.close(r)
    os.close(w)


class Preparer:
    """One thread that claims jobs and writes their payload copies, one request at a time.

    A request asks for up to ``count`` jobs: they are claimed inside one
    ``q.batch()``, so the claims share one directory barrier, and none is
    handed to the loop before that barrier is done (a command may start only
    once its claim is durable). Then each payload is copied, the later
    claims renewed while an earlier copy runs long.

    The loop calls :meth:`submit`, watches :meth:`fileno` and calls
    :meth:`collect` when it is readable. Nothing but this thread touches its
    queue handle while it runs; a lease and its :class:`Prepared` belong to
    the loop from the moment :meth:`collect` returns them.
    """

    def __init__(self, q: Backend, reopen: Callable[[], Backend]) -> None:
        self._q: Backend | None = q
        self._reopen = reopen
        self._requests: queue.SimpleQueue[tuple[WorkerConfig, QueueSettings, dict[str, Any], int] | None]
        self._requests = queue.SimpleQueue()
        self._results: collections.deque[Prepared] = collections.deque()
        self._stop = threading.Event()
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.busy = False  # a request is in flight (loop side only)
        self._thread = threading.Thread(target=self._run, name="steadqd-prepare", daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        return self._r

    def submit(self, cfg: WorkerConfig, settings: QueueSettings, credentials: dict[str, Any], count: int = 1) -> None:
        assert not self.busy, "one request at a time"
        self.busy = True
        self._requests.put((cfg, settings, credentials, max(1, count)))

    def collect(self) -> list[Prepared]:
        drain_wakeups(self._r)
        done: list[Prepared] = []
        while self._results:
            done.append(self._results.popleft())
        if done:
            self.busy = False
        return done

    def close(self, wait: float) -> list[Prepared]:
        """Stop the thread (a copy stops at its next chunk) and return what it finished meanwhile.

        A claim cannot be interrupted while it hashes; if it outlasts
        ``wait``, the thread is left to the process's exit and recovery
        returns its lease when it expires.
        """
        self._stop.set()
        self._requests.put(None)
        self._thread.join(wait)
        done = self.collect()
        if not self._thread.is_alive():
            close_owned(self._q, self._r, self._w)
            self._q = None
        return done

    @property
    def stuck(self) -> bool:
        """Still claiming after :meth:`close` gave up waiting."""
        return self._stop.is_set() and self._thread.is_alive()

    def _run(self) -> None:
        name_thread(self._thread.name)
        while True:
            request = self._requests.get()
            if request is None:
                return
            cfg, settings, credentials, count = request
            jobs: list[Prepared] = []
            try:
                self._prepare(jobs, cfg, credentials, count, settings)
            except BaseException as e:  # handed to the loop, which logs it: the thread must go on
                if not jobs or jobs[-1].lease is None:
                    jobs.append(Prepared(cfg, credentials))
                for job in jobs:
                    if job.error is None and job.lease is not None or job is jobs[-1]:
                        _failed(job, e)
            self._results.extend(jobs)  # at once: the loop's collect() ends the request as a whole
            with contextlib.suppress(BlockingIOError):
                os.write(self._w, b"\0")

    def _prepare(
        self, jobs: list[Prepared], cfg: WorkerConfig, credentials: dict[str, Any], count: int, settings: QueueSettings
    ) -> None:
        if self._q is None:
            try:
                self._q = self._reopen()
            except SteadQError as e:
                jobs.append(Prepared(cfg, credentials, lease_error=e))
                return
        q = self._q
        try:
            self._claim(q, jobs, cfg, credentials, count)
            for i, job in enumerate(jobs):
                if job.lease is not None and job.error is None and not self._stop.is_set():
                    try:
                        self._copy(q, job, settings, jobs[i:])
                    except BaseException as e:  # this job's; the next claim's copy goes on
                        _failed(job, e)
        finally:
            if q.poisoned is not None:
                if not jobs:
                    jobs.append(Prepared(cfg, credentials))
                jobs[-1].poisoned = q.poisoned
                with contextlib.suppress(SteadQError, OSError):
                    q.close()
                self._q = None

    @staticmethod
    def _claim(q: Backend, jobs: list[Prepared], cfg: WorkerConfig, credentials: dict[str, Any], count: int) -> None:
        """Up to ``count`` claims under one barrier; an empty queue, a pause or a failed claim ends the run.

        The pause is read before the first claim and again before any claim
        more than :data:`PAUSE_RECHECK` after the last read, so no claim
        starts later than that after a pause became visible in the store.
        """
        try:
            with q.batch():
                checked = -PAUSE_RECHECK
                taken = len(jobs)  # len(jobs), counted here rather than asked at every claim
                while taken < count:
                    job = Prepared(cfg, credentials, renewed=time.monotonic())
                    jobs.append(job)
                    taken += 1
                    try:
                        if job.renewed - checked >= PAUSE_RECHECK:
                            job.paused = q.pause_state()
                            checked = job.renewed
                            if job.paused is not None:
                                break
                        job.lease = q.lease(wait=0.0, duration=cfg.lease)
                    except SteadQError as e:
                        job.lease_error = e
                        break
                    job.scan = q.last_scan
                    if job.lease is None:
                        break
        except SteadQError as e:  # the shared barrier failed: no claim of the run may start its command
            for job in jobs:
                if job.lease is not None:
                    job.error = e

    def _copy(self, q: Backend, job: Prepared, settings: QueueSettings, waiting: Sequence[Prepared]) -> None:
        lease, cfg = job.lease, job.cfg
        assert lease is not None
        owner = None
        if "user" in job.credentials and cfg.input == "file":
            owner = (job.credentials["user"], job.credentials["group"])

        def copy(f: BinaryIO) -> object:
            out: BinaryIO = _RenewingWriter(f, q, waiting, self._stop)  # type: ignore[assignment]  # (cast: a call)
            return q.copy_payload(lease, out)

        other = (job.credentials["user"], job.credentials["group"]) if "user" in job.credentials else None
        made = payload.make_with_files(lease.job_id) if other is None else None  # all three in one call
        if made is not None:
            job.tmpdir, progress, fd = made
            job.payload_path = payload.fill_copy(job.tmpdir, fd, copy)
        else:
            job.tmpdir = payload.make(lease.job_id)
            progress = payload.make_progress(job.tmpdir, other, traverse=other is not None and owner is None)
            job.payload_path = payload.write_copy(job.tmpdir, copy, owner)
        job.env = build_environment(
            cfg,
            lease,
            queue_name=settings.name,
            queue_path=settings.queue,
            parent_env=os.environ,
            payload_file=job.payload_path if cfg.input == "file" else None,
            progress_file=progress,
        )
