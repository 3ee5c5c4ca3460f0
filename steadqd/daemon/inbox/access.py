"""Who besides the daemon can rearrange a watch folder, and what that would let them do.

A watch folder is usually a group share: every member may create, rename and
remove entries in it. These checks say, before a start, whether that reaches
the daemon's state directory (``exposed``) or the paths handed to jobs
(``handoff_risk``); ``files`` turns each answer into a refusal or a warning.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat

from steadqd.daemon.inbox.intent import shown

__all__ = ["cannot_write_fix", "exposed", "handoff_risk", "named_user"]


def named_user(uid: int) -> str:
    try:
        return f" ({shown(pwd.getpwuid(uid).pw_name)})"
    except KeyError:
        return ""


def exposed(st: os.stat_result) -> str:
    """Why others could rename entries of a folder with status ``st`` away, or "" if they cannot.

    In a directory that others may write, anyone may rename or remove any entry,
    the daemon's state directory included, unless the sticky bit is set (then only
    an entry's owner, the directory's owner and root may). A folder owned by
    another user is theirs to rearrange whatever its mode.
    """
    euid = os.geteuid()
    if st.st_uid not in (0, euid):
        return f"is owned by uid {st.st_uid}{named_user(st.st_uid)}, who can rename anything in it"
    who = [w for bit, w in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others")) if st.st_mode & bit]
    if who and not st.st_mode & stat.S_ISVTX:
        return f"is writable by {' and '.join(who)} without the sticky bit"
    return ""


def handoff_risk(folder: str) -> str:
    """Why a path in ``folder`` handed to a job could be redirected later, or "" if it cannot.

    A job given a path opens it when it runs, by that path: whoever can replace the
    file (or rename any directory on the way) can point the job at any file its user
    may read, with a symbolic link. So the folder itself must be writable by the
    daemon's user (or root) alone (the sticky bit is not enough: the uploader owns
    the file and may replace it), and no directory above it may be rearranged by others.
    """
    try:
        st = os.stat(folder)
    except OSError as e:
        return f"cannot be examined ({e.strerror})"
    if st.st_uid not in (0, os.geteuid()):
        return exposed(st)
    who = [w for bit, w in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others")) if st.st_mode & bit]
    if who:
        return f"is writable by {' and '.join(who)}"
    real = os.path.realpath(folder)
    for chain in (folder, real):
        parent = os.path.dirname(chain)
        while True:
            try:
                pst = os.lstat(parent)
            except OSError as e:
                return f"lies below {shown(parent)}, which cannot be examined ({e.strerror})"
            if not stat.S_ISLNK(pst.st_mode) and (why := exposed(pst)):
                return f"lies below {shown(parent)}, which {why}"
            if parent == "/":
                break
            parent = os.path.dirname(parent)
    return ""


def cannot_write_fix(folder: str, e: OSError) -> str:
    """The fix for a watch folder the daemon could not write (its state directory goes in it).

    Read-only is what a hardened unit's ``ProtectSystem=strict`` makes of every path
    outside its ``ReadWritePaths=`` (units/steadq-worker@.service: only /var/lib/steadq);
    permission denied is the folder's owner, group or mode.
    """
    where = shown(folder)
    if e.errno == errno.EROFS:
        return (
            f"the service sees {where} read-only: under systemd the worker writes only its unit's ReadWritePaths=, "
            f"so add ReadWritePaths={where} in a drop-in (systemctl edit steadq-worker@QUEUE) and restart it"
        )
    if e.errno in (errno.EACCES, errno.EPERM):
        try:
            group = grp.getgrgid(os.getegid()).gr_name
        except KeyError:
            group = str(os.getegid())
        return (
            f"the daemon's user{named_user(os.geteuid())} cannot write {where}: give it to the group "
            f"(chgrp {shown(group)} {where} && chmod g+w,+t {where}, mode 3770)"
        )
    return f"make {where} writable by the daemon's user"
