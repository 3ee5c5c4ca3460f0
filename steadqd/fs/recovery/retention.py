"""Phase 5, retention (recovery.md): receipts past retention are deleted,
then, opt-in, dead letters past theirs; emptied directories are removed.

Skipped without a wall floor (retention is a wall-clock decision). Bucket
``B`` of ``receipts/`` is due once ``B × w + w + retention ≤ wall``
(``w`` = terminal width); only objects that verify for their very directory
are unlinked, after a re-stat that proves the path still names the verified
inode, so a file swapped in meanwhile is kept.

Dead-letter retention (open-questions A7: the reference has none) is opt-in
per handle (``OpenOptions.dead_retention_ns``, default None = keep forever).
It runs inside this phase after the receipt buckets, because the cursor's
phase names are fixed by the spec, with the receipt rules: only names that
parse as dead, authenticate for their directory and pass structural
validation are unlinked; anything else is kept and reported. Its position
keys start with ``_DEAD_KEY``, which sorts after every receipt key, so a
resumed pass never repeats the receipt walk.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable
from typing import Any

from steadqd.constants import DEAD_DIR, JOB_EXT, RECEIPT_EXT, RECEIPTS_DIR, State
from steadqd.errors import CorruptObject, QueueCorrupt, SteadQError
from steadqd.fs import linux
from steadqd.fs.names import JobName, bucket_end, parse_bucket_dir, parse_name
from steadqd.fs.recovery.objects import locked_receipt, validate, verified_receipt
from steadqd.fs.recovery.state import Key, Pass
from steadqd.fs.recovery.walk import Level, ascii_name, dirs, entries, open_dir, shard_level
from steadqd.fs.tree import Indeterminate, MoveFailed, SourceMissing, Witness

# 0xff sorts after any bucket name, so the receipt walk's keys all come first.
_DEAD_KEY: Key = (b"\xffdead",)

# Empties one shard directory: (pass, fd, rel, key, bucket, shard) -> every entry seen is gone.
ShardDeleter = Callable[[Pass, int, str, Key, int, int], bool]


def delete_receipts(p: Pass) -> None:
    if p.wall is None:
        return
    _expire_tree(p, RECEIPTS_DIR, (), p.ctx.options.receipt_retention_ns, _delete_receipts_in_shard)
    dead_retention = p.ctx.options.dead_retention_ns
    if dead_retention is not None:
        _expire_tree(p, DEAD_DIR, _DEAD_KEY, dead_retention, _delete_dead_in_shard)


def _expire_tree(p: Pass, top_rel: str, prefix: Key, retention: int, delete_in_shard: ShardDeleter) -> None:
    """Empty every due ``top/<B>/<S>/`` through ``delete_in_shard`` and
    remove the directories it emptied."""
    assert p.wall is not None
    wall = p.wall
    width = p.fmt.terminal_width_ns

    def expired(values: tuple[Any, ...]) -> bool:
        try:
            return bucket_end(values[0], width) + retention <= wall
        except SteadQError:
            return False

    # Not the generic walk: directories are removed on the way back up.
    # Bad names are compact_receipts' (or fsck's) to report.
    buckets = Level(parse_bucket_dir, None, expired)
    with open_dir(p, p.ctx.root_fd, top_rel, top_rel) as top:
        if top is None:
            return
        with contextlib.closing(dirs(p, top, top_rel, prefix, buckets, ())) as bucket_dirs:
            for (bucket,), kfd, krel, kname, kkey in bucket_dirs:
                if _expire_bucket(p, kfd, krel, kkey, bucket, delete_in_shard):
                    _remove_dir(p, top, top_rel, kname)


def _expire_bucket(p: Pass, kfd: int, krel: str, kkey: Key, bucket: int, delete_in_shard: ShardDeleter) -> bool:
    """Empty and remove every shard directory of one bucket; True if none is left."""
    # A shard directory we did not enter keeps its bucket directory.
    not_entered: list[bytes] = []
    bucket_empty = True
    with contextlib.closing(dirs(p, kfd, krel, kkey, shard_level(p, None), (bucket,), not_entered)) as shard_dirs:
        for (_, shard), sfd, srel, sname, skey in shard_dirs:
            if not (delete_in_shard(p, sfd, srel, skey, bucket, shard) and _remove_dir(p, kfd, krel, sname)):
                bucket_empty = False
    return bucket_empty and not not_entered


# Deletes one parsed object of a shard directory: (pass, fd, rel, name, parsed name, bucket, shard) -> gone.
ObjectDeleter = Callable[[Pass, int, str, str, JobName, int, int], bool]


def _shard_deleter(state: State, ext: str, bad_name: tuple[str, str], delete: ObjectDeleter) -> ShardDeleter:
    """Empties one shard directory of ``state``'s names through ``delete``; True if every entry seen is gone.

    Only names that parse as ``state``'s are handed to ``delete``, which
    deletes only what proves to be this queue's object for this very
    directory: a stray or corrupt file may be evidence somebody needs, so it
    stays (fsck reports it) and keeps its directory. ``bad_name``: the error
    code and text a name of the right extension that does not parse is reported with.
    """

    def delete_in_shard(p: Pass, dir_fd: int, rel: str, prefix: Key, bucket: int, shard: int) -> bool:
        all_gone = True
        for raw in entries(p, dir_fd, rel, prefix):
            name = ascii_name(raw)
            if name is None or not name.endswith(ext):
                all_gone = False
                continue
            try:
                job = parse_name(state, name)
            except CorruptObject:
                p.error(bad_name[0], f"{rel}/{name}: {bad_name[1]}")
                all_gone = False
                continue
            if not delete(p, dir_fd, rel, name, job, bucket, shard):
                all_gone = False
        return all_gone

    return delete_in_shard


def _delete_receipt(p: Pass, dir_fd: int, rel: str, name: str, _job: JobName, bucket: int, shard: int) -> bool:
    """True when the receipt is gone (deleted now or by someone else)."""
    with locked_receipt(p, dir_fd, rel, name, "receipt_delete_failed") as fd:
        if fd is None:
            return not _exists(dir_fd, name)
        info = verified_receipt(p, fd, rel, name, bucket, shard, "receipt_delete", note="; kept")
        if info is None:
            return False
        gone, deleted = _unlink_verified(p, dir_fd, rel, name, info.witness, "receipt_delete")
        p.report.receipts_deleted += deleted
        return gone


def _delete_dead(p: Pass, dir_fd: int, rel: str, name: str, job: JobName, bucket: int, shard: int) -> bool:
    """True when the dead job is gone (deleted now or by someone else, e.g.
    an ``admin requeue``/``dead-remove`` that won the race)."""
    try:
        # Tag (dead/B/S context), shard placement, envelope, name vs header.
        env = validate(p, dir_fd, name, job, shard=shard, bucket=bucket)
    except FileNotFoundError:
        return True
    except (CorruptObject, QueueCorrupt) as e:
        p.error("dead_delete_invalid", f"{rel}/{name}: {e}; kept")
        return False
    except (OSError, SteadQError) as e:
        p.error("dead_delete_failed", f"{rel}/{name}: {e}")
        return False
    gone, deleted = _unlink_verified(p, dir_fd, rel, name, env.witness, "dead_delete")
    p.report.dead_deleted += deleted
    return gone


_delete_receipts_in_shard = _shard_deleter(
    State.RECEIPT, RECEIPT_EXT, ("receipt_parse", "not a receipt name"), _delete_receipt
)
_delete_dead_in_shard = _shard_deleter(State.DEAD, JOB_EXT, ("dead_parse", "not a dead job name; kept"), _delete_dead)


def _unlink_verified(p: Pass, dir_fd: int, rel: str, name: str, witness: Witness, code: str) -> tuple[bool, bool]:
    """Unlink an object only if the path still names the inode that was
    verified; returns (gone, deleted by this call). A file swapped in
    after verification is evidence and is kept."""
    try:
        st = linux.stat_at(dir_fd, name)
    except FileNotFoundError:
        return True, False
    except OSError as e:
        p.error(f"{code}_failed", f"{rel}/{name}: {e.strerror}")
        return False, False
    if not witness.names_single_file(st):
        p.error(f"{code}_failed", f"{rel}/{name}: replaced while being verified; kept")
        return False, False
    p.op()
    try:
        p.ctx.tree.unlink(dir_fd, name)
    except SourceMissing:
        return True, False
    except MoveFailed as e:
        p.error(f"{code}_failed", f"{rel}/{name}: {e}")
        return False, False
    except Indeterminate as e:
        p.error(f"{code}_outcome_unknown", f"{rel}/{name}: {e}")
        return True, False
    return True, True


def _remove_dir(p: Pass, parent_fd: int, parent_rel: str, name: str) -> bool:
    """rmdir + fsync of the parent; "not empty" is a normal outcome (False)."""
    p.check_budget()
    p.op()
    rel = f"{parent_rel}/{name}"
    try:
        linux.rmdir_at(parent_fd, name)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return True
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            p.error("rmdir_failed", f"{rel}: {e.strerror}")
        return False
    p.ctx.tree.forget(rel)
    p.report.directories_removed += 1
    try:
        linux.fsync(parent_fd)
    except OSError as e:
        p.error("rmdir_outcome_unknown", f"{rel}: fsync {parent_rel}: {e.strerror}")
    return True


def _exists(dir_fd: int, name: str) -> bool:
    try:
        linux.stat_at(dir_fd, name)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True
