"""steadqd: a SteadQ/1 broker-less filesystem job queue.

    from steadqd import Queue
    with Queue.open("/var/lib/steadq/render") as q:
        q.enqueue(b"frame 42", content_type="text/plain")
        lease = q.lease(wait=5)
        if lease:
            do_work(lease.payload())
            q.ack(lease)
"""

from .backoff import RetryPolicy
from .constants import DeadReason, QuarantineReason, State
from .errors import (
    AlreadyExists,
    ConfigError,
    CorruptObject,
    EnqueueIncomplete,
    ErrorKind,
    InvalidInput,
    LeaseLost,
    MaintenanceBusy,
    NotCommitted,
    OutcomeUnknown,
    QueueCorrupt,
    QueuePoisoned,
    SteadQError,
    UnsupportedFilesystem,
    UnsupportedFormat,
)
from .lease import Lease
from .queue import JobInfo, Queue
from .settle import AckResult

__all__ = [
    "AckResult",
    "AlreadyExists",
    "ConfigError",
    "CorruptObject",
    "DeadReason",
    "EnqueueIncomplete",
    "ErrorKind",
    "InvalidInput",
    "JobInfo",
    "Lease",
    "LeaseLost",
    "MaintenanceBusy",
    "NotCommitted",
    "OutcomeUnknown",
    "Queue",
    "QuarantineReason",
    "QueueCorrupt",
    "QueuePoisoned",
    "RetryPolicy",
    "State",
    "SteadQError",
    "UnsupportedFilesystem",
    "UnsupportedFormat",
]
