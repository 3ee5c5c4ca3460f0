"""Empty delayed buckets are removed once they are well in the past.

Why: promotion empties ``delayed/<B>/`` but leaves the bucket and all its
shard directories behind. With 10 s buckets a year of delayed jobs leaves
millions of directories that every promote pass, ``fsck`` and ``stats``
list again. The reference never removes them (open-questions.md 21), but it
creates any bucket or shard directory on demand and never relies on one
being present (layout.md "ensure_dir"), so a tree without them stays valid
for it, as one without expired receipt buckets does.

Which: bucket ``B`` holds jobs due at ``B × w``. A publisher targets ``B``
only while its wall floor is below that instant, so once ``B × w + GRACE_NS``
is behind the instant promotion judged due, only a publication that spent
more than ``GRACE_NS`` between choosing its bucket and linking its file (a
slow stream, a stopped process) can still aim at ``B``. Such a publication
meets a removed directory: steadqd's make it again and link there
(``publish.py``, ``settle.py``), the reference's fails NotCommitted. Nothing
is lost either way. One hour is far beyond the clock-skew bound and the
wall floor's cache, and leaves at most 360 empty 10 s buckets in place.
A directory changed in the last ``QUIET_NS`` (its modification time, which
the kernel stamps from the local clock) is in use, typically made again by
such a publisher a moment ago, and is left alone: a removal never strikes
the same publication twice.

How: a shard directory that lists empty is removed (``rmdir`` of one that is
no longer empty fails harmlessly: a racing link won), then the bucket once
nothing is left in it; one fsync of the parent covers each bucket's
removals. Anything else in a bucket (a stray file, a name that is not a
shard of this queue) keeps the bucket for ``fsck`` to report.

Budget: this runs after promotion has finished its tree and spends only what
the pass has left, at most ``_MAX_OPS`` removals. Running out ends pruning,
not the phase (the report still says the budget ran out, so a sweeper comes
back at once), so a backlog of empty buckets is worked off over several
passes without holding back the phases after promotion, and the cursor keeps
the shape records.md gives promotion.
"""

from __future__ import annotations

import os

from steadqd.constants import DELAYED_DIR, NS_PER_SECOND
from steadqd.fs import linux
from steadqd.fs.names import parse_bucket_dir, parse_shard_dir
from steadqd.fs.recovery.state import Exhausted, Pass
from steadqd.fs.recovery.walk import open_dir
from steadqd.fs.tree import MoveFailed, SourceMissing

GRACE_NS = 3600 * NS_PER_SECOND
QUIET_NS = 60 * NS_PER_SECOND
_MAX_OPS = 128


def prune_delayed_buckets(p: Pass, due: int) -> None:
    """Remove the empty buckets at least ``GRACE_NS`` older than bucket ``due``."""
    last = due - -(-GRACE_NS // p.fmt.delayed_width_ns)
    if last < 0:
        return
    stop = p.report.operations_attempted + _MAX_OPS
    try:
        quiet_before = linux.realtime_ns() - QUIET_NS
        with open_dir(p, p.ctx.root_fd, DELAYED_DIR, DELAYED_DIR) as top:
            if top is None:
                return
            for raw in _listing(p, top, DELAYED_DIR):
                bucket = parse_bucket_dir(raw)
                if bucket is None:
                    continue  # promotion reports names that are not buckets
                if bucket > last:
                    return  # 16 lowercase hex digits sort as the numbers they are
                if p.report.operations_attempted >= stop:
                    raise Exhausted()
                _prune_bucket(p, top, raw.decode("ascii"), quiet_before)
    except Exhausted:
        p.report.budget_exhausted = True  # more to remove: worth another pass soon
    except OSError as e:  # the clock
        p.error("recovery_aborted", f"removing empty delayed buckets: {e.strerror or e}")


def _prune_bucket(p: Pass, top: int, name: str, quiet_before: int) -> None:
    rel = f"{DELAYED_DIR}/{name}"
    removed_before = p.report.directories_removed
    kept = False
    with open_dir(p, top, rel, name) as bucket_fd:
        if bucket_fd is None or not _quiet(p, bucket_fd, rel, quiet_before):
            return
        for raw in _listing(p, bucket_fd, rel):
            shard = raw.decode("ascii") if parse_shard_dir(raw, p.fmt.shard_count) is not None else None
            if shard is None or not _unused_shard(p, bucket_fd, f"{rel}/{shard}", shard, quiet_before):
                kept = True
            elif not _rmdir(p, bucket_fd, rel, shard):
                kept = True
        if kept:
            if p.report.directories_removed > removed_before:
                _barrier(p, bucket_fd, rel)
            return
    if _rmdir(p, top, DELAYED_DIR, name):
        _barrier(p, top, DELAYED_DIR)


def _unused_shard(p: Pass, bucket_fd: int, rel: str, name: str, quiet_before: int) -> bool:
    """Empty and quiet. Listed first, so a shard still holding jobs costs no operation of the budget."""
    with open_dir(p, bucket_fd, rel, name) as fd:
        return fd is not None and _quiet(p, fd, rel, quiet_before) and not _listing(p, fd, rel)


def _quiet(p: Pass, dir_fd: int, rel: str, quiet_before: int) -> bool:
    try:
        st: os.stat_result = linux.fstat(dir_fd)
    except OSError as e:
        p.error("directory", f"cannot stat {rel}: {e.strerror}")
        return False
    return st.st_mtime_ns <= quiet_before


def _rmdir(p: Pass, parent_fd: int, parent_rel: str, name: str) -> bool:
    """True if the directory is gone (removed now, or by someone else)."""
    p.check_budget()
    p.op()
    try:
        removed = p.ctx.tree.rmdir(parent_fd, parent_rel, name)
    except SourceMissing:
        return True
    except MoveFailed as e:
        p.error("rmdir_failed", f"{parent_rel}/{name}: {e}")
        return False
    if removed:
        p.report.directories_removed += 1
    return removed


def _barrier(p: Pass, dir_fd: int, rel: str) -> None:
    try:
        linux.fsync(dir_fd)
    except OSError as e:
        p.error("rmdir_outcome_unknown", f"fsync {rel}: {e.strerror}")


def _listing(p: Pass, dir_fd: int, rel: str) -> list[bytes]:
    try:
        return linux.list_dir(dir_fd)
    except OSError as e:
        p.error("directory", f"cannot list {rel}: {e.strerror}")
        return []
