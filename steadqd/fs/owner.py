"""Root producing into a queue another user owns: every new entry goes to that user.

A private queue is its owner's tree (0700 directories, 0600 files). A job
that root writes there stays root's, and the owner (the daemon's user)
can never lease it: the worker would loop on EACCES. So root gives each
entry it creates to the owner of the queue's root (``Modes.owner``), and
refuses in one line where it cannot (no CAP_CHOWN).
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat

from steadqd.errors import ErrorKind, NotCommitted
from steadqd.fs import linux


def give_to_owner(fd: int, owner: tuple[int, int]) -> None:
    """fchown an entry this process just created to the queue's owner, or refuse in one line.

    A root producer without CAP_CHOWN (a container, a user namespace, NFS's
    root squash) cannot give the entry away, and a root-owned job in a
    private queue is one the queue's owner can never lease: nothing is
    published, and the message names the owner and the fixes."""
    try:
        linux.fchown(fd, *owner)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EACCES):
            raise
        who = user_name(owner[0])
        as_owner = f"runuser -u {who} -- steadq put ..." if not who.startswith("uid ") else f"as {who}"
        raise NotCommitted(
            f"this queue belongs to {who} and root cannot give a new job to {who} ({e.strerror}): "
            f"{who} could never read it; run the producer as {who} ({as_owner}), "
            "or make the queue shared (steadq init --shared) and add the producer to its group",
            ErrorKind.PERMISSION_DENIED,
        ) from e


def user_name(uid: int) -> str:
    """The login name of ``uid``, or ``uid N`` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def command_name(uid: int) -> str:
    """How a command line names ``uid``: its login name, or the number (``chown 1234:``)."""
    return user_name(uid).removeprefix("uid ")


def owner_and_mode(st: os.stat_result) -> str:
    """``owner USER:GROUP, mode 0NNN`` of an entry, as ``ls -l`` lets a person check it."""
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    user = user_name(st.st_uid)
    return f"owner {user.removeprefix('uid ')}:{group}, mode {stat.S_IMODE(st.st_mode):04o}"


def readable_by(st: os.stat_result, uid: int, gids: frozenset[int]) -> bool:
    """Whether a user (``uid`` in groups ``gids``) may read a file with this stat, by its mode bits alone."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IRUSR)
    if st.st_gid in gids:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def groups_of(uid: int, gid: int) -> frozenset[int]:
    """The groups of ``uid`` (primary ``gid`` when the user has no name here)."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return frozenset({gid})
    return frozenset(os.getgrouplist(name, gid))


def unreadable_job_text(st: os.stat_result, where: str) -> str:
    """Why this process cannot read the job at ``where`` (the queue's path and the job's), and the fix."""
    me, cmd = user_name(os.geteuid()), command_name(os.geteuid())
    return (
        f"the job is {owner_and_mode(st)}, which {me} cannot read (its producer was neither {me} nor in "
        f"the group of a queue made with init --shared); run: chown {cmd}: {where}, and have producers run "
        f"as {me} (runuser -u {cmd} -- steadq put ...) or use a queue made with init --shared"
    )
