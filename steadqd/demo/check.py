"""Checking the demo's result against its plan: the tree's counts, and what the daemon's log says.

The demo exits 0 only when every job it enqueued was acknowledged or buried
as its kind says, nothing is left ready, leased or delayed, nothing was
quarantined, and the daemon stopped cleanly. The counts come from the tree
(the tree is the only state); the retries, which leave no object behind,
from the daemon's log.
"""

from __future__ import annotations

from collections import Counter

from steadqd.backend import Backend


def counts(q: Backend) -> dict[str, int]:
    """Objects per state, classified by name (colocated leases count as leased)."""
    return {k: v.objects for k, v in q.stats().items()}


def pending(counts: dict[str, int]) -> int:
    """Jobs not yet settled: ready, leased or delayed."""
    return counts["ready"] + counts["leased"] + counts["delayed"]


def problems(
    jobs: int,
    expected: Counter[str],
    before: dict[str, int],
    after: dict[str, int],
    retried: int,
    code: int | None,
    *,
    settled: bool,
) -> list[str]:
    """What is wrong with a run that enqueued ``jobs`` (planned as ``expected``), one sentence each; [] if nothing.

    ``before``/``after`` are the tree's counts around the run, ``retried`` the
    retries the log reported, ``code`` the daemon's exit status.
    """
    acked = after["receipts"] - before["receipts"]
    buried = after["dead"] - before["dead"]
    quarantined = after["quarantine"] - before["quarantine"]
    found = []
    leftover = pending(before)
    if leftover:  # jobs of an interrupted run: their kinds are unknown, only the total can be checked
        if acked + buried != jobs + leftover:
            found.append(f"expected {jobs} + {leftover} jobs settled, the tree has {acked + buried}")
    else:
        want_acked = expected["plain"] + expected["flaky"]
        if acked != want_acked:
            found.append(f"expected {want_acked} acked (plain + flaky), the tree has {acked}")
        if buried != expected["poison"]:
            found.append(f"expected {expected['poison']} buried (poison), the tree has {buried}")
        if retried != expected["flaky"]:
            found.append(f"expected {expected['flaky']} retries (flaky), the log shows {retried}")
    if quarantined:
        found.append(f"{quarantined} objects were quarantined")
    if code != 0:
        found.append(f"the daemon exited with status {code}")
    if not settled:
        found.append("the jobs did not settle")
    if pending(after):
        found.append(f"left over: {after['ready']} ready, {after['leased']} leased, {after['delayed']} delayed")
    return found
