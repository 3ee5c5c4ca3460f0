"""A Hypothesis state machine: StowQ/1 on the in-memory store against a pure model of what each call must do.

Two workers enqueue, claim, renew, ack, nack and bury while the test moves
store time on (so leases expire and are taken over). The model knows, for
every job, the generation of its chain's tail, who holds it until when, its
attempts and whether it settled; each answer of the real queue is checked
against it, and after every step the bucket itself is audited
(:mod:`tests.stowq.protocol_audit`): never two admissible claims at once, no
stale generation settled, nothing committed lost, ack idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from steadqd.constants import AckResult, DeadReason
from steadqd.errors import LeaseLost
from steadqd.s3 import keys
from steadqd.s3.handle import BucketQueue
from steadqd.s3.lease import Lease
from steadqd.s3.records import DeadRecord
from steadqd.s3.store.memory import ManualClock, MemoryStore
from steadqd.s3.verify import read_record
from tests.stowq.protocol_audit import audit

SECOND = 1_000_000_000
LEASE_S = 4
PREFIX = "m/"


@dataclass
class ModelJob:
    max_attempts: int
    tail: int = 0  # generation of the chain's tail (0: never claimed)
    attempt: int = 0
    expires_ns: int = 0  # the tail's store time + lease (the skew guard is 1 ns on this store)
    retry_at_ns: int = 0  # the retry deadline of the fail record at generation retry_generation
    retry_generation: int = 0  # 0: no nack yet
    terminal: str | None = None  # "receipt" | "dead"
    terminal_generation: int = 0
    leases: list[Lease] = field(default_factory=list)


class BucketQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(step_ns=1000)
        self.memory = MemoryStore(clock=self.clock)
        # Everything that steers the run is drawn or fixed (job ids, first shards), so Hypothesis can replay it.
        options = {"certify_store": False, "floor_staleness_s": 0, "queue_id": bytes(16)}
        first = BucketQueue.init(self.memory, PREFIX, worker_id="w1", first_shard=0, **options)
        self.workers = [first, BucketQueue.open(self.memory, PREFIX, worker_id="w2", first_shard=7, **options)]
        self.jobs: dict[str, ModelJob] = {}
        self.leases: list[Lease] = []

    # -- helpers ----------------------------------------------------------------------

    def _ready_now(self, job: ModelJob) -> bool:
        """Certainly claimable: no margin case (expiry is compared with a floor at most a few µs old)."""
        if job.terminal is not None:
            return False
        if job.tail == 0:
            return True
        return False  # a taken-over job's readiness depends on the floor's exact value: not asserted

    def _current(self, lease: Lease) -> bool:
        job = self.jobs[lease.job_id]
        return job.terminal is None and job.tail == lease.generation

    def _reconcile_exhausted(self) -> None:
        """A scan buries a job whose attempts ran out; the model accepts it only when that was due."""
        layout = self.workers[0].layout
        for job_id, job in self.jobs.items():
            if job.terminal is not None:
                continue
            raw = bytes.fromhex(job_id)
            rel = keys.dead_key(keys.shard_of(layout.queue_id, raw, layout.format.shard_count), raw)
            body = self.memory.snapshot().get(PREFIX + rel)
            if body is None:
                continue
            dead = read_record(body, layout.queue_id, rel, required_feature_bits=layout.format.required_feature_bits)
            assert isinstance(dead, DeadRecord) and dead.reason == DeadReason.ATTEMPTS_EXHAUSTED
            assert job.attempt >= job.max_attempts and dead.generation == job.tail
            assert self.clock.peek_ns() >= job.expires_ns
            job.terminal, job.terminal_generation = "dead", job.tail

    # -- rules ------------------------------------------------------------------------

    @precondition(lambda self: len(self.jobs) < 6)
    @rule(payload=st.binary(max_size=8), attempts=st.integers(1, 3))
    def enqueue(self, payload: bytes, attempts: int) -> None:
        job_id = self.workers[0].enqueue(payload, max_attempts=attempts, job_id=f"{len(self.jobs) + 1:032x}")
        assert job_id not in self.jobs
        self.jobs[job_id] = ModelJob(attempts)

    @rule(w=st.integers(0, 1))
    def claim(self, w: int) -> None:
        before = {j: m.tail for j, m in self.jobs.items()}
        ready = [j for j, m in self.jobs.items() if self._ready_now(m)]
        lease = self.workers[w].lease(duration=LEASE_S)
        self._reconcile_exhausted()
        if lease is None:
            assert not ready, f"jobs {ready} were ready but nothing was claimed"
            return
        job = self.jobs[lease.job_id]
        assert job.terminal is None and lease.generation == before[lease.job_id] + 1
        if job.tail:
            assert lease.claim_store_time_ns >= job.expires_ns, "taken over before the lease expired"
            if job.retry_generation == job.tail:  # readiness honours the tail's fail record only
                assert lease.claim_store_time_ns >= job.retry_at_ns, "taken over before the retry deadline"
        assert lease.attempt == job.attempt + 1 <= job.max_attempts
        job.tail, job.attempt = lease.generation, lease.attempt
        job.expires_ns = lease.claim_store_time_ns + lease.lease_duration_ns
        self.leases.append(lease)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        current = self._current(lease)
        job = self.jobs[lease.job_id]
        # A repeated renewal (as after a lost answer) gets its own continuation back while it is the tail.
        repeat = job.terminal is None and any(
            (held.job_id, held.generation, held.worker_token) == (lease.job_id, job.tail, lease.worker_token)
            and held.generation == lease.generation + 1
            for held in self.leases
        )
        try:
            renewed = self.workers[0].renew(lease, duration=LEASE_S)
        except LeaseLost:
            assert not current and not repeat, "the holder's renewal was refused"
            return
        if repeat:
            assert renewed.generation == job.tail
            return
        assert current, f"generation {lease.generation} renewed although it is not the tail"
        assert (renewed.generation, renewed.attempt) == (lease.generation + 1, lease.attempt)
        job.tail = renewed.generation
        job.expires_ns = renewed.claim_store_time_ns + renewed.lease_duration_ns
        self.leases.append(renewed)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        job = self.jobs[lease.job_id]
        again = job.terminal == "receipt" and job.terminal_generation == lease.generation
        current = self._current(lease)
        try:
            result = self.workers[1].ack(lease)
        except LeaseLost:
            assert not current and not again, "the holder's ack was refused"
            return
        if again:
            assert result is AckResult.ALREADY_ACKED
            return
        assert current and result is AckResult.ACKED, "a stale generation acked"
        job.terminal, job.terminal_generation = "receipt", lease.generation

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), delay=st.sampled_from([0, 1, 10]))
    def nack(self, data: st.DataObject, delay: int) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        job = self.jobs[lease.job_id]
        current = self._current(lease)
        try:
            state = self.workers[0].retry(lease, delay=delay)
        except LeaseLost:
            assert not current
            return
        assert current, "a stale generation nacked"
        if lease.attempt >= job.max_attempts:
            assert state == "dead"
            job.terminal, job.terminal_generation = "dead", lease.generation
        else:
            assert state == "delayed"
            if job.retry_generation != lease.generation:  # put-if-absent: a second nack keeps the first deadline
                job.retry_generation = lease.generation
                job.retry_at_ns = self.clock.peek_ns() + delay * SECOND - 10**6

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def bury(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        job = self.jobs[lease.job_id]
        again = job.terminal == "dead" and job.terminal_generation == lease.generation
        current = self._current(lease)
        try:
            self.workers[1].bury(lease, 0x0101)
        except LeaseLost:
            assert not current and not again
            return
        assert current or again, "a stale generation buried"
        job.terminal, job.terminal_generation = "dead", lease.generation

    @rule(seconds=st.sampled_from([1, 3, 5, 12]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds * SECOND)

    # -- the gates --------------------------------------------------------------------

    @invariant()
    def gates_hold_in_the_bucket(self) -> None:
        states = audit(self.workers[0], self.memory)
        assert set(states) == {bytes.fromhex(j) for j in self.jobs}, "a committed job is missing"
        for job_id, job in self.jobs.items():
            expected = job.terminal or "open"
            assert states[bytes.fromhex(job_id)] == expected, (job_id, states[bytes.fromhex(job_id)], expected)


TestBucketQueueModel = BucketQueueMachine.TestCase
TestBucketQueueModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


class _Drawn:
    """Stands in for ``st.data()`` when a case the machine found is replayed step by step."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    def draw(self, strategy: object) -> Lease:
        return self.lease


def test_a_second_nack_of_one_generation_keeps_the_first_deadline() -> None:
    """A case the machine found (STEADQ_HYPOTHESIS_SEED=3422274240): the fail record is put-if-absent,
    so a second nack of the same generation, with a longer delay, changes nothing (records.md, "Retry")."""
    m = BucketQueueMachine()
    m.enqueue(payload=b"", attempts=2)
    m.claim(w=0)
    m.advance(seconds=5)
    (lease,) = m.leases
    m.nack(data=cast(st.DataObject, _Drawn(lease)), delay=0)
    m.nack(data=cast(st.DataObject, _Drawn(lease)), delay=1)
    m.claim(w=0)  # a takeover at the first nack's deadline
    m.gates_hold_in_the_bucket()
    m.teardown()
