"""The gates every StowQ/1 protocol test checks, read from the bucket's objects alone (no handle's word for it).

* every claim chain is dense from generation 1, each takeover's basis names
  its predecessor exactly and proves its expiry, each continuation carries
  its predecessor's worker and token: so no two admissible claims were ever
  current at once;
* at most one terminal record per job, and it was written by the chain's
  tail generation (no stale generation settled over a later one);
* nothing committed is lost: ``drain`` runs until every job has its receipt
  or dead record.
"""

from __future__ import annotations

from collections.abc import Callable

from steadqd.s3 import keys
from steadqd.s3.handle import BucketQueue
from steadqd.s3.keys import KeyKind
from steadqd.s3.records import ClaimRecord, DeadRecord, JobRecord, ReceiptRecord
from steadqd.s3.recovery.repair import REPAIR_CURSOR_KEY
from steadqd.s3.store.memory import ManualClock, MemoryStore
from steadqd.s3.timemath import saturating_add
from steadqd.s3.verify import read_record

__all__ = ["audit", "drain", "job_ids"]


def _records(memory: MemoryStore, prefix: str, queue_id: bytes, bits: int) -> dict[str, tuple[object, int]]:
    out: dict[str, tuple[object, int]] = {}
    for key in memory.keys(prefix):
        rel = key[len(prefix) :]
        if rel == REPAIR_CURSOR_KEY:
            continue  # steadqd's own object, outside keys.abnf (steadqd/s3/recovery/repair.py)
        kind = keys.parse_key(rel).kind
        if kind in (KeyKind.JOB, KeyKind.CLAIM, KeyKind.RECEIPT, KeyKind.DEAD, KeyKind.FAIL):
            body = memory.get(key)
            out[rel] = (read_record(body.body, queue_id, rel, required_feature_bits=bits), body.meta.store_time_ns)
    return out


def job_ids(memory: MemoryStore, prefix: str) -> set[bytes]:
    found = set()
    for key in memory.keys(prefix + "jobs/"):
        job_id = keys.parse_key(key[len(prefix) :]).job_id
        assert job_id is not None
        found.add(job_id)
    return found


def audit(q: BucketQueue, memory: MemoryStore, *, collecting: bool = False) -> dict[bytes, str]:
    """Check the gates on every job; returns each job's state: "receipt", "dead" or "open".

    ``collecting``: GC passes may have been cut short. gc.delete_job_graph deletes a settled job's
    claims from the top before its job record and its terminal record, so such a job's chain may be
    a prefix of the settled generation (still settled: the tombstone goes last).
    """
    layout = q.layout
    prefix = layout.prefix
    records = _records(memory, prefix, layout.queue_id, layout.format.required_feature_bits)
    states: dict[bytes, str] = {}
    for job_id in job_ids(memory, prefix):
        shard = keys.shard_of(layout.queue_id, job_id, layout.format.shard_count)
        job = records[keys.job_key(shard, job_id)][0]
        assert isinstance(job, JobRecord)
        chain: list[tuple[ClaimRecord, int]] = []
        g = 1
        while (found := records.get(keys.claim_key(shard, job_id, g))) is not None:
            claim = found[0]
            assert isinstance(claim, ClaimRecord) and claim.generation == g
            chain.append((claim, found[1]))
            g += 1
        claims_listed = sum(1 for k in memory.keys(prefix + keys.chain_prefix(KeyKind.CLAIM, shard, job_id)))
        assert claims_listed == len(chain), f"claim chain of {job_id.hex()} has a gap"
        for i, (claim, store_time) in enumerate(chain):
            if claim.continuation:
                prev, _ = chain[i - 1]
                assert i > 0 and claim.worker_id == prev.worker_id and claim.prev_token == prev.worker_token
                assert claim.attempt == prev.attempt
                continue
            basis = claim.basis
            assert basis is not None
            prev_time, prev_lease = (0, 0) if i == 0 else (chain[i - 1][1], chain[i - 1][0].lease_duration_ns)
            assert (basis.prev_store_time_ns, basis.prev_duration_ns) == (prev_time, prev_lease), (
                "basis names another claim"
            )
            assert saturating_add(prev_time, prev_lease) <= basis.observed_watermark_ns <= store_time, (
                f"generation {claim.generation} of {job_id.hex()} was written over a live lease"
            )
            assert claim.attempt == (chain[i - 1][0].attempt + 1 if i else 1)
            assert claim.attempt <= job.maximum_attempts
        receipt = records.get(keys.receipt_key(shard, job_id))
        dead = records.get(keys.dead_key(shard, job_id))
        assert receipt is None or dead is None, f"job {job_id.hex()} has a receipt and a dead record"
        tail = len(chain)
        terminal = receipt or dead
        if terminal is not None:
            record = terminal[0]
            assert isinstance(record, ReceiptRecord | DeadRecord)
            settled = record.generation >= tail if collecting else record.generation == tail
            assert settled, f"generation {record.generation} settled, but {tail} is the tail"
            if isinstance(record, ReceiptRecord):
                assert record.payload_digest == job.payload_digest
        states[job_id] = "receipt" if receipt else "dead" if dead else "open"
    return states


def drain(
    q: BucketQueue, clock: ManualClock, *, step_ns: int, rounds: int = 50, act: Callable[..., object] | None = None
) -> None:
    """Run a clean worker until every job is settled, moving store time on when nothing is ready."""
    for _ in range(rounds):
        lease = q.lease(duration=step_ns / 1e9)
        if lease is None:
            if _all_settled(q):
                return
            clock.advance(step_ns * 3)
            continue
        (act or q.ack)(lease)
    raise AssertionError("the queue did not drain: a committed job is stuck")


def _all_settled(q: BucketQueue) -> bool:
    layout = q.layout
    memory = layout.store
    inner = getattr(memory, "inner", memory)
    assert isinstance(inner, MemoryStore)
    for job_id in job_ids(inner, layout.prefix):
        shard = keys.shard_of(layout.queue_id, job_id, layout.format.shard_count)
        if not (layout.exists(keys.receipt_key(shard, job_id)) or layout.exists(keys.dead_key(shard, job_id))):
            return False
    return True
