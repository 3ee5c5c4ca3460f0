"""Isolating corrupt objects: rename them, unchanged, into ``quarantine/``.

Quarantine never deletes evidence: the raw bytes move under a fresh random
id with the reason code in the name (``q<id>.x<reason>.raw``), using the same
no-replace rename and barriers as any other move, so the object is either
where it was or in quarantine after a crash, never gone.
"""

from __future__ import annotations

from steadqd.fs.context import Context
from steadqd.fs.names import make_quarantine_name
from steadqd.fs.tree import Collision, Witness

_ATTEMPTS = 8


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
