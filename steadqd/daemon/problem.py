"""Whom a start's checks run as (:class:`Account`), what they find (:class:`Problem`), and how a path looks
to that user (``owner_mode``): the terms preflight.py and command_check.py say their lines in."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Account", "Problem", "blocked_parent", "owner_mode"]


@dataclass(frozen=True)
class Account:
    """A user the checks run as: the numbers decide, the name is for the message."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def current(cls) -> Account:
        uid = os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        return cls(name, uid, os.getegid(), tuple(os.getgroups()))

    @classmethod
    def named(cls, user: str, group: str | None = None) -> Account:
        """The account of a user name or number (KeyError if this machine has no such user)."""
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        gid = pw.pw_gid
        if group:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        return cls(pw.pw_name, pw.pw_uid, gid, tuple(os.getgrouplist(pw.pw_name, gid)))


@dataclass(frozen=True)
class Problem:
    """One thing that keeps a role from working; ``text`` is the whole line, fix included."""

    text: str
    transient: bool = False  # room or time cures it (a full disk): wait, do not exit


def _owner(st: os.stat_result) -> str:
    def name(get: Callable[[int], object], n: int, attr: str) -> str:
        try:
            return str(getattr(get(n), attr))
        except KeyError:
            return str(n)

    return f"{name(pwd.getpwuid, st.st_uid, 'pw_name')}:{name(grp.getgrgid, st.st_gid, 'gr_name')}"


def owner_mode(path: str) -> str:
    """``owner:group mode 0NNN`` of a path, as ``ls -l`` would let a person check it."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"({e.strerror})"
    return f"owner {_owner(st)}, mode {stat.S_IMODE(st.st_mode):04o}"


def blocked_parent(path: str) -> str | None:
    """The first directory on the way to ``path`` this process may not search, if any."""
    parts = os.path.abspath(path).split("/")[1:-1]
    here = "/"
    for part in parts:
        here = os.path.join(here, part)
        if os.path.isdir(here) and not os.access(here, os.X_OK):
            return here
    return None
