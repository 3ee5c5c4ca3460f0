"""Attributes a daemon sets on its own process.

Secrets stay in memory
    A bucket queue's daemon holds the store's keys (from its environment or
    a credentials file). :func:`keep_secrets` runs before the configuration
    is loaded and does two things, because each covers what the other cannot:

    * ``PR_SET_DUMPABLE 0``: no core dump (unless an administrator set
      ``fs.suid_dumpable=2``, and then only root can read it), and no other
      process of the same user may ptrace the daemon or read its
      ``/proc/<pid>/environ`` and ``mem``: a job command runs as the
      daemon's user by default, and the environment is where
      ``AWS_SECRET_ACCESS_KEY`` lives. The daemon's own uses of ``/proc/self``
      still work: ``fd/N`` and ``ns/`` are allowed to the process itself
      whatever their owner, and ``timens_offsets`` is world-readable.
    * ``RLIMIT_CORE`` 0 (soft and hard): a core-dump helper that honours the
      limit (systemd-coredump, apport) stores nothing even with
      ``suid_dumpable=2``. The units say ``LimitCORE=0`` as well.

    Both are reset or inherited in the job commands the way the kernel
    does it: the dumpable flag is set again by their ``execve``, the core
    limit is inherited (a job cannot dump core either, as under the units).

Escaped job processes
    The worker is a child subreaper (:func:`become_subreaper`): a job's
    process that left its group is re-parented to the worker when its
    parent dies, and :func:`kill_escaped` kills it once its job has ended.
    The guard covers the worker's own death (steadqd.daemon.worker.run.guard).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import threading
from collections.abc import Collection, Mapping

__all__ = [
    "DAEMON_CREDENTIAL_VARIABLES",
    "become_subreaper",
    "children",
    "keep_secrets",
    "kill_escaped",
    "prctl",
    "without_credentials",
]

# The store's secrets the daemons read from their own environment (botocore's environment provider, the
# "env" source of steadqd.s3.store.s3): the daemon's own, never a job's or a helper's.
DAEMON_CREDENTIAL_VARIABLES = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"}
)

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
_prctl.restype = ctypes.c_int


def prctl(option: int, arg: int = 0) -> int:
    """``prctl(option, arg, 0, 0, 0)``; async-signal-safe enough for a ``preexec_fn`` (one call, no allocation)."""
    return int(_prctl(option, arg, 0, 0, 0))


def keep_secrets() -> None:
    """No core dump of this process and no peeking at it by same-user processes; raises OSError if refused."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if prctl(PR_SET_DUMPABLE, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), "prctl(PR_SET_DUMPABLE, 0)")


def without_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less the daemon's credentials: for a helper process, which is dumpable again after its exec."""
    return {k: v for k, v in env.items() if k not in DAEMON_CREDENTIAL_VARIABLES}


# --- escaped job processes ---------------------------------------------------------------

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans among our descendants become our children rather than init's (False: not on this kernel).

    A job's process that leaves its group (``setsid``) escapes the group kill
    of the job's end; once its parent has died it is re-parented here, where
    :func:`kill_escaped` finds it.
    """
    return prctl(PR_SET_CHILD_SUBREAPER, 1) == 0


def _read(path: str) -> bytes | None:
    """A small /proc file's bytes (one open, one read: the sweep runs after every job), None once it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 65536)
        while len(data) >= 65536 and (more := os.read(fd, 65536)):  # a children list of thousands
            data += more
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat(pid: int | str) -> tuple[str, int, int] | None:
    """(state, session id, start time in clock ticks) of a process, None once it is gone."""
    raw = _read(f"/proc/{pid}/stat")
    try:
        fields = raw.rsplit(b")", 1)[1].split() if raw is not None else None
    except IndexError:
        return None
    if not fields:
        return None
    # after the ")": state ppid pgrp session ... starttime is the 20th
    return fields[0].decode(), int(fields[3]), int(fields[19])


# This process's threads as last listed, with the number of Python threads then: the sweep runs after every
# job, and listing /proc/self/task each time costs five syscalls for a list that changes when a thread starts.
_tasks: tuple[int, list[str]] | None = None


def _task_ids() -> list[str]:
    global _tasks
    count = threading.active_count()
    if _tasks is None or _tasks[0] != count:
        _tasks = (count, os.listdir("/proc/self/task"))
    return _tasks[1]


# The main thread's children list (its tid is the pid), named once per process: a getpid fewer a sweep.
_main_children: str | None = None


def _forget_main_children() -> None:
    global _main_children
    _main_children = None


os.register_at_fork(after_in_child=_forget_main_children)


def children(*, every_thread: bool = True) -> set[int]:
    """This process's children: of every thread, or (``every_thread=False``) of the main thread only.

    A child is its forking thread's (the spawn pool's commands are its C threads'). An orphan goes to the
    subreaper's first live thread, the main one (kernel/exit.c, ``find_new_reaper``), so the main
    thread's list alone holds the escaped processes as they come, at a sixth of the syscalls of 7
    threads' (the sweep after every job's end takes it; every thread's still comes at least every
    ``ESCAPED_SWEEP``: run/escaped.py). The threads are listed again when their number changed, or at
    the next call when one of them was gone.
    """
    global _tasks, _main_children
    if not every_thread:
        if _main_children is None:
            _main_children = f"/proc/self/task/{os.getpid()}/children"
        raw = _read(_main_children)
        return set() if raw is None else {int(p) for p in raw.split()}
    try:
        tasks = _task_ids()
    except OSError:
        return set()
    found: set[int] = set()
    for tid in tasks:
        raw = _read(f"/proc/self/task/{tid}/children")
        if raw is None:  # a thread that ended since the listing
            _tasks = None
        else:
            found.update(int(p) for p in raw.split())
    return found


def kill_escaped(leaders: Collection[int], ours: Collection[int] = (), *, every_thread: bool = True) -> tuple[int, int]:
    """SIGKILL and reap the children that escaped from job process groups that have ended.

    ``leaders`` are the running jobs' unreaped leaders. Any other child in a
    session not ours came out of a job (the guard and the preflight's forks
    share our session). One that started after the oldest running leader may
    still be that job's, so it is left for a later sweep; the others belong
    to jobs that have ended. Only children are touched: an unreaped child's
    pid cannot be reused, so the signal cannot hit another process. Their own
    children come to us when they die, for the next sweep. Returns how many
    were killed and how many reaped ((0, 0): nothing escaped, no follow-up sweep needed).
    The leaders' start times are read only when a live escapee is there to judge (the
    sweep runs after every job, and almost always finds only the guard, in our session).
    ``ours`` are children known to be the worker's own and unreaped (its guard): not judged, not read.
    ``every_thread=False`` looks at the main thread's children only (:func:`children`).
    """
    own_session = os.getsid(0)
    oldest: int | None = None
    oldest_known = False
    killed = reaped = 0
    for pid in children(every_thread=every_thread).difference(leaders, ours):
        st = _stat(pid)
        if st is None or st[1] == own_session:
            continue
        state, _, started = st
        if state != "Z":
            if not oldest_known:
                oldest = min((s[2] for s in (_stat(p) for p in leaders) if s is not None), default=None)
                oldest_known = True
            if oldest is not None and started >= oldest:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped += 1
    return killed, reaped
