"""Batched claiming (``BucketQueue.lease_many``) on the in-memory store, with the fault injector at every call.

A batch is several independent claims under one floor, tried in waves
over a thread pool; StowQ/1 has no atomic batches. So the gates are the
single claim's: no two admissible claims at once (the audit), and nothing
lost when a batch is interrupted at any store call, whether a claim of the
batch failed before transmit, timed out with or without its write applied,
or got a 5xx: every claim won is handed to the caller, and what was not
is claimed by a later round.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from steadqd.constants import AckResult
from steadqd.errors import InvalidInput, NotCommitted, OutcomeUnknown
from steadqd.s3 import keys
from steadqd.s3.claim import claim_job
from steadqd.s3.handle import BucketQueue
from steadqd.s3.keys import KeyKind
from steadqd.s3.layout import DEFAULT_FORMAT
from steadqd.s3.lease import Lease
from steadqd.s3.store.base import Committed
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import ManualClock, MemoryStore
from tests.stowq.protocol_audit import audit, drain
from tests.stowq.test_protocol_faults import FAULTS, World

SECOND = 1_000_000_000
LEASE_S = 5
PREFIX = "q/"
JOBS = 4


def _world(jobs: int = JOBS, *, threads: int = 4, worker: str = "w1", first_shard: int | None = None) -> World:
    clock = ManualClock(step_ns=1000)
    memory = MemoryStore(clock=clock)
    store = FaultyStore(memory)
    q = BucketQueue.init(
        store,
        PREFIX,
        worker_id=worker,
        certify_store=False,
        floor_staleness_s=0,
        batch_threads=threads,
        first_shard=first_shard,
        queue_id=bytes(range(16)),
    )
    for i in range(jobs):
        q.enqueue(b"job %d" % i, job_id=f"{i + 1:032x}")
    return World(clock, memory, store, q)


def _claims_of(w: World, job_id: bytes) -> str:
    shard = keys.shard_of(w.q.layout.queue_id, job_id, w.q.layout.format.shard_count)
    return PREFIX + keys.chain_prefix(KeyKind.CLAIM, shard, job_id)


def test_a_batch_claims_distinct_jobs_and_leaves_the_rest_for_the_next_round() -> None:
    w = _world(5)
    first = w.q.lease_many(3, duration=LEASE_S)
    assert len(first) == 3 and len({lease.job_id for lease in first}) == 3
    second = w.q.lease_many(3, duration=LEASE_S)
    assert len(second) == 2 and not {lease.job_id for lease in first} & {lease.job_id for lease in second}
    assert w.q.lease_many(3, duration=LEASE_S) == []
    for lease in first + second:
        w.q.ack(lease)
    assert set(audit(w.q, w.memory).values()) == {"receipt"}


def test_one_job_a_batch_makes_the_store_calls_of_a_lease() -> None:
    """lease() and lease_many(1) are one code path: the same calls, in the same order."""
    traces = []
    for take in (lambda q: q.lease(duration=LEASE_S), lambda q: q.lease_many(1, duration=LEASE_S)):
        w = _world(3, first_shard=0)
        w.store.trace.clear()
        take(w.q)
        beacon = PREFIX + "meta/clock/"
        traces.append([(c.op, beacon if c.key.startswith(beacon) else c.key) for c in w.store.trace])
    assert traces[0] == traces[1] and traces[0]


@pytest.mark.parametrize("n", [0, -1, 1001, True, 2.0])
def test_a_batch_size_that_is_not_a_count_is_refused(n: object) -> None:
    w = _world(1)
    with pytest.raises(InvalidInput, match="lease_many: n"):
        w.q.lease_many(n, duration=LEASE_S)  # type: ignore[arg-type]


def test_racing_batches_of_two_workers_claim_each_job_once() -> None:
    w = _world(24, threads=4)
    other = BucketQueue.open(w.store, PREFIX, worker_id="w2", certify_store=False, floor_staleness_s=0)
    got: dict[str, list[Lease]] = {"w1": [], "w2": []}

    def work(name: str, q: BucketQueue) -> None:
        while batch := q.lease_many(5, duration=60):
            for lease in batch:
                q.ack(lease)
            got[name].extend(batch)

    threads = [threading.Thread(target=work, args=item) for item in (("w1", w.q), ("w2", other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ids = [lease.job_id for leases in got.values() for lease in leases]
    assert len(ids) == len(set(ids)) == 24
    assert set(audit(w.q, w.memory).values()) == {"receipt"}
    other.close()


def test_a_failed_claim_does_not_cost_its_wave_mates_theirs() -> None:
    """One job's claim PUT never leaves: the batch returns the other claims, and the job is claimed later."""
    w = _world(3)
    broken = bytes.fromhex(f"{2:032x}")
    with w.store.armed(Fault(FaultKind.BEFORE_SEND, op="put_if_absent", key_prefix=_claims_of(w, broken), times=None)):
        batch = w.q.lease_many(3, duration=LEASE_S)
    assert sorted(lease.job_id for lease in batch) == [f"{1:032x}", f"{3:032x}"]
    (later,) = w.q.lease_many(3, duration=LEASE_S)
    assert later.job_id_bytes == broken


