"""One job's command: its process group, its output, its end and its timeout.

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

The worker's own death
    A SIGKILLed worker cannot clean up: each leader has a parent-death signal
    and a guard process kills the groups left behind (steadqd.daemon.worker.run.guard).

Output
    Each line of output is one journal entry (stdout at INFO, stderr at
    WARNING) with the job's fields; a line longer than :data:`MAX_LINE` is
    cut there and the rest of it dropped, so a command cannot make the
    daemon hold an unbounded line in memory. Output that is not text (a line
    with a NUL byte or that is not UTF-8: a frame, a video written to stdout)
    is never dumped: from that line on the stream is counted, and one entry
    ``<N bytes of binary output>`` says so when it closes, so the job's own
    lines and verdict are not buried under replacement characters.

Timeout
    SIGTERM to the group, SIGKILL after ``kill_grace``; what the run then
    counts as is the exit policy's business (steadqd.daemon.worker.policy).

A :class:`Child` knows nothing of leases or queues: it tells its owner
once, through ``on_exit``, that the command has ended and its output is
closed.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import grp
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from steadqd.daemon.config import WorkerConfig
from steadqd.daemon.journal import INFO, WARNING, Log, short_id
from steadqd.daemon.service import Loop, Timers
from steadqd.daemon.worker.run import exec_helper, fastspawn
from steadqd.daemon.worker.run.fastspawn import Process
from steadqd.daemon.worker.run.guard import GroupGuard, die_with_parent, process_guard

__all__ = ["Child", "Starting", "command_argv", "identity", "launch", "spawn", "spawned", "submit", "terminate"]

MAX_LINE = 16 * 1024  # bytes of one forwarded output line; the rest of the line is dropped
READ_CHUNK = 64 * 1024
EXIT_CHECK_RUNNING = 2.0  # s; safety check of a job whose output is still open
EXIT_CHECK_MAX = 2.0  # s; slowest re-check of a job that closed its output but runs on
STDERR_TAIL = 20  # lines kept for a notification command (each at most MAX_LINE)
OUTPUT_GRACE = 2.0  # s; how long output may stay open after the command exited

Guard = Callable[[Callable[[], None]], Callable[[], None]]


# --- starting the command -----------------------------------------------------------


def identity(cfg: WorkerConfig) -> dict[str, Any]:
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


def command_argv(cfg: WorkerConfig) -> list[str]:
    return ["/bin/sh", "-c", cfg.command[0]] if cfg.shell else list(cfg.command)


def launch(
    cfg: WorkerConfig, env: Mapping[str, str], payload_path: str, credentials: Mapping[str, Any]
) -> tuple[Process, int | None]:
    """Start the command in a session of its own, output on pipes, with a parent-death signal.

    The compiled path (steadqd.daemon.worker.run.fastspawn: one vfork, one
    exec, whoever the command runs as) returns once the exec worked, with no
    report pipe. Without it: Popen through ``steadq-exec``
    (steadqd.daemon.worker.run.exec_helper) returns before the command's own
    exec, with the read end of the helper's report pipe: its EOF says the
    command runs, a number that its exec failed. None instead of a pipe: the
    exec is already known to have worked (Popen itself raised otherwise).
    The signal is set by ``steadq-exec`` so that Popen can vfork: a
    ``preexec_fn`` would make it fork the whole worker. On that path a
    command run as another user gets it from ``preexec_fn``: a uid/gid change
    makes CPython fork anyway.
    With ``input: stdin`` its stdin is the read-only payload copy itself: a
    regular file cannot deadlock the loop the way a pipe it must feed could.
    On every path the child tells the guard its group before the command can
    run (:meth:`GroupGuard.pipe`): told after the spawn returned, a worker
    killed in between would leave a running group the guard never heard of.
    """
    stdin: Any = subprocess.DEVNULL
    stdin_file = None
    try:
        if cfg.input == "stdin":
            stdin_file = open(payload_path, "rb")  # noqa: SIM115 - closed right after the spawn
            stdin = stdin_file
        report: int | None = None
        proc: Process
        guard = process_guard(env.get("STEADQ_QUEUE", ""))
        job_id = env.get("STEADQ_JOB_ID", "")
        told = False  # has the child written its own guard line (or will Popen's preexec_fn)?
        if fastspawn.available():
            guard_fd = guard.pipe()
            told = guard_fd >= 0
            proc = fastspawn.spawn(
                command_argv(cfg),
                env=env,
                cwd=cfg.working_directory,
                stdin_fd=None if stdin_file is None else stdin_file.fileno(),
                credentials=credentials,
                guard_fd=guard_fd,
                guard_tail=guard.tail(job_id),
            )
        else:
            kwargs: dict[str, Any] = dict(
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cfg.working_directory,
                start_new_session=True,
                close_fds=True,
                **credentials,
            )
            # With user:/group: CPython forks whatever we pass, and that user need not be able to
            # execute the helper (a checkout under /root); an uninstalled tree has no helper.
            if exec_helper.available() and not credentials:
                guard_fd = guard.pipe()
                told = guard_fd >= 0
                proc, report = exec_helper.start(command_argv(cfg), guard_fd=guard_fd, **kwargs)
            else:
                proc = _popen_telling_the_guard(command_argv(cfg), guard, job_id, kwargs)
                told = True  # by the preexec_fn; started() sees a guard that could not be started
        guard.started(proc.pid, job_id, told=told)
        return proc, report
    finally:
        if stdin_file is not None:
            stdin_file.close()


@dataclass(eq=False)
class Starting:
    """A command handed to the spawn pool (:func:`submit`); :func:`spawned` finishes it."""

    token: int
    job_id: str
    guard_fd: int
    generation: int


def submit(
    pool: fastspawn.Pool, cfg: WorkerConfig, env: Mapping[str, str], payload_path: str, credentials: Mapping[str, Any]
) -> Starting:
    """:func:`launch`'s compiled path without waiting for the exec: the pool's thread spawns, the caller goes on.

    The child still tells the guard its group before the command can run;
    the guard's descriptor is lent to the spawn (:meth:`GroupGuard.lend`) so
    that a guard replaced meanwhile does not close it under the child.
    The pool's result goes to :func:`spawned` (with the same ``Starting``).
    """
    stdin_fd = os.open(payload_path, os.O_RDONLY | os.O_CLOEXEC) if cfg.input == "stdin" else None
    guard = process_guard(env.get("STEADQ_QUEUE", ""))
    job_id = env.get("STEADQ_JOB_ID", "")
    guard_fd, generation = guard.lend()
    try:
        token = pool.submit(
            command_argv(cfg),
            env=env,
            cwd=cfg.working_directory,
            stdin_fd=stdin_fd,  # the pool's now: closed once the spawn is done, or by submit if it raises
            credentials=credentials,
            guard_fd=guard_fd,
            guard_tail=guard.tail(job_id),
        )
    except BaseException:
        guard.give_back(guard_fd)
        raise
    return Starting(token, job_id, guard_fd, generation)


def spawned(starting: Starting, result: Process | OSError) -> Process:
    """A pooled spawn is done: the command runs (its group is the guard's), or its ``OSError`` is raised
    (its child took its guard line back itself)."""
    guard = process_guard()
    guard.give_back(starting.guard_fd)
    if isinstance(result, OSError):
        raise result
    guard.started(result.pid, starting.job_id, told=starting.guard_fd >= 0, generation=starting.generation)
    return result


def _popen_telling_the_guard(
    argv: list[str], guard: GroupGuard, job_id: str, kwargs: Mapping[str, Any]
) -> subprocess.Popen[bytes]:
    """Popen with :func:`die_with_parent` as ``preexec_fn``, which also tells the guard the group.

    A failed exec makes Popen raise after reaping the child, with no pid: the child wrote it to a pipe
    of ours too, so its guard line is taken back.
    """
    pid_r, pid_w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            preexec = die_with_parent(guard.pipe(), guard.tail(job_id), pid_w)
            return subprocess.Popen(argv, preexec_fn=preexec, **kwargs)
        except OSError:
            os.close(pid_w)
            pid_w = -1
            os.set_blocking(pid_r, False)
            with contextlib.suppress(OSError, ValueError):
                guard.failed(int(os.read(pid_r, 32)))
            raise
    finally:
        os.close(pid_r)
        if pid_w >= 0:
            os.close(pid_w)


def spawn(cfg: WorkerConfig, env: Mapping[str, str], payload_path: str, credentials: Mapping[str, Any]) -> Process:
    """:func:`launch`, returning once the command's exec worked (else its ``OSError``, as Popen's)."""
    proc, report = launch(cfg, env, payload_path, credentials)
    if report is not None:
        try:  # only the helper's path (a Popen) reports through a pipe
            exec_helper.wait_report(cast("subprocess.Popen[bytes]", proc), report, command_argv(cfg)[0])
        except OSError:
            process_guard().forget(proc.pid)
            raise
    return proc


def terminate(children: list[Child]) -> None:
    """Forced stop: SIGTERM to every group, SIGKILL to those still there after the longest kill grace."""
    for c in children:
        job = str(c.fields.get("job_id", "?"))
        c.log.warning(
            f"stopping: terminating job {short_id(job)} (SIGTERM to its process group)", **c.fields, pid=c.pid
        )
        c.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + max((c.cfg.kill_grace for c in children), default=0.0)
    while children and time.monotonic() < deadline:
        children = [c for c in children if not c.exited()]
        if children:
            time.sleep(0.05)
    for c in children:
        c.signal_group(signal.SIGKILL)


# --- the running command -------------------------------------------------------------


@dataclass(eq=False)
class Stream:
    name: str  # "stdout" | "stderr"
    fd: int
    buf: bytearray = field(default_factory=bytearray)
    dropping: bool = False  # inside an over-long line: discard until its newline
    seen: int = 0  # bytes read from the stream so far
    line_start: int = 0  # the offset in the stream of the line being gathered
    binary_from: int | None = None  # the offset of the first line that was not text: counted from there


def output_text(raw: bytes, *, truncated: bool = False) -> str | None:
    """One output line as text, or None when it is not text (a NUL, or not UTF-8).

    A line cut at :data:`MAX_LINE` may end inside a character: that tail is dropped, not judged."""
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if truncated and e.reason == "unexpected end of data":
            return raw[: e.start].decode("utf-8", "replace")
        return None


class Child:
    """A started command, driven by the loop until it has exited and its output is closed."""

    def __init__(
        self,
        proc: Process,
        cfg: WorkerConfig,
        *,
        loop: Loop,
        log: Log,
        fields: dict[str, object],
        guard: Guard,
        on_exit: Callable[[], None],
        report_fd: int | None = None,
        on_report: Callable[[bytes], None] | None = None,
    ) -> None:
        self.proc = proc
        self.pid: int = proc.pid  # the leader's, for its life (the group id): read many times a job
        self.cfg = cfg
        self.loop = loop
        self.log = log
        self.fields = fields
        self.timers = Timers(loop, guard)  # "exit", "timeout", "kill"
        self._guard = guard
        self._on_exit = on_exit
        self.returncode: int | None = None
        self.timed_out = False
        self.released = False
        self.output_deadline: float | None = None
        self.exit_check_delay = 0.01
        self.streams: dict[int, Stream] = {}
        # The last stderr lines, for a notification command (worker.on_bury: daemon/worker/hooks.py).
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._report_fd = report_fd  # steadq-exec's report pipe, until its end is read
        self._on_report = on_report
        self._report = b""
        self._pidfd: int | None = None  # readable once the leader has exited (Linux 5.3+): _watch_exit
        self._pidfd_tried = False  # _watch_exit opens it once at most
        self._exit_told = False  # on_exit is called once
        if report_fd is not None:
            os.set_blocking(report_fd, False)
        set_already = getattr(proc, "pipes_nonblocking", False)  # the spawn pool's thread did it
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            if pipe is not None:
                fd = pipe.fileno()
                if not set_already:
                    os.set_blocking(fd, False)
                self.streams[fd] = Stream(name, fd)

    @property
    def signal_name(self) -> str | None:
        """The signal that killed the command, if one did."""
        code = self.returncode
        if code is None or code >= 0:
            return None
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
        return None

    @property
    def ended(self) -> str:
        """How it ended, for the journal: ``exit 1``, ``killed by SIGKILL``."""
        code = self.returncode
        if code is not None and code >= 0:  # the usual end: no signal to name (and no call to ask)
            return f"exit {code}"
        name = self.signal_name
        return f"killed by {name}" if name else f"exit {self.returncode}"

    def start(self) -> None:
        """Read its output and its start report, and watch for its end (and its timeout)."""
        if self._report_fd is not None:
            self.loop.add_reader(self._report_fd, self._guard(self.read_report))
        for st in self.streams.values():
            self.loop.add_reader(st.fd, self._guard(functools.partial(self._on_output, st)))
        self.timers.set("exit", EXIT_CHECK_RUNNING, self.check_exit)
        if self.cfg.timeout is not None:
            self.timers.set("timeout", self.cfg.timeout, self._on_timeout)

    def _watch_exit(self) -> None:
        """Its output is closed but the leader runs on: its pidfd wakes the loop at its exit (no polling).

        Opened only then, not at the start: the exit of a command whose output is still open is left to
        the exit checks' timers anyway, and almost every command closes its output by exiting, which EOF
        reports, so its end needs no pidfd (nor its four system calls and a wake-up of its own).
        """
        if self._pidfd is not None or self._pidfd_tried:
            return
        self._pidfd_tried = True
        with contextlib.suppress(OSError, AttributeError):  # no pidfds: the exit checks' timers alone
            self._pidfd = os.pidfd_open(self.pid)  # an unreaped child: its pid is not another's
            self.loop.add_reader(self._pidfd, self._guard(self._on_pidfd))

    def _on_pidfd(self) -> None:
        """The leader exited (its output was closed before: :meth:`_watch_exit`); that is its end now."""
        self._close_pidfd()
        if not self.streams and not self.released:
            self.check_exit()

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def release(self) -> None:
        """Its owner is done with it: no more callbacks, no more output."""
        self.released = True
        self.timers.cancel_all()
        if self._pidfd is not None:  # the usual end has none (it closed its output by exiting): no call
            self._close_pidfd()
        if self.streams or self._report_fd is not None:  # the usual end closed them already
            self.close_streams()

    def kill(self) -> None:
        """Forced stop: SIGKILL what is left of the group, reap the leader, close the pipes."""
        self.timers.cancel_all()
        self._close_pidfd()
        if self.returncode is None:
            self.signal_group(signal.SIGKILL)
            process_guard().forget(self.pid)
            self.returncode = self.proc.wait()
        self.close_streams()

    # -- the start report -----------------------------------------------------------

    @property
    def starting(self) -> bool:
        """Its start report has not been read to its end yet."""
        return self._report_fd is not None

    def read_report(self, *, wait: bool = False) -> None:
        """Read the start report; at its end tell ``on_report`` what it said (b"": the command runs).

        ``wait`` is only for when the report is known to be complete: the
        command has produced output or exited, so the helper's copy of the
        pipe is closed (at the exec, or with the helper) and a read cannot block.
        """
        fd = self._report_fd
        if fd is None:
            return
        if wait:
            os.set_blocking(fd, True)
        try:
            while chunk := os.read(fd, 64):
                self._report += chunk
        except BlockingIOError:
            return
        except OSError:
            pass  # a pipe that cannot be read says no more: what was read is the report
        self._close_report()
        if self._on_report is not None:
            self._on_report(self._report)

    def _close_report(self) -> None:
        if self._report_fd is not None:
            self.loop.remove_reader(self._report_fd)
            os.close(self._report_fd)
            self._report_fd = None

    # -- output -------------------------------------------------------------------

    def _on_output(self, st: Stream) -> None:
        if self._report_fd is not None:  # output: the exec is done, and "started" comes first
            self.read_report(wait=True)
            if self.released:
                return
        try:
            data = os.read(st.fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._feed(st, data)
            return
        self.close_stream(st)
        if not self.streams:
            self.exit_check_delay = 0.01
            self.check_exit()

    def _feed(self, st: Stream, data: bytes) -> None:
        base = st.seen
        st.seen += len(data)
        if st.binary_from is not None:
            return  # counted only
        start = 0
        while True:
            nl = data.find(b"\n", start)
            chunk = data[start:] if nl < 0 else data[start:nl]
            if not st.dropping:
                room = MAX_LINE - len(st.buf)
                st.buf += chunk[:room]
                if len(chunk) > room:
                    if not self._emit(st, truncated=True):
                        return
                    st.dropping = True
            if nl < 0:
                return
            if st.dropping:
                st.dropping = False
            elif not self._emit(st):
                return
            start = nl + 1
            st.line_start = base + start

    def _emit(self, st: Stream, *, truncated: bool = False) -> bool:
        """Log the gathered line; False (nothing logged) when it is not text: the stream is counted from it."""
        line = output_text(bytes(st.buf), truncated=truncated)
        st.buf.clear()
        if line is None:
            st.binary_from = st.line_start
            return False
        if st.name == "stderr":
            self.stderr_tail.append(line)
        self.log.log(
            INFO if st.name == "stdout" else WARNING,
            line.rstrip("\r"),
            **self.fields,
            stream=st.name,
            truncated="true" if truncated else None,
        )
        return True

    def close_stream(self, st: Stream) -> None:
        self.loop.remove_reader(st.fd)
        if st.buf and not st.dropping and st.binary_from is None:
            self._emit(st)
        if st.binary_from is not None:
            self.log.log(
                INFO if st.name == "stdout" else WARNING,
                f"<{st.seen - st.binary_from} bytes of binary output>",
                **self.fields,
                stream=st.name,
            )
        self.streams.pop(st.fd, None)
        pipe = self.proc.stdout if st.name == "stdout" else self.proc.stderr
        if pipe is not None:
            try:  # not contextlib.suppress: twice a job on the loop's thread, a context manager's three calls each
                pipe.close()
            except OSError:
                pass

    def close_streams(self) -> None:
        self._close_report()
        for st in list(self.streams.values()):
            self.close_stream(st)

    # -- the process group --------------------------------------------------------------

    def exited(self) -> bool:
        """Has the leader exited? Leaves it unreaped, so its pid still names the group."""
        if self.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def signal_group(self, sig: int) -> None:
        """Signal the job's process group; only while the leader is unreaped (pid reuse)."""
        if self.returncode is not None:
            return
        try:  # once a job at least (the reap): no context manager's calls
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self) -> None:
        """Kill leftovers of the group while the zombie pins its id, then reap."""
        self.signal_group(signal.SIGKILL)
        process_guard().forget(self.pid)  # while the zombie still pins the group id
        code = self.proc.poll()
        if code is None:  # cannot be: waitid saw it exit; wait for real rather than guess
            code = self.proc.wait()
        self.returncode = code
        self.timers.cancel("timeout")
        self.timers.cancel("kill")

    # -- the end ------------------------------------------------------------------------

    def check_exit(self) -> None:
        if self.released or self._exit_told:  # a pidfd, a timer and EOF may each ask after the end was told
            return
        if self.returncode is None:
            if not self.exited():
                if self.streams:
                    self.timers.set("exit", EXIT_CHECK_RUNNING, self.check_exit)
                else:  # output closed: the exit is normally a moment away
                    self._watch_exit()
                    self.timers.set("exit", self.exit_check_delay, self.check_exit)
                    self.exit_check_delay = min(EXIT_CHECK_MAX, self.exit_check_delay * 2)
                return
            self.reap()
        if self.streams and not self._output_grace_over():
            return
        if self._report_fd is not None:  # exited before its report was read: the report is complete
            self.read_report(wait=True)
            if self.released:  # its exec failed: not a run that ended
                return
        self.timers.cancel("exit")
        if self._pidfd is not None:
            self._close_pidfd()
        self._exit_told = True
        self._on_exit()

    def _output_grace_over(self) -> bool:
        """Exited, but something (an escaped process) still holds the pipes: wait a little, then close them."""
        now = self.loop.now()
        if self.output_deadline is None:
            self.output_deadline = now + OUTPUT_GRACE
        if now < self.output_deadline:
            self.timers.set("exit", self.output_deadline - now, self.check_exit)
            return False
        self.log.warning("command exited but its output stays open; closing it", **self.fields)
        for st in list(self.streams.values()):
            with contextlib.suppress(OSError):
                while data := os.read(st.fd, READ_CHUNK):
                    self._feed(st, data)
            self.close_stream(st)
        return True

    def _on_timeout(self) -> None:
        if self.returncode is not None or self.timed_out:
            return
        if self.exited():  # it finished in time; only its output is still held open
            self.check_exit()
            return
        self.timed_out = True
        self.log.warning(
            f"job timed out after {self.cfg.timeout:g}s; sending SIGTERM to its process group",
            **self.fields,
            pid=self.pid,
        )
        self.signal_group(signal.SIGTERM)
        self.timers.set("kill", self.cfg.kill_grace, self._on_kill)

    def stop(self) -> None:
        """SIGTERM to the group now, SIGKILL after ``kill_grace`` (a cancel: the run's outcome is decided)."""
        if self.returncode is not None or self.exited():
            self.check_exit()
            return
        self.signal_group(signal.SIGTERM)
        self.timers.set("kill", self.cfg.kill_grace, self._on_kill)

    def _on_kill(self) -> None:
        if self.returncode is not None or self.exited():
            self.check_exit()
            return
        self.log.warning("job still running after the kill grace; sending SIGKILL", **self.fields, pid=self.pid)
        self.signal_group(signal.SIGKILL)
        self.exit_check_delay = 0.01
        self.timers.set("exit", 0.01, self.check_exit)
