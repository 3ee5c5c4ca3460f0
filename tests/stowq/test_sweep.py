"""The StowQ/1 sweeps on the memory store: each entry re-evaluated against the authoritative records, then pruned."""

from __future__ import annotations

import threading

import pytest

from steadqd.constants import DeadReason
from steadqd.s3 import keys
from steadqd.s3.keys import KeyKind
from steadqd.s3.records import DeadRecord
from steadqd.s3.recovery.sweep import Budget, Exhausted, budgeted
from steadqd.s3.store.faults import Fault, FaultKind
from steadqd.s3.verify import read_record
from tests.stowq.protocol_audit import audit, drain
from tests.stowq.recovery_world import LEASE_S, MINUTE, World, drain_recovery, total, world

SWEEPS = ("reap_leases", "promote_delayed")


def _lease_entries(w: World) -> list[str]:
    return w.keys("leases/")


def test_an_expired_lease_is_counted_pruned_and_its_job_claimed_again_by_the_shard_scan() -> None:
    w = world()
    job = w.q.enqueue(b"p")
    assert w.q.lease(duration=LEASE_S) is not None
    assert len(_lease_entries(w)) == 1
    early = w.q.recover(phases=SWEEPS)
    assert (early.leases_reaped, early.index_entries_pruned) == (0, 0), "the bucket is not due yet"
    assert len(_lease_entries(w)) == 1
    w.advance(2 * MINUTE)
    report = w.q.recover(phases=SWEEPS)
    assert (report.leases_reaped, report.leases_to_dead, report.index_entries_pruned) == (1, 0, 1)
    assert _lease_entries(w) == []
    other = w.handle("w2")
    again = other.lease(duration=LEASE_S)
    assert again is not None and again.job_id == job and again.generation == 2 and again.attempt == 2
    audit(w.q, w.memory)


def test_entries_of_settled_and_renewed_claims_are_pruned_without_counting() -> None:
    w = world()
    w.q.enqueue(b"a")
    w.q.enqueue(b"b")
    first = w.q.lease(duration=LEASE_S)
    second = w.q.lease(duration=LEASE_S)
    assert first is not None and second is not None
    w.q.ack(first)
    renewed = w.q.renew(second, duration=LEASE_S)
    assert len(_lease_entries(w)) == 3
    w.advance(2 * MINUTE)
    report = w.q.recover(phases=SWEEPS)
    # the acked job's entry and the renewed generation 1 are stale; generation 2 expired and is counted
    assert (report.leases_reaped, report.index_entries_pruned) == (1, 3)
    assert _lease_entries(w) == []
    assert renewed.generation == 2


def test_the_last_attempts_expired_lease_is_buried_as_attempts_exhausted() -> None:
    w = world()
    job = w.q.enqueue(b"p", max_attempts=1)
    assert w.q.lease(duration=LEASE_S) is not None
    w.advance(2 * MINUTE)
    report = w.q.recover(phases=SWEEPS)
    assert (report.leases_reaped, report.leases_to_dead) == (0, 1)
    shard = w.shard(job)
    rel = keys.dead_key(shard, bytes.fromhex(job))
    body = w.memory.get("q/" + rel).body
    dead = read_record(body, w.q.layout.queue_id, rel, required_feature_bits=w.q.layout.format.required_feature_bits)
    assert isinstance(dead, DeadRecord) and dead.reason == DeadReason.ATTEMPTS_EXHAUSTED
    assert audit(w.q, w.memory) == {bytes.fromhex(job): "dead"}
    assert any(k.startswith("termidx/") and "/d/" in k for k in w.keys("termidx/"))


def test_a_due_delayed_entry_is_verified_then_pruned_and_the_job_is_claimable() -> None:
    w = world()
    job = w.q.enqueue(b"later", delay=600)
    assert len(w.keys("delayed/")) == 1
    w.advance(5 * MINUTE)
    assert w.q.recover(phases=SWEEPS).delayed_promoted == 0
    assert w.q.lease(duration=LEASE_S) is None
    w.advance(12 * MINUTE)  # past the end of the entry's bucket: the sweep is conservative by one bucket
    report = w.q.recover(phases=SWEEPS)
    assert (report.delayed_promoted, report.index_entries_pruned) == (1, 1)
    assert w.keys("delayed/") == []
    got = w.q.lease(duration=LEASE_S)
    assert got is not None and got.job_id == job


def test_a_nack_is_due_at_its_fail_records_deadline() -> None:
    w = world()
    w.q.enqueue(b"p")
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None
    assert w.q.retry(lease, delay=30) == "delayed"
    assert len(w.keys("delayed/")) == 1
    w.advance(6 * MINUTE)
    report = w.q.recover(phases=SWEEPS)
    assert report.delayed_promoted == 1 and w.keys("delayed/") == []
    again = w.q.lease(duration=LEASE_S)
    assert again is not None and again.attempt == 2


def test_an_entry_in_a_bucket_before_the_authoritative_deadline_is_moved_where_it_belongs() -> None:
    w = world()
    job = w.q.enqueue(b"p", delay=3600)
    shard, raw = w.shard(job), bytes.fromhex(job)
    right = w.keys("delayed/")
    wrong = keys.delay_index_key(1, shard, raw)  # written by hand, long due
    w.put(wrong)
    w.delete(right[0])  # lost too: the sweep re-creates it from the job record
    report = w.q.recover(phases=SWEEPS)
    assert report.delayed_promoted == 0 and report.index_entries_pruned == 1
    assert w.keys("delayed/") == right
    assert w.q.lease(duration=LEASE_S) is None, "the job is still delayed"