def test_a_batch_whose_every_claim_fails_raises_the_failure() -> None:
    w = _world(2)
    with w.store.armed(Fault(FaultKind.BEFORE_SEND, op="put_if_absent", key_prefix=PREFIX + "claims/", times=None)):
        with pytest.raises(NotCommitted):
            w.q.lease_many(2, duration=LEASE_S)
    assert len(w.q.lease_many(2, duration=LEASE_S)) == 2


@pytest.mark.parametrize("threads", [1, 4], ids=["in-turn", "threaded"])
@pytest.mark.parametrize(("kind", "applied"), FAULTS)
def test_a_fault_at_every_store_call_of_a_batch_keeps_the_gates(kind: FaultKind, applied: bool, threads: int) -> None:
    n = 1
    while True:
        w = _world(threads=threads)
        fault = w.store.inject(Fault(kind, nth=n, applied=applied))
        batch: list[Lease] = []
        try:
            batch = w.q.lease_many(JOBS, duration=LEASE_S)
        except (NotCommitted, OutcomeUnknown) as exc:
            if isinstance(exc, OutcomeUnknown):
                assert exc.ticket is not None and exc.ticket.key.startswith(PREFIX), "OutcomeUnknown names no key"
        w.store.clear()
        assert len({lease.job_id for lease in batch}) == len(batch) <= JOBS
        for lease in batch:
            w.q.ack(lease)
        for lease in w.q.lease_many(JOBS, duration=LEASE_S):  # the caller's next round
            w.q.ack(lease)
        audit(w.q, w.memory)
        drain(w.q, w.clock, step_ns=LEASE_S * SECOND)
        states = audit(w.q, w.memory)
        assert len(states) == JOBS and set(states.values()) == {"receipt"}, f"call {n}: {states}"
        if not fault.fired:
            break
        n += 1
    assert n > JOBS * 7, f"a batch of {JOBS} made only {n - 1} store calls"


class _RivalFirst(MemoryStore):
    """A memory store where a rival's claim lands just before this handle's first claim create."""

    rival: Callable[[str], object] | None = None

    def put_if_absent(self, key: str, body: bytes, *, sha256: bytes | None = None) -> Committed:
        if self.rival is not None and key.startswith(PREFIX + "claims/"):
            rival, self.rival = self.rival, None
            rival(key)
        return super().put_if_absent(key, body, sha256=sha256)


def test_a_race_lost_leaves_the_rest_of_that_shard_to_the_winner() -> None:
    store = _RivalFirst(clock=ManualClock(step_ns=1000))
    fmt = replace(DEFAULT_FORMAT, shard_count=1)
    q = BucketQueue.init(store, PREFIX, fmt=fmt, worker_id="w1", certify_store=False, floor_staleness_s=0)
    for i in range(3):
        q.enqueue(b"job %d" % i, job_id=f"{i + 1:032x}")
    rival = BucketQueue.open(store, PREFIX, worker_id="w2", certify_store=False, floor_staleness_s=0)

    def race(key: str) -> None:
        job_id = keys.parse_key(key[len(PREFIX) :]).job_id
        assert job_id is not None
        got = claim_job(rival.layout, 0, job_id, floor_ns=rival.wall_floor_ns(), lease_duration_ns=LEASE_S * SECOND)
        assert isinstance(got, Lease)

    store.rival = race
    assert q.lease_many(1, duration=LEASE_S) == []  # lost the race: the shard is the rival's for this pass
    assert len(q.lease_many(3, duration=LEASE_S)) == 2  # the next pass lists it again


