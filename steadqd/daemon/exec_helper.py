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
which ``steadqd.daemon.hold`` relies on. Without a built helper (a source tree
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

__all__ = ["HELPER", "available", "popen"]

HELPER = Path(__file__).with_name("steadq-exec")
_REPORT_MAX = 64  # bytes; the helper writes one decimal errno


def available() -> bool:
    return os.access(HELPER, os.X_OK)


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **kwargs)`` with the parent-death signal set in the command.

    ``kwargs`` must not hold ``preexec_fn`` (it would bring the fork back) or
    ``pass_fds`` (the helper's report descriptor is the one passed).
    """
    if "preexec_fn" in kwargs or "pass_fds" in kwargs:
        raise ValueError("exec_helper.popen sets the parent-death signal itself and passes its own descriptor")
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            proc = subprocess.Popen([str(HELPER), str(os.getpid()), str(w), *argv], pass_fds=(w,), **kwargs)
        finally:
            os.close(w)
        report = b""
        while chunk := os.read(r, _REPORT_MAX):  # EOF: the command's exec closed the helper's copy
            report += chunk
    finally:
        os.close(r)
    if report:
        err = int(report)
        proc.wait()  # the helper exits 127 right after its report
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        raise OSError(err, os.strerror(err), argv[0])
    return proc
