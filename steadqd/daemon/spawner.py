"""The worker spawner role: lease jobs and run the configured command for each.

Wake-ups, never polling
    The role sleeps in the service loop. It is woken by an inotify watch on
    every ``ready/<S>/`` shard directory (a ready name appearing: IN_CREATE
    for a published link, IN_MOVED_TO for a rename), by its own jobs (output,
    end of output, exit, renew and timeout timers) and by one *safety rescan*
    timer every :data:`SAFETY_RESCAN` seconds. The rescan exists only to
    catch what inotify cannot report: a shard directory that was removed and
    recreated (its watch is gone), an event-queue overflow we handled badly,
    or a lease the last scan skipped because of a transient error. It is the
    only periodic queue scan an idle worker makes. Only a *ready* name wakes
    the role; the leased names our own claims and renewals create in the same
    directories are recognised and ignored, so a claim never triggers a scan.
    The watch also reports ready names leaving (IN_MOVED_FROM, IN_DELETE),
    only to keep the ready count of STATUS= current without listing
    directories every few seconds; the count is redone at each safety rescan
    and after an inotify overflow (and not at all beyond 256 shards: "?").

Children without SIGCHLD
    Each job is its command in its own process group (``start_new_session``),
    with stdout and stderr on pipes registered as loop readers. When both
    pipes reach EOF the child is almost always exiting; it is then reaped with
    ``Popen.poll()``. A per-job safety timer covers a command that exits while
    something else (a background grandchild) still holds the pipes, and one
    that closes its output but keeps running. Before the leader is reaped we
    check it with ``waitid(WNOWAIT)`` and SIGKILL whatever is left in its
    process group: the job *is* its group, like a systemd unit's cgroup, and
    while the leader is an unreaped zombie its pid (the group id) cannot be
    reused, so signalling the group can never hit an unrelated process.

The payload
    Before the command starts, the payload is copied with
    ``Lease.copy_payload_to`` into a private per-job temporary directory and
    made read-only (0400). The copy is verified against the payload digest,
    so a corrupt payload is quarantined by the library and never reaches a
    command. ``input: file`` passes the copy's path in STEADQ_PAYLOAD_FILE;
    ``input: stdin`` opens the same copy read-only as the command's stdin.
    A regular file on stdin cannot deadlock (no writer thread, no pipe buffer
    to fill while the command is busy writing its own output), a command may
    even seek in it, and no other thread ever touches the queue handle.
    The directory is removed when the job ends. The copy runs in the loop
    thread, so a very large payload holds up the other jobs' timers while it
    is copied; the first renewal is scheduled from the claim, not the spawn.

Settling
    By exit status through ``worker.exit_status`` (death by a signal is
    "other"); by timeout (SIGTERM to the group, SIGKILL after ``kill_grace``,
    then retry). A lease whose renewal failed with LeaseLost or
    OutcomeUnknown belongs to whoever claims the job next: it is logged
    loudly and never acknowledged or retried by us. A handle poisoned by an
    OutcomeUnknown is closed and the queue reopened (the tree is the truth).

Attempts
    SteadQ/1 counts an attempt when a job is *claimed*. When the daemon is
    stopped by force, running commands are killed and their leases given
    back with an immediate ``retry``: the interrupted run still used up its
    attempt, because that is the spec's (and the reference's) semantics. A
    normal SIGTERM drain lets running commands finish and loses nothing.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import inotify_simple

from steadqd.backoff import RetryPolicy
from steadqd.constants import READY_DIR, State
from steadqd.daemon import payload_dirs
from steadqd.daemon.config import QueueSettings, WorkerConfig
from steadqd.daemon.journal import INFO, WARNING, Log
from steadqd.daemon.service import Loop, Timer, open_queue
from steadqd.daemon.verdict import Verdict, verdict
from steadqd.errors import ErrorKind, LeaseLost, NotCommitted, OutcomeUnknown, SteadQError, kind_for_errno
from steadqd.fs.handle import Queue
from steadqd.fs.lease import Lease
from steadqd.fs.names import looks_ready, parse_name, shard_dir

SAFETY_RESCAN = 60.0  # s; the only periodic scan of an idle worker (see the module docstring)
MAX_LINE = 16 * 1024  # bytes of one forwarded output line; the rest of the line is dropped
READ_CHUNK = 64 * 1024
EXIT_CHECK_RUNNING = 2.0  # s; safety check of a job whose output is still open
EXIT_CHECK_MAX = 2.0  # s; slowest re-check of a job that closed its output but runs on
OUTPUT_GRACE = 2.0  # s; how long output may stay open after the command exited
SETTLE_TRIES = 5  # attempts to settle a job after NotCommitted, one second apart
BUSY_RETRY = 1.0  # s; re-lease after MAINTENANCE_BUSY
ERROR_RETRY = 5.0  # s; re-lease / reopen after other errors
READY_COUNT_SHARDS = 256  # count ready names by listing only up to this many shards
_WATCH_FLAGS = (  # DONT_FOLLOW/ONLYDIR: a symlink planted as a shard is never watched through
    inotify_simple.flags.CREATE
    | inotify_simple.flags.MOVED_TO
    | inotify_simple.flags.MOVED_FROM
    | inotify_simple.flags.DELETE
    | inotify_simple.flags.ONLYDIR
    | inotify_simple.flags.DONT_FOLLOW
)
_APPEAR = inotify_simple.flags.CREATE | inotify_simple.flags.MOVED_TO
_VANISH = inotify_simple.flags.MOVED_FROM | inotify_simple.flags.DELETE


# --- pure helpers (unit-tested) -------------------------------------------------


def meta_env_name(key: str) -> str:
    """STEADQ_META_<KEY>: metadata keys are ``[a-z0-9][a-z0-9._-]*`` (records.md)."""
    return "STEADQ_META_" + key.upper().replace(".", "_").replace("-", "_")


def meta_env_value(value: object) -> str | None:
    """The environment form of a metadata value, or None if it cannot be one (NUL)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, bytes):
        text = value.hex()
    elif isinstance(value, str):
        text = value
    else:
        return None
    return None if "\0" in text else text


