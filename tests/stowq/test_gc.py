"""Retention GC of bucket queues on the memory store: terminal graphs in recovery.md's order, orphans, beacons."""

from __future__ import annotations

import os

import pytest

from steadqd.constants import DeadReason
from steadqd.s3 import keys
from steadqd.s3.claim import settle_dead
from steadqd.s3.keys import TermKind
from steadqd.s3.recovery.gc import delete_job_graph
from steadqd.s3.store.faults import Fault, FaultKind
from tests.stowq.protocol_audit import audit, drain
from tests.stowq.recovery_world import LEASE_S, MINUTE, SECOND, World, drain_recovery, total, world

GC = ("delete_receipts", "cleanup_temp", "collect_beacons")
BIG = b"d" * 70_000  # detached: above the default inline limit


def _job_keys(w: World, job: str) -> list[str]:
    """Every object of the job, in any plane (index entries included)."""
    return [k for k in w.keys() if job in k]


def _acked(w: World, payload: bytes = b"p", **options: object) -> str:
    job = w.q.enqueue(payload, **options)  # type: ignore[arg-type]
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None and lease.job_id == job
    w.q.ack(lease)
    return job


def test_a_receipt_past_its_retention_takes_its_whole_graph_with_it() -> None:
    w = world()
    job = _acked(w, BIG)
    young = w.q.recover(phases=GC)
    assert young.receipts_deleted == 0 and _job_keys(w, job)
    w.advance(121 * SECOND)
    report = w.q.recover(phases=GC)
    assert report.receipts_deleted == 1
    assert _job_keys(w, job) == [], "jobs, payloads, claims, leases, receipts, termidx: all gone"
    assert {"meta/FORMAT", "meta/watermark"} <= set(w.keys("meta/"))
    assert w.q.lease(duration=LEASE_S) is None, "a collected job is never delivered again"


def test_the_graph_is_deleted_in_recovery_md_order_with_the_terminal_record_last() -> None:
    w = world()
    job = w.q.enqueue(BIG, delay=30)
    w.advance(6 * MINUTE)
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None
    assert w.q.retry(lease, delay=1) == "delayed"
    w.advance(MINUTE)
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None and lease.generation == 2
    w.q.ack(lease)
    shard, raw = w.shard(job), bytes.fromhex(job)
    start = len(w.store.trace)
    delete_job_graph(w.q.layout, shard, raw, TermKind.RECEIPT)
    deletes = [c.key[len("q/") :] for c in w.store.trace[start:] if c.op == "delete"]
    planes = [d.split("/")[0] for d in deletes]
    first = {p: planes.index(p) for p in set(planes)}
    assert first["leases"] < first["fails"] < first["claims"] < first["payloads"] < first["jobs"] < first["receipts"]
    assert planes[-1] == "receipts" and planes.count("receipts") == 1
    assert deletes[-1] == keys.receipt_key(shard, raw)
    assert "delayed" in planes and planes.index("delayed") < first["fails"]
    left = _job_keys(w, job)
    assert [keys.parse_key(k).kind.label for k in left] == ["termidx"], "the work item goes after the tombstone"


def test_dead_jobs_stay_forever_unless_a_dead_retention_is_set() -> None:
    w = world()
    job = w.q.enqueue(b"p")
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None
    w.q.bury(lease)
    w.advance(3600 * SECOND * 30)
    assert w.q.recover(phases=GC).dead_deleted == 0 and _job_keys(w, job)
    keeper = w.handle("sweeper", dead_retention=7200.0)
    assert keeper.recover(phases=GC).dead_deleted == 1
    assert _job_keys(w, job) == []


def test_dead_entries_kept_forever_do_not_stop_receipts_behind_them_from_being_collected() -> None:
    w = world()
    for _ in range(3):
        lease = (w.q.enqueue(b"d"), w.q.lease(duration=LEASE_S))[1]
        assert lease is not None
        w.q.bury(lease)
    job = _acked(w)
    w.advance(121 * SECOND)
    report = w.q.recover(budget_ops=10, phases=("delete_receipts",))
    assert report.receipts_deleted == 1 and report.dead_deleted == 0
    assert _job_keys(w, job) == []
    assert len(w.keys("dead/")) == 3


def test_a_receipt_and_dead_pair_is_not_collected() -> None:
    w = world()
    job = _acked(w)
    shard, raw = w.shard(job), bytes.fromhex(job)
    assert settle_dead(w.q.layout, shard, raw, 1, 1, DeadReason.CONSUMER_REJECTED, w.q.wall_floor_ns()) is None
    w.advance(121 * SECOND)
    keeper = w.handle("sweeper", dead_retention=3600.0)
    w.advance(3601 * SECOND)
    report = keeper.recover(phases=GC)
    assert report.receipts_deleted == report.dead_deleted == 0
    assert keys.receipt_key(shard, raw) in w.keys() and keys.dead_key(shard, raw) in w.keys()


def test_a_stale_termidx_entry_is_pruned() -> None:
    w = world()
    raw = os.urandom(16)
    shard = w.shard(raw.hex())
    w.put(keys.termidx_key(1, TermKind.RECEIPT, shard, raw))
    report = w.q.recover(phases=GC)
    assert report.index_entries_pruned == 1 and w.keys("termidx/") == []


