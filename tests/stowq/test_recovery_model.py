"""A Hypothesis state machine: workers and two sweepers on one bucket queue, store time moved by the test.

Workers enqueue, lease, ack, nack and bury; two sweepers run budgeted
recovery passes (sweeps, GC with short retentions, the repair scan) in
between, some of them cut by a fault at one of their store calls. After every step the bucket is audited (:mod:`tests.stowq.protocol_audit`:
no two admissible claims, no stale settle), and two more gates hold: a job
once settled is never leased again, even after GC collected it; and every
job ever enqueued is either still in ``jobs/`` or was seen settled, so GC
only ever removes finished work.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from steadqd.errors import LeaseLost
from steadqd.s3.backend import BucketBackend
from steadqd.s3.layout import DEFAULT_FORMAT, init_layout, open_layout
from steadqd.s3.lease import Lease
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import ManualClock, MemoryStore
from tests.stowq.protocol_audit import audit, job_ids

SECOND = 1_000_000_000
PREFIX = "m/"
URL = "s3://model/m"
LEASE_S = 4.0
FAULTS = [(FaultKind.BEFORE_SEND, False), (FaultKind.TIMEOUT, False), (FaultKind.TIMEOUT, True)]
RETENTION = {"receipt_retention": 60.0, "dead_retention": 120.0, "temp_ttl": 60.0, "floor_staleness_s": 0}


class RecoveryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(step_ns=1000)
        self.memory = MemoryStore(clock=self.clock)
        fmt = DEFAULT_FORMAT.__class__(**{**DEFAULT_FORMAT.__dict__, "shard_count": 2})
        layout = init_layout(self.memory, PREFIX, worker_id="w", queue_id=bytes(16), fmt=fmt, certify_store=False)
        self.worker = BucketBackend(layout, url=URL, first_shard=0, **RETENTION)
        # The sweepers reach the bucket through a fault injector, so a pass can be cut at any store call.
        self.faulty = FaultyStore(self.memory)
        self.sweepers = [
            BucketBackend(
                open_layout(self.faulty, PREFIX, worker_id=f"s{i}", certify_store=False), url=URL, **RETENTION
            )
            for i in range(2)
        ]
        self.next_id = 1
        self.enqueued: set[bytes] = set()
        self.settled: set[bytes] = set()
        self.leases: list[Lease] = []

    @rule(delay=st.sampled_from([0, 0, 30, 200]), attempts=st.integers(1, 3), detached=st.booleans())
    def enqueue(self, delay: int, attempts: int, detached: bool) -> None:
        job_id = self.next_id.to_bytes(16, "big")
        self.next_id += 1
        payload = b"x" * (70_000 if detached else 8)
        self.worker.enqueue(payload, job_id=job_id.hex(), max_attempts=attempts, delay=delay)
        self.enqueued.add(job_id)

    @rule()
    def lease(self) -> None:
        got = self.worker.lease(duration=LEASE_S)
        if got is not None:
            assert got.job_id_bytes not in self.settled, f"{got.job_id} was settled and is delivered again"
            assert self.worker.read_payload(got)
            self.leases.append(got)

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(0, 99), how=st.sampled_from(["ack", "retry", "bury"]))
    def settle(self, pick: int, how: str) -> None:
        lease = self.leases.pop(pick % len(self.leases))
        try:
            if how == "ack":
                self.worker.ack(lease)
            elif how == "retry":
                self.worker.retry(lease, delay=10)
            else:
                self.worker.bury(lease)
        except LeaseLost:
            pass  # expired and taken over, or already settled by another path

    @rule(seconds=st.sampled_from([1, 5, 30, 90, 400]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds * SECOND)

    @rule(which=st.integers(0, 1), budget=st.integers(1, 80))
    def recover(self, which: int, budget: int) -> None:
        report = self.sweepers[which].recover(budget_ops=budget, budget_ms=60_000)
        assert report.errors == []

    @rule(which=st.integers(0, 1), nth=st.integers(1, 40), fault=st.sampled_from(FAULTS))
    def recover_with_a_fault(self, which: int, nth: int, fault: tuple[FaultKind, bool]) -> None:
        """A pass cut by a failed store call: before transmit, or a timeout after the write was applied or not."""
        self.faulty.inject(Fault(fault[0], nth=nth, applied=fault[1]))
        try:
            self.sweepers[which].recover(budget_ops=1000, budget_ms=60_000)
        finally:
            self.faulty.clear()

    @invariant()
    def gates(self) -> None:
        states = audit(self.worker, self.memory, collecting=True)
        self.settled |= {job for job, state in states.items() if state != "open"}
        present = job_ids(self.memory, PREFIX)
        lost = self.enqueued - present - self.settled
        assert not lost, f"jobs gone without being settled: {sorted(j.hex() for j in lost)}"

    def teardown(self) -> None:
        for _ in range(200):
            got = self.worker.lease(duration=LEASE_S)
            if got is None:
                if all(s != "open" for s in audit(self.worker, self.memory, collecting=True).values()):
                    return
                self.clock.advance(400 * SECOND)
                continue
            assert got.job_id_bytes not in self.settled
            self.worker.ack(got)
        raise AssertionError("the queue did not drain")


TestRecoveryModel = RecoveryMachine.TestCase
TestRecoveryModel.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
