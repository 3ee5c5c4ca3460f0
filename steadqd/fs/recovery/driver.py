"""One pass from start to end: arguments, the recovery lock, the clocks, the
phases in cursor order, the cursor written back.

``control/recovery.lock`` (an OFD lock) lets one pass run at a time; the
no-replace renames of every phase would keep concurrent passes correct
anyway, the lock only keeps them from doing each other's work.

The phases not yet in modules of their own are here too, in cursor
order, before the table that runs them.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from typing import Any

from steadqd.constants import (
    CONTROL_DIR,
    DEAD_DIR,
    JOB_EXT,
    RECEIPT_EXT,
    RECEIPTS_DIR,
    RECOVERY_LOCK,
    U32_MAX,
    Modes,
    State,
)
from steadqd.errors import CorruptObject, InvalidInput, QueueCorrupt, SteadQError
from steadqd.fs import linux
from steadqd.fs.context import Context
from steadqd.fs.names import JobName, bucket_end, parse_bucket_dir, parse_name
from steadqd.fs.receipt import verify_receipt
from steadqd.fs.recovery.compact import compact_receipts
from steadqd.fs.recovery.cursor import Positions, read_cursor, remember, write_cursor
from steadqd.fs.recovery.objects import locked_receipt, validate
from steadqd.fs.recovery.promote import promote_delayed
from steadqd.fs.recovery.reap import reap_leases
from steadqd.fs.recovery.state import PHASES, Exhausted, Key, Pass, RecoveryReport
from steadqd.fs.recovery.temp import cleanup_temp
from steadqd.fs.recovery.walk import Level, ascii_name, dirs, entries, open_dir, shard_level
from steadqd.fs.tree import Indeterminate, MoveFailed, SourceMissing, Witness, is_single_regular

MAX_BUDGET_MS = 24 * 3600 * 1000
_NS_PER_MS = 1_000_000


# ----------------------------------------------------------------------------
# Phase 5, retention (recovery.md): receipts past retention are deleted,
# then, opt-in, dead letters past theirs; emptied directories are removed.
#
# Skipped without a wall floor (retention is a wall-clock decision). Bucket
# ``B`` of ``receipts/`` is due once ``B × w + w + retention ≤ wall``
# (``w`` = terminal width); only objects that verify for their very directory
# are unlinked, after a re-stat that proves the path still names the verified
# inode, so a file swapped in meanwhile is kept.
#
# Dead-letter retention (open-questions A7: the reference has none) is opt-in
# per handle (``OpenOptions.dead_retention_ns``, default None = keep forever).
# It runs inside this phase after the receipt buckets, because the cursor's
# phase names are fixed by the spec, with the receipt rules: only names that
# parse as dead, authenticate for their directory and pass structural
# validation are unlinked; anything else is kept and reported. Its position
# keys start with ``_DEAD_KEY``, which sorts after every receipt key, so a
# resumed pass never repeats the receipt walk.


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


def _delete_receipts_in_shard(p: Pass, dir_fd: int, rel: str, prefix: Key, bucket: int, shard: int) -> bool:
    """Delete every verified receipt; True if every entry seen is gone."""
    all_gone = True
    for raw in entries(p, dir_fd, rel, prefix):
        name = ascii_name(raw)
        if name is None or not name.endswith(RECEIPT_EXT):
            all_gone = False
            continue
        try:
            parse_name(State.RECEIPT, name)
        except CorruptObject:
            p.error("receipt_parse", f"{rel}/{name}: not a receipt name")
            all_gone = False
            continue
        if not _delete_receipt(p, dir_fd, rel, name, bucket, shard):
            all_gone = False
    return all_gone


def _delete_receipt(p: Pass, dir_fd: int, rel: str, name: str, bucket: int, shard: int) -> bool:
    """True when the receipt is gone (deleted now or by someone else)."""
    with locked_receipt(p, dir_fd, rel, name, "receipt_delete_failed") as fd:
        if fd is None:
            return not _exists(dir_fd, name)
        try:
            info = verify_receipt(p.fmt, fd, name, bucket, shard)
        except SteadQError as e:
            p.error("receipt_delete_invalid", f"{rel}/{name}: {e}; kept")
            return False
        except OSError as e:
            p.error("receipt_delete_failed", f"{rel}/{name}: {e.strerror}")
            return False
        gone, deleted = _unlink_verified(p, dir_fd, rel, name, info.witness, "receipt_delete")
        p.report.receipts_deleted += deleted
        return gone


def _delete_dead_in_shard(p: Pass, dir_fd: int, rel: str, prefix: Key, bucket: int, shard: int) -> bool:
    """Delete every verified dead job of an expired bucket; True if every entry seen is gone.

    Only objects that prove to be this queue's dead jobs for this very
    directory are deleted: a stray or corrupt file may be evidence somebody
    needs, so it stays (fsck reports it) and keeps its directory.
    """
    all_gone = True
    for raw in entries(p, dir_fd, rel, prefix):
        name = ascii_name(raw)
        if name is None or not name.endswith(JOB_EXT):
            all_gone = False
            continue
        try:
            job = parse_name(State.DEAD, name)
        except CorruptObject:
            p.error("dead_parse", f"{rel}/{name}: not a dead job name; kept")
            all_gone = False
            continue
        if not _delete_dead(p, dir_fd, rel, name, job, bucket, shard):
            all_gone = False
    return all_gone


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
    if not (witness.matches(st) and is_single_regular(st)):
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


_RUNNERS: dict[str, Callable[[Pass], None]] = {
    "reap_leases": reap_leases,
    "promote_delayed": promote_delayed,
    "cleanup_temp": cleanup_temp,
    "compact_receipts": compact_receipts,
    "delete_receipts": delete_receipts,
}


def run_recovery(
    ctx: Context,
    *,
    budget_ops: int = 1000,
    budget_ms: int = 100,
    now_boottime: int | None = None,
    phases: tuple[str, ...] | None = None,
) -> RecoveryReport:
    """Run one recovery pass on an open queue context.

    An invalid budget raises InvalidInput and a poisoned handle raises
    QueuePoisoned before anything is touched; everything else that goes wrong
    is recorded in the returned report. ``now_boottime`` replaces the
    CLOCK_BOOTTIME reading (tests use it to age leases and temps without
    sleeping).

    ``phases`` (default: all) restricts the pass to the named phases, run in
    the usual order, each from its beginning; such a pass neither reads nor
    writes the recovery cursor and leaves this process's remembered position
    alone, so a promoter's promote-only passes never disturb the progress of
    full passes (and still run when the cursor names a later phase).
    """
    ops, ms = _check_args(budget_ops, budget_ms, now_boottime, phases)
    ctx.check_usable()
    report = RecoveryReport()
    # Our own descriptor: the handle's directory cache may evict (close) its
    # entries between operations, and a pass spans many operations.
    try:
        control = linux.open_beneath(ctx.root_fd, CONTROL_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        report.errors.append(("recovery_lock", f"cannot open control/: {e.strerror}"))
        return report
    try:
        lock_fd = _open_lock(control, report, ctx.modes)
        if lock_fd is None:
            return report
        try:
            if not _try_lock(lock_fd, report):
                return report
            _run_pass(Pass(ctx, report, control, ops, phases), ms, now_boottime)
        finally:
            with contextlib.suppress(OSError):
                linux.close(lock_fd)  # releases the OFD lock
    finally:
        with contextlib.suppress(OSError):
            linux.close(control)
    return report


def _check_args(budget_ops: object, budget_ms: object, now_boottime: object, phases: object) -> tuple[int, int]:
    if isinstance(budget_ops, bool) or not isinstance(budget_ops, int) or not 1 <= budget_ops <= U32_MAX:
        raise InvalidInput(f"budget_ops must be an integer in 1..{U32_MAX}, got {budget_ops!r}")
    if isinstance(budget_ms, bool) or not isinstance(budget_ms, int) or not 1 <= budget_ms <= MAX_BUDGET_MS:
        raise InvalidInput(f"budget_ms must be an integer in 1..{MAX_BUDGET_MS}, got {budget_ms!r}")
    if phases is not None and (not isinstance(phases, tuple) or not phases or any(p not in PHASES for p in phases)):
        raise InvalidInput(f"phases must be a non-empty tuple of {', '.join(PHASES)}; got {phases!r}")
    if now_boottime is not None and (
        isinstance(now_boottime, bool) or not isinstance(now_boottime, int) or now_boottime < 0
    ):
        raise InvalidInput(f"now_boottime must be a non-negative integer, got {now_boottime!r}")
    return budget_ops, budget_ms


def _open_lock(control: int, report: RecoveryReport, modes: Modes) -> int | None:
    """Open ``control/recovery.lock``, creating it durably if it is missing."""
    for _ in range(2):
        try:
            return linux.open_at(control, RECOVERY_LOCK, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as e:
            if e.errno != errno.ENOENT:
                report.errors.append(("recovery_lock", f"cannot open control/{RECOVERY_LOCK}: {e.strerror}"))
                return None
        try:
            fd = linux.open_at(control, RECOVERY_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, modes.file)
        except OSError as e:
            if e.errno == errno.EEXIST:
                continue  # created by a concurrent pass: open it
            report.errors.append(("recovery_lock", f"cannot create control/{RECOVERY_LOCK}: {e.strerror}"))
            return None
        try:
            if modes.enforce:
                linux.fchmod(fd, modes.file)
            linux.fsync(fd)
            linux.fsync(control)
        except OSError as e:
            linux.close(fd)
            report.errors.append(("recovery_lock", f"cannot make control/{RECOVERY_LOCK} durable: {e.strerror}"))
            return None
        return fd
    report.errors.append(("recovery_lock", f"control/{RECOVERY_LOCK} keeps disappearing"))
    return None


def _try_lock(fd: int, report: RecoveryReport) -> bool:
    try:
        if linux.ofd_lock(fd, exclusive=True):
            return True
        report.errors.append(("recovery_lock", "another recovery pass holds control/recovery.lock"))
    except OSError as e:
        report.errors.append(("recovery_lock", f"cannot lock control/{RECOVERY_LOCK}: {e.strerror}"))
    return False


def _run_pass(p: Pass, budget_ms: int, now_bt: int | None) -> None:
    if p.only is None:
        cursor = read_cursor(p)
        if cursor is None:
            return
        start, positions = cursor
    else:
        start, positions = PHASES[0], {}
    if not _read_clocks(p, budget_ms, now_bt):
        return
    next_phase, remembered = _run_phases(p, start, positions)
    if p.only is not None:
        return  # a restricted pass leaves the cursor and the remembered position alone
    remember(p.ctx.queue_id, remembered)
    write_cursor(p, next_phase)


def _read_clocks(p: Pass, budget_ms: int, now_bt: int | None) -> bool:
    """Boottime, wall floor, then the budget's deadline; False if a clock failed."""
    try:
        p.bt_now = now_bt if now_bt is not None else linux.boottime_ns()
    except OSError as e:
        p.error("clock", f"cannot read CLOCK_BOOTTIME: {e.strerror}")
        return False
    try:
        p.wall = p.ctx.wall.for_mutation()
        p.report.wall_floor_available = True
    except (SteadQError, OSError) as e:
        p.wall = None
        p.error("wall_floor", f"wall floor unavailable: {e}; skipping promotion, receipt deletion, reap-to-dead")
    try:
        p.deadline = linux.monotonic_ns() + budget_ms * _NS_PER_MS
    except OSError as e:
        p.error("clock", f"cannot read CLOCK_MONOTONIC: {e.strerror}")
        return False
    return True


def _run_phases(p: Pass, start: str, positions: Positions) -> tuple[str, tuple[str, Key] | None]:
    """Run the phases from ``start``; returns (the phase the next pass starts
    with, the position to resume that phase at in this process)."""
    for phase in PHASES[PHASES.index(start) :]:
        if p.only is not None and phase not in p.only:
            continue
        p.pos = positions.get(phase)
        try:
            _RUNNERS[phase](p)
        except Exhausted:
            p.report.budget_exhausted = True
            return phase, None if p.pos is None else (phase, p.pos)
        except OSError as e:
            # Not an on-disk problem (every file operation records its own
            # errors): the clock or getrandom failed. Stop as if out of
            # budget, but restart this phase from its beginning: the entry
            # at the position may be half done.
            p.error("recovery_aborted", f"{phase}: {e.strerror or e}")
            return phase, None
    return PHASES[0], None