def build_environment(
    cfg: WorkerConfig,
    lease: Lease,
    *,
    queue_name: str,
    queue_path: str,
    parent_env: Mapping[str, str],
    payload_file: str | None = None,
) -> dict[str, str]:
    """The command's whole environment, from the configuration only.

    Nothing of the daemon's environment leaks except the names listed in
    ``pass_environment``; job facts are data in variables, never command
    text, so metadata cannot become shell syntax or argv.
    """
    env: dict[str, str] = {}
    for name in cfg.pass_environment:
        if name in parent_env:
            env[name] = parent_env[name]
    env.update(cfg.environment)
    env["STEADQ_QUEUE"] = queue_name
    env["STEADQ_QUEUE_PATH"] = queue_path
    env["STEADQ_JOB_ID"] = lease.job_id
    env["STEADQ_ATTEMPT"] = str(lease.attempt)
    env["STEADQ_MAX_ATTEMPTS"] = str(lease.max_attempts)
    env["STEADQ_CONTENT_TYPE"] = lease.content_type
    metadata = lease.metadata  # loads the extension, which also carries the producer id
    producer = lease.producer_id
    if producer and "\0" not in producer:
        env["STEADQ_PRODUCER_ID"] = producer
    for key in sorted(metadata):
        name, value = meta_env_name(key), meta_env_value(metadata[key])
        if value is not None and name not in env:  # "a.b" and "a-b" collide: the first (sorted) wins
            env[name] = value
    if payload_file is not None:
        env["STEADQ_PAYLOAD_FILE"] = payload_file
    return env


def retry_policy(cfg: WorkerConfig) -> RetryPolicy:
    r = cfg.retry
    base = max(1, round(r.backoff_base * 1000))
    return RetryPolicy(base_ms=base, cap_ms=max(base, round(r.backoff_max * 1000)), use_jitter=r.jitter)


def is_ready_name(name: str) -> bool:
    """A ready job name (not a colocated leased name, not a stray file)."""
    if not looks_ready(name):
        return False
    try:
        parse_name(State.READY, name)
    except SteadQError:
        return False
    return True


def _identity(cfg: WorkerConfig) -> dict[str, Any]:
    """Popen user/group/extra_groups for ``user:``/``group:`` (KeyError if unknown)."""
    kw: dict[str, Any] = {}
    gid: int | None = None
    if cfg.group:
        gid = int(cfg.group) if cfg.group.isdigit() else grp.getgrnam(cfg.group).gr_gid
        kw["group"] = gid
    if cfg.user:
        pw = pwd.getpwuid(int(cfg.user)) if cfg.user.isdigit() else pwd.getpwnam(cfg.user)
        if gid is None:
            gid = pw.pw_gid  # without this the command would keep the daemon's group
            kw["group"] = gid
        kw["user"] = pw.pw_uid
        kw["extra_groups"] = os.getgrouplist(pw.pw_name, gid)
    return kw


# --- one running job --------------------------------------------------------------


@dataclass(eq=False)
class _Stream:
    name: str  # "stdout" | "stderr"
    fd: int
    buf: bytearray = field(default_factory=bytearray)
    dropping: bool = False  # inside an over-long line: discard until its newline


