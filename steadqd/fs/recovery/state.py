"""What every phase of a pass shares: the report, the budget, the position.

A pass is a sequence of phases that all spend one work budget, record every
problem instead of raising it, and move one position forward through their
tree; keeping those three in one small object lets each phase be a plain
function of it.

The time budget runs from the pass's first piece of work (the first entry a
phase looks at, or the first operation), not from its start: taking the
lock, reading the cursor, stabilizing the wall floor and listing the
directory where the pass resumes are not work, and charging them let a pass
on a slow disk stop before it did anything, every time. And the clock can
only stop a pass once it has handed a phase one entry, so every pass moves
its position forward. A pass that finds no entry at all (only directories)
starts its clock after ``FREE_CHECKS`` budget checks, which keeps it bounded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from steadqd.fs import linux
from steadqd.fs.context import Context
from steadqd.fs.json_records import CURSOR_PHASES
from steadqd.fs.records import FormatRecord

PHASES = CURSOR_PHASES  # reap_leases, promote_delayed, cleanup_temp, compact_receipts, delete_receipts

# A position: the names on the path to an entry, compared bytewise so that
# sorted listings and cursor tuples order the same way (recovery.md).
Key = tuple[bytes, ...]


@dataclass
class RecoveryReport:
    """What one pass did. ``errors`` holds ``(code, message)`` pairs; any
    error (even a benign one such as a busy lock) makes the CLI exit 6."""

    leases_reaped: int = 0
    leases_to_dead: int = 0
    # Job ids (hex) whose expired lease this pass returned to ready or buried: the
    # sweeper names them, so a job's story in the journal (and `show`) is complete.
    reaped_jobs: list[str] = field(default_factory=list)
    delayed_promoted: int = 0
    temp_files_deleted: int = 0
    receipts_compacted: int = 0
    receipts_deleted: int = 0
    quarantined: int = 0
    # Dead jobs deleted by dead-letter retention (only with OpenOptions.dead_retention_ns).
    dead_deleted: int = 0
    operations_attempted: int = 0
    budget_exhausted: bool = False
    errors: list[tuple[str, str]] = field(default_factory=list)
    # (original relative path, quarantine reason, quarantine file name)
    quarantined_objects: list[tuple[str, int, str]] = field(default_factory=list)
    directories_removed: int = 0
    wall_floor_available: bool = False
    # The phase the persisted cursor names (where the next pass starts); None if not persisted.
    next_phase: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def changed(self) -> int:
        """Objects moved, deleted or rewritten by this pass."""
        return (
            self.leases_reaped
            + self.leases_to_dead
            + self.delayed_promoted
            + self.temp_files_deleted
            + self.receipts_compacted
            + self.receipts_deleted
            + self.dead_deleted
            + self.quarantined
            + self.directories_removed
        )


class Exhausted(Exception):
    """The work budget ran out; unwinds the phase, keeping its position."""


# Budget checks a pass may make before its first entry without starting its
# clock: the directories of a tree with no entries in them are work too.
FREE_CHECKS = 1024


@dataclass
class Pass:
    """One pass: the clocks read at its start, its budget and its position.

    The clocks are read once, after the cursor (recovery.md "Pass
    structure"), so every phase judges expiry against the same instant.
    ``ops_limit`` and ``time_limit_ns`` are the limits of the current step
    (the driver gives the due phases only a share of the pass's budget).
    """

    ctx: Context
    report: RecoveryReport
    control: int  # our own control/ descriptor (the handle's cache may close its own)
    max_ops: int
    budget_ns: int
    only: tuple[str, ...] | None = None  # restricted pass: these phases only, cursor untouched
    bt_now: int = 0
    wall: int | None = None  # None: no wall floor, the wall-sensitive actions are skipped
    ops_limit: int = 0
    time_limit_ns: int = 0
    started_ns: int | None = None  # CLOCK_MONOTONIC at the first piece of work
    checks: int = 0
    # The current phase's position: the last entry it began to process.
    pos: Key | None = None

    def __post_init__(self) -> None:
        self.ops_limit = self.max_ops
        self.time_limit_ns = self.budget_ns

    @property
    def fmt(self) -> FormatRecord:
        return self.ctx.fmt

    def error(self, code: str, message: str) -> None:
        self.report.errors.append((code, message))

    def op(self) -> None:
        """Count one attempted move, unlink, rmdir, compaction or quarantine."""
        self.report.operations_attempted += 1
        self._start_clock()

    def enter(self, key: Key) -> None:
        """The position moves to an entry a phase is about to process."""
        self.pos = key
        self._start_clock()

    def _start_clock(self) -> None:
        if self.started_ns is None:
            self.started_ns = linux.monotonic_ns()

    def check_budget(self) -> None:
        if self.report.operations_attempted >= self.ops_limit:
            raise Exhausted()
        if self.started_ns is None:
            self.checks += 1
            if self.checks > FREE_CHECKS:
                self._start_clock()
            return
        if linux.monotonic_ns() - self.started_ns >= self.time_limit_ns:
            raise Exhausted()

    def done_before(self, key: Key) -> bool:
        """Every entry below ``key`` compares ≤ the position: already done."""
        return self.pos is not None and key < self.pos[: len(key)]
