"""Claim: taking a job by creating the next link of its claim chain (records.md, Claim; time.md, Expiry).

Why a chain of creates: the store lets exactly one writer create
``claims/<shard>/<job-id>/<g>``, so of all workers racing for a job exactly
one holds generation ``g``, and ``g`` is the fencing token every later
write of the holder is checked against. A claim is written only when the
job is ready by the claimant's floor (a proven lower bound on store time):
no receipt or dead record; the tail claim, if any, expired
(``floor ≥ tail time + lease + skew guard``); the tail's nack deadline and
the job's ``not_before`` passed; attempts left. A takeover carries its
basis (the tail's store time and lease, the floor it saw), which is what
makes it admissible to an auditor. As in the reference, a nacked tail is
taken over only once its lease has also expired, so the basis proves an
expiry.

The lease expires at the claim object's own store time plus its duration,
read back after the create; the ``leases/`` entry is advisory.
"""

from __future__ import annotations

import enum
import os
from typing import cast

from steadqd.constants import DeadReason
from steadqd.errors import CorruptRecord, InvalidKey
from steadqd.s3 import keys
from steadqd.s3.chain import AttemptsExhausted, next_claim
from steadqd.s3.keys import KeyKind, TermKind
from steadqd.s3.layout import Oversized, QueueLayout
from steadqd.s3.lease import Lease, commit_claim
from steadqd.s3.quarantine import flag
from steadqd.s3.records import (
    TOKEN_BYTES,
    ClaimBasis,
    ClaimRecord,
    DeadRecord,
    FailRecord,
    JobRecord,
    QuarantineReason,
    Record,
)
from steadqd.s3.resolve import Won, best_effort, create
from steadqd.s3.store.base import ObjectMeta
from steadqd.s3.timemath import is_expired, takeover_admissible
from steadqd.s3.verify import read_record, verify_payload

__all__ = [
    "chain_tail",
    "claim_job",
    "read_checked",
    "settle_dead",
    "Unusable",
    "write_termidx",
]


class Miss(enum.Enum):
    """Why a claim was not written."""

    TERMINAL = "terminal"  # a receipt or dead record is there (monotone: a scan may skip the job from now on)
    NOT_READY = "not-ready"  # leased, delayed, backing off, or settled just now as attempts_exhausted
    LOST = "lost"  # another worker created the generation first
    # An object of the job is corrupt (quarantined) or was collected meanwhile, or the key is under a
    # shard the id does not map to (no key of the job: keys.in_own_shard; the repair scan names it).
    UNUSABLE = "unusable"


class _Unusable(Exception):
    """An object the claim path must not act on: it was quarantined (or could not be read as a key)."""


# The sweeps meet the same objects through read_checked and chain_tail, and act on this too.
Unusable = _Unusable


def read_checked(layout: QueueLayout, rel: str, job_id: bytes) -> tuple[Record, ObjectMeta] | None:
    """The record at ``rel`` (None if absent); a corrupt one is quarantined and raises _Unusable."""
    try:
        found = layout.get(rel)
    except Oversized as exc:
        flag(layout, rel, exc.reason, exc.meta.store_time_ns, job_id=job_id, why=str(exc))
        raise _Unusable(rel) from exc
    if found is None:
        return None
    data, meta = found
    try:
        record = read_record(data, layout.queue_id, rel, required_feature_bits=layout.format.required_feature_bits)
    except CorruptRecord as exc:
        flag(layout, rel, exc.reason, meta.store_time_ns, job_id=job_id, why=str(exc))
        raise _Unusable(rel) from exc
    return record, meta


def chain_tail(layout: QueueLayout, shard: int, job_id: bytes) -> tuple[int, ObjectMeta | None]:
    """The tail generation of the job's claim chain and its listing entry ((0, None) when empty)."""
    prefix = keys.chain_prefix(KeyKind.CLAIM, shard, job_id)
    last: ObjectMeta | None = None
    after: str | None = None
    while True:
        page = layout.list_page(prefix, start_after=after)
        if page.items:
            last = page.items[-1]
        if page.next_start_after is None:
            break
        after = layout.relative(page.next_start_after)
    if last is None:
        return 0, None
    rel = layout.relative(last.key)
    try:
        return keys.chain_tail([rel]), last
    except (InvalidKey, ValueError) as exc:
        flag(layout, rel, QuarantineReason.ENVELOPE_CORRUPT, last.store_time_ns, job_id=job_id, why=str(exc))
        raise _Unusable(rel) from exc


def write_termidx(layout: QueueLayout, term: TermKind, shard: int, job_id: bytes, floor_ns: int) -> None:
    best_effort(layout, keys.termidx_key_for(floor_ns, layout.format.terminal_bucket_width_ns, term, shard, job_id))


