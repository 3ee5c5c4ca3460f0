"""steadqd: a SteadQ/1 broker-less filesystem job queue.

from steadqd import Queue
with Queue.open("/var/lib/steadq/render") as q:
    q.enqueue(b"frame 42", content_type="text/plain")
    lease = q.lease(wait=5)
    if lease:
        do_work(lease.payload())
        q.ack(lease)

or let the worker API lease, renew and settle (steadqd.tasks):

@steadqd.task("/var/lib/steadq/render")
def render(frame: int) -> None: ...
render.enqueue(42)           # a producer
render.work(concurrency=4)   # a consumer, until SIGTERM
"""

from typing import TYPE_CHECKING

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
    "Bury",
    "Job",
    "Retry",
    "Task",
    "Worker",
    "WorkStats",
    "task",
    "work",
    "work_async",
]

# The worker API (steadqd.tasks) is loaded on first use: it needs asyncio, and
# the CLI and the daemons, which import this package on every start, do not.
# Type checkers see the real names.
if TYPE_CHECKING:
    from steadqd.tasks import Bury, Job, Retry, Task, Worker, WorkStats, task, work, work_async
_TASKS_API = frozenset({"Bury", "Job", "Retry", "Task", "Worker", "WorkStats", "task", "work", "work_async"})


def __getattr__(name: str) -> object:
    if name in _TASKS_API:
        from steadqd import tasks

        return getattr(tasks, name)
    raise AttributeError(f"module 'steadqd' has no attribute {name!r}")
