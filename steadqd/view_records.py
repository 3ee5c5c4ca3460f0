"""The records ``steadq stats``, ``ls`` and ``show`` print, whichever backend read the queue.

Why one home: the command formats every view from these attributes
(docs/cli.md), so a bucket's view and a filesystem's must be the same
shape; defining them once keeps a field added for one backend from
silently missing in the other. Where a field means nothing to a backend,
that backend leaves it None and says so in its own module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from steadqd.constants import NS_PER_SECOND

__all__ = ["CLASSIFIED_STATES", "JobEntry", "JobFile", "JobStory", "StateStats", "StateTally"]

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
