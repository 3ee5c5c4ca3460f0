"""The bucket queue's recovery pass: the sweeps, retention GC and a slice of the repair scan, on one budget.

What ``BucketBackend.recover`` (and so ``steadq recover`` and the sweeper)
runs. One home for the phases' names and order, how the budget is shared
between them, and the retention a handle was opened with, because it is the
one caller of all three parts (``sweep.py``, ``gc.py``, ``repair.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from steadqd.errors import CorruptRecord, InvalidInput, NotCommitted, OutcomeUnknown, StateExhausted
from steadqd.s3.handle import seconds_ns
from steadqd.s3.layout import QueueLayout
from steadqd.s3.recovery.gc import (
    BEACON_STALENESS_MULTIPLE,
    MIN_FLOOR_STALENESS_NS,
    GcPass,
    Positions,
    Retention,
    collect_beacons,
    collect_orphan_payloads,
    collect_terminal,
)
from steadqd.s3.recovery.repair import repair_step
from steadqd.s3.recovery.sweep import Budget, Exhausted, RecoveryReport, budgeted, sweep_delayed, sweep_leases

__all__ = [
    "RECOVERY_PHASES",
    "REPAIR_PAGES_PER_PASS",
    "RecoverySetting",
    "check_phases",
    "recovery_setting",
    "run_recovery",
]

# Phase names, the filesystem's where they mean the same (steadqd.fs.recovery.PHASES).
RECOVERY_PHASES = ("reap_leases", "promote_delayed", "delete_receipts", "cleanup_temp", "collect_beacons", "repair")
# Pages the repair scan lists per recovery pass, so a cycle spreads over many passes.
REPAIR_PAGES_PER_PASS = 4


def _run_phase(
    name: str,
    work: QueueLayout,
    layout: QueueLayout,
    floor_ns: int,
    setting: RecoverySetting,
    report: RecoveryReport,
    budget: Budget,
) -> bool:
    """Run one phase; True when the budget cut it short."""
    retention, positions = setting.retention, setting.positions
    try:
        if name == "reap_leases":
            sweep_leases(work, floor_ns, report, budget)
        elif name == "promote_delayed":
            sweep_delayed(work, floor_ns, report, budget)
        elif name == "delete_receipts":
            collect_terminal(GcPass(work, floor_ns, retention, positions, report, budget))
        elif name == "cleanup_temp":
            collect_orphan_payloads(GcPass(work, floor_ns, retention, positions, report, budget))
        elif name == "collect_beacons":
            collect_beacons(GcPass(work, floor_ns, retention, positions, report, budget))
        else:
            step = repair_step(work, layout, floor_ns, max_pages=REPAIR_PAGES_PER_PASS, budget=budget)
            report.indexes_regenerated += step.scan.regenerated
            report.quarantined += step.scan.quarantined
            if step.cycle_done:
                report.shards_repaired += layout.format.shard_count
            if step.error is not None:
                raise step.error
    except Exhausted:
        return True
    except (NotCommitted, OutcomeUnknown, StateExhausted, CorruptRecord) as exc:
        report.error(exc, f"recovery phase {name} of {layout.location}")
    return False


@dataclass
class RecoverySetting:
    """What a handle keeps between its passes: the retention it was opened with and where its walks stopped."""

    retention: Retention
    positions: Positions = field(default_factory=Positions)


def recovery_setting(
    receipt_retention: float, dead_retention: float | None, temp_ttl: float, floor_staleness_s: float
) -> RecoverySetting:
    """The retention of a handle's passes from the sweeper's settings (seconds, as for a filesystem queue).

    ``temp_ttl`` is the orphan-payload horizon; beacons go after
    ``BEACON_STALENESS_MULTIPLE`` floor-staleness windows (at least the reference's).
    """
    staleness_ns = max(seconds_ns("floor_staleness_s", floor_staleness_s), MIN_FLOOR_STALENESS_NS)
    return RecoverySetting(
        Retention(
            receipt_ns=seconds_ns("receipt_retention", receipt_retention),
            dead_ns=None if dead_retention is None else seconds_ns("dead_retention", dead_retention),
            orphan_ns=seconds_ns("temp_ttl", temp_ttl),
            beacon_ns=BEACON_STALENESS_MULTIPLE * staleness_ns,
        )
    )


def check_phases(phases: tuple[str, ...] | None) -> tuple[str, ...]:
    if phases is None:
        return RECOVERY_PHASES
    unknown = [p for p in phases if p not in RECOVERY_PHASES]
    if unknown or not phases:
        raise InvalidInput(
            f"recovery phases {', '.join(unknown) or '(none)'} are not those of a bucket queue; "
            f"give some of {', '.join(RECOVERY_PHASES)}"
        )
    return tuple(p for p in RECOVERY_PHASES if p in phases)


def run_recovery(
    layout: QueueLayout,
    floor_ns: int,
    budget: Budget,
    setting: RecoverySetting,
    phases: tuple[str, ...] | None = None,
) -> RecoveryReport:
    """One bounded pass; each phase first gets an equal share of the budget, then what the others left.

    Store problems are reported in ``errors``, never raised; a phase cut
    short keeps its place (sweeps by what they deleted, GC in ``setting``,
    the repair scan in its cursor) and is what ``budget_exhausted`` reports.
    """
    names = check_phases(phases)
    report = RecoveryReport()
    work = budgeted(layout, budget)
    cut: list[str] = []
    for i, name in enumerate(names):
        if budget.spent():
            cut.extend(names[i:])
            break
        budget.give(max(1, budget.left // (len(names) - i)))
        if _run_phase(name, work, layout, floor_ns, setting, report, budget):
            cut.append(name)
    unfinished = []
    for name in cut:
        if budget.spent():
            unfinished.append(name)
            continue
        budget.give(budget.left)
        if _run_phase(name, work, layout, floor_ns, setting, report, budget):
            unfinished.append(name)
    report.operations_attempted = budget.ops
    report.budget_exhausted = bool(unfinished)
    return report