def test_orphan_payloads_past_the_horizon_go_and_referenced_or_young_ones_stay() -> None:
    w = world()
    live = w.q.enqueue(BIG)
    orphan = os.urandom(16)
    w.put(keys.payload_key(orphan, os.urandom(32)), b"half an enqueue")
    w.advance(59 * SECOND)
    young = os.urandom(16)
    w.put(keys.payload_key(young, os.urandom(32)), b"in flight")
    w.advance(2 * SECOND)
    report = w.q.recover(phases=GC)
    assert report.temp_files_deleted == 1
    left = w.keys("payloads/")
    assert [keys.parse_key(k).job_id for k in left] == sorted([bytes.fromhex(live), young])
    got = w.q.lease(duration=LEASE_S)
    assert got is not None and w.q.read_payload(got) == BIG


def test_clock_beacons_are_collected_after_ten_staleness_windows() -> None:
    w = world()
    for _ in range(5):
        w.q.wall_floor_ns()
    assert len(w.keys("meta/clock/")) == 5
    w.advance(299 * SECOND)
    assert w.q.recover(phases=GC).beacons_deleted == 0
    w.advance(2 * SECOND)
    report = w.q.recover(phases=GC)
    assert report.beacons_deleted == 5
    assert len(w.keys("meta/clock/")) == 2  # the floors of the two passes, 2 s old and new
    assert {"meta/FORMAT", "meta/watermark"} <= set(w.keys("meta/"))


def test_quarantine_format_and_watermark_are_never_collected() -> None:
    w = world()
    job = w.q.enqueue(b"p")
    shard, raw = w.shard(job), bytes.fromhex(job)
    w.delete(keys.job_key(shard, raw))
    w.put(keys.job_key(shard, raw), b"garbage")
    assert w.q.lease(duration=LEASE_S) is None  # quarantined by the claim path
    quarantine = w.keys("quarantine/")
    assert quarantine
    w.advance(3600 * SECOND * 24 * 400)
    drain_recovery(w.handle("sweeper", dead_retention=3600.0), phases=GC)
    assert w.keys("quarantine/") == quarantine
    assert {"meta/FORMAT", "meta/watermark"} <= set(w.keys("meta/"))


FAULTS = [
    pytest.param(FaultKind.BEFORE_SEND, False, id="before-send"),
    pytest.param(FaultKind.TIMEOUT, False, id="timeout-not-applied"),
    pytest.param(FaultKind.TIMEOUT, True, id="timeout-applied"),
    pytest.param(FaultKind.SERVER_ERROR, True, id="5xx-applied"),
]


def _collectable() -> tuple[World, str, str, str]:
    w = world()
    done = _acked(w, BIG)
    w.put(keys.payload_key(os.urandom(16), os.urandom(32)), b"orphan")
    w.advance(121 * SECOND)
    waiting = w.q.enqueue(b"still waiting")
    delayed = w.q.enqueue(b"later", delay=3600)
    return w, done, waiting, delayed


@pytest.mark.parametrize(("kind", "applied"), FAULTS)
def test_a_fault_at_every_store_call_of_gc_is_repaired_by_the_next_pass(kind: FaultKind, applied: bool) -> None:
    n = 1
    while True:
        w, done, waiting, delayed = _collectable()
        sweeper = w.handle("sweeper")
        fault = w.store.inject(Fault(kind, nth=n, applied=applied))
        first = sweeper.recover(phases=GC)
        w.store.clear()
        # Never resurrected: a job record is left only together with its tombstone.
        shard, raw = w.shard(done), bytes.fromhex(done)
        if keys.job_key(shard, raw) in w.keys():
            assert keys.receipt_key(shard, raw) in w.keys()
        reports = [first, *drain_recovery(sweeper, phases=GC)]
        assert _job_keys(w, done) == [], f"call {n}: the interrupted collection did not complete"
        assert total(reports, "receipts_deleted") <= 1
        assert w.keys("payloads/") == []
        states = audit(w.q, w.memory)
        assert states == {bytes.fromhex(waiting): "open", bytes.fromhex(delayed): "open"}, f"call {n}"
        w.advance(2 * 3600 * SECOND)
        drain(w.q, w.clock, step_ns=int(LEASE_S * SECOND))
        assert set(audit(w.q, w.memory).values()) == {"receipt"}
        if not fault.fired:
            break
        n += 1
    assert n > 10, "GC made fewer store calls than a graph has objects"


def test_a_graph_whose_terminal_record_is_corrupt_is_left_for_the_repair_scan() -> None:
    w = world()
    job = _acked(w)
    shard, raw = w.shard(job), bytes.fromhex(job)
    receipt = keys.receipt_key(shard, raw)
    w.delete(receipt)
    w.put(receipt, b"not a receipt")
    w.advance(121 * SECOND)
    before = _job_keys(w, job)
    assert w.q.recover(phases=GC).receipts_deleted == 0
    assert _job_keys(w, job) == before and w.keys("quarantine/") == []
    # the repair scan lists a few pages a pass: its cycle over the four shards takes several
    assert sum(w.q.recover(phases=("repair",)).quarantined for _ in range(8)) == 1
