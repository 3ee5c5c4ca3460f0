"""Job process groups die with the worker, however the worker dies.

A worker that is SIGKILLed (or crashes) runs no cleanup. Its job commands,
each in a session of its own, would live on under PID 1 with no timeout,
while recovery hands their jobs to another worker once the leases expire:
two runs of one job at the same time. Under systemd the unit's cgroup ends
them (``KillMode=``), but ``steadqd run`` in a shell or a container has no
such net. Two defences, because each covers what the other cannot:

Parent-death signal
    Each command's leader gets ``PR_SET_PDEATHSIG(SIGKILL)`` between fork
    and exec, after the uid/gid change, which would clear it: from
    ``steadq-exec`` (steadqd.daemon.worker.run.exec_helper), or from
    :func:`die_with_parent` as Popen's ``preexec_fn`` for a command run as
    another user and in a source tree where that helper was never built. It covers the leader only: the signal is not inherited.

The guard process
    One small process per worker (``python -m steadqd.daemon.worker.run.guard``) holds
    the read end of a pipe; the worker, the only holder of the write end,
    has ``+PGID`` sent when it starts a command and sends ``-PGID`` just before it
    reaps the command's leader. ``+PGID`` is written by the spawned child
    itself before the command can run (spawn.c, ``steadq-exec``, or the
    ``preexec_fn``): written by the worker after the spawn returned, it
    would miss a worker killed in between while the command already ran and
    forked (:meth:`GroupGuard.pipe`). When the pipe reaches EOF the worker is gone:
    the guard SIGKILLs every group still on its list (the grandchildren the
    parent-death signal does not reach) and exits. ``-PGID`` goes out while
    the leader is still an unreaped zombie, which pins the number, so the
    guard never holds a group id that may have been reused; at EOF a group
    whose leader init has just reaped can still have members, and then the
    id is still theirs. The guard ignores SIGINT, SIGTERM and SIGHUP: how a
    stop drains or hands back jobs is the worker's business.

A command that leaves its process group (``setsid`` of its own) escapes
both. While the worker lives it is a child subreaper, so such a process comes
to it and dies when its job has ended (steadqd.daemon.process.kill_escaped).
For the worker's own death the guard gets each job's id with its group
(``+PGID JOBID``) and, after the group kills, SIGKILLs every process whose
environment still says ``STEADQ_JOB_ID=`` one of them, in a few rounds (a
process forking meanwhile). A process that also replaced its environment
escapes this; under systemd the unit's cgroup (``KillMode=mixed``) holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from steadqd.daemon.journal import Log
from steadqd.daemon.process import PR_SET_PDEATHSIG, prctl, without_credentials

__all__ = ["GroupGuard", "die_with_parent", "guard_pid", "guard_pipe", "main", "process_guard"]

READ_PACE = 0.05  # s; the guard's shortest time between two reads of the worker's lines (see _read_groups)


def die_with_parent(guard_fd: int = -1, tail: bytes = b"\n", pid_fd: int = -1) -> Callable[[], None]:
    """A ``preexec_fn`` for a job: SIGKILL when this process's forking thread dies.

    The fallback of ``steadq-exec``, which does the same without making Popen fork.

    Call it in the thread that forks, and fork from a thread that lives as
    long as the worker (the fallback forks from the loop's; the compiled
    spawn from its pool's C threads): the kernel sends the signal when the
    parent *thread* exits. The function runs
    in the forked child, so it does little but syscalls; the getppid check
    closes the race of a worker that died before the prctl.

    With ``guard_fd`` (:meth:`GroupGuard.pipe`) it first writes ``+PID`` and
    ``tail`` there, as spawn.c and ``steadq-exec`` do, and its pid to
    ``pid_fd``: if the exec then fails, Popen raises without a pid, and the
    worker takes the line back with :meth:`GroupGuard.failed`.
    """
    parent = os.getpid()

    def preexec() -> None:
        told = False
        if guard_fd >= 0:
            pid = os.getpid()
            told = _write_guard(guard_fd, b"+%d" % pid + tail)
            if told and pid_fd >= 0:
                os.write(pid_fd, b"%d" % pid)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            if told:
                _write_guard(guard_fd, b"-%d\n" % os.getpid())
            os._exit(255)

    return preexec


def _write_guard(fd: int, line: bytes) -> bool:
    """One line to the guard from a forked child, where SIGPIPE is back to its default: a dead guard's EPIPE
    must not kill the job. The signal is blocked around the write and a pending one taken."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
    try:
        os.write(fd, line)
    except OSError:
        signal.sigtimedwait({signal.SIGPIPE}, 0)
        return False
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return True


def _tail(job_id: str) -> str:
    """What follows ``+PGID`` on a guard line: the job id if it is one (the guard's escapee scan keys on it)."""
    return f" {job_id}\n" if _JOB_ID.fullmatch(job_id) else "\n"


def guard_pipe() -> tuple[int, int]:
    """A close-on-exec pipe whose write end is never 0, 1 or 2.

    A daemon may be started with those closed, and a spawn's dup2 onto them would replace the guard's end.
    """
    r, w = os.pipe2(os.O_CLOEXEC)
    if w < 3:
        moved = fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 3)
        os.close(w)
        w = moved
    return r, w


