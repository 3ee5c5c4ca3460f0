"""Enqueue on a bucket queue: the job record is the linearization point (records.md, Job record and enqueue).

Order of writes, each a create: a detached payload first at its
content-addressed key (contention there is benign: same key, same bytes),
then ``jobs/<shard>/<job-id>`` (the job exists from this moment), then, for
a delayed job, its ``delayed/`` index entry. A crash between the steps
leaves an orphan payload or a delayed job without its index entry, both
safe: GC collects the first, the repair scan re-indexes the second.

Idempotent enqueue: a producer that chose its ``job_id`` and did not learn
the outcome sends the same enqueue again; the record is deterministic (no
store time in it), so the create either commits or finds its own bytes. A
different record under the same id is refused, never replaced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from steadqd.constants import ID_BYTES, U64_MAX
from steadqd.errors import AlreadyExists, InvalidInput, NotCommitted
from steadqd.s3 import keys
from steadqd.s3.layout import Oversized, QueueLayout
from steadqd.s3.records import JobRecord, new_job
from steadqd.s3.resolve import WRITE_TRIES, Won, best_effort, create
from steadqd.s3.store.base import sha256_of
from steadqd.s3.timemath import eligibility

__all__ = ["Enqueued", "enqueue"]


@dataclass(frozen=True)
class Enqueued:
    job_id: bytes
    shard: int
    job: JobRecord
    indexed: bool  # False when a delayed job's index entry could not be written (the repair scan finds it)
    already: bool = False  # the same record was at the key before this call (an earlier enqueue of this id)


def _put_payload(layout: QueueLayout, job: JobRecord, payload: bytes) -> None:
    assert job.payload_key is not None
    rel = job.payload_key
    digest = sha256_of(payload)
    # Raw bytes, not a record: content-addressed, so the key's digest is the proof.
    for _ in range(WRITE_TRIES):
        if best_effort(layout, rel, payload):
            return
    try:
        found = layout.get(rel, limit=len(payload), payload=True)
    except Oversized:
        found = None  # longer than ours, so not ours
    if found is None or sha256_of(found[0]) != digest:
        raise NotCommitted(f"the payload of job {job.job_id.hex()} could not be stored at {layout.key(rel)}; try again")


def enqueue(
    layout: QueueLayout,
    payload: bytes,
    *,
    content_type: str = "application/octet-stream",
    maximum_attempts: int = 3,
    job_id: bytes | None = None,
    not_before_ns: int | None = None,
) -> Enqueued:
    """Publish one job; ``not_before_ns`` (store time) is rounded up to its delayed bucket's start."""
    if not 1 <= maximum_attempts <= U64_MAX:
        raise InvalidInput(f"maximum_attempts {maximum_attempts}: give a whole number from 1 to 2^64-1")
    job_id = os.urandom(ID_BYTES) if job_id is None else bytes(job_id)
    if len(job_id) != ID_BYTES:
        raise InvalidInput(f"job_id must be {ID_BYTES} bytes (32 hex digits), got {len(job_id)}")
    due = None
    if not_before_ns is not None:
        due = eligibility(not_before_ns, layout.format.delayed_bucket_width_ns)[1]
    job = new_job(
        job_id,
        bytes(payload),
        content_type=content_type,
        maximum_attempts=maximum_attempts,
        inline_limit=layout.format.inline_limit,
        not_before_ns=due,
    )
    if job.payload_key is not None:
        _put_payload(layout, job, bytes(payload))
    shard = keys.shard_of(layout.queue_id, job_id, layout.format.shard_count)
    created = create(layout, keys.job_key(shard, job_id), job)
    if created.won is Won.THEIRS:
        raise AlreadyExists(
            f"job {job_id.hex()} already exists in {layout.location} with another payload or settings; "
            "a job id is never reused: enqueue with a new id"
        )
    indexed = True
    if due is not None:
        rel = keys.delay_index_key_for(due, layout.format.delayed_bucket_width_ns, shard, job_id)
        indexed = best_effort(layout, rel)
    return Enqueued(job_id, shard, job, indexed, created.already)
