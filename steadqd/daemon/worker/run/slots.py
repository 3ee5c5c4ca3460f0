"""Which slot (STEADQ_SLOT) a starting command gets: the lowest that no running command holds.

Apart from the role so that the rule a job's environment depends on reads on its own; the slot's
values (``slot_values:``) are the environment's (steadqd.daemon.environment.slot_environment).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from steadqd.daemon.worker.run import _Job

__all__ = ["free_slot"]


def free_slot(jobs: Iterable[_Job], starting: Iterable[int] = ()) -> int:
    """The lowest slot no running command holds (STEADQ_SLOT).

    A slot is held from the spawn until the command's group is reaped (its
    end), not while the run is settled, so it never names two running
    commands. There is always one below ``cfg.concurrency``: a claim is
    asked for only while fewer commands than that run (WorkerRole._fill).
    After a reload running jobs keep theirs, which may lie beyond a lowered
    concurrency; new jobs get slots below the new one. ``starting``: the
    slots of commands the spawn pool is starting (held from the hand-over).
    """
    held = {j.slot for j in jobs if j.child.returncode is None}
    held.update(starting)
    slot = 0
    while slot in held:
        slot += 1
    return slot
