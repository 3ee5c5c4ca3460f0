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
"""

from __future__ import annotations

import ctypes
import os
import resource
from collections.abc import Mapping

__all__ = ["DAEMON_CREDENTIAL_VARIABLES", "keep_secrets", "prctl", "without_credentials"]

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
