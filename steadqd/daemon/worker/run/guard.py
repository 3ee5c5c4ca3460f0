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
    ``steadq-exec`` (steadqd.daemon.exec_helper), or from
    :func:`die_with_parent` as Popen's ``preexec_fn`` for a command run as
    another user and in a source tree where that helper was never built. It covers the leader only: the signal is not inherited.

The guard process
    One small process per worker (``python -m steadqd.daemon.guard``) holds
    the read end of a pipe; the worker, the only holder of the write end,
    sends ``+PGID`` when it starts a command and ``-PGID`` just before it
    reaps the command's leader. When the pipe reaches EOF the worker is gone:
    the guard SIGKILLs every group still on its list (the grandchildren the
    parent-death signal does not reach) and exits. ``-PGID`` goes out while
    the leader is still an unreaped zombie, which pins the number, so the
    guard never holds a group id that may have been reused; at EOF a group
    whose leader init has just reaped can still have members, and then the
    id is still theirs. The guard ignores SIGINT, SIGTERM and SIGHUP: how a
    stop drains or hands back jobs is the worker's business.

A command that leaves its process group (``setsid`` of its own) escapes
both, as it escapes the worker's timeout; only a cgroup holds such a one.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from steadqd.daemon.journal import Log

__all__ = ["GroupGuard", "die_with_parent", "main", "process_guard"]

_PR_SET_PDEATHSIG = 1
READ_PACE = 0.05  # s; the guard's shortest time between two reads of the worker's lines (see _read_groups)
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
_prctl.restype = ctypes.c_int


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` for a job: SIGKILL when this process's forking thread dies.

    The fallback of ``steadq-exec``, which does the same without making Popen fork.

    Call it in the thread that forks, and fork from the loop's thread: the
    kernel sends the signal when the parent *thread* exits. The function runs
    in the forked child, so it does nothing but two syscalls; the getppid
    check closes the race of a worker that died before the prctl.
    """
    parent = os.getpid()

    def preexec() -> None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(255)

    return preexec


class GroupGuard:
    """The worker's side: a pipe to the guard process, restarted if the guard died."""

    def __init__(self, queue: str = "") -> None:
        self.queue = queue
        self.groups: set[int] = set()
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd = -1

    def watch(self, pgid: int) -> None:
        """A command was started as group ``pgid``; never raises (the job runs either way)."""
        self.groups.add(pgid)
        self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        """Its leader is about to be reaped: the id may be reused after that."""
        if pgid in self.groups:
            self.groups.discard(pgid)
            self._send(f"-{pgid}\n")

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        """The worker is done: EOF tells the guard to kill what is left (nothing, normally) and exit."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
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
                os.close(self._fd)
                self._fd = -1
                if self._proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(timeout=1)
                self._proc = None
                line = "".join(f"+{g}\n" for g in sorted(self.groups))

    def _start(self) -> bool:
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "steadqd.daemon.worker.run.guard", str(os.getpid()), self.queue],
                stdin=r,
                close_fds=True,
                process_group=0,  # a terminal's Ctrl-C is for the worker; the guard waits for its EOF
            )
        except OSError:
            os.close(w)
            return False
        finally:
            os.close(r)
        self._fd = w
        initial = "".join(f"+{g}\n" for g in sorted(self.groups))
        if initial:
            try:
                os.write(w, initial.encode())
            except OSError:
                return False
        return True


_guard: GroupGuard | None = None


def process_guard(queue: str = "") -> GroupGuard:
    """This process's guard: one per worker process, as there is one parent to outlive."""
    global _guard
    if _guard is None:
        _guard = GroupGuard(queue)
    return _guard


def _read_groups(fd: int) -> set[int]:
    """Follow the worker's +/- lines until EOF; what is left is still running.

    After each read the guard sleeps :data:`READ_PACE` before the next: a
    worker starting hundreds of jobs a second would otherwise wake it twice
    per job, and on a small machine each wake-up takes the CPU from the
    worker. The lines wait in the pipe meanwhile (its 64 KiB are thousands
    of them), and everything written before the worker's end is read before
    its EOF, so a ``-PGID`` written before a reap is still seen first; only
    the reaction to the EOF waits up to one pace.
    """
    groups: set[int] = set()
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
            with contextlib.suppress(ValueError):
                pgid = int(line[1:])
                if line[:1] == b"+":
                    groups.add(pgid)
                elif line[:1] == b"-":
                    groups.discard(pgid)


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
    if killed:
        what = "1 job command" if killed == 1 else f"{killed} job commands"
        Log("guard", queue).warning(
            f"worker {worker} died with {what} still running; killed their process groups",
            count=killed,
            worker_pid=worker,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