def test_a_pass_is_bounded_by_its_budget_and_the_next_passes_finish_the_work() -> None:
    w = world()
    for i in range(12):
        w.q.enqueue(f"job {i}".encode())
    for _ in range(12):
        assert w.q.lease(duration=LEASE_S) is not None
    w.advance(2 * MINUTE)
    first = w.q.recover(budget_ops=20, phases=SWEEPS)
    # a phase stops between two entries: the budget, plus at most the one entry it was in (6 calls here)
    assert first.budget_exhausted and first.operations_attempted <= 20 + 6
    assert 0 < first.leases_reaped < 12
    reports = [first, *drain_recovery(w.q, budget_ops=20, phases=SWEEPS)]
    assert total(reports, "leases_reaped") == 12 and _lease_entries(w) == []
    assert all(r.operations_attempted <= 20 + 6 for r in reports)


def test_the_budget_counts_every_store_call_and_stops_a_phase_only_after_its_first_piece_of_work() -> None:
    w = world()
    budget = Budget(max_ops=10, budget_ms=10_000)
    work = budgeted(w.q.layout, budget)
    before = w.store.count()
    budget.give(2)
    budget.check()  # nothing done yet in this phase: it may always start
    work.exists("jobs/0000/" + "0" * 32)
    work.exists("jobs/0000/" + "1" * 32)
    assert w.store.count() - before == budget.ops == 2
    with pytest.raises(Exhausted):
        budget.check()
    assert budget.exhausted and not budget.spent()
    budget.give(budget.left)
    budget.check()
    assert budget.left == 8


def test_two_sweepers_at_once_prune_everything_and_bury_each_exhausted_job_once() -> None:
    w = world()
    jobs = [w.q.enqueue(f"job {i}".encode(), max_attempts=1 if i % 3 == 0 else 3) for i in range(18)]
    for _ in jobs:
        assert w.q.lease(duration=LEASE_S) is not None
    w.advance(2 * MINUTE)
    sweepers = [w.handle("s1"), w.handle("s2")]
    start = threading.Barrier(2)
    reports: dict[int, list[object]] = {}

    def run(i: int) -> None:
        start.wait()
        reports[i] = drain_recovery(sweepers[i], budget_ops=15, phases=SWEEPS)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(reports) == {0, 1}
    assert _lease_entries(w) == []
    states = audit(w.q, w.memory)
    assert sum(1 for s in states.values() if s == "dead") == 6
    dead_keys = [k for k in w.keys("dead/")]
    assert len(dead_keys) == len(set(dead_keys)) == 6
    # every other job is claimable again by an ordinary worker
    worker = w.handle("w3")
    claimed = {lease.job_id for lease in iter(lambda: worker.lease(duration=LEASE_S), None)}
    assert claimed == {j for i, j in enumerate(jobs) if i % 3}
    assert all(keys.parse_key(k).kind is KeyKind.DEAD for k in dead_keys)


FAULTS = [
    pytest.param(FaultKind.BEFORE_SEND, False, id="before-send"),
    pytest.param(FaultKind.TIMEOUT, False, id="timeout-not-applied"),
    pytest.param(FaultKind.TIMEOUT, True, id="timeout-applied"),
    pytest.param(FaultKind.SERVER_ERROR, True, id="5xx-applied"),
]


@pytest.mark.parametrize(("kind", "applied"), FAULTS)
def test_a_fault_at_every_store_call_of_the_sweeps_keeps_the_gates(kind: FaultKind, applied: bool) -> None:
    n = 1
    while True:
        w = world()
        reaped = w.q.enqueue(b"expired")
        last = w.q.enqueue(b"last attempt", max_attempts=1)
        for _ in range(2):
            assert w.q.lease(duration=LEASE_S) is not None
        delayed = w.q.enqueue(b"due", delay=60)
        w.advance(8 * MINUTE)
        fault = w.store.inject(Fault(kind, nth=n, applied=applied))
        first = w.q.recover(phases=SWEEPS)
        w.store.clear()
        reports = [first, *drain_recovery(w.q, phases=SWEEPS)]
        assert w.keys("leases/") == [] and w.keys("delayed/") == [], f"call {n}"
        assert total(reports, "leases_to_dead") <= 2
        states = audit(w.q, w.memory)
        assert states[bytes.fromhex(last)] == "dead", f"call {n}: the exhausted job was not buried"
        assert states[bytes.fromhex(reaped)] == states[bytes.fromhex(delayed)] == "open"
        drain(w.q, w.clock, step_ns=int(LEASE_S * 1e9))
        assert set(audit(w.q, w.memory).values()) == {"receipt", "dead"}
        if not fault.fired:
            break
        n += 1
    assert n > 10


def test_the_time_budget_stops_a_phase_between_entries_once_it_has_run_out() -> None:
    now = [0]
    budget = Budget(max_ops=1000, budget_ms=5, monotonic_ns=lambda: now[0])
    budget.give(1000)
    budget.check()
    budget.count()  # the clock starts at the first store call
    now[0] += 4_000_000
    budget.check()
    now[0] += 1_000_000
    with pytest.raises(Exhausted):
        budget.check()
    assert budget.spent() and budget.exhausted
