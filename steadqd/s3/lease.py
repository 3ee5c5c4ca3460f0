"""Renew: the holder extends its lease by creating the next generation as a continuation (records.md).

Why a new link rather than an update: nothing is overwritten, and a renewal
shares its linearization point with a takeover (both create generation
``g+1``), so a sweeper's takeover racing a renewal is decided by the store
and the loser learns at once. The continuation proves custody with the same
worker id and the predecessor's secret token; it spends no attempt. A
renewal of a settled job is refused: a chain must not grow past its
receipt or dead record.
"""

from __future__ import annotations

from steadqd.errors import LeaseLost
from steadqd.s3 import keys
from steadqd.s3.chain import renewal
from steadqd.s3.claim import Lease, commit_claim
from steadqd.s3.layout import QueueLayout
from steadqd.s3.records import ClaimRecord

__all__ = ["renew"]


def renew(layout: QueueLayout, lease: Lease, *, floor_ns: int, lease_duration_ns: int | None = None) -> Lease:
    """The lease at the next generation; LeaseLost when the job settled or another generation is there."""
    shard, job_id = lease.shard, lease.job_id_bytes
    if layout.exists(keys.receipt_key(shard, job_id)) or layout.exists(keys.dead_key(shard, job_id)):
        raise LeaseLost(
            f"job {lease.job_id} in {layout.location} is settled: generation {lease.generation} cannot be renewed"
        )
    plan = renewal(lease.generation, lease.attempt)
    record = ClaimRecord(
        job_id=job_id,
        generation=plan.generation,
        attempt=plan.attempt,
        worker_id=lease.worker_id,
        worker_token=lease.worker_token,
        lease_duration_ns=lease.lease_duration_ns if lease_duration_ns is None else lease_duration_ns,
        continuation=True,
        prev_token=lease.worker_token,
    )
    renewed = commit_claim(layout, shard, record, lease.job, floor_ns, lease.job_store_time_ns)
    if renewed is None:
        raise LeaseLost(
            f"job {lease.job_id} in {layout.location}: generation {plan.generation} was created by another worker; "
            f"the lease at generation {lease.generation} is lost, stop working on it"
        )
    return renewed
