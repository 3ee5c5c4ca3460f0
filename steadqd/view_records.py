"""The records ``steadq stats``, ``ls``, ``show``, ``recover`` and ``admin`` print, whichever backend read the queue.

Why one home: the command formats every view from these attributes
(docs/cli.md), so a bucket's view and a filesystem's must be the same
shape; defining them once keeps a field added for one backend from
silently missing in the other. Where a field means nothing to a backend,
that backend leaves it None and says so in its own module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

from steadqd.constants import NS_PER_SECOND

__all__ = [
    "CLASSIFIED_STATES",
    "JobEntry",
    "JobFile",
    "JobStory",
    "QuarantinedObject",
    "RecoveryReport",
    "StateStats",
    "StateTally",
]

# The states ``stats`` classifies objects into, as its output names them.
CLASSIFIED_STATES = ("dead", "delayed", "leased", "quarantine", "ready", "receipts", "tmp")

# A backend's own record of one object of a job (``steadq inspect``'s rows).
ObjectT = TypeVar("ObjectT")


@dataclass(frozen=True)
class StateStats:
    """Objects in one state and the age of the oldest, in whole seconds.

    The age is by the backend's clock of entry: a file's mtime, an object's
    store time. ``oldest_age_seconds`` is None exactly when ``objects`` is 0.
    """

    objects: int
    oldest_age_seconds: int | None


class StateTally:
    """Count and oldest entry time of one state, accumulated while streaming a listing.

    An entry whose time could not be read (None) is counted but not aged.
    """

    __slots__ = ("count", "oldest_ns")

    def __init__(self) -> None:
        self.count = 0
        self.oldest_ns: int | None = None

    def add(self, time_ns: int | None) -> None:
        self.count += 1
        if time_ns is not None and (self.oldest_ns is None or time_ns < self.oldest_ns):
            self.oldest_ns = time_ns

    def result(self, now_ns: int) -> StateStats:
        if self.oldest_ns is None:
            return StateStats(self.count, None)
        # floor(now - oldest) in seconds; a time in the future is age 0.
        return StateStats(self.count, max(0, now_ns - self.oldest_ns) // NS_PER_SECOND)


@dataclass(frozen=True)
class JobEntry:
    """One job object as ``steadq ls`` lists it: what its name says, not verified (``fsck`` verifies).

    ``mtime_ns`` is when it entered its state (a file's mtime, an object's
    store time), None when the entry vanished before it could be stat'ed;
    ``deadline_ns`` is a lease's wall deadline or a delayed job's
    not-before; ``reason`` is a dead job's.
    """

    state: str
    job_id: str
    generation: int
    attempt: int
    max_attempts: int
    path: str
    mtime_ns: int | None
    deadline_ns: int | None
    reason: int | None
    metadata: dict[str, object] | None = None  # read from the job file only when asked (``ls --meta``)


@dataclass(frozen=True)
class JobFile:
    """What one job's file or record says about its job, read and judged, never trusted.

    ``problem`` says why it fails verification (then the fields it could
    not establish are None); ``payload_verified`` is True only when the whole
    payload was read and matched its digest, and ``payload_head`` (at most
    the first bytes asked for) is empty on a bucket unless it did.
    ``metadata`` and ``producer_id`` are always None on a bucket: StowQ/1
    job records have no such fields.
    """

    path: str
    created_at_ns: int | None = None
    changed_ns: int | None = None
    content_type: str | None = None
    metadata: dict[str, object] | None = None
    producer_id: str | None = None
    initial_not_before_ns: int | None = None
    payload_length: int | None = None
    payload_head: bytes = b""
    payload_verified: bool = False
    problem: str | None = None


@dataclass(frozen=True)
class JobStory(Generic[ObjectT]):
    """One job as ``steadq show`` tells it: where it is, what its file says, every object it has.

    ``state`` is a state word or ``quarantine``; ``current`` is the object
    the story is about (the live one; the receipt when only a receipt is
    left; None in quarantine). ``file`` is None for a filesystem's receipt
    (an acknowledged job's payload is gone); a bucket keeps a done job's
    record and payload until garbage collection, and judges them.
    ``reason`` is a dead job's or a quarantined object's.
    """

    job_id: str
    state: str
    path: str
    objects: list[ObjectT]
    current: ObjectT | None
    file: JobFile | None
    reason: int | None = None
    quarantine_id: str | None = None


@dataclass(frozen=True)
class QuarantinedObject:
    """One quarantined object, as ``admin quarantine-list``/``-inspect`` show it.

    On a filesystem ``path`` is the object in ``quarantine/`` and ``size``
    and ``mtime_ns`` its lstat's (it may be a symlink or a directory); on a
    bucket ``path`` is the object the finding is about (which stays where it
    is), ``size`` that object's (0 once it is gone), ``mtime_ns`` the
    finding's store time and ``finding`` the finding's own key.
    """

    quarantine_id: str
    reason: int
    path: str
    size: int
    mtime_ns: int | None = field(default=None, compare=False)  # its age for selection, not its identity
    finding: str = ""


def quarantined_by_id(
    found: Iterable[QuarantinedObject], quarantine_id: str, missing: Callable[[], Exception]
) -> QuarantinedObject:
    """The first of ``found`` with this id (both backends' ``admin quarantine-inspect``); raises ``missing()`` if none."""
    for obj in found:
        if obj.quarantine_id == quarantine_id:
            return obj
    raise missing()


@dataclass
class RecoveryReport:
    """What one recovery pass did, as the sweeper, the promoter and ``steadq recover`` report it.

    The counts both backends keep; each backend's report adds its own and
    names, in ``CHANGED``, the counts that are objects moved, created,
    deleted or rewritten. ``errors`` holds ``(code, message)`` pairs: problems
    are reported, never raised, and any of them makes ``recover`` exit 6.
    """

    CHANGED: ClassVar[tuple[str, ...]] = (
        "leases_reaped",
        "leases_to_dead",
        "delayed_promoted",
        "temp_files_deleted",
        "receipts_compacted",
        "receipts_deleted",
        "dead_deleted",
        "quarantined",
        "directories_removed",
    )

    leases_reaped: int = 0
    leases_to_dead: int = 0
    # Hex ids of the jobs counted in the two above: the sweeper names each, so a job's story is complete.
    reaped_jobs: list[str] = field(default_factory=list)
    delayed_promoted: int = 0
    temp_files_deleted: int = 0
    receipts_compacted: int = 0
    receipts_deleted: int = 0
    dead_deleted: int = 0
    quarantined: int = 0
    directories_removed: int = 0
    operations_attempted: int = 0
    budget_exhausted: bool = False  # the pass stopped at its budget: more work is waiting
    errors: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def changed(self) -> int:
        """Objects moved, created, deleted or rewritten by this pass."""
        return sum(getattr(self, name) for name in self.CHANGED)
