"""Unique jobs on a filesystem queue: at most one job per key anywhere in the queue.

A unique job's id is derived from the queue id and the key
(steadqd.queue_control.unique_job_id). A job keeps its id through every
state, but its *name* changes with each transition (attempt, generation,
bucket), so no single no-replace create decides; instead the producer
looks for an object of that id in every state (ready and leased in place,
legacy leased, delayed, dead, receipts full or compacted:
steadqd.fs.views.inspect_job) and publishes only if it finds none, holding
``control/unique.lock`` (flock) over both steps so that producers of this
host never both find it absent.

A job moving *backwards* in the scan's order while it lists (a promotion
delayed -> ready, a requeue dead -> ready) could slip past one look, so the
look is made twice: to be missed it would have to move back, forward and
back again within two listings. Once its receipt or dead letter is gone
(retention), the key is free again and the same id is drawn anew.

What this does not cover: producers on two hosts of a network filesystem
(flock does not serialise them; SteadQ/1 queues are local only), and a
producer that publishes a job under the derived id by hand without the lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from steadqd.errors import DuplicateJob
from steadqd.fs.context import Context
from steadqd.fs.control import unique_lock
from steadqd.fs.views import inspect_job
from steadqd.queue_control import unique_job_id
from steadqd.text import printable

__all__ = ["publish_unique"]

T = TypeVar("T")


def existing_state(ctx: Context, job_id: str) -> str | None:
    """The state of an object of ``job_id`` anywhere in the queue (looked for twice), or None."""
    for _ in range(2):
        found = inspect_job(ctx, job_id)
        if found:
            return found[0].state
    return None


def publish_unique(ctx: Context, key: str, publish: Callable[[str], T]) -> T:
    """``publish(job_id)`` for the key's job unless it is already in the queue (DuplicateJob naming it)."""
    job_id = unique_job_id(ctx.queue_id.hex(), key)
    with unique_lock(ctx):
        state = existing_state(ctx, job_id)
        if state is not None:
            raise DuplicateJob(
                f"a job with unique key {printable(key)!r} is already in the queue: job {job_id} ({state}); "
                "nothing was enqueued",
                job_id,
            )
        return publish(job_id)
