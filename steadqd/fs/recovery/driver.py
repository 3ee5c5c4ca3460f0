"""One pass from start to end: arguments, the recovery lock, the clocks, the
due phases, the phases in cursor order, the cursor written back.

``control/recovery.lock`` (an OFD lock) lets one pass run at a time; the
no-replace renames of every phase would keep concurrent passes correct
anyway, the lock only keeps them from doing each other's work.

A pass that resumes at a maintenance phase (temp cleanup, compaction,
retention) first runs the due phases the cursor has not reached yet, reaping
and promotion, with at most half of its budget: a backlog of a million
receipts to compact takes thousands of passes to get round to reaping, and
expired leases and due delayed jobs are the work somebody is waiting for. The
other half keeps the maintenance phases moving however many leases expire.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable

from steadqd.constants import CONTROL_DIR, RECOVERY_LOCK, U32_MAX, Modes
from steadqd.errors import InvalidInput, SteadQError
from steadqd.fs import linux
from steadqd.fs.clock import trusted_wall
from steadqd.fs.context import Context
from steadqd.fs.owner import give_to_owner
from steadqd.fs.recovery.compact import compact_receipts
from steadqd.fs.recovery.cursor import Positions, read_cursor, recall, remember, write_cursor
from steadqd.fs.recovery.promote import promote_delayed
from steadqd.fs.recovery.reap import reap_leases
from steadqd.fs.recovery.retention import delete_receipts
from steadqd.fs.recovery.state import PHASES, Exhausted, Key, Pass, RecoveryReport
from steadqd.fs.recovery.temp import cleanup_temp

MAX_BUDGET_MS = 24 * 3600 * 1000
_NS_PER_MS = 1_000_000

_RUNNERS: dict[str, Callable[[Pass], None]] = {
    "reap_leases": reap_leases,
    "promote_delayed": promote_delayed,
    "cleanup_temp": cleanup_temp,
    "compact_receipts": compact_receipts,
    "delete_receipts": delete_receipts,
}
# The phases that compare CLOCK_BOOTTIME readings: lease expiry and temp age.
_BOOTTIME_PHASES = frozenset({"reap_leases", "cleanup_temp"})


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
            _run_pass(Pass(ctx, report, control, ops, ms * _NS_PER_MS, phases), now_boottime)
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
            return linux.open_regular(control, RECOVERY_LOCK, os.O_RDWR, label=f"control/{RECOVERY_LOCK}")[0]
        except linux.NotRegularFile as e:
            report.errors.append(("recovery_lock", str(e)))
            return None
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
            if modes.owner is not None:
                give_to_owner(fd, modes.owner)
            if modes.enforce:
                linux.fchmod(fd, modes.file)
            linux.fsync(fd)
            linux.fsync(control)
        except OSError as e:
            linux.close(fd)
            report.errors.append(("recovery_lock", f"cannot make control/{RECOVERY_LOCK} durable: {e.strerror}"))
            return None
        except SteadQError as e:  # root that cannot give the lock to the queue's owner
            linux.close(fd)
            report.errors.append(("recovery_lock", f"cannot create control/{RECOVERY_LOCK}: {e}"))
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


def _run_pass(p: Pass, now_bt: int | None) -> None:
    if p.only is None:
        cursor = read_cursor(p)
        if cursor is None:
            return
        start, positions = cursor
    else:
        start, positions = PHASES[0], {}
    if not _read_clocks(p, now_bt):
        return
    if p.only is None:
        _run_due(p, tuple(phase for phase in _DUE_PHASES if PHASES.index(phase) < PHASES.index(start)))
    next_phase, remembered = _run_phases(p, start, positions)
    if p.only is not None:
        return  # a restricted pass leaves the cursor and the remembered position alone
    remember(p.ctx.queue_id, "cycle", remembered)
    write_cursor(p, next_phase, None if remembered is None else remembered[1])


def _read_clocks(p: Pass, now_bt: int | None) -> bool:
    """Boottime, then the wall floor; False if boottime failed. (The budget's
    clock starts with the first piece of work, state.py.) Also False in a
    process that may not judge boottimes (fs/clock.py)."""
    if p.ctx.boottime_problem is not None and (p.only is None or not _BOOTTIME_PHASES.isdisjoint(p.only)):
        p.error("time_namespace", f"recovery refused: {p.ctx.boottime_problem}")
        return False
    try:
        p.bt_now = now_bt if now_bt is not None else linux.boottime_ns()
    except OSError as e:
        p.error("clock", f"cannot read CLOCK_BOOTTIME: {e.strerror}")
        return False
    try:
        p.wall, skew = trusted_wall(p.ctx.wall.for_mutation(), linux.realtime_ns(), p.ctx.max_clock_skew_ns)
        p.report.wall_floor_available = True
        if skew is not None:
            p.error("clock_skew", skew)
    except (SteadQError, OSError) as e:
        p.wall = None
        p.error("wall_floor", f"wall floor unavailable: {e}; skipping promotion, receipt deletion, reap-to-dead")
    return True


# The phases whose work somebody waits for (a job to run), in cursor order.
_DUE_PHASES = ("reap_leases", "promote_delayed")


def _run_due(p: Pass, due: tuple[str, ...]) -> None:
    """Run ``due`` with half the budget, resuming where this process's last
    pass left them. A budget of one operation cannot be split: it goes to the
    cursor's phase, whose progress is what the budget guarantees."""
    share = p.max_ops // 2
    if not due or not share:
        return
    qid = p.ctx.queue_id
    mem = recall(qid, "due")
    left: tuple[str, Key] | None = None
    p.ops_limit, p.time_limit_ns = share, p.budget_ns // 2
    try:
        for phase in due:
            p.pos = mem[1] if mem is not None and mem[0] == phase else None
            try:
                _RUNNERS[phase](p)
            except Exhausted:
                p.report.budget_exhausted = True
                left = None if p.pos is None else (phase, p.pos)
                return
            except OSError as e:
                # As in _run_phases; the cursor's phase still gets its turn.
                p.error("recovery_aborted", f"{phase}: {e.strerror or e}")
                return
    finally:
        remember(qid, "due", left)
        p.ops_limit, p.time_limit_ns = p.max_ops, p.budget_ns


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
