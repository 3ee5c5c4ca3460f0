"""Start a job command through ``steadq-exec``, so that Popen can use vfork.

A ``preexec_fn`` makes CPython fork the whole worker for every job (in a 25 MB
daemon about 25 ms of wall time and 6 ms of CPU per spawn, against 5 ms and
1.5 ms with vfork), and the parent-death signal has to be set in the child
after the uid/gid change, so it cannot be set by the parent. The compiled
helper (``exec_helper.c``, built next to this module by ``setup.py``) does it
instead: Popen starts the helper with vfork, the helper sets
``PR_SET_PDEATHSIG(SIGKILL)``, checks that the worker is still its parent and
executes the command.

A start failure stays exact: the helper writes a failed exec's errno to a
close-on-exec pipe, and :func:`popen` raises the same ``OSError`` (with the
command as its filename) that Popen raises for a command it cannot execute,
which ``steadqd.daemon.worker.run.hold`` relies on. The worker does not wait for that
report: :func:`start` returns with Popen, the report pipe becomes one of the
loop's readers, and :func:`start_error` turns what it said into the same error. Without a built helper (a source tree
that was never installed) :func:`available` is false and the caller falls back
to ``preexec_fn``; it does so too for a command run as another user, for which
CPython forks anyway and which may not be allowed to execute the helper.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["HELPER", "available", "popen", "start", "start_error", "wait_report"]

HELPER = Path(__file__).with_name("steadq-exec")
_REPORT_MAX = 64  # bytes; the helper writes one decimal errno


def available() -> bool:
    return os.access(HELPER, os.X_OK)


def start(argv: Sequence[str], *, guard_fd: int = -1, **kwargs: Any) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``argv`` through the helper; returns the process and the read end of its report pipe.

    Returns as soon as Popen does, before the command's own exec: the
    caller reads the report (EOF: the command runs; bytes: a failed exec,
    :func:`start_error`) and closes it. ``kwargs`` must not hold
    ``preexec_fn`` (it would bring the fork back) or ``pass_fds`` (the
    helper's report descriptor is the one passed). ``guard_fd`` (-1: none): the guard's pipe, to which
    the helper writes ``+PID`` (and the job id of the environment's ``STEADQ_JOB_ID``) before the command
    can run (steadqd.daemon.worker.run.guard).
    """
    if "preexec_fn" in kwargs or "pass_fds" in kwargs:
        raise ValueError("exec_helper.popen sets the parent-death signal itself and passes its own descriptor")
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fds = (w, guard_fd) if guard_fd >= 0 else (w,)
        proc = subprocess.Popen([str(HELPER), str(os.getpid()), str(w), str(guard_fd), *argv], pass_fds=fds, **kwargs)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return proc, r


def start_error(report: bytes, program: str) -> OSError | None:
    """The ``OSError`` Popen would have raised for the exec the helper reported, None for a command that runs."""
    if not report:
        return None
    err = int(report)
    return OSError(err, os.strerror(err), program)


def wait_report(proc: subprocess.Popen[bytes], report_fd: int, program: str) -> None:
    """Read the report to its end and close it; a failed exec reaps the helper and raises its ``OSError``."""
    report = b""
    try:
        while chunk := os.read(report_fd, _REPORT_MAX):  # EOF: the command's exec closed the helper's copy
            report += chunk
    finally:
        os.close(report_fd)
    err = start_error(report, program)
    if err is not None:
        proc.wait()  # the helper exits 127 right after its report
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        raise err


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **kwargs)`` with the parent-death signal set in the command.

    Returns once the command's exec succeeded (:func:`start`, then :func:`wait_report`).
    """
    proc, report_fd = start(argv, **kwargs)
    wait_report(proc, report_fd, argv[0])
    return proc
