"""What every phase of a pass shares: the report, the budget, the position.

A pass is a sequence of phases that all spend one work budget, record every
problem instead of raising it, and move one position forward through their
tree; keeping those three in one small object lets each phase be a plain
function of it.
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


@dataclass
class Pass:
    """One pass: the clocks read at its start, its budget and its position.

    The clocks are read once, after the cursor (recovery.md "Pass
    structure"), so every phase judges expiry against the same instant.
    """

    ctx: Context
    report: RecoveryReport
    control: int  # our own control/ descriptor (the handle's cache may close its own)
    max_ops: int
    only: tuple[str, ...] | None = None  # restricted pass: these phases only, cursor untouched
    bt_now: int = 0
    wall: int | None = None  # None: no wall floor, the wall-sensitive actions are skipped
    deadline: int = 0  # CLOCK_MONOTONIC
    # The current phase's position: the last entry it began to process.
    pos: Key | None = None

    @property
    def fmt(self) -> FormatRecord:
        return self.ctx.fmt

    def error(self, code: str, message: str) -> None:
        self.report.errors.append((code, message))

    def op(self) -> None:
        """Count one attempted move, unlink, rmdir, compaction or quarantine."""
        self.report.operations_attempted += 1

    def check_budget(self) -> None:
        if self.report.operations_attempted >= self.max_ops or linux.monotonic_ns() >= self.deadline:
            raise Exhausted()

    def done_before(self, key: Key) -> bool:
        """Every entry below ``key`` compares ≤ the position: already done."""
        return self.pos is not None and key < self.pos[: len(key)]