class GroupGuard:
    """The worker's side: a pipe to the guard process, restarted if the guard died."""

    def __init__(self, queue: str = "") -> None:
        self.queue = queue
        self.groups: set[int] = set()
        self.jobs: dict[int, str] = {}  # the job id of each group, for its escaped processes
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd = -1
        self.generation = 0  # how many guards were started: a line told to an earlier one may be lost
        self._lent = 0  # spawns in flight (a spawn thread's child) that may still write to the pipe
        self._retired: list[int] = []  # write ends of dead guards' pipes, closed once nothing is lent

    def watch(self, pgid: int, job_id: str = "") -> None:
        """A command was started as group ``pgid`` for ``job_id``; never raises (the job runs either way)."""
        self.started(pgid, job_id, told=False)

    def pipe(self) -> int:
        """The guard's pipe for a spawn whose child writes its own ``+PGID`` line (-1: no guard could be started).

        The child writes before its command can run, so a worker killed while
        it is still on its way back from the spawn leaves no group unknown.
        The descriptor is close-on-exec and never 0, 1 or 2 (which a spawn
        overwrites). It changes when a dead guard is replaced: ask each time.
        """
        if self._fd < 0:
            self._start()
        return self._fd

    def lend(self) -> tuple[int, int]:
        """:meth:`pipe` for a spawn that runs in another thread (fastspawn.Pool), and the guard's generation,
        for :meth:`started`. Until :meth:`give_back` the descriptor is never closed (a dead guard's is set
        aside): closed, its number could be reused by another file, and the child's line would land there."""
        fd = self.pipe()
        if fd >= 0:
            self._lent += 1
        return fd, self.generation

    def give_back(self, fd: int) -> None:
        """A spawn :meth:`lend` lent ``fd`` to is done: the child wrote its line or has exec'd (close-on-exec)."""
        if fd < 0:
            return
        self._lent -= 1
        if self._lent == 0:
            for old in self._retired:
                os.close(old)
            self._retired.clear()

    def tail(self, job_id: str) -> bytes:
        """What follows ``+PGID`` on a line a child writes: the job id if it is one, then the newline."""
        return f" {job_id}\n".encode() if _JOB_ID.fullmatch(job_id) else b"\n"  # _tail's, as bytes

    def started(self, pgid: int, job_id: str = "", *, told: bool, generation: int | None = None) -> None:
        """Group ``pgid`` runs ``job_id``; ``told``: its child wrote the line to :meth:`pipe` itself. Never raises.

        A child's line can have gone nowhere (EPIPE: the guard had died); a
        guard found dead is replaced here with the whole list, this group
        included. ``generation``: :meth:`lend`'s, for a spawn in another
        thread: a guard started meanwhile got the whole list without this
        group, and the line the child told the old one is lost with it.
        A line the guard gets twice is harmless: it keeps a set.
        """
        self.groups.add(pgid)
        self.jobs[pgid] = job_id
        if not told or not self.running() or (generation is not None and generation != self.generation):
            self._send(self._line(pgid))

    def _line(self, pgid: int) -> str:
        return f"+{pgid}{_tail(self.jobs.get(pgid, ''))}"

    def _lines(self) -> str:
        """The whole list, for a guard started (again) while groups run."""
        return "".join(self._line(g) for g in sorted(self.groups))

    def failed(self, pgid: int) -> None:
        """A child that wrote ``+PGID`` itself failed to execute its command: take the line back."""
        self.groups.discard(pgid)
        self.jobs.pop(pgid, None)
        if self.running():
            self._send(f"-{pgid}\n")

    def forget(self, pgid: int) -> None:
        """Its leader is about to be reaped: the id may be reused after that."""
        if pgid in self.groups:
            self.groups.discard(pgid)
            self.jobs.pop(pgid, None)
            self._send(f"-{pgid}\n")

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def unreaped_pid(self) -> int | None:
        """The guard's pid while it is an unreaped child of ours (its number cannot be another's then)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def close(self) -> None:
        """The worker is done: EOF tells the guard to kill what is left (nothing, normally) and exit."""
        if self._fd >= 0:
            self._drop_fd()
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None

    def _send(self, line: str) -> None:
        for _ in range(2):  # a dead guard is replaced once, with the whole list
            if self._fd < 0 and not self._start():
                return
            try:
                os.write(self._fd, line.encode())
                return
            except OSError:
                self._drop_fd()
                if self._proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(timeout=1)
                self._proc = None
                line = self._lines()

    def _drop_fd(self) -> None:
        """No more lines to this guard: its pipe is closed, or set aside while a spawn may still write to it."""
        if self._lent:
            self._retired.append(self._fd)
        else:
            os.close(self._fd)
        self._fd = -1

    def _start(self) -> bool:
        r, w = guard_pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "steadqd.daemon.worker.run.guard", str(os.getpid()), self.queue],
                stdin=r,
                close_fds=True,
                process_group=0,  # a terminal's Ctrl-C is for the worker; the guard waits for its EOF
                env=without_credentials(os.environ),  # the guard is dumpable: /proc/<guard>/environ is readable
            )
        except OSError:
            os.close(w)
            return False
        finally:
            os.close(r)
        self._fd = w
        self.generation += 1
        initial = self._lines()
        if initial:
            try:
                os.write(w, initial.encode())
            except OSError:
                return False
        return True


_guard: GroupGuard | None = None


def guard_pid() -> int | None:
    """The pid of this process's guard while it is our unreaped child; None if none was made (never makes one:
    the first spawn does, with the queue's name for the guard's journal lines)."""
    return None if _guard is None else _guard.unreaped_pid()


def process_guard(queue: str = "") -> GroupGuard:
    """This process's guard: one per worker process, as there is one parent to outlive."""
    global _guard
    if _guard is None:
        _guard = GroupGuard(queue)
    return _guard


