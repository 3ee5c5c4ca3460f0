"""Ack, retry (nack) and bury: the holder's last word on a claim (records.md, Acknowledgment; Renewal, retry, bury).

Why each is a create that may find a record already there: the first
receipt or dead record wins, and a later ack (a retry after a lost answer,
or a zombie) checks the existing record's evidence instead of writing, so
an ack is idempotent and never destructive. Before writing, the holder
checks that its generation is still the tail (the next generation would
exist otherwise: generations are dense), so a stale generation does not
settle over a later one; the payload is re-verified before a receipt, so a
receipt proves the job ran on the bytes that were enqueued.

A job has at most one terminal record: ack refuses when a dead record is
there, bury when a receipt is.
"""

from __future__ import annotations

from typing import cast

from steadqd.backoff import RetryPolicy
from steadqd.constants import AckResult, DeadReason
from steadqd.errors import CorruptRecord, InvalidInput, LeaseLost, NotFound
from steadqd.s3 import keys
from steadqd.s3.claim import settle_dead, write_termidx
from steadqd.s3.keys import TermKind
from steadqd.s3.layout import QueueLayout
from steadqd.s3.lease import Lease, superseded
from steadqd.s3.quarantine import flag
from steadqd.s3.records import FailRecord, JobRecord, QuarantineReason, ReceiptRecord, payload_digest
from steadqd.s3.resolve import Won, best_effort, create
from steadqd.s3.retry import nack_deadline
from steadqd.s3.timemath import bucket_number, retry_not_before
from steadqd.s3.verify import verify_payload

__all__ = ["ack", "bury", "read_payload", "retry"]


def read_payload(layout: QueueLayout, job: JobRecord, job_time: int = 0) -> bytes:
    """The job's payload, verified against its digest; a corrupt or missing one is quarantined, never returned."""
    try:
        return verify_payload(job, _payload_body(layout, job, job_time))
    except CorruptRecord as exc:
        source = job.payload_key or keys.job_key(
            keys.shard_of(layout.queue_id, job.job_id, layout.format.shard_count), job.job_id
        )
        flag(layout, source, exc.reason, job_time, job_id=job.job_id, why=str(exc))
        raise


def _payload_body(layout: QueueLayout, job: JobRecord, job_time: int) -> bytes:
    """The payload's bytes, no more than the job says it has plus one (a longer object is Oversized)."""
    if job.payload_inline is not None:
        return job.payload_inline
    assert job.payload_key is not None
    found = layout.get(job.payload_key, limit=job.payload_length, payload=True)
    if found is None:
        shard = keys.shard_of(layout.queue_id, job.job_id, layout.format.shard_count)
        flag(
            layout,
            job.payload_key,
            QuarantineReason.ORPHAN_REFERENCED_PAYLOAD_MISSING,
            job_time,
            job_id=job.job_id,
            why="payload absent",
        )
        raise NotFound(
            f"the payload of job {job.job_id.hex()} is missing at {layout.key(job.payload_key)} "
            f"(job record {keys.job_key(shard, job.job_id)}); bury the job"
        )
    return found[0]


def _fence(layout: QueueLayout, lease: Lease, what: str) -> None:
    if superseded(layout, lease.shard, lease.job_id_bytes, lease.generation):
        raise LeaseLost(
            f"job {lease.job_id} in {layout.location}: generation {lease.generation + 1} exists, so generation "
            f"{lease.generation} may not {what} (its lease expired and another worker took the job)"
        )


