"""StowQ/1 transitions on the in-memory store: init/open, the floor, enqueue, claim, renew, ack, retry, bury, quarantine."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest

from steadqd.constants import AckResult, DeadReason
from steadqd.errors import (
    AlreadyExists,
    EnqueueIncomplete,
    InvalidInput,
    LeaseLost,
    NotCommitted,
    NotFound,
    OutcomeUnknown,
    QueueCorrupt,
    StoreProfileViolation,
    UnsupportedFormat,
)
from steadqd.s3 import keys
from steadqd.s3.handle import BucketQueue
from steadqd.s3.layout import DEFAULT_FORMAT, open_layout
from steadqd.s3.lease import Lease
from steadqd.s3.records import (
    ClaimRecord,
    DeadRecord,
    FailRecord,
    JobRecord,
    QuarantineReason,
    QuarantineRecord,
    ReceiptRecord,
    WatermarkRecord,
    encode_record,
)
from steadqd.s3.store.base import Committed
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import ManualClock, MemoryStore, WallClock
from steadqd.s3.verify import read_record
from tests.stowq.protocol_audit import audit

SECOND = 1_000_000_000
PREFIX = "farm/"


class _Harness:
    def __init__(self, certify: bool = False) -> None:
        self.clock = ManualClock(step_ns=1000)
        self.memory = MemoryStore(clock=self.clock)
        self.store = FaultyStore(self.memory)
        self.q = BucketQueue.init(self.store, PREFIX, worker_id="w1", certify_store=certify, floor_staleness_s=0)

    def worker(self, name: str) -> BucketQueue:
        return BucketQueue.open(self.store, PREFIX, worker_id=name, certify_store=False, floor_staleness_s=0)

    def record(self, rel: str) -> object:
        body = self.memory.snapshot()[PREFIX + rel]
        return read_record(
            body, self.q.layout.queue_id, rel, required_feature_bits=DEFAULT_FORMAT.required_feature_bits
        )

    def rels(self, plane: str) -> list[str]:
        return [k[len(PREFIX) :] for k in self.memory.keys(PREFIX + plane)]

    def expire(self, lease: Lease) -> None:
        self.clock.advance(lease.lease_duration_ns + SECOND)


@pytest.fixture
def h() -> Iterator[_Harness]:
    yield _Harness()


# -- init and open ----------------------------------------------------------------------


def test_init_certifies_the_store_and_open_reads_the_same_queue() -> None:
    h = _Harness(certify=True)
    again = open_layout(h.store, PREFIX)  # certifies again, then reads meta/FORMAT
    assert again.queue_id == h.q.layout.queue_id and again.format == DEFAULT_FORMAT
    assert h.rels("meta/") == ["meta/FORMAT"]  # the certification cleaned up after itself


class _NoPutIfAbsent(MemoryStore):
    """An engine that ignores If-None-Match: every create overwrites."""

    def put_if_absent(self, key: str, body: bytes, *, sha256: bytes | None = None) -> Committed:
        with self._bucket.lock:
            return self._store(key, bytes(body))


def test_init_and_open_refuse_a_store_that_fails_certification_naming_the_primitive() -> None:
    store = _NoPutIfAbsent()
    with pytest.raises(StoreProfileViolation) as info:
        BucketQueue.init(store, PREFIX)
    assert info.value.primitive.startswith("P1")
    assert not list(store.keys(PREFIX))
    with pytest.raises(StoreProfileViolation, match="P1"):
        BucketQueue.open(store, PREFIX)


def test_init_again_with_the_same_format_is_accepted_and_another_is_refused(h: _Harness) -> None:
    layout = h.q.layout
    BucketQueue.init(h.store, PREFIX, queue_id=layout.queue_id, certify_store=False)
    with pytest.raises(AlreadyExists, match="already holds a queue"):
        BucketQueue.init(h.store, PREFIX, certify_store=False)
    with pytest.raises(AlreadyExists):
        BucketQueue.init(
            h.store, PREFIX, queue_id=layout.queue_id, fmt=replace(DEFAULT_FORMAT, shard_count=4), certify_store=False
        )


def test_open_refuses_a_missing_queue_the_wrong_queue_id_and_unknown_feature_bits(h: _Harness) -> None:
    with pytest.raises(NotFound, match="not a queue"):
        BucketQueue.open(h.store, "elsewhere/", certify_store=False)
    with pytest.raises(QueueCorrupt, match="check the prefix"):
        BucketQueue.open(h.store, PREFIX, queue_id=bytes(16), certify_store=False)
    queue_id = bytes(range(16))
    future = replace(DEFAULT_FORMAT, required_feature_bits=DEFAULT_FORMAT.required_feature_bits | 8)
    body = encode_record(future, queue_id, keys.key_tag(queue_id, keys.FORMAT_KEY))
    h.memory.put_if_absent("future/" + keys.FORMAT_KEY, body)
    with pytest.raises(UnsupportedFormat):
        BucketQueue.open(h.store, "future/", certify_store=False)


def test_open_refuses_garbage_at_meta_format(h: _Harness) -> None:
    h.memory.put_if_absent("junk/meta/FORMAT", b"not a record")
    with pytest.raises(QueueCorrupt, match="not a queue"):
        BucketQueue.open(h.store, "junk/", certify_store=False)


# -- the floor and the watermark ----------------------------------------------------------


def test_the_floor_is_a_beacons_store_time_and_raises_the_watermark(h: _Harness) -> None:
    before = h.clock.peek_ns()
    floor = h.q.wall_floor_ns()
    assert before < floor <= h.clock.peek_ns()
    assert len(h.rels("meta/clock/")) == 1
    mark = h.record(keys.WATERMARK_KEY)
    assert isinstance(mark, WatermarkRecord) and mark.sequence == 0
    assert mark.highest_observed_wall_bucket == floor // DEFAULT_FORMAT.delayed_bucket_width_ns
    h.clock.advance(DEFAULT_FORMAT.delayed_bucket_width_ns)
    later = h.q.wall_floor_ns()
    raised = h.record(keys.WATERMARK_KEY)
    assert isinstance(raised, WatermarkRecord) and raised.sequence == 1
    assert raised.highest_observed_wall_bucket == later // DEFAULT_FORMAT.delayed_bucket_width_ns


def test_a_watermark_ahead_of_store_time_fails_closed_and_is_quarantined(h: _Harness) -> None:
    layout = h.q.layout
    ahead = WatermarkRecord(
        highest_observed_wall_bucket=h.clock.peek_ns() // DEFAULT_FORMAT.delayed_bucket_width_ns + 10, sequence=5
    )
    h.memory.put_if_absent(PREFIX + keys.WATERMARK_KEY, layout.encode(keys.WATERMARK_KEY, ahead))
    with pytest.raises(StoreProfileViolation, match="store time went back") as info:
        h.q.wall_floor_ns()
    assert info.value.primitive.startswith("P6")
    (finding,) = h.rels("quarantine/")
    record = h.record(finding)
    assert isinstance(record, QuarantineRecord) and record.reason == QuarantineReason.STORE_TIME_REGRESSION
    assert record.source_key == keys.WATERMARK_KEY


# -- enqueue --------------------------------------------------------------------------------


def test_enqueue_inline_writes_exactly_the_job_record(h: _Harness) -> None:
    job_id = h.q.enqueue(b"hello", content_type="text/plain", max_attempts=5)
    (rel,) = h.rels("jobs/")
    assert rel == h.q.job_key(job_id)
    job = h.record(rel)
    assert isinstance(job, JobRecord) and job.payload_inline == b"hello" and job.maximum_attempts == 5
    assert job.content_type == "text/plain" and job.payload_key is None


def test_enqueue_detached_writes_the_payload_before_the_job_record(h: _Harness) -> None:
    big = b"x" * (DEFAULT_FORMAT.inline_limit + 1)
    job_id = h.q.enqueue(big)
    writes = [c.key[len(PREFIX) :] for c in h.store.trace if c.op == "put_if_absent" and "/clock/" not in c.key]
    job = h.record(h.q.job_key(job_id))
    assert isinstance(job, JobRecord) and job.payload_inline is None and job.payload_key is not None
    assert writes[-2:] == [job.payload_key, h.q.job_key(job_id)]
    lease = h.q.lease()
    assert lease is not None and h.q.read_payload(lease) == big


def test_enqueue_with_a_chosen_job_id_is_idempotent_and_another_payload_is_refused(h: _Harness) -> None:
    job_id = bytes(range(16)).hex()
    assert h.q.enqueue(b"a", job_id=job_id) == job_id
    assert h.q.enqueue(b"a", job_id=job_id) == job_id
    assert len(h.rels("jobs/")) == 1
    with pytest.raises(AlreadyExists, match="never reused"):
        h.q.enqueue(b"b", job_id=job_id)


def test_enqueue_refuses_what_a_bucket_queue_cannot_store(h: _Harness) -> None:
    with pytest.raises(InvalidInput, match="metadata"):
        h.q.enqueue(b"a", metadata={"k": "v"})
    with pytest.raises(InvalidInput, match="32 hex"):
        h.q.enqueue(b"a", job_id="xyz")
    with pytest.raises(InvalidInput, match="maximum_attempts"):
        h.q.enqueue(b"a", max_attempts=0)
    assert h.rels("jobs/") == []


def test_a_delayed_job_is_indexed_and_not_delivered_before_its_bucket(h: _Harness) -> None:
    job_id = h.q.enqueue(b"later", delay=10)
    job = h.record(h.q.job_key(job_id))
    width = DEFAULT_FORMAT.delayed_bucket_width_ns
    assert isinstance(job, JobRecord) and job.not_before_ns is not None and job.not_before_ns % width == 0
    (entry,) = h.rels("delayed/")
    assert entry.endswith(job_id) and int(entry.split("/")[1], 16) == job.not_before_ns // width
    assert h.q.lease() is None
    h.clock.advance(job.not_before_ns - h.clock.peek_ns())
    lease = h.q.lease()
    assert lease is not None and lease.job_id == job_id


# -- claim, renew, takeover ----------------------------------------------------------------------


def test_lease_writes_generation_one_with_a_basis_and_a_lease_index_entry(h: _Harness) -> None:
    job_id = h.q.enqueue(b"p")
    lease = h.q.lease(duration=30)
    assert lease is not None and (lease.job_id, lease.generation, lease.attempt) == (job_id, 1, 1)
    claim = h.record(keys.claim_key(lease.shard, lease.job_id_bytes, 1))
    assert isinstance(claim, ClaimRecord) and not claim.continuation and claim.basis is not None
    assert claim.worker_id == "w1" and claim.lease_duration_ns == 30 * SECOND
    assert (
        lease.claim_store_time_ns
        == h.memory.head(PREFIX + keys.claim_key(lease.shard, lease.job_id_bytes, 1)).store_time_ns
    )
    (entry,) = h.rels("leases/")
    assert entry.endswith(f"{job_id}.00000001")
    assert h.worker("w2").lease() is None  # held


def test_an_expired_claim_is_taken_over_and_the_old_holder_cannot_settle(h: _Harness) -> None:
    h.q.enqueue(b"p")
    first = h.q.lease(duration=5)
    assert first is not None
    other = h.worker("w2")
    h.clock.advance(5 * SECOND - 10_000)
    assert other.lease() is None  # not yet expired
    h.expire(first)
    second = other.lease(duration=5)
    assert second is not None and (second.generation, second.attempt) == (2, 2)
    claim = h.record(keys.claim_key(second.shard, second.job_id_bytes, 2))
    assert isinstance(claim, ClaimRecord) and claim.basis is not None
    assert claim.basis.prev_store_time_ns == first.claim_store_time_ns and claim.basis.prev_duration_ns == 5 * SECOND
    for settle in (h.q.ack, h.q.bury, h.q.retry, h.q.renew):
        with pytest.raises(LeaseLost):
            settle(first)
    assert other.ack(second) is AckResult.ACKED


def test_renew_writes_a_continuation_that_spends_no_attempt(h: _Harness) -> None:
    h.q.enqueue(b"p")
    lease = h.q.lease(duration=5)
    assert lease is not None
    renewed = h.q.renew(lease, duration=7)
    assert (renewed.generation, renewed.attempt, renewed.lease_duration_ns) == (2, 1, 7 * SECOND)
    claim = h.record(keys.claim_key(lease.shard, lease.job_id_bytes, 2))
    assert isinstance(claim, ClaimRecord) and claim.continuation and claim.prev_token == lease.worker_token
    assert claim.basis is None
    again = h.q.renew(lease, duration=7)  # a repeated renewal (its answer was lost) finds its own link
    assert again.generation == 2 and again.claim_store_time_ns == renewed.claim_store_time_ns
    renewed = h.q.renew(renewed, duration=7)
    with pytest.raises(LeaseLost):
        h.q.renew(lease)  # generation 3 is there: generation 1 is long gone
    assert h.q.ack(renewed) is AckResult.ACKED
    with pytest.raises(LeaseLost, match="settled"):
        h.q.renew(renewed)


def test_attempts_exhausted_on_takeover_buries_the_job(h: _Harness) -> None:
    h.q.enqueue(b"p", max_attempts=1)
    lease = h.q.lease(duration=5)
    assert lease is not None
    h.expire(lease)
    assert h.worker("w2").lease() is None
    dead = h.record(keys.dead_key(lease.shard, lease.job_id_bytes))
    assert isinstance(dead, DeadRecord) and dead.reason == DeadReason.ATTEMPTS_EXHAUSTED
    assert (dead.generation, dead.attempt) == (1, 1)
    assert len(h.rels("termidx/")) == 1


# -- ack, retry, bury --------------------------------------------------------------------------


def test_ack_writes_the_receipt_and_a_second_ack_checks_it(h: _Harness) -> None:
    h.q.enqueue(b"p")
    lease = h.q.lease()
    assert lease is not None
    assert h.q.ack(lease) is AckResult.ACKED
    receipt = h.record(keys.receipt_key(lease.shard, lease.job_id_bytes))
    assert (
        isinstance(receipt, ReceiptRecord)
        and receipt.generation == 1
        and receipt.payload_digest == lease.job.payload_digest
    )
    writes = len(h.memory.snapshot())
    assert h.q.ack(lease) is AckResult.ALREADY_ACKED
    assert len(h.memory.snapshot()) == writes + 1  # only the floor's beacon
    with pytest.raises(LeaseLost, match="acked"):
        h.q.bury(lease)
    assert h.q.lease() is None


def test_retry_records_the_deadline_and_the_job_returns_after_it_and_the_lease(h: _Harness) -> None:
    h.q.enqueue(b"p")
    lease = h.q.lease(duration=5)
    assert lease is not None
    assert h.q.retry(lease, delay=20) == "delayed"
    fail = h.record(keys.fail_key(lease.shard, lease.job_id_bytes, 1))
    assert isinstance(fail, FailRecord) and fail.attempt == 1
    assert fail.retry_not_before_ns >= lease.claim_store_time_ns + 20 * SECOND
    assert len(h.rels("delayed/")) == 1
    h.expire(lease)  # the lease is over, the deadline is not
    assert h.q.lease() is None
    h.clock.advance(fail.retry_not_before_ns - h.clock.peek_ns())
    again = h.q.lease()
    assert again is not None and (again.generation, again.attempt) == (2, 2)


def test_retry_with_no_attempt_left_buries(h: _Harness) -> None:
    h.q.enqueue(b"p", max_attempts=1)
    lease = h.q.lease()
    assert lease is not None
    assert h.q.retry(lease) == "dead"
    dead = h.record(keys.dead_key(lease.shard, lease.job_id_bytes))
    assert isinstance(dead, DeadRecord) and dead.reason == DeadReason.ATTEMPTS_EXHAUSTED


def test_bury_is_first_wins_and_idempotent(h: _Harness) -> None:
    h.q.enqueue(b"p")
    lease = h.q.lease()
    assert lease is not None
    h.q.bury(lease, reason=0x0101)
    h.q.bury(lease, reason=0x0101)
    dead = h.record(keys.dead_key(lease.shard, lease.job_id_bytes))
    assert isinstance(dead, DeadRecord) and dead.reason == 0x0101
    with pytest.raises(LeaseLost, match="buried"):
        h.q.ack(lease)
    with pytest.raises(InvalidInput, match="u16"):
        h.q.bury(lease, reason=1 << 16)


# -- quarantine --------------------------------------------------------------------------------


def test_a_corrupt_job_record_is_quarantined_and_never_delivered(h: _Harness) -> None:
    job_id = h.q.enqueue(b"good")
    rel = h.q.job_key(job_id)
    body = bytearray(h.memory.snapshot()[PREFIX + rel])
    body[40] ^= 0xFF
    h.memory.delete(PREFIX + rel)
    h.memory.put_if_absent(PREFIX + rel, bytes(body))
    assert h.q.lease() is None
    (finding,) = h.rels("quarantine/")
    record = h.record(finding)
    assert isinstance(record, QuarantineRecord) and record.source_key == rel
    assert h.q.lease() is None and h.rels("quarantine/") == [finding]  # the same finding, not a second one


def test_a_corrupt_detached_payload_is_quarantined_not_returned(h: _Harness) -> None:
    job_id = h.q.enqueue(b"y" * (DEFAULT_FORMAT.inline_limit + 1))
    job = h.record(h.q.job_key(job_id))
    assert isinstance(job, JobRecord) and job.payload_key is not None
    h.memory.delete(PREFIX + job.payload_key)
    h.memory.put_if_absent(PREFIX + job.payload_key, b"z" * (DEFAULT_FORMAT.inline_limit + 1))
    lease = h.q.lease()
    assert lease is not None
    with pytest.raises(Exception, match="payload"):
        h.q.read_payload(lease)
    with pytest.raises(Exception, match="payload"):
        h.q.ack(lease)
    assert len(h.rels("quarantine/")) == 1 and h.rels("receipts/") == []


# -- what a lifecycle costs --------------------------------------------------------------------


def test_store_operations_per_job_lifecycle(h: _Harness) -> None:
    """Enqueue, lease, ack of many jobs through one handle that reuses its floor: at most 13 per job.

    Counted, not timed: the reference reports 14.2 operations per job
    against MinIO; docs/stowq.md states this count.
    """
    q = BucketQueue.open(h.store, PREFIX, worker_id="w1", certify_store=False, floor_staleness_s=3600)
    jobs = 64
    start = h.store.count()
    for i in range(jobs):
        q.enqueue(b"job %d" % i)
    while (lease := q.lease()) is not None:
        q.ack(lease)
    per_job = (h.store.count() - start) / jobs
    assert len(h.rels("receipts/")) == jobs
    assert per_job <= 13, per_job


# -- outcome unknown -----------------------------------------------------------------------------


def test_an_applied_create_whose_answer_was_lost_is_resolved_by_reading_the_key(h: _Harness) -> None:
    h.q.enqueue(b"p")
    with h.store.armed(Fault(FaultKind.TIMEOUT, op="put_if_absent", key_prefix=PREFIX + "claims/", applied=True)) as (
        f,
    ):
        lease = h.q.lease()
    assert f.fired == 1 and lease is not None and lease.generation == 1
    assert len(h.rels("claims/")) == 1
    with h.store.armed(Fault(FaultKind.CONNECTION_LOST, op="put_if_absent", key_prefix=PREFIX + "receipts/")) as (f,):
        assert h.q.ack(lease) is AckResult.ACKED  # not applied: found absent, sent again
    assert f.fired == 1 and len(h.rels("receipts/")) == 1


def test_an_unknown_outcome_that_cannot_be_read_back_names_the_key_to_read(h: _Harness) -> None:
    h.q.enqueue(b"p")
    lease = h.q.lease()
    assert lease is not None
    receipt = PREFIX + keys.receipt_key(lease.shard, lease.job_id_bytes)
    unknown = Fault(FaultKind.TIMEOUT, op="put_if_absent", key_prefix=receipt, applied=True)
    unreadable = Fault(FaultKind.BEFORE_SEND, op="get", key_prefix=receipt, times=None)
    with h.store.armed(unknown, unreadable):
        with pytest.raises(OutcomeUnknown, match="read " + receipt) as info:
            h.q.ack(lease)
    assert info.value.ticket.key == receipt
    assert h.q.ack(lease) is AckResult.ALREADY_ACKED  # the later read finds our receipt


@pytest.mark.parametrize("applied", [False, True])
def test_init_resolves_an_unknown_outcome_of_its_format_write(applied: bool) -> None:
    memory = MemoryStore(clock=ManualClock())
    store = FaultyStore(memory)
    unknown = Fault(FaultKind.TIMEOUT, op="put_if_absent", key_prefix=PREFIX + keys.FORMAT_KEY, applied=applied)
    with store.armed(unknown):
        if applied:
            q = BucketQueue.init(store, PREFIX, certify_store=False)
            assert BucketQueue.open(store, PREFIX, certify_store=False).queue_id == q.queue_id
        else:
            with pytest.raises(NotCommitted, match="run init again"):
                BucketQueue.init(store, PREFIX, certify_store=False)
            assert list(memory.keys(PREFIX)) == []


def test_racing_workers_each_job_is_acked_once_and_the_gates_hold() -> None:
    """Four threads, each with its own handle, drain one queue at once: the store picks every winner."""
    memory = MemoryStore(clock=WallClock())
    first = BucketQueue.init(memory, PREFIX, certify_store=False)
    jobs = {first.enqueue(b"job %d" % i) for i in range(40)}
    acked: list[str] = []
    lock = threading.Lock()

    def work(name: str) -> None:
        q = BucketQueue.open(memory, PREFIX, worker_id=name, certify_store=False, first_shard=0)
        while (lease := q.lease(duration=60)) is not None:
            if q.ack(lease) is AckResult.ACKED:
                with lock:
                    acked.append(lease.job_id)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(acked) == sorted(jobs)
    states = audit(first, memory)
    assert set(states.values()) == {"receipt"} and len(states) == len(jobs)


def test_enqueue_many_names_the_published_prefix_when_one_fails(h: _Harness) -> None:
    def payloads() -> Iterator[bytes]:
        yield b"a"
        yield b"b"
        h.store.inject(Fault(FaultKind.BEFORE_SEND, op="put_if_absent", key_prefix=PREFIX + "jobs/", times=None))
        yield b"c"
        yield b"d"

    with pytest.raises(EnqueueIncomplete) as info:
        h.q.enqueue_many(payloads())
    h.store.clear()
    assert len(info.value.published) == 2 and isinstance(info.value.cause, NotCommitted)
    assert sorted(h.rels("jobs/")) == sorted(h.q.job_key(j) for j in info.value.published)