def _read_groups(fd: int) -> dict[int, str]:
    """Follow the worker's +/- lines until EOF; what is left is still running.

    After each read the guard sleeps :data:`READ_PACE` before the next: a
    worker starting hundreds of jobs a second would otherwise wake it twice
    per job, and on a small machine each wake-up takes the CPU from the
    worker. The lines wait in the pipe meanwhile (its 64 KiB are thousands
    of them), and everything written before the worker's end is read before
    its EOF, so a ``-PGID`` written before a reap is still seen first; only
    the reaction to the EOF waits up to one pace.
    """
    groups: dict[int, str] = {}
    buf = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            return groups
        time.sleep(READ_PACE)
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                number, _, job = line[1:].decode().partition(" ")
                pgid = int(number)
                if line[:1] == b"+":
                    groups[pgid] = job
                elif line[:1] == b"-":
                    groups.pop(pgid, None)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    worker = args[0] if args else "?"
    queue = args[1] if len(args) > 1 else ""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups = _read_groups(0)
    killed = 0
    for pgid in sorted(groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
            killed += 1
    escaped = _kill_escaped({job for job in groups.values() if _JOB_ID.fullmatch(job)})
    log = Log("guard", queue)
    if killed:
        what = "1 job command" if killed == 1 else f"{killed} job commands"
        log.warning(
            f"worker {worker} died with {what} still running; killed their process groups",
            count=killed,
            worker_pid=worker,
        )
    if escaped:
        log.warning(
            f"killed {escaped} process(es) of those jobs that had left their process groups",
            count=escaped,
            worker_pid=worker,
        )
    return 0


_JOB_ID = re.compile(r"[0-9a-f]{32}")
ESCAPED_ROUNDS = 5  # passes over /proc: a process forking while the last pass ran is found by the next
ESCAPED_PACE = 0.05  # s between two passes


def _kill_escaped(jobs: set[str]) -> int:
    """SIGKILL every process whose environment names one of ``jobs``; how many were killed.

    The job id is 128 random bits, set by the worker in each command's
    environment and inherited by whatever it starts, so a match is that job's
    process. Its pid is checked again through a pidfd before the signal, so a
    process that exited between the read and the kill is never confused with
    a new one under its number.
    """
    if not jobs:
        return 0
    marks = {f"STEADQ_JOB_ID={job}".encode() for job in jobs}
    killed: set[int] = set()
    me = os.getpid()
    for _ in range(ESCAPED_ROUNDS):
        found = 0
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            pid = int(name)
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if marks.intersection(environ):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed.add(pid)
                    found += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        if not found:
            break
        time.sleep(ESCAPED_PACE)
    return len(killed)


if __name__ == "__main__":
    sys.exit(main())
