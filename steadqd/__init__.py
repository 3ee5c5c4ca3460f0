"""steadqd: a SteadQ/1 broker-less filesystem job queue.

from steadqd import Queue
with Queue.open("/var/lib/steadq/render") as q:
    q.enqueue(b"frame 42", content_type="text/plain")
    lease = q.lease(wait=5)
    if lease:
        do_work(lease.payload())
        q.ack(lease)
"""

from steadqd.backoff import RetryPolicy
from steadqd.constants import AckResult, DeadReason, QuarantineReason, State
from steadqd.errors import (
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
from steadqd.fs.handle import JobInfo, Queue
from steadqd.fs.lease import Lease

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
