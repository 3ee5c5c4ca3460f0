"""The repair scan and fsck of bucket queues on the memory store: lost index entries, findings, the cursor."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from steadqd.constants import DeadReason
from steadqd.errors import InvalidInput, NotCommitted, OutcomeUnknown
from steadqd.s3 import keys
from steadqd.s3.claim import settle_dead
from steadqd.s3.fsck import FsckReport
from steadqd.s3.layout import DEFAULT_FORMAT
from steadqd.s3.records import ClaimBasis, ClaimRecord, QuarantineReason, QuarantineRecord
from steadqd.s3.recovery.repair import (
    REPAIR_CURSOR_KEY,
    Cursor,
    Finding,
    decode_cursor,
    encode_cursor,
    read_cursor,
    repair_step,
)
from steadqd.s3.store.faults import Fault, FaultKind
from steadqd.s3.verify import read_record
from tests.stowq.protocol_audit import audit, drain
from tests.stowq.recovery_world import HOUR, LEASE_S, SECOND, World, world

BIG = b"d" * 70_000


def _findings(report: FsckReport, kind: str) -> list[Finding]:
    return [f for f in report.findings if f.finding_type == kind]


def _quarantine(w: World) -> list[QuarantineRecord]:
    out = []
    for rel in w.keys("quarantine/"):
        body = w.memory.get("q/" + rel).body
        record = read_record(body, w.q.layout.queue_id, rel, required_feature_bits=1)
        assert isinstance(record, QuarantineRecord)
        out.append(record)
    return out


def _busy_queue() -> tuple[World, dict[str, str]]:
    """One job in each state that has an index entry: delayed, leased, nacked, done, dead."""
    w = world()
    jobs = {"delayed": w.q.enqueue(b"later", delay=3600)}
    jobs["leased"] = w.q.enqueue(b"held")
    jobs["nacked"] = w.q.enqueue(b"again")
    jobs["done"] = w.q.enqueue(b"done")
    jobs["dead"] = w.q.enqueue(b"dead")
    by_id = {v: k for k, v in jobs.items()}
    for _ in range(4):
        lease = w.q.lease(duration=600)
        assert lease is not None
        state = by_id[lease.job_id]
        if state == "nacked":
            w.q.retry(lease, delay=1800)
        elif state == "done":
            w.q.ack(lease)
        elif state == "dead":
            w.q.bury(lease)
    return w, jobs


def test_a_healthy_queue_has_no_findings() -> None:
    w, _ = _busy_queue()
    report = w.q.fsck()
    assert report.findings == [] and report.exit_code == 0
    assert report.total_objects == len(w.keys()) and report.structurally_verified >= 12


def test_index_entries_deleted_by_hand_are_reported_then_regenerated() -> None:
    w, jobs = _busy_queue()
    planes = ("delayed/", "leases/", "termidx/")
    before = {p: w.keys(p) for p in planes}
    assert len(before["delayed/"]) == 2 and len(before["termidx/"]) == 2 and before["leases/"]
    for plane in planes:
        for rel in before[plane]:
            w.delete(rel)
    # settled jobs' lease entries are the sweep's to prune, and are not regenerated
    settled = (jobs["done"], jobs["dead"])
    before["leases/"] = [k for k in before["leases/"] if not any(j in k for j in settled)]
    check = w.q.fsck()
    assert sorted(f.path for f in _findings(check, "index_missing")) == sorted(sum(before.values(), []))
    assert check.exit_code == 0, "a missing advisory entry is a warning"
    assert all(w.keys(p) == [] for p in planes), "fsck without --repair writes nothing"
    repaired = w.q.fsck(repair=True)
    assert repaired.indexes_regenerated == len(sum(before.values(), []))
    # the lease entries of live tails, both delayed entries and both terminal entries are back
    assert {p: w.keys(p) for p in planes} == before
    assert len(before["leases/"]) == 2, "the leased job's and the nacked job's tails"
    assert w.q.fsck().findings == []


def test_the_recovery_pass_regenerates_through_its_cursor() -> None:
    w, _ = _busy_queue()
    for rel in w.keys("termidx/"):
        w.delete(rel)
    reports = [w.q.recover(phases=("repair",)) for _ in range(12)]
    assert sum(r.indexes_regenerated for r in reports) == 2 and len(w.keys("termidx/")) == 2
    cursor, etag = read_cursor(w.q.layout)
    assert etag is not None and cursor.cycle == 1 and cursor.at_start and cursor.completed_ns
    # A finished cycle starts again only after the interval.
    w.delete(w.keys("termidx/")[0])
    assert w.q.recover(phases=("repair",)).indexes_regenerated == 0
    w.advance(HOUR + SECOND)
    again = [w.q.recover(phases=("repair",)) for _ in range(12)]
    assert sum(r.indexes_regenerated for r in again) == 1


def test_a_receipt_and_dead_pair_is_quarantined_once_as_the_reference_names_it() -> None:
    w = world()
    job = w.q.enqueue(b"p")
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None
    w.q.ack(lease)
    shard, raw = w.shard(job), bytes.fromhex(job)
    settle_dead(w.q.layout, shard, raw, 1, 1, DeadReason.CONSUMER_REJECTED, w.q.wall_floor_ns())
    report = w.q.fsck(repair=True)
    assert report.exit_code == 3 and report.quarantined == 1
    [finding] = _quarantine(w)
    receipt_rel = keys.receipt_key(shard, raw)
    receipt_time = w.memory.head("q/" + receipt_rel).store_time_ns
    assert (finding.reason, finding.source_key, finding.observed_store_ns) == (
        QuarantineReason.DUPLICATE_STATE_CONFLICT,
        receipt_rel,
        receipt_time,
    )
    assert w.keys("quarantine/") == [
        keys.quarantine_key_for(
            w.q.layout.queue_id, receipt_rel, 0x0007, receipt_time, w.q.layout.format.terminal_bucket_width_ns
        )
    ]
    assert w.q.fsck(repair=True).quarantined == 0, "a finding that recurs is not recorded again"
    assert len(w.keys("quarantine/")) == 1


def test_a_v1_queue_gets_findings_reported_and_nothing_written() -> None:
    w = world(replace(DEFAULT_FORMAT, required_feature_bits=0))
    job = w.q.enqueue(b"p")
    shard, raw = w.shard(job), bytes.fromhex(job)
    junk = os.urandom(16)
    w.put(keys.job_key(w.shard(junk.hex()), junk), b"not a record")
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None and lease.job_id == job
    w.q.ack(lease)
    settle_dead(w.q.layout, shard, raw, 1, 1, DeadReason.CONSUMER_REJECTED, w.q.wall_floor_ns())
    report = w.q.fsck(repair=True)
    assert {f.finding_type for f in report.errors} == {"record_corrupt", "duplicate_state_conflict"}
    assert report.quarantined == 0 and w.keys("quarantine/") == []


def test_grammar_corruption_tag_gaps_evidence_and_missing_payloads_are_each_flagged() -> None:
    w = world()
    layout = w.q.layout
    shard0 = "jobs/0000/"
    w.put(shard0 + "not-a-job-id")  # grammar
    w.put("stray/object")  # grammar, outside every plane
    good = w.q.enqueue(b"p")
    shard, raw = w.shard(good), bytes.fromhex(good)
    body = w.memory.get("q/" + keys.job_key(shard, raw)).body
    copied = os.urandom(16)
    w.put(keys.job_key(w.shard(copied.hex()), copied), body)  # a record copied to another key: key tag
    w.q.enqueue(BIG)
    [payload] = w.keys("payloads/")
    w.delete(payload)  # a referenced payload gone
    renewed = w.q.enqueue(b"r")
    lease = w.q.lease(duration=600)
    while lease is not None and lease.job_id != renewed:
        lease = w.q.lease(duration=600)
    assert lease is not None
    w.q.renew(lease, duration=600)
    r_shard, r_raw = w.shard(renewed), bytes.fromhex(renewed)
    w.delete(keys.claim_key(r_shard, r_raw, 1))  # a head gap
    forged = ClaimRecord(
        job_id=r_raw,
        generation=3,
        attempt=2,
        worker_id="thief",
        worker_token=os.urandom(16),
        lease_duration_ns=600 * SECOND,
        continuation=False,
        basis=ClaimBasis(prev_store_time_ns=1, prev_duration_ns=2, observed_watermark_ns=3),
    )
    forged_rel = keys.claim_key(r_shard, r_raw, 3)
    w.put(forged_rel, layout.encode(forged_rel, forged))  # a takeover whose basis proves nothing
    report = w.q.fsck(repair=True)
    found = {(f.finding_type, f.path) for f in report.errors}
    assert ("key_grammar", shard0 + "not-a-job-id") in found
    assert ("key_grammar", "stray/object") in found
    assert ("record_corrupt", keys.job_key(w.shard(copied.hex()), copied)) in found
    assert ("payload_missing", payload) in found
    assert ("chain_gap", keys.claim_key(r_shard, r_raw, 2)) in found
    assert ("inadmissible_claim", forged_rel) in found
    reasons = {q.source_key: q.reason for q in _quarantine(w)}
    assert reasons[keys.job_key(w.shard(copied.hex()), copied)] == QuarantineReason.KEY_TAG_FAILED
    assert reasons[payload] == QuarantineReason.ORPHAN_REFERENCED_PAYLOAD_MISSING
    assert reasons[forged_rel] == QuarantineReason.INADMISSIBLE_CLAIM
    assert reasons[shard0 + "not-a-job-id"] == QuarantineReason.KEY_PARSE_FAILED
    assert report.exit_code == 3


def test_deep_fsck_reads_every_payload() -> None:
    w = world()
    w.q.enqueue(BIG)
    w.q.enqueue(b"small")
    assert w.q.fsck().payloads_deep_verified == 0
    assert w.q.fsck(deep=True).payloads_deep_verified == 2


def test_the_cursor_round_trips_and_a_bad_one_is_replaced() -> None:
    cursor = Cursor(cycle=3, shard=2, plane="claims", after="claims/0002/" + "ab" * 16 + "/00000001", completed_ns=9)
    assert decode_cursor(encode_cursor(cursor), 4) == cursor
    for bad in (b"", b"\xa0", encode_cursor(replace(cursor, shard=7)), encode_cursor(replace(cursor, plane="x"))):
        with pytest.raises(InvalidInput, match=REPAIR_CURSOR_KEY):
            decode_cursor(bad, 4)
    w = world()
    w.put(REPAIR_CURSOR_KEY, b"junk")
    assert read_cursor(w.q.layout)[0] == Cursor()
    step = repair_step(w.q.layout, w.q.layout, w.q.wall_floor_ns(), max_pages=100)
    assert step.cycle_done and read_cursor(w.q.layout)[0].cycle == 1


def test_two_repairers_interleaved_page_by_page_both_finish_and_agree() -> None:
    w, _ = _busy_queue()
    for rel in w.keys("termidx/") + w.keys("delayed/"):
        w.delete(rel)
    a, b = w.q.layout, w.handle("r2").layout
    floor = w.q.wall_floor_ns()
    done = 0
    for _ in range(200):
        for layout in (a, b):
            done += repair_step(layout, layout, floor, max_pages=1, only_if_due=False).scan.regenerated
        if read_cursor(a)[0].cycle >= 2:
            break
    assert len(w.keys("termidx/")) == 2 and len(w.keys("delayed/")) == 2
    assert done == 4, "every lost entry regenerated exactly once (the second repairer found it there)"


@pytest.mark.parametrize("kind", [FaultKind.BEFORE_SEND, FaultKind.TIMEOUT], ids=["before-send", "timeout"])
def test_a_fault_at_every_store_call_of_the_repair_scan_is_harmless(kind: FaultKind) -> None:
    n = 1
    while True:
        w, jobs = _busy_queue()
        for rel in w.keys("termidx/") + w.keys("leases/"):
            w.delete(rel)
        fault = w.store.inject(Fault(kind, nth=n, applied=kind is FaultKind.TIMEOUT))
        try:
            w.q.fsck(repair=True)
        except (NotCommitted, OutcomeUnknown):
            pass  # a read that failed three times ends fsck; the command reports it
        w.store.clear()
        w.q.fsck(repair=True)
        assert w.q.fsck().findings == [], f"call {n}"
        assert _quarantine(w) == [], f"call {n}: a fault is never a finding"
        audit(w.q, w.memory)
        w.advance(2 * HOUR)
        drain(w.q, w.clock, step_ns=int(LEASE_S * SECOND))
        assert set(audit(w.q, w.memory).values()) == {"receipt", "dead"}
        if not fault.fired:
            break
        n += 1
    assert n > 20 and len(jobs) == 5
