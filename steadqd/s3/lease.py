"""A bucket lease: the committed claim link that holds a job, and its renewal (records.md, Claim; time.md, Expiry).

Where a lease is made and renewed: :func:`commit_claim` creates a claim link
and, when it is ours, reads its store time back (the lease expires at that
time plus its duration) and indexes its expiry; ``claim`` decides whether a
job may be claimed and calls it, and :func:`renew` calls it for the next
generation, as ``steadqd.fs.lease`` holds the filesystem's lease.

Renew: the holder extends its lease by creating the next generation as a continuation.
Why a new link rather than an update: nothing is overwritten, and a renewal
shares its linearization point with a takeover (both create generation
``g+1``), so a sweeper's takeover racing a renewal is decided by the store
and the loser learns at once. The continuation proves custody with the same
worker id and the predecessor's secret token; it spends no attempt. A
renewal of a settled job is refused: a chain must not grow past its
receipt or dead record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from steadqd.errors import LeaseLost, NotCommitted, NotFound
from steadqd.s3 import keys
from steadqd.s3.chain import renewal
from steadqd.s3.layout import QueueLayout
from steadqd.s3.records import ClaimRecord, JobRecord
from steadqd.s3.resolve import Won, best_effort, create
from steadqd.s3.timemath import expiry_ns

__all__ = ["Lease", "commit_claim", "renew", "superseded"]


@dataclass(frozen=True)
class Lease:
    """A committed claim: generation ``generation`` of ``job_id`` is ours until ``expires_ns`` (store time)."""

    job_id_bytes: bytes
    shard: int
    generation: int
    attempt: int
    worker_id: str
    worker_token: bytes
    lease_duration_ns: int
    claim_store_time_ns: int
    job: JobRecord = field(repr=False)
    job_store_time_ns: int = 0

    @property
    def job_id(self) -> str:
        return self.job_id_bytes.hex()

    @property
    def max_attempts(self) -> int:
        return self.job.maximum_attempts

    @property
    def content_type(self) -> str:
        return self.job.content_type

    @property
    def payload_length(self) -> int:
        return self.job.payload_length

    @property
    def metadata(self) -> dict[str, bool | int | str | bytes]:
        return {}  # StowQ/1 job records carry no metadata map

    @property
    def producer_id(self) -> str | None:
        return None

    @property
    def expires_ns(self) -> int:
        return expiry_ns(self.claim_store_time_ns, self.lease_duration_ns)


def superseded(layout: QueueLayout, shard: int, job_id: bytes, generation: int) -> bool:
    """Whether generation ``generation`` is no longer the tail: the next one exists (generations are dense)."""
    return layout.exists(keys.claim_key(shard, job_id, generation + 1))


def commit_claim(
    layout: QueueLayout, shard: int, record: ClaimRecord, job: JobRecord, floor_ns: int, job_time: int
) -> Lease | None:
    """Create the claim; if it is ours, read its store time and index its expiry. None if another won.

    A renewal repeated after a lost answer finds its own continuation there
    (same token) and gets it back, unless the chain has grown past it.

    When the store time cannot be read, the floor stands in for it: it is a
    lower bound of the claim's time, so the holder's lease only looks shorter.
    """
    rel = keys.claim_key(shard, record.job_id, record.generation)
    created = create(layout, rel, record)
    if created.won is Won.THEIRS:
        return None
    if created.already and superseded(layout, shard, record.job_id, record.generation):
        return None  # a repeated renewal finds its own link, but the chain has moved past it
    try:
        store_time = layout.store_time(rel)
    except (NotCommitted, NotFound):
        store_time = floor_ns
    best_effort(
        layout,
        keys.lease_index_key_for(
            store_time,
            record.lease_duration_ns,
            layout.format.lease_bucket_width_ns,
            shard,
            record.job_id,
            record.generation,
        ),
    )
    return Lease(
        job_id_bytes=record.job_id,
        shard=shard,
        generation=record.generation,
        attempt=record.attempt,
        worker_id=record.worker_id,
        worker_token=record.worker_token,
        lease_duration_ns=record.lease_duration_ns,
        claim_store_time_ns=store_time,
        job=job,
        job_store_time_ns=job_time,
    )


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