def settle_dead(
    layout: QueueLayout, shard: int, job_id: bytes, generation: int, attempt: int, reason: int, floor_ns: int
) -> DeadRecord | None:
    """Create the dead record; returns the other writer's dead record when one was first (None when ours)."""
    record = DeadRecord(job_id=job_id, generation=generation, attempt=attempt, reason=reason)
    created = create(layout, keys.dead_key(shard, job_id), record)
    if created.won is Won.OURS:
        write_termidx(layout, TermKind.DEAD, shard, job_id, floor_ns)
        return None
    return cast(DeadRecord, created.existing)


def _terminal(layout: QueueLayout, shard: int, job_id: bytes) -> bool:
    return layout.exists(keys.receipt_key(shard, job_id)) or layout.exists(keys.dead_key(shard, job_id))


def claim_job(
    layout: QueueLayout,
    shard: int,
    job_id: bytes,
    *,
    floor_ns: int,
    lease_duration_ns: int,
) -> Lease | Miss:
    """Claim the job if it is ready by ``floor_ns``; otherwise say why not."""
    if not keys.in_own_shard(layout.queue_id, layout.format.shard_count, shard, job_id):
        return Miss.UNUSABLE
    try:
        return _claim(layout, shard, job_id, floor_ns, lease_duration_ns)
    except _Unusable:
        return Miss.UNUSABLE


def _tail_claim(layout: QueueLayout, shard: int, job_id: bytes, tail: int) -> ClaimRecord:
    found = read_checked(layout, keys.claim_key(shard, job_id, tail), job_id)
    if found is None:  # listed a moment ago: only GC of a finished graph deletes claims
        raise _Unusable(keys.claim_key(shard, job_id, tail))
    return cast(ClaimRecord, found[0])


def _claim(layout: QueueLayout, shard: int, job_id: bytes, floor_ns: int, lease_ns: int) -> Lease | Miss:
    if _terminal(layout, shard, job_id):
        return Miss.TERMINAL
    tail, tail_meta = chain_tail(layout, shard, job_id)
    tail_attempt, tail_duration, tail_time = 0, 0, 0
    if tail:
        assert tail_meta is not None
        tail_record = _tail_claim(layout, shard, job_id, tail)
        tail_attempt, tail_duration = tail_record.attempt, tail_record.lease_duration_ns
        tail_time = layout.store_time(layout.relative(tail_meta.key), tail_meta)
        # Expiry first: a nacked tail must have expired too, and a held job then costs one GET less.
        if not is_expired(floor_ns, tail_time, tail_duration, layout.skew_guard_ns):
            return Miss.NOT_READY
        fail = read_checked(layout, keys.fail_key(shard, job_id, tail), job_id)
        if fail is not None and floor_ns < cast(FailRecord, fail[0]).retry_not_before_ns:
            return Miss.NOT_READY
    found = read_checked(layout, keys.job_key(shard, job_id), job_id)
    if found is None:
        return Miss.UNUSABLE  # collected after it settled, between the listing and now
    job = cast(JobRecord, found[0])
    if job.not_before_ns is not None and floor_ns < job.not_before_ns:
        return Miss.NOT_READY
    if job.payload_inline is not None:
        try:
            verify_payload(job, job.payload_inline)
        except CorruptRecord as exc:
            flag(layout, keys.job_key(shard, job_id), exc.reason, found[1].store_time_ns, job_id=job_id, why=str(exc))
            return Miss.UNUSABLE
    plan = next_claim(job.maximum_attempts, tail, tail_attempt)
    if isinstance(plan, AttemptsExhausted):
        settle_dead(layout, shard, job_id, plan.generation, plan.attempt, DeadReason.ATTEMPTS_EXHAUSTED, floor_ns)
        return Miss.TERMINAL
    basis = ClaimBasis(prev_store_time_ns=tail_time, prev_duration_ns=tail_duration, observed_watermark_ns=floor_ns)
    if not takeover_admissible(
        tail_time,
        tail_duration,
        floor_ns,
        predecessor_store_time_ns=tail_time,
        predecessor_lease_duration_ns=tail_duration,
    ):
        return Miss.NOT_READY  # cannot happen after the expiry test above; a claim is never written without its proof
    record = ClaimRecord(
        job_id=job_id,
        generation=plan.generation,
        attempt=plan.attempt,
        worker_id=layout.worker_id,
        worker_token=os.urandom(TOKEN_BYTES),
        lease_duration_ns=lease_ns,
        continuation=False,
        basis=basis,
    )
    lease = commit_claim(layout, shard, record, job, floor_ns, found[1].store_time_ns)
    return Miss.LOST if lease is None else lease