def ack(layout: QueueLayout, lease: Lease, *, floor_ns: int) -> AckResult:
    """Write the receipt; returns AckResult.ACKED, or ALREADY_ACKED when our receipt was already there."""
    shard, job_id = lease.shard, lease.job_id_bytes
    if layout.exists(keys.dead_key(shard, job_id)):
        raise LeaseLost(f"job {lease.job_id} in {layout.location} was buried: it cannot be acked")
    _fence(layout, lease, "ack")
    payload = read_payload(layout, lease.job, lease.job_store_time_ns)
    record = ReceiptRecord(
        job_id=job_id,
        generation=lease.generation,
        attempt=lease.attempt,
        worker_id=lease.worker_id,
        worker_token=lease.worker_token,
        payload_digest=payload_digest(payload),
    )
    created = create(layout, keys.receipt_key(shard, job_id), record)
    if created.won is Won.OURS and not created.already:
        write_termidx(layout, TermKind.RECEIPT, shard, job_id, floor_ns)
        return AckResult.ACKED
    existing = cast(ReceiptRecord, created.existing)
    if (existing.generation, existing.attempt) != (lease.generation, lease.attempt):
        raise LeaseLost(
            f"job {lease.job_id} in {layout.location} was acked by generation {existing.generation}, "
            f"not by this lease's {lease.generation}"
        )
    if existing.payload_digest != record.payload_digest or existing.output_digests != record.output_digests:
        meta = created.existing_meta
        flag(
            layout,
            keys.receipt_key(shard, job_id),
            QuarantineReason.RECEIPT_EVIDENCE_MISMATCH,
            0 if meta is None else meta.store_time_ns,
            job_id=job_id,
            why="a receipt of the same generation names another payload or outputs",
        )
        raise CorruptRecord(
            f"job {lease.job_id}: the receipt of generation {lease.generation} names other evidence than this ack",
            QuarantineReason.RECEIPT_EVIDENCE_MISMATCH,
            error_class="receipt_evidence",
        )
    return AckResult.ALREADY_ACKED


def retry(
    layout: QueueLayout,
    lease: Lease,
    *,
    floor_ns: int,
    delay_ns: int | None = None,
    policy: RetryPolicy | None = None,
    reason: int = 1,
) -> str:
    """Nack: the fail record with its retry deadline; "dead" instead when no attempt is left, else "delayed".

    The deadline is the floor plus ``delay_ns``, or plus the policy's delay
    for this attempt (its jitter is a hash, so every worker computes the
    same), or the floor itself when neither is given."""
    if delay_ns is not None and policy is not None:
        raise InvalidInput("give either a delay or a retry policy, not both")
    shard, job_id = lease.shard, lease.job_id_bytes
    if layout.exists(keys.receipt_key(shard, job_id)) or layout.exists(keys.dead_key(shard, job_id)):
        raise LeaseLost(f"job {lease.job_id} in {layout.location} is settled: it cannot be retried")
    if lease.attempt >= lease.max_attempts:
        bury(layout, lease, floor_ns=floor_ns, reason=DeadReason.ATTEMPTS_EXHAUSTED)
        return "dead"
    _fence(layout, lease, "retry")
    width = layout.format.delayed_bucket_width_ns
    if policy is not None:
        deadline = nack_deadline(
            policy, layout.queue_id, lease.job_id_bytes, lease.attempt, floor_ns=floor_ns, delayed_width_ns=width
        ).retry_not_before_ns
    else:
        deadline = retry_not_before(floor_ns, delay_ns or 0)
    record = FailRecord(
        job_id=lease.job_id_bytes,
        generation=lease.generation,
        reason=reason,
        attempt=lease.attempt,
        retry_not_before_ns=deadline,
    )
    # A fail record found there is this generation's nack (only its holder writes
    # one), from an earlier try whose answer was lost: as good as ours.
    create(layout, keys.fail_key(lease.shard, lease.job_id_bytes, lease.generation), record)
    best_effort(layout, keys.delay_index_key(bucket_number(deadline, width), lease.shard, lease.job_id_bytes))
    return "delayed"


def bury(layout: QueueLayout, lease: Lease, *, floor_ns: int, reason: int = DeadReason.CONSUMER_REJECTED) -> None:
    """Write the dead record; an existing one of this generation is success, any other is LeaseLost."""
    shard, job_id = lease.shard, lease.job_id_bytes
    if layout.exists(keys.receipt_key(shard, job_id)):
        raise LeaseLost(f"job {lease.job_id} in {layout.location} was acked: it cannot be buried")
    _fence(layout, lease, "bury")
    existing = settle_dead(layout, shard, job_id, lease.generation, lease.attempt, reason, floor_ns)
    if existing is not None and (existing.generation, existing.attempt) != (lease.generation, lease.attempt):
        raise LeaseLost(
            f"job {lease.job_id} in {layout.location} was buried by generation {existing.generation}, "
            f"not by this lease's {lease.generation}"
        )