@dataclass(eq=False)
class _Job:
    lease: Lease
    cfg: WorkerConfig
    proc: subprocess.Popen[bytes]
    tmpdir: str
    started: float
    streams: dict[int, _Stream]
    returncode: int | None = None
    lost: str | None = None  # why the lease is no longer ours
    timed_out: bool = False
    verdict: Verdict | None = None
    settle_tries: int = 0
    output_deadline: float | None = None
    exit_check_delay: float = 0.01
    timers: dict[str, Timer] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def fields(self) -> dict[str, object]:
        return {"job_id": self.lease.job_id, "attempt": self.lease.attempt}


class WorkerRole:
    """Runs ``worker.command`` for leased jobs, up to ``worker.concurrency`` at once."""

    name = "worker"

    def __init__(self, settings: QueueSettings, log: Log) -> None:
        if settings.worker is None:
            raise ValueError("WorkerRole needs a `worker:` section")
        self.settings = settings
        self.log = log
        self.loop: Loop | None = None
        self.q: Queue | None = None
        self.jobs: dict[int, _Job] = {}  # by pid
        self.draining = False
        self.closed = False
        self.done = 0
        self.failed = 0
        self.retried = 0
        self.ready_estimate: int | None = None
        self._inotify: inotify_simple.INotify | None = None
        self._watched: dict[int, str] = {}  # wd -> shard path
        self._fill_timer: Timer | None = None
        self._rescan_timer: Timer | None = None
        self._reopen_timer: Timer | None = None
        self._to_settle: list[_Job] = []  # finished in this loop pass, settled together
        self._settle_timer: Timer | None = None
        self._grouping = False  # inside a group settle: reopening waits for its barriers
        self._reopen_after_group: str | None = None

    # -- Role protocol ------------------------------------------------------------

    def start(self, loop: Loop) -> None:
        self.loop = loop
        # An inherited SIG_IGN for SIGCHLD would make the kernel reap our children
        # itself, and exit statuses (hence acks) would be lost. No handler: default.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.q = open_queue(self.settings)  # a SteadQError refuses the start with its exit code
        stale = payload_dirs.remove_stale()
        if stale:
            self.log.notice(f"removed {len(stale)} payload copies left by a worker that was killed", count=len(stale))
        try:
            self._inotify = inotify_simple.INotify(nonblocking=True)
        except OSError as e:  # e.g. fs.inotify.max_user_instances reached
            self.q.close()
            self.q = None
            raise SteadQError(f"cannot create an inotify instance: {e.strerror}", kind_for_errno(e.errno or 0)) from e
        self._watch_shards()
        loop.add_reader(self._inotify.fileno(), self._guarded(self._on_inotify))
        self._count_ready()
        self._rescan_timer = loop.call_later(SAFETY_RESCAN, self._guarded(self._safety_rescan))
        self._schedule_fill(0.0)  # the first scan runs once the service loop is up (after READY=1)

    def status(self) -> str:
        ready = "?" if self.ready_estimate is None else f"{self.ready_estimate:,}"
        text = f"{len(self.jobs)} running, {ready} ready, {self.done:,} done, {self.failed:,} failed"
        if self.retried:
            text += f", {self.retried:,} retried"
        if self.draining:
            text += ", draining"
        return text

    def reload(self, settings: QueueSettings) -> None:
        if os.path.normpath(settings.queue) != os.path.normpath(self.settings.queue):
            self.log.error(
                "reload refused for the worker: the queue path cannot change while running; restart the service",
                path=settings.queue,
            )
            return
        if settings.worker is None:
            self.log.error("reload refused for the worker: the new configuration has no `worker:` section")
            return
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
        self._schedule_fill(0.0)  # a higher concurrency applies now

    def drain(self) -> None:
        self.draining = True
        if self._fill_timer is not None:
            self._fill_timer.cancel()
            self._fill_timer = None

    def drained(self) -> bool:
        return not self.jobs

    def close(self) -> None:
        """Forced stop: kill what still runs and give its leases back right away."""
        if self.closed:
            return
        self.closed = True
        self.draining = True
        for t in (self._fill_timer, self._rescan_timer, self._reopen_timer, self._settle_timer):
            if t is not None:
                t.cancel()
        self._to_settle.clear()  # still in self.jobs with their verdicts: settled below
        jobs = list(self.jobs.values())
        for j in jobs:  # already exited (not yet noticed): settle by exit status, not as interrupted
            if j.returncode is None and self._exited(j):
                self._reap(j)
        finished = {j.pid for j in jobs if j.returncode is not None}
        running = [j for j in jobs if j.returncode is None]
        for j in running:
            self.log.warning("stopping: terminating a running job", **j.fields, pid=j.pid)
            self._signal_group(j, signal.SIGTERM)
        grace = max((j.cfg.kill_grace for j in running), default=0.0)
        deadline = time.monotonic() + grace
        while running and time.monotonic() < deadline:
            running = [j for j in running if not self._exited(j)]
            if running:
                time.sleep(0.05)
        for j in running:
            self._signal_group(j, signal.SIGKILL)
        for j in jobs:
            try:
                self._shutdown_job(j, interrupted=j.pid not in finished)
            except Exception as e:  # one job must not keep the others' leases
                self.log.error(f"handing back job failed: {e!r}", **j.fields)
        self.jobs.clear()
        if self._inotify is not None:
            if self.loop is not None:
                self.loop.remove_reader(self._inotify.fileno())
            with contextlib.suppress(OSError):
                self._inotify.close()
            self._inotify = None
        if self.q is not None:
            with contextlib.suppress(SteadQError, OSError):
                self.q.close()
            self.q = None

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

    def _later(self, job: _Job, key: str, delay: float, fn: Callable[[], None]) -> None:
        assert self.loop is not None
        old = job.timers.pop(key, None)
        if old is not None:
            old.cancel()
        job.timers[key] = self.loop.call_later(delay, self._guarded(fn, job))

    def _cancel(self, job: _Job, key: str) -> None:
        t = job.timers.pop(key, None)
        if t is not None:
            t.cancel()

    def _schedule_fill(self, delay: float) -> None:
        if self.loop is None or self.draining:
            return
        when = self.loop.now() + delay
        if self._fill_timer is not None and not self._fill_timer.cancelled:
            if self._fill_timer.when <= when:
                return
            self._fill_timer.cancel()
        self._fill_timer = self.loop.call_at(when, self._guarded(self._fill))

    # -- wake-ups ---------------------------------------------------------------

    def _watch_shards(self) -> None:
        assert self._inotify is not None and self.q is not None
        base = os.path.join(self.settings.queue, READY_DIR)
        for s in range(self.q.shard_count):
            path = os.path.join(base, shard_dir(s))
            try:
                wd = self._inotify.add_watch(path, _WATCH_FLAGS)
            except OSError as e:
                self.log.warning(f"cannot watch {path}: {e.strerror}; the safety rescan retries")
                continue
            self._watched[wd] = path

    def _on_inotify(self) -> None:
        assert self._inotify is not None
        wake = False
        for ev in self._inotify.read(timeout=0):
            if ev.mask & inotify_simple.flags.Q_OVERFLOW:
                self.log.warning("inotify queue overflowed; rescanning")
                self._count_ready()
                wake = True
                continue
            if ev.mask & inotify_simple.flags.IGNORED:  # the shard dir went away
                self._watched.pop(ev.wd, None)
                continue
            if not ev.name or not is_ready_name(ev.name):
                continue  # leased names (our claims and renewals), temps, strays
            if ev.mask & _APPEAR:
                wake = True
                if self.ready_estimate is not None:
                    self.ready_estimate += 1
            elif ev.mask & _VANISH and self.ready_estimate is not None:
                self.ready_estimate = max(0, self.ready_estimate - 1)
        if wake:
            self._schedule_fill(0.0)

    def _safety_rescan(self) -> None:
        assert self.loop is not None
        self._rescan_timer = self.loop.call_later(SAFETY_RESCAN, self._guarded(self._safety_rescan))
        if self.q is not None and self._inotify is not None and len(self._watched) < self.q.shard_count:
            self._watch_shards()
        self._count_ready()
        self._schedule_fill(0.0)

    def _count_ready(self) -> None:
        """Ready names by listing the shards, for STATUS=; inotify keeps it current in between."""
        if self.q is None or self.q.shard_count > READY_COUNT_SHARDS:
            self.ready_estimate = None
            return
        base = os.path.join(self.settings.queue, READY_DIR)
        n = 0
        for s in range(self.q.shard_count):
            try:
                with os.scandir(os.path.join(base, shard_dir(s))) as it:
                    n += sum(1 for e in it if looks_ready(e.name))
            except OSError:
                continue
        self.ready_estimate = n

    # -- leasing ------------------------------------------------------------------

    def _fill(self) -> None:
        self._fill_timer = None
        cfg = self.settings.worker
        assert cfg is not None
        while not self.draining and not self.closed and len(self.jobs) < cfg.concurrency:
            if self.q is None:
                self._schedule_reopen()
                return
            try:
                lease = self.q.lease(wait=0.0, duration=cfg.lease)
            except OutcomeUnknown as e:
                self._reopen(f"lease: {e}")
                return
            except NotCommitted as e:
                if e.kind is ErrorKind.QUEUE_POISONED:
                    self._reopen(f"lease: {e}")
                elif e.kind is ErrorKind.MAINTENANCE_BUSY:
                    self._schedule_fill(BUSY_RETRY)
                else:
                    self.log.error(f"lease failed: {e}", error=e.kind.label)
                    self._schedule_fill(ERROR_RETRY)
                return
            except SteadQError as e:
                self.log.error(f"lease failed: {e}", error=e.kind.label)
                self._schedule_fill(ERROR_RETRY)
                return
            self._report_scan()
            if lease is None:
                return
            try:
                self._start_job(lease, cfg)
            except Exception as e:
                self.log.error(f"starting the job failed: {e!r}", job_id=lease.job_id, attempt=lease.attempt)

    def _report_scan(self) -> None:
        report = self.q.last_scan if self.q is not None else None
        if report is None:
            return
        for path, reason, qname in report.quarantined:
            self.log.warning("quarantined a corrupt object", path=path, reason=f"0x{reason:04x}", quarantine=qname)
        for path in report.dead_lettered:
            self.log.warning("dead-lettered a job with no attempts left", path=path)
        for err in report.errors:
            self.log.warning(f"scan: {err}")

    # -- starting a job -------------------------------------------------------------

    def _start_job(self, lease: Lease, cfg: WorkerConfig) -> None:
        assert self.loop is not None
        fields = {"job_id": lease.job_id, "attempt": lease.attempt}
        claimed = self.loop.now()
        tmpdir = ""
        try:
            tmpdir = payload_dirs.make(lease.job_id)
            identity = _identity(cfg)
            payload_path = os.path.join(tmpdir, "payload")
            fd = os.open(payload_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                lease.copy_payload_to(f)  # verified: a corrupt payload raises (and is quarantined)
                os.fchmod(f.fileno(), 0o400)
                if "user" in identity and cfg.input == "file":
                    os.fchown(f.fileno(), identity["user"], identity["group"])
            if "user" in identity and cfg.input == "file":
                os.chown(tmpdir, identity["user"], identity["group"])
                os.chmod(tmpdir, 0o500)
            env = build_environment(
                cfg,
                lease,
                queue_name=self.settings.name,
                queue_path=self.settings.queue,
                parent_env=os.environ,
                payload_file=payload_path if cfg.input == "file" else None,
            )
        except (LeaseLost, OutcomeUnknown) as e:
            self._rmtree(tmpdir)
            self.log.error(f"lost the job while preparing it: {e}", **fields)
            if isinstance(e, OutcomeUnknown):
                self._reopen(str(e))
            return
        except SteadQError as e:
            self._rmtree(tmpdir)
            if getattr(e, "payload", False) or e.kind is ErrorKind.PAYLOAD_CORRUPT:
                self.failed += 1
                self.log.error(f"payload is corrupt; the job was quarantined: {e}", **fields)
                return
            self.log.error(f"cannot prepare the job: {e}", **fields)
            self._settle_simple(lease, cfg, Verdict.RETRY)
            return
        except (OSError, KeyError, ValueError) as e:
            self._rmtree(tmpdir)
            self.log.error(f"cannot prepare the job: {e!r}", **fields)
            self._settle_simple(lease, cfg, Verdict.RETRY)
            return

        argv = ["/bin/sh", "-c", cfg.command[0]] if cfg.shell else list(cfg.command)
        stdin: Any = subprocess.DEVNULL
        stdin_file = None
        try:
            if cfg.input == "stdin":
                stdin_file = open(payload_path, "rb")  # noqa: SIM115 - closed right after the spawn
                stdin = stdin_file
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cfg.working_directory,
                start_new_session=True,
                close_fds=True,
                **identity,
            )
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            self._rmtree(tmpdir)
            self.log.error(f"cannot start the command {argv[0]!r}: {e}", **fields)
            self._settle_simple(lease, cfg, Verdict.RETRY)
            return
        finally:
            if stdin_file is not None:
                stdin_file.close()
        assert proc.stdout is not None and proc.stderr is not None
        streams: dict[int, _Stream] = {}
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            streams[fd] = _Stream(name, fd)
        job = _Job(lease=lease, cfg=cfg, proc=proc, tmpdir=tmpdir, started=self.loop.now(), streams=streams)
        self.jobs[proc.pid] = job
        for fd, st in streams.items():
            self.loop.add_reader(fd, self._guarded(lambda j=job, s=st: self._on_output(j, s), job))
        # The copy above ran in this thread; count it against the first renewal.
        self._later(job, "renew", max(0.0, cfg.renew_interval - (self.loop.now() - claimed)), lambda: self._renew(job))
        self._later(job, "exit", EXIT_CHECK_RUNNING, lambda: self._check_exit(job))
        if cfg.timeout is not None:
            self._later(job, "timeout", cfg.timeout, lambda: self._on_timeout(job))
        self.log.info("job started", **fields, pid=proc.pid, max_attempts=lease.max_attempts)

    # -- output -------------------------------------------------------------------

    def _on_output(self, job: _Job, st: _Stream) -> None:
        try:
            data = os.read(st.fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._feed(job, st, data)
            return
        self._close_stream(job, st)
        if not job.streams:
            job.exit_check_delay = 0.01
            self._check_exit(job)

    def _feed(self, job: _Job, st: _Stream, data: bytes) -> None:
        start = 0
        while True:
            nl = data.find(b"\n", start)
            chunk = data[start:] if nl < 0 else data[start:nl]
            if not st.dropping:
                room = MAX_LINE - len(st.buf)
                st.buf += chunk[:room]
                if len(chunk) > room:
                    self._emit(job, st, truncated=True)
                    st.dropping = True
            if nl < 0:
                return
            if st.dropping:
                st.dropping = False
            else:
                self._emit(job, st)
            start = nl + 1

    def _emit(self, job: _Job, st: _Stream, *, truncated: bool = False) -> None:
        line = bytes(st.buf).decode("utf-8", "replace").rstrip("\r")
        st.buf.clear()
        self.log.log(
            INFO if st.name == "stdout" else WARNING,
            line,
            **job.fields,
            stream=st.name,
            truncated="true" if truncated else None,
        )

    def _close_stream(self, job: _Job, st: _Stream) -> None:
        if self.loop is not None:
            self.loop.remove_reader(st.fd)
        if st.buf and not st.dropping:
            self._emit(job, st)
        job.streams.pop(st.fd, None)
        pipe = job.proc.stdout if st.name == "stdout" else job.proc.stderr
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()

    # -- exit -------------------------------------------------------------------

    def _exited(self, job: _Job) -> bool:
        """Has the leader exited? Leaves it unreaped, so its pid still names the group."""
        if job.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, job.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def _signal_group(self, job: _Job, sig: int) -> None:
        """Signal the job's process group; only while the leader is unreaped (pid reuse)."""
        if job.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.pid, sig)

    def _reap(self, job: _Job) -> None:
        """Kill leftovers of the group while the zombie pins its id, then reap."""
        self._signal_group(job, signal.SIGKILL)
        code = job.proc.poll()
        if code is None:  # cannot be: waitid saw it exit; wait for real rather than guess
            code = job.proc.wait()
        job.returncode = code
        self._cancel(job, "timeout")
        self._cancel(job, "kill")

    def _check_exit(self, job: _Job) -> None:
        assert self.loop is not None
        if job.proc.pid not in self.jobs:
            return
        if job.returncode is None:
            if not self._exited(job):
                if job.streams:
                    self._later(job, "exit", EXIT_CHECK_RUNNING, lambda: self._check_exit(job))
                else:  # output closed: the exit is normally a moment away
                    self._later(job, "exit", job.exit_check_delay, lambda: self._check_exit(job))
                    job.exit_check_delay = min(EXIT_CHECK_MAX, job.exit_check_delay * 2)
                return
            self._reap(job)
        if job.streams:  # exited, but something (an escaped process) still holds the pipes
            now = self.loop.now()
            if job.output_deadline is None:
                job.output_deadline = now + OUTPUT_GRACE
            if now < job.output_deadline:
                self._later(job, "exit", job.output_deadline - now, lambda: self._check_exit(job))
                return
            self.log.warning("command exited but its output stays open; closing it", **job.fields)
            for st in list(job.streams.values()):
                with contextlib.suppress(OSError):
                    while data := os.read(st.fd, READ_CHUNK):
                        self._feed(job, st, data)
                self._close_stream(job, st)
        self._cancel(job, "exit")
        self._finish(job)

    def _on_timeout(self, job: _Job) -> None:
        if job.returncode is not None or job.timed_out:
            return
        if self._exited(job):  # it finished in time; only its output is still held open
            self._check_exit(job)
            return
        job.timed_out = True
        self.log.warning(
            f"job timed out after {job.cfg.timeout:g}s; sending SIGTERM to its process group",
            **job.fields,
            pid=job.pid,
        )
        self._signal_group(job, signal.SIGTERM)
        self._later(job, "kill", job.cfg.kill_grace, lambda: self._on_kill(job))

    def _on_kill(self, job: _Job) -> None:
        if job.returncode is not None or self._exited(job):
            self._check_exit(job)
            return
        self.log.warning("job still running after the kill grace; sending SIGKILL", **job.fields, pid=job.pid)
        self._signal_group(job, signal.SIGKILL)
        job.exit_check_delay = 0.01
        self._later(job, "exit", 0.01, lambda: self._check_exit(job))

    # -- renewing -------------------------------------------------------------------

    def _renew(self, job: _Job) -> None:
        if job.lost is not None or job.proc.pid not in self.jobs:
            return
        if self.q is None:
            self._schedule_reopen()
        else:
            try:
                self.q.renew(job.lease, duration=job.cfg.lease)
            except LeaseLost as e:
                self._lose(job, f"renewal: lease lost: {e}")
                return
            except OutcomeUnknown as e:
                self._lose(job, f"renewal outcome unknown: {e}")
                self._reopen(f"renew: {e}")
                return
            except NotCommitted as e:
                self.log.warning(
                    f"lease renewal not committed; retrying in {job.cfg.renew_interval:g}s: {e}", **job.fields
                )
                if e.kind is ErrorKind.QUEUE_POISONED:
                    self._reopen(f"renew: {e}")
        self._later(job, "renew", job.cfg.renew_interval, lambda: self._renew(job))

    def _lose(self, job: _Job, reason: str) -> None:
        job.lost = reason
        self._cancel(job, "renew")
        self.log.error(
            "LEASE LOST while the command runs: the job may run again elsewhere; this run will not be settled",
            **job.fields,
            reason=reason,
        )

    # -- settling -----------------------------------------------------------------

    def _finish(self, job: _Job) -> None:
        assert self.loop is not None
        self._cancel(job, "timeout")
        self._cancel(job, "kill")
        code = job.returncode
        assert code is not None
        duration_ms = round((self.loop.now() - job.started) * 1000)
        signame = None
        if code < 0:
            with contextlib.suppress(ValueError):
                signame = signal.Signals(-code).name
        outcome = job.verdict = self._verdict(job)
        self.log.log(
            INFO if outcome is Verdict.ACK else WARNING,
            f"job finished: {outcome}" + (" (timed out)" if job.timed_out else ""),
            **job.fields,
            exit_status=code if code >= 0 else None,
            signal=signame,
            verdict=outcome,
            duration_ms=duration_ms,
            timed_out="true" if job.timed_out else None,
        )
        self._rmtree(job.tmpdir)
        if outcome is Verdict.ABANDON:
            self._drop(job)
            return
        self._queue_settle(job)

    def _queue_settle(self, job: _Job) -> None:
        """Settle at the end of this loop pass, with every other job that finished in it."""
        assert self.loop is not None
        self._to_settle.append(job)
        if self._settle_timer is None:
            self._settle_timer = self.loop.call_later(0.0, self._guarded(self._settle_finished))

    def _settle_finished(self) -> None:
        """Group commit: the verdicts of jobs that finished together share their barriers.

        Inside one ``q.batch()`` each ack/retry/bury still renames at once (its
        linearization point) but the directory fsyncs are issued together at
        the end, one per directory, and a journal commit covers all of them, so
        concurrency overlaps the fsyncs as well as the commands. Nothing is
        reported durable before the batch's sync: a failed barrier makes every
        outcome in the group unknown, the handle is poisoned and reopened.
        """
        self._settle_timer = None
        jobs, self._to_settle = self._to_settle, []
        q = self.q
        if q is None or len(jobs) < 2:
            for job in jobs:
                self._settle(job)
            return
        self._grouping = True
        why: str | None = None
        try:
            with q.batch():
                for job in jobs:
                    try:
                        self._settle(job)
                    except Exception as e:  # one job must not leave the others unsettled
                        self.log.error(f"internal error settling a job: {e!r}", **job.fields)
                        self._drop(job)
        except OutcomeUnknown as e:
            self.log.error(
                f"settling outcome unknown for {len(jobs)} jobs settled together (recovery decides): {e}",
                job_ids=",".join(j.lease.job_id for j in jobs),
            )
            why = f"settle: {e}"
        finally:
            self._grouping = False
            why = self._reopen_after_group or why
            self._reopen_after_group = None
        if why is not None:
            self._reopen(why)

    @staticmethod
    def _verdict(job: _Job) -> Verdict:
        assert job.returncode is not None
        return verdict(
            job.returncode, timed_out=job.timed_out, lease_lost=job.lost is not None, policy=job.cfg.exit_status
        )

    def _settle(self, job: _Job) -> None:
        """Apply ``job.verdict``; NotCommitted is retried (renewals go on meanwhile)."""
        if job.lost is not None:
            self._drop(job)
            return
        job.settle_tries += 1
        if self.q is None:
            self._reopen_now()
        try:
            if self.q is None:
                raise NotCommitted("queue is not open", ErrorKind.IO_FAILURE)
            self._apply(job.lease, job.cfg, job.verdict or Verdict.RETRY)
        except LeaseLost as e:
            self.log.error(f"settling failed: the lease was lost: {e}", **job.fields, verdict=job.verdict)
        except OutcomeUnknown as e:
            self.log.error(
                f"settling outcome unknown (recovery decides): {e}",
                **job.fields,
                verdict=job.verdict,
                ticket=_ticket(e),
            )
            self._reopen(f"settle: {e}")
        except NotCommitted as e:
            if e.kind is ErrorKind.QUEUE_POISONED:
                self._reopen(f"settle: {e}")
            if job.settle_tries < SETTLE_TRIES:
                self.log.warning(f"settling not committed, retrying: {e}", **job.fields, verdict=job.verdict)
                self._later(job, "settle", 1.0, lambda: self._settle(job))
                return
            self.log.error(
                f"giving up settling; the lease expires and recovery returns the job: {e}",
                **job.fields,
                verdict=job.verdict,
            )
        except SteadQError as e:
            self.log.error(f"settling failed: {e}", **job.fields, verdict=job.verdict)
        self._drop(job)

    def _apply(self, lease: Lease, cfg: WorkerConfig, outcome: Verdict) -> None:
        assert self.q is not None
        fields = {"job_id": lease.job_id, "attempt": lease.attempt}
        if outcome is Verdict.ACK:
            self.q.ack(lease)
            self.done += 1
        elif outcome is Verdict.BURY:
            self.q.bury(lease, reason=cfg.exit_status.bury_reason)
            self.failed += 1
            self.log.warning("job buried", **fields, reason=f"0x{cfg.exit_status.bury_reason:04x}")
        else:
            state = self.q.retry(lease, policy=retry_policy(cfg))
            if state == "dead":
                self.failed += 1
                self.log.warning(
                    f"no attempts left ({lease.attempt}/{lease.max_attempts}); job buried with reason 0x0004",
                    **fields,
                    reason="0x0004",
                )
            else:
                self.retried += 1
                self.log.info(f"job retried: {state}", **fields, state=state)

    def _settle_simple(self, lease: Lease, cfg: WorkerConfig, outcome: Verdict) -> None:
        """Settle a lease whose command never ran (preparation or spawn failed)."""
        try:
            if self.q is None:
                raise NotCommitted("queue is not open", ErrorKind.IO_FAILURE)
            self._apply(lease, cfg, outcome)
        except OutcomeUnknown as e:
            self.log.error(f"settling outcome unknown: {e}", job_id=lease.job_id, ticket=_ticket(e))
            self._reopen(str(e))
        except SteadQError as e:
            self.log.error(f"settling failed; the lease expires and recovery returns the job: {e}", job_id=lease.job_id)

    def _drop(self, job: _Job) -> None:
        for key in list(job.timers):
            self._cancel(job, key)
        for st in list(job.streams.values()):
            self._close_stream(job, st)
        self.jobs.pop(job.pid, None)
        self._schedule_fill(0.0)

    def _abandon(self, job: _Job, why: str) -> None:
        """After an internal error: make sure the job cannot hang the role forever."""
        if job.pid not in self.jobs:
            return
        with contextlib.suppress(Exception):
            if job.returncode is None and self._exited(job):
                self._reap(job)
        if job.returncode is not None and job.verdict is None:
            with contextlib.suppress(Exception):
                self._finish(job)
                return
        if job.returncode is None:  # still running: keep it; its timers and pipes still drive it
            if not job.timers:
                self._later(job, "exit", EXIT_CHECK_RUNNING, lambda: self._check_exit(job))
            return
        self.log.error(f"dropping the job after an internal error ({why}); the lease will expire", **job.fields)
        self._drop(job)

    def _shutdown_job(self, job: _Job, *, interrupted: bool) -> None:
        """close(): reap, then hand an interrupted job's lease back; settle a finished one."""
        for key in list(job.timers):
            self._cancel(job, key)
        if job.returncode is None:
            self._signal_group(job, signal.SIGKILL)
            job.returncode = job.proc.wait()
        for st in list(job.streams.values()):
            self._close_stream(job, st)
        self._rmtree(job.tmpdir)
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
            self._apply(job.lease, job.cfg, job.verdict)
            return
        state = self.q.retry(job.lease)
        self.log.warning(f"job handed back on stop: {state} (its attempt is counted)", **job.fields, state=state)

    # -- the queue handle -----------------------------------------------------------

    def _reopen(self, why: str) -> None:
        """A poisoned handle: close it and open a fresh one (the tree is the truth)."""
        if self._grouping:  # the group's earlier settles still owe their barriers: after it
            self._reopen_after_group = self._reopen_after_group or why
            return
        self.log.error(f"queue handle poisoned ({why}); reopening the queue")
        if self.q is not None:
            with contextlib.suppress(SteadQError, OSError):
                self.q.close()
            self.q = None
        self._reopen_now()

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

    @staticmethod
    def _rmtree(path: str) -> None:
        if not path:
            return
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)
        shutil.rmtree(path, ignore_errors=True)


def _ticket(e: OutcomeUnknown) -> str | None:
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


__all__ = ["WorkerRole", "build_environment", "meta_env_name", "meta_env_value", "is_ready_name", "SAFETY_RESCAN"]