def test_a_pass_lists_every_shard_once_whatever_the_stride() -> None:
    """Workers walk the shards with strides of their own; each still sees every shard in one pass."""
    w = _world(0)
    count = w.q.layout.format.shard_count
    for _ in range(12):
        q = BucketQueue.open(w.store, PREFIX, worker_id="w2", certify_store=False, floor_staleness_s=0)
        w.store.trace.clear()
        assert q.lease_many(4, duration=LEASE_S) == []
        listed = [c.key for c in w.store.trace if c.op == "list" and c.key.startswith(PREFIX + "jobs/")]
        assert len(listed) == len(set(listed)) == count


def test_a_job_found_held_is_not_read_again_under_the_same_floor() -> None:
    """Under one floor a held job cannot become ready, so its four reads are made once per floor."""
    w = _world(1, worker="w2")
    assert w.q.lease(duration=LEASE_S) is not None
    now = [0.0]
    q = BucketQueue.open(w.store, PREFIX, worker_id="w1", certify_store=False, monotonic=lambda: now[0])
    job_reads = []
    for advance in (0.0, 0.5, 2.0):  # the floor is re-established once it is 1 s old
        now[0] += advance
        w.store.trace.clear()
        assert q.lease(duration=LEASE_S) is None
        job_reads.append(sum(1 for c in w.store.trace if f"{1:032x}" in c.key))
    assert job_reads == [4, 0, 4]  # HEAD receipt, HEAD dead, LIST of the chain, GET of the tail claim


def test_the_acks_of_a_batch_renew_a_stale_floor_once() -> None:
    """Eight acks at once that find the floor stale make one beacon between them, not eight."""
    w = _world(8)
    now = [0.0]
    q = BucketQueue.open(w.store, PREFIX, worker_id="w2", certify_store=False, monotonic=lambda: now[0])
    batch = q.lease_many(8, duration=LEASE_S)
    assert len(batch) == 8
    now[0] += 5.0  # the floor is stale now
    beacons = PREFIX + "meta/clock/"
    before = sum(1 for c in w.store.trace if c.op == "put_if_absent" and c.key.startswith(beacons))
    slow = Fault(FaultKind.SLOW, op="put_if_absent", key_prefix=beacons, delay_s=0.05, times=None)
    with w.store.armed(slow), ThreadPoolExecutor(8) as pool:
        assert set(pool.map(q.ack, batch)) == {AckResult.ACKED}
    made = sum(1 for c in w.store.trace if c.op == "put_if_absent" and c.key.startswith(beacons)) - before
    assert made == 1


def test_once_others_settle_jobs_a_listing_skips_their_receipts() -> None:
    """After one candidate came back settled by another worker, a shard's receipts are listed with it."""
    store = MemoryStore(clock=ManualClock(step_ns=1000))
    fmt = replace(DEFAULT_FORMAT, shard_count=1)
    a = BucketQueue.init(store, PREFIX, fmt=fmt, worker_id="a", certify_store=False, first_shard=0)
    c = BucketQueue.open(FaultyStore(store), PREFIX, worker_id="c", certify_store=False, first_shard=0)
    ids = [f"{i:032x}" for i in range(1, 6)]
    a.enqueue(b"1", job_id=ids[0])
    first = a.lease(duration=LEASE_S)
    assert first is not None
    a.ack(first)
    assert c.lease(duration=LEASE_S) is None  # its only candidate was settled by a: c has seen others settle
    for i, job_id in enumerate(ids[1:], 2):
        a.enqueue(b"%d" % i, job_id=job_id)
    for _ in range(3):
        lease = a.lease(duration=LEASE_S)
        assert lease is not None
        a.ack(lease)
    trace = c.layout.store
    assert isinstance(trace, FaultyStore)
    trace.trace.clear()
    got = c.lease(duration=LEASE_S)
    assert got is not None and got.job_id == ids[4]
    assert [call.op for call in trace.trace if call.key.startswith(PREFIX + "receipts/")] == ["list", "head"]
