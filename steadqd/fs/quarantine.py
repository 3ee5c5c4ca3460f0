"""Isolating corrupt objects: rename them, unchanged, into ``quarantine/``.

Quarantine never deletes evidence: the raw bytes move under a fresh random
id with the reason code in the name (``q<id>.x<reason>.raw``), using the same
no-replace rename and barriers as any other move, so the object is either
where it was or in quarantine after a crash, never gone.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict

from steadqd.fs.context import Context
from steadqd.fs.names import make_quarantine_name
from steadqd.fs.tree import Collision, MoveFailed, Witness

_ATTEMPTS = 8
# Special files this process failed to quarantine for lack of permission, by
# (st_dev, st_ino); bounded, since each planted entry adds one.
_UNMOVABLE_MAX = 4096
_unmovable: OrderedDict[tuple[int, int], None] = OrderedDict()
_unmovable_lock = threading.Lock()


def quarantine(ctx: Context, src_fd: int, src_name: str, reason: int, witness: Witness | None = None) -> str:
    """Move one object to quarantine; return its quarantine file name.

    With a witness the move is exact-source (lease time); without one it is
    the unwitnessed move recovery and fsck use. Raises the tree's move
    errors (SourceMissing, Indeterminate, ...) for the caller to classify.
    """
    qdir = ctx.quarantine_dir()
    last: Collision | None = None
    for _ in range(_ATTEMPTS):
        qname = make_quarantine_name(ctx.random(16), reason)
        try:
            if witness is not None:
                ctx.tree.move_witnessed(src_fd, src_name, qdir, qname, witness, force=True)
            else:
                ctx.tree.move_unwitnessed(src_fd, src_name, qdir, qname)
            return qname
        except Collision as e:  # a 128-bit id collision: draw again
            last = e
    assert last is not None
    raise last


def quarantine_special(ctx: Context, src_fd: int, src_name: str, reason: int, st: os.stat_result) -> str | None:
    """Quarantine a FIFO, socket, directory or symlink found at an object's name (``st``: its lstat).

    A directory that another user owns cannot be moved to another parent
    without write access to it (the kernel must rewrite its ``..``), so a
    daemon that is not root may never be able to isolate one. Such a failure
    is raised once, for the caller to report; afterwards this returns None
    for the same entry, and the caller steps over it instead of reporting the
    same error on every scan. fsck keeps reporting it until someone who may
    remove it does.
    """
    key = (st.st_dev, st.st_ino)
    with _unmovable_lock:
        if key in _unmovable:
            return None
    try:
        return quarantine(ctx, src_fd, src_name, reason)
    except MoveFailed as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            with _unmovable_lock:
                _unmovable[key] = None
                while len(_unmovable) > _UNMOVABLE_MAX:
                    _unmovable.popitem(last=False)
        raise
