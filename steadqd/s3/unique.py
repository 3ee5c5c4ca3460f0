"""Unique jobs on a bucket queue: the job record's put-if-absent decides which producer made the key's job.

A unique job's id is derived from the queue id and the key
(steadqd.queue_control.unique_job_id), so every producer of a key, on any
host, creates the same ``jobs/<shard>/<id>`` key, and the store's
put-if-absent lets exactly one of them in (records.md: the job record is the
enqueue's linearization point). The record stays while the job is ready,
delayed, claimed or dead, and after its receipt, until retention GC
collects the graph; so "a job with this key is anywhere in the queue" is
"the job record or its terminal record is there".

Why the terminal records are looked at first: GC deletes the job record
just *before* the terminal record (the tombstone, steadqd.s3.recovery.gc).
A create in between would make a job that the old tombstone settles at
once and that becomes deliverable when the tombstone goes. So the
producer first reads ``receipts/`` and ``dead/`` of the id (a tombstone
there: the key's job is within retention, refused), then creates. A
tombstone is only ever written while the job record exists, so one that
appears after the look finds the record there and the create refused.

A producer whose create got no answer and whose retry then found the record
cannot tell its own write from another producer's; it reports the job as
already there (exit 1 with its id): either way exactly one job exists.
"""

from __future__ import annotations

from collections.abc import Callable

from steadqd.errors import AlreadyExists, DuplicateJob
from steadqd.queue_control import unique_job_id
from steadqd.s3 import keys
from steadqd.s3.layout import QueueLayout
from steadqd.s3.publish import Enqueued
from steadqd.text import printable

__all__ = ["enqueue_unique"]


def _refuse(key: str, job_id: str, where: str) -> DuplicateJob:
    return DuplicateJob(
        f"a job with unique key {printable(key)!r} is already in the queue: job {job_id} ({where}); "
        "nothing was enqueued",
        job_id,
    )


def enqueue_unique(layout: QueueLayout, key: str, publish: Callable[[bytes], Enqueued]) -> Enqueued:
    """``publish(job_id)`` for the key's job unless it is already in the queue (DuplicateJob naming it)."""
    job_id = unique_job_id(layout.queue_id.hex(), key)
    raw = bytes.fromhex(job_id)
    shard = keys.shard_of(layout.queue_id, raw, layout.format.shard_count)
    for rel, where in ((keys.receipt_key(shard, raw), "acknowledged"), (keys.dead_key(shard, raw), "dead")):
        if layout.get(rel) is not None:
            raise _refuse(key, job_id, where)
    try:
        done = publish(raw)
    except DuplicateJob:
        raise
    except AlreadyExists:  # the key's record with another payload or settings: still the key's job
        raise _refuse(key, job_id, "in the queue") from None
    if done.already:
        raise _refuse(key, job_id, "in the queue")
    return done
