"""Process helpers shared by the harnesses that start their own servers (Ceph, the multi-host network, the sysroot).

Not steadqd.fs.linux's: the harnesses import nothing from the package for
their own process handling, so a broken package cannot leave their
processes running.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1
# Loaded now, not in die_with_parent: between fork and exec the child should not dlopen.
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """A ``preexec_fn``: the child gets SIGKILL when the test process dies, so a killed run leaves nothing behind."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited: a zombie (Z) or a dead task (X) does not run."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists in this pid namespace (``kill(pid, 0)``); another user's counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
