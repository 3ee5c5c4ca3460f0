"""One process per (queue, role) on a host: a foreground run beside the active unit is refused.

Two workers of one queue on one host would each think they own the
concurrency and the watch folder's state; two sweepers or promoters double
the recovery work and race over what the other is doing. So every role
holds an ``flock`` on ``<dir>/<key>.<role>.lock`` while it runs, where
``key`` names the queue (a digest of its configured location, so two
configuration names of one queue meet) and ``dir`` is, in order:
``$STEADQ_ROLE_LOCK_DIR``, ``/run/steadq/roles`` (made by tmpfiles.d,
3770 steadq:steadq, so the units and the group's members share it), else
``$XDG_RUNTIME_DIR/steadq-roles`` (a user's own runs). Without any of them
the role runs unlocked and says so once.

The directory is writable by every group member, so the lock file is
hostile input: it is opened with O_NOFOLLOW and O_NONBLOCK, must be a
regular file, is never waited on (LOCK_NB), and what it says about its
holder (written by the holder, one short line) is read bounded, checked
against a grammar and used only to name the holder in the refusal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import stat
from dataclasses import dataclass

from steadqd.text import printable

LOCK_DIR_ENV = "STEADQ_ROLE_LOCK_DIR"
RUN_DIR = "/run/steadq/roles"
EXIT_HELD = 75  # EX_TEMPFAIL: a unit refused this way restarts (RestartSec=) and takes over once the other run ends
# The unit that runs each role (the watch folder runs in the worker's unit).
UNIT_OF_ROLE = {"worker": "worker", "inbox": "worker", "sweeper": "sweeper", "promoter": "promoter"}
_HOLDER_RE = re.compile(r"(?P<pid>[0-9]{1,10}) (?P<unit>[A-Za-z0-9@._:-]{1,200}|-)\n?")
_MAX_HOLDER = 256


class RoleHeld(Exception):
    """The role already runs for this queue on this host; the message names the holder and the fix."""


@dataclass
class Held:
    """The lock files this process holds (closed, and so released, at exit or by :meth:`release`)."""

    fds: list[int]
    where: str | None  # the directory, or None when no lock directory was usable

    def release(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def lock_dir() -> str | None:
    """The first usable directory for the role locks, or None."""
    override = os.environ.get(LOCK_DIR_ENV)
    if override:
        return override
    if os.path.isdir(RUN_DIR) and os.access(RUN_DIR, os.W_OK | os.X_OK):
        return RUN_DIR
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        own = os.path.join(runtime, "steadq-roles")
        with contextlib.suppress(FileExistsError):
            os.mkdir(own, 0o700)
        return own
    return None


def unit_name(role: str, name: str) -> str:
    """The systemd unit that runs ``role`` of the configured queue ``name``."""
    return f"steadq-{UNIT_OF_ROLE.get(role, role)}@{name}.service"


def acquire(queue: str, name: str, roles: list[str]) -> Held:
    """Lock every role of ``roles`` for ``queue`` (configured as ``name``), or raise :class:`RoleHeld`.

    All or nothing: the locks already taken are released before the refusal."""
    where = lock_dir()
    held = Held([], where)
    if where is None:
        return held
    key = hashlib.sha256(queue.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    try:
        dir_fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        held.where = None
        return held
    try:
        for role in roles:
            try:
                held.fds.append(_lock_one(dir_fd, f"{key}.{role}.lock", queue, name, role))
            except RoleHeld:
                held.release()
                raise
    finally:
        os.close(dir_fd)
    return held


def _lock_one(dir_fd: int, file: str, queue: str, name: str, role: str) -> int:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(file, flags | os.O_CREAT, 0o660, dir_fd=dir_fd)
    except PermissionError:  # protected_regular: another member's file in the sticky directory
        fd = os.open(file, flags, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{file} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RoleHeld(_refusal(fd, queue, name, role)) from None
        os.ftruncate(fd, 0)
        unit = os.environ.get("INVOCATION_ID") and unit_name(role, name)
        os.pwrite(fd, f"{os.getpid()} {unit or '-'}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refusal(fd: int, queue: str, name: str, role: str) -> str:
    """One line: who runs the role already, and how to stop it (the unit, when the holder is one)."""
    try:
        text = os.pread(fd, _MAX_HOLDER, 0).decode("ascii")
    except (OSError, UnicodeDecodeError):
        text = ""
    m = _HOLDER_RE.fullmatch(text)
    ours = unit_name(role, name)
    if m is not None and m["unit"] != "-":
        holder, fix = f"{printable(m['unit'])}, pid {m['pid']}", f"systemctl stop {printable(m['unit'])}"
    elif m is not None:
        holder, fix = f"pid {m['pid']}, a foreground steadqd", f"stop pid {m['pid']} (or its unit {ours})"
    else:
        holder, fix = f"probably {ours}", f"systemctl stop {ours}"
    return (
        f"the {role} of queue {printable(queue)} already runs on this host ({holder}); one per queue and host: "
        f"{fix} before running another"
    )
