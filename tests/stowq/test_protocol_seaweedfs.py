"""The StowQ/1 lifecycle live against a real SeaweedFS: a few jobs, every transition once.

Slower than the memory tests (SeaweedFS keeps whole seconds, so a lease is
at least 2 s and a takeover waits for one to expire): keep it to a few jobs.
"""

from __future__ import annotations

import time

import pytest

from steadqd.constants import AckResult, DeadReason
from steadqd.errors import LeaseLost
from steadqd.s3 import keys
from steadqd.s3.handle import BucketQueue
from steadqd.s3.layout import DEFAULT_FORMAT
from steadqd.s3.records import ClaimRecord, DeadRecord, ReceiptRecord
from steadqd.s3.verify import read_record
from tests.stowq.conftest import LIVE_BUCKET
from tests.stowq.seaweed import Seaweed

LEASE_S = 2


def test_the_lifecycle_on_seaweedfs(seaweed: Seaweed, live_prefix: str) -> None:
    store = seaweed.store(LIVE_BUCKET)
    try:
        q = BucketQueue.init(store, live_prefix, worker_id="w1")  # certifies the engine first
        other = BucketQueue.open(store, live_prefix, worker_id="w2", certify_store=False)
        small = q.enqueue(b"small", job_id=bytes(range(16)).hex())
        assert q.enqueue(b"small", job_id=small) == small  # idempotent
        big = b"B" * (DEFAULT_FORMAT.inline_limit + 1)
        q.enqueue(big)
        q.enqueue(b"third")

        def record(rel: str) -> object:
            body = store.get(live_prefix + rel).body
            return read_record(body, q.layout.queue_id, rel, required_feature_bits=DEFAULT_FORMAT.required_feature_bits)

        payloads = []
        first = q.lease(duration=LEASE_S)
        assert first is not None
        payloads.append(q.read_payload(first))
        renewed = q.renew(first, duration=LEASE_S)
        assert (renewed.generation, renewed.attempt) == (2, 1)
        assert q.ack(renewed) is AckResult.ACKED
        assert q.ack(renewed) is AckResult.ALREADY_ACKED
        receipt = record(keys.receipt_key(renewed.shard, renewed.job_id_bytes))
        assert isinstance(receipt, ReceiptRecord) and receipt.generation == 2

        second = q.lease(duration=LEASE_S)
        assert second is not None
        payloads.append(q.read_payload(second))
        q.bury(second)
        dead = record(keys.dead_key(second.shard, second.job_id_bytes))
        assert isinstance(dead, DeadRecord) and dead.reason == DeadReason.CONSUMER_REJECTED

        third = q.lease(duration=LEASE_S)
        assert third is not None
        payloads.append(q.read_payload(third))
        assert other.lease(duration=LEASE_S) is None  # held
        deadline = time.monotonic() + 10
        taken = None
        while taken is None and time.monotonic() < deadline:
            time.sleep(0.5)
            taken = other.lease(duration=LEASE_S)
        assert taken is not None and taken.job_id == third.job_id and taken.generation == 2
        claim = record(keys.claim_key(taken.shard, taken.job_id_bytes, 2))
        assert isinstance(claim, ClaimRecord) and claim.basis is not None
        assert claim.basis.prev_store_time_ns == third.claim_store_time_ns
        with pytest.raises(LeaseLost):
            q.ack(third)  # taken over: generation 1 may not settle
        assert other.ack(taken) is AckResult.ACKED
        assert sorted(payloads) == sorted([b"small", b"third", big])
        assert q.lease(duration=LEASE_S) is None
        listed = [m.key[len(live_prefix) :] for m in store.list_page(live_prefix + "receipts/").items]
        assert len(listed) == 2 and len(store.list_page(live_prefix + "dead/").items) == 1
    finally:
        store.close()
