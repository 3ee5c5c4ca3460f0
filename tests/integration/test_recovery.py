"""The recovery pass (recovery.md) against a real queue tree.

Every test builds the on-disk situation recovery exists for (expired or
orphaned leases, due delayed jobs, abandoned temps, full receipts, receipts
past retention, corrupt objects), runs a pass and then checks the *tree*:
which names exist where, with which generation/attempt/reason, and that they
still authenticate, because other implementations only ever see the tree.
Time is moved with ``now_boottime`` (boottime) and by publishing a later wall
watermark (wall floor), so no test depends on sleeping except the one that
checks the real clock path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from steadqd import (
    AckResult,
    ErrorKind,
    LeaseLost,
    NotCommitted,
    Queue,
    State,
)
from steadqd.fs import linux, names
from steadqd.fs.json_records import reset_cursor_json, validate_cursor
from steadqd.fs.names import JobName
from steadqd.fs.receipt import verify_receipt
from steadqd.fs.records import CompactReceipt, Watermark
from steadqd.fs.recovery import RecoveryReport, run_recovery
from steadqd.fs.watermark import publish_watermark, read_watermark

SHARDS = 4
SEC = 1_000_000_000
OTHER_BOOT = bytes.fromhex("0123456789abcdef0123456789abcdef")
BIG_BUDGET = {"budget_ops": 100_000, "budget_ms": 60_000}


# --------------------------------------------------------------------------- fixtures and helpers


# The root queue_path and queue (tests/conftest.py), under this module's short names.
@pytest.fixture
def qpath(queue_path: str) -> str:
    return queue_path


@pytest.fixture
def q(queue: Queue) -> Queue:
    return queue


def recover(queue: Queue, **kwargs: int) -> RecoveryReport:
    """One pass with a budget large enough never to interfere (unless overridden)."""
    args = {**BIG_BUDGET, **kwargs}
    return run_recovery(queue._ctx, **args)


def no_errors(report: RecoveryReport) -> None:
    assert report.errors == [], report.errors


def files_under(root: str, top: str) -> list[str]:
    """Relative paths of every non-directory below ``root/top``, sorted."""
    out = []
    for dirpath, _dirs, filenames in os.walk(os.path.join(root, top)):
        for f in filenames:
            out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def objects_of(root: str, job_hex: str) -> list[str]:
    """Every path (outside quarantine) whose name starts with the job id."""
    return [
        p
        for top in ("ready", "leased", "delayed", "dead", "receipts")
        for p in files_under(root, top)
        if os.path.basename(p).startswith(job_hex)
    ]


def only_object(root: str, job_hex: str) -> str:
    found = objects_of(root, job_hex)
    assert len(found) == 1, found
    return found[0]


def authentic(queue: Queue, rel: str, state: State) -> JobName:
    """Parse a path's name for ``state`` and check its tag against the directory it is in."""
    parts = rel.split("/")
    jn = names.parse_name(state, parts[-1])
    shard = int(parts[-2], 16)
    bucket = None if state in (State.READY, State.LEASED) else int(parts[-3], 16)
    fmt = queue.format
    assert names.authenticate(fmt.queue_id, jn, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns), rel
    assert names.shard_of(fmt.queue_id, jn.job_id, fmt.shard_count) == shard
    return jn


def craft_lease(
    queue: Queue,
    *,
    boot: bytes,
    deadline: int,
    legacy: bool = False,
    max_attempts: int = 3,
    attempt: int = 1,
    payload: bytes = b"job",
) -> tuple[str, str, JobName]:
    """Turn a fresh ready job into a leased file as a (possibly other-boot,
    possibly legacy-layout) claimer would have left it. Returns (job, rel, name)."""
    job, rel = queue.enqueue_detailed(payload, max_attempts=max_attempts)
    _, shard_s, fname = rel.split("/")
    shard = int(shard_s, 16)
    ready = names.parse_name(State.READY, fname)
    fmt = queue.format
    ln = names.leased_name(
        ready.job_id,
        ready.generation + 1,
        attempt,
        max_attempts,
        boot_id=boot,
        boottime_deadline=deadline,
        wall_deadline=queue.wall_floor_ns() + 30 * SEC,
        lease_token=os.urandom(16),
    )
    leased_file = names.make_filename(fmt.queue_id, ln, shard=shard, lease_width_ns=fmt.lease_width_ns)
    if legacy:
        bucket = names.lease_bucket(deadline, fmt.lease_width_ns)
        dest = f"leased/{names.boot_dashed(boot)}/{bucket:016x}/{shard_s}"
        os.makedirs(os.path.join(queue.path, dest), exist_ok=True)
    else:
        dest = f"ready/{shard_s}"
    new_rel = f"{dest}/{leased_file}"
    os.rename(os.path.join(queue.path, rel), os.path.join(queue.path, new_rel))
    return job, new_rel, names.parse_name(State.LEASED, leased_file)


def flip_byte(root: str, rel: str, offset: int) -> None:
    p = Path(root, rel)
    data = bytearray(p.read_bytes())
    data[offset] ^= 0xFF
    p.write_bytes(bytes(data))


def control_fd(root: str) -> int:
    return os.open(os.path.join(root, "control"), os.O_RDONLY | os.O_DIRECTORY)


def advance_watermark_to(root: str, bucket: int) -> None:
    """Publish a watermark: the wall floor of any fresh handle becomes at least
    ``bucket × delayed_width`` (the situation after a clock was set back)."""
    fd = control_fd(root)
    try:
        old = read_watermark(fd)
        publish_watermark(fd, Watermark(bucket=bucket, sequence=old.sequence + 1), ".wm.adv.")
    finally:
        os.close(fd)


def quarantine_reasons(root: str) -> list[int]:
    out = []
    for f in os.listdir(os.path.join(root, "quarantine")):
        parsed = names.parse_quarantine_name(f)
        assert parsed is not None, f
        out.append(parsed[1])
    return sorted(out)


def cursor_bytes(root: str) -> bytes:
    return Path(root, "control", "recovery-cursor.json").read_bytes()


# =========================================================================== phase 1: leases


def test_expired_lease_is_reaped_to_ready_exactly_at_its_deadline(q: Queue, qpath: str) -> None:
    job = q.enqueue(b"work")
    lease = q.lease(duration=1)
    assert lease is not None
    before = recover(q, now_boottime=lease.boottime_deadline_ns - 1)
    no_errors(before)
    assert before.leases_reaped == 0 and only_object(qpath, job) == lease.path

    report = recover(q, now_boottime=lease.boottime_deadline_ns)
    no_errors(report)
    assert (report.leases_reaped, report.leases_to_dead, report.quarantined) == (1, 0, 0)
    rel = only_object(qpath, job)
    assert rel.startswith(f"ready/{rel.split('/')[1]}/") and rel.split("/")[1] == lease.path.split("/")[1]
    jn = authentic(q, rel, State.READY)
    assert (jn.generation, jn.attempt, jn.max_attempts) == (lease.generation + 1, lease.attempt, 3)
    # The reaped lease is void; the job is claimable again with the next attempt.
    with pytest.raises(LeaseLost):
        q.ack(lease)
    again = q.lease()
    assert again is not None and again.job_id == job and again.attempt == lease.attempt + 1
    assert again.payload() == b"work"


def test_expired_lease_is_reaped_with_the_real_clock(q: Queue, qpath: str) -> None:
    job = q.enqueue(b"x")
    lease = q.lease(duration=1)
    assert lease is not None
    while linux.boottime_ns() <= lease.boottime_deadline_ns:
        time.sleep(0.05)
    report = q.recover()
    no_errors(report)
    assert report.leases_reaped == 1
    assert only_object(qpath, job).startswith("ready/")


def test_exhausted_expired_lease_goes_to_dead_with_reason_4(q: Queue, qpath: str) -> None:
    job = q.enqueue(b"last try", max_attempts=1)
    lease = q.lease(duration=1)
    assert lease is not None and lease.attempt == 1
    report = recover(q, now_boottime=lease.boottime_deadline_ns + 1)
    no_errors(report)
    assert (report.leases_reaped, report.leases_to_dead) == (0, 1)
    rel = only_object(qpath, job)
    assert rel.startswith("dead/")
    jn = authentic(q, rel, State.DEAD)
    assert (jn.generation, jn.attempt, jn.max_attempts, jn.reason) == (lease.generation + 1, 1, 1, 4)
    bucket = int(rel.split("/")[1], 16)
    assert bucket == names.terminal_bucket(q.wall_floor_ns(), q.format.terminal_width_ns)


def test_previous_boot_lease_is_reaped_immediately_running_lease_is_not(q: Queue, qpath: str) -> None:
    # A lease of another boot is due whatever its deadline says.
    old_job, old_rel, old_name = craft_lease(q, boot=OTHER_BOOT, deadline=(1 << 63))
    running = q.enqueue(b"running")
    lease = q.lease(duration=3600)
    assert lease is not None and lease.job_id == running
    report = recover(q)
    no_errors(report)
    assert report.leases_reaped == 1
    rel = only_object(qpath, old_job)
    jn = authentic(q, rel, State.READY)
    assert (jn.generation, jn.attempt) == (old_name.generation + 1, old_name.attempt)
    assert only_object(qpath, lease.job_id) == lease.path  # the running lease is untouched
    assert q.ack(lease) is AckResult.ACKED


def test_legacy_leased_tree_is_reaped_and_its_directories_kept(q: Queue, qpath: str) -> None:
    width = q.format.lease_width_ns
    now = (linux.boottime_ns() // width) * width + width // 2  # mid-bucket: now ± 1 share the bucket
    me = names.boot_raw(q.boot_id)
    other_job, other_rel, other_name = craft_lease(q, boot=OTHER_BOOT, deadline=now + 3600 * SEC, legacy=True)
    expired_job, expired_rel, _ = craft_lease(q, boot=me, deadline=now, legacy=True)
    running_job, running_rel, _ = craft_lease(q, boot=me, deadline=now + 1, legacy=True)  # same bucket
    future_job, future_rel, _ = craft_lease(q, boot=me, deadline=now + 3600 * SEC, legacy=True)
    assert expired_rel.split("/")[2] == running_rel.split("/")[2]  # same legacy bucket directory
    report = recover(q, now_boottime=now)
    no_errors(report)
    assert report.leases_reaped == 2
    assert only_object(qpath, running_job) == running_rel
    for job, old in ((other_job, other_name), (expired_job, None)):
        rel = only_object(qpath, job)
        jn = authentic(q, rel, State.READY)
        if old is not None:
            assert (jn.generation, jn.attempt) == (old.generation + 1, old.attempt)
    assert only_object(qpath, future_job) == future_rel
    # Empty legacy directories are never removed.
    assert os.path.isdir(os.path.join(qpath, os.path.dirname(other_rel)))
    assert os.listdir(os.path.join(qpath, os.path.dirname(other_rel))) == []


def test_corrupt_legacy_objects_are_quarantined_with_their_reason(q: Queue, qpath: str) -> None:
    now = linux.boottime_ns()
    _, good_rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=now, legacy=True)
    shard_dir = os.path.join(qpath, os.path.dirname(good_rel))
    # 1. an unparseable .sqj name: 0x0003
    Path(shard_dir, "garbage.sqj").write_bytes(b"not a job")
    # 2. a parseable, authentic name over a corrupt envelope: 0x0001
    bad_job, bad_rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=now, legacy=True)
    flip_byte(qpath, bad_rel, 60)  # created_at: the envelope digest no longer matches
    bad_bytes = Path(qpath, bad_rel).read_bytes()
    # 3. an authentic name in the wrong bucket directory: 0x0001 (structural validation)
    moved_job, moved_rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=now, legacy=True)
    wrong_dir = os.path.join(qpath, "leased", names.boot_dashed(OTHER_BOOT), "0" * 16, moved_rel.split("/")[-2])
    os.makedirs(wrong_dir)
    os.rename(os.path.join(qpath, moved_rel), os.path.join(wrong_dir, os.path.basename(moved_rel)))
    # 4. an authentic name filed under another boot's directory: 0x0001
    stray_job, stray_rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=now, legacy=True)
    third_boot = "fedcba98-7654-3210-fedc-ba9876543210"
    stray_dir = os.path.join(qpath, "leased", third_boot, *stray_rel.split("/")[2:4])
    os.makedirs(stray_dir)
    os.rename(os.path.join(qpath, stray_rel), os.path.join(stray_dir, os.path.basename(stray_rel)))
    # 5. anything that is not *.sqj is left alone
    Path(shard_dir, "notes.txt").write_text("hello")

    report = recover(q, now_boottime=now)
    no_errors(report)
    assert report.leases_reaped == 1 and report.quarantined == 4
    assert quarantine_reasons(qpath) == [0x0001, 0x0001, 0x0001, 0x0003]
    assert objects_of(qpath, bad_job) == [] and objects_of(qpath, moved_job) == []
    assert objects_of(qpath, stray_job) == []
    assert os.listdir(shard_dir) == ["notes.txt"]
    by_origin = {origin: (reason, qname) for origin, reason, qname in report.quarantined_objects}
    reason, qname = by_origin[bad_rel]
    assert reason == 1 and Path(qpath, "quarantine", qname).read_bytes() == bad_bytes  # bytes unchanged


def test_colocated_corrupt_or_unauthentic_leases_are_quarantined(q: Queue, qpath: str) -> None:
    """Our deliberate difference to the reference (open-questions B12): not skipped forever."""
    bad_job, bad_rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=1)
    flip_byte(qpath, bad_rel, 60)
    # A running-looking lease whose tag does not authenticate: no holder can own it.
    forged_job, forged_rel, forged = craft_lease(q, boot=names.boot_raw(q.boot_id), deadline=(1 << 63))
    forged_name = names.format_name(forged, b"\x00" * 8)
    os.rename(os.path.join(qpath, forged_rel), os.path.join(qpath, os.path.dirname(forged_rel), forged_name))
    report = recover(q)
    no_errors(report)
    assert (report.quarantined, report.leases_reaped) == (2, 0)
    assert quarantine_reasons(qpath) == [0x0001, 0x0004]
    assert objects_of(qpath, bad_job) == [] and objects_of(qpath, forged_job) == []


# =========================================================================== phase 2: delayed


def test_delayed_job_is_promoted_only_when_its_bucket_is_due(qpath: str) -> None:
    width = SEC
    with Queue.init(qpath, shards=SHARDS, delayed_width_ns=width) as q:
        job, rel = q.enqueue_detailed(b"later", delay=60)
        jn = authentic(q, rel, State.DELAYED)
        assert jn.not_before is not None
        due_bucket = names.delayed_bucket(jn.not_before, width)
        assert int(rel.split("/")[1], 16) == due_bucket
        r0 = recover(q)
        no_errors(r0)
        assert r0.delayed_promoted == 0 and only_object(qpath, job) == rel
    # The wall floor one bucket before the job's bucket: still not eligible.
    advance_watermark_to(qpath, due_bucket - 1)
    with Queue.open(qpath) as q:
        assert q.wall_floor_ns() >= (due_bucket - 1) * width
        r1 = recover(q)
        no_errors(r1)
        assert r1.wall_floor_available and r1.delayed_promoted == 0 and only_object(qpath, job) == rel
    # The floor reaches bucket × width (≥ not_before by the ceiling): promoted.
    advance_watermark_to(qpath, due_bucket)
    with Queue.open(qpath) as q:
        r2 = recover(q)
        no_errors(r2)
        assert r2.delayed_promoted == 1
        new_rel = only_object(qpath, job)
        ready = authentic(q, new_rel, State.READY)
        assert (ready.generation, ready.attempt) == (jn.generation + 1, jn.attempt)
        lease = q.lease()
        assert lease is not None and lease.job_id == job and lease.payload() == b"later"


def test_after_a_clock_rollback_the_watermark_still_gates_delivery(qpath: str) -> None:
    """The watermark is ahead of CLOCK_REALTIME (the clock was set back): the
    floor, not the raw clock, decides, so a job delayed relative to that floor
    is not delivered early and the pass does not go back in time. An hour is
    more than max_clock_skew, so the pass also warns (test_clock_skew.py)."""
    width = SEC
    with Queue.init(qpath, shards=SHARDS, delayed_width_ns=width):
        pass
    ahead = (linux.realtime_ns() + 3600 * SEC) // width
    advance_watermark_to(qpath, ahead)
    with Queue.open(qpath) as q:
        job, rel = q.enqueue_detailed(b"x", delay=5)
        jn = names.parse_name(State.DELAYED, rel.split("/")[-1])
        assert jn.not_before is not None and jn.not_before >= ahead * width + 5 * SEC
        report = recover(q)
        assert [code for code, _ in report.errors] == ["clock_skew"], report.errors
        assert report.delayed_promoted == 0 and only_object(qpath, job) == rel
        assert q.wall_floor_ns() >= ahead * width


def test_corrupt_delayed_objects_are_quarantined_only_once_due(q: Queue, qpath: str) -> None:
    width = q.format.delayed_width_ns
    good, good_rel = q.enqueue_detailed(b"good", delay=60)
    bad, bad_rel = q.enqueue_detailed(b"bad", delay=60)
    flip_byte(qpath, bad_rel, 60)
    # An authentic delayed name placed in a bucket that does not match its not_before.
    misplaced, mis_rel = q.enqueue_detailed(b"misplaced", delay=60)
    jn = names.parse_name(State.DELAYED, mis_rel.split("/")[-1])
    assert jn.not_before is not None
    wrong_bucket = names.delayed_bucket(jn.not_before, width) - 1
    wrong_name = names.make_filename(
        q.format.queue_id,
        jn,
        shard=int(mis_rel.split("/")[2], 16),
        bucket=wrong_bucket,
        lease_width_ns=q.format.lease_width_ns,
    )
    wrong_dir = os.path.join(qpath, "delayed", f"{wrong_bucket:016x}", mis_rel.split("/")[2])
    os.makedirs(wrong_dir)
    os.rename(os.path.join(qpath, mis_rel), os.path.join(wrong_dir, wrong_name))
    r0 = recover(q)
    no_errors(r0)
    assert (r0.quarantined, r0.delayed_promoted) == (0, 0)  # nothing due yet: not even looked at
    advance_watermark_to(qpath, names.delayed_bucket(jn.not_before, width) + 1)
    with Queue.open(qpath) as q2:
        r1 = recover(q2)
    no_errors(r1)
    assert (r1.quarantined, r1.delayed_promoted) == (2, 1)
    assert quarantine_reasons(qpath) == [0x0001, 0x0001]
    assert only_object(qpath, good).startswith("ready/")
    assert objects_of(qpath, bad) == [] and objects_of(qpath, misplaced) == []


def test_without_a_wall_floor_only_wall_free_actions_run(q: Queue, qpath: str) -> None:
    delayed = q.enqueue(b"d", delay=30)
    exhausted = q.enqueue(b"e", max_attempts=1)
    l1 = q.lease(duration=1)
    assert l1 is not None
    fresh = q.enqueue(b"f")
    l2 = q.lease(duration=1)
    assert l2 is not None
    lease_exhausted, lease_fresh = (l1, l2) if l1.job_id == exhausted else (l2, l1)
    assert lease_fresh.job_id == fresh
    advance_watermark_to(qpath, (linux.realtime_ns() + 60 * SEC) // q.format.delayed_width_ns)
    wm = Path(qpath, "control", "wall-watermark")
    good = wm.read_bytes()
    wm.write_bytes(b"\0" * 64)  # the floor can no longer be authenticated
    try:
        with Queue.open(qpath) as q2:
            deadline = max(l1.boottime_deadline_ns, l2.boottime_deadline_ns)
            report = recover(q2, now_boottime=deadline)
            codes = [c for c, _ in report.errors]
            assert codes[0] == "wall_floor" and "reap_to_dead_no_wall_floor" in codes
            assert not report.wall_floor_available
            assert (report.leases_reaped, report.leases_to_dead, report.delayed_promoted) == (1, 0, 0)
            assert q2.poisoned is None  # recovery never poisons
    finally:
        wm.write_bytes(good)
    assert only_object(qpath, fresh).startswith("ready/")
    assert only_object(qpath, exhausted) == lease_exhausted.path
    assert only_object(qpath, delayed).startswith("delayed/")


# =========================================================================== phase 3: temps


def test_temp_cleanup_rules(qpath: str) -> None:
    ttl_s = 5
    with Queue.init(qpath, shards=SHARDS, temp_ttl=ttl_s) as q:
        me, other = q.boot_id, names.boot_dashed(OTHER_BOOT)
        created = 1_000 * SEC
        old = names.make_temp_name(created, os.urandom(16))
        young = names.make_temp_name(created + 1, os.urandom(16))
        layout = {
            f"tmp/{other}/0000/{names.make_temp_name(0, os.urandom(16))}": False,
            f"tmp/{other}/0001/whatever.tmp": False,  # other boot: any *.tmp goes
            f"tmp/{other}/0001/keep.dat": True,  # not *.tmp
            f"tmp/{me}/0002/{old}": False,  # age ttl + 1 ns
            f"tmp/{me}/0002/{young}": True,  # age exactly ttl
            f"tmp/{me}/0002/junk.tmp": True,  # current boot, unparseable: kept
            "tmp/doctor-probe.tmp": True,  # directly in tmp/: never touched
            "tmp/not-a-boot/0000/x.tmp": True,  # not a canonical boot directory
        }
        for rel in layout:
            os.makedirs(os.path.join(qpath, os.path.dirname(rel)), exist_ok=True)
            Path(qpath, rel).write_bytes(b"partial")
        report = recover(q, now_boottime=created + ttl_s * SEC + 1)
        no_errors(report)
        assert report.temp_files_deleted == 3
        for rel, kept in layout.items():
            assert os.path.exists(os.path.join(qpath, rel)) == kept, rel
        assert os.path.isdir(os.path.join(qpath, f"tmp/{other}/0000"))  # directories stay


# =========================================================================== phase 4: compaction


def _ack_one(q: Queue, payload: bytes) -> tuple[str, object]:
    q.enqueue(payload)
    lease = q.lease()
    assert lease is not None
    assert q.ack(lease) is AckResult.ACKED
    return lease.job_id, lease


def test_full_receipt_is_compacted_in_place_and_duplicate_ack_still_recognised(q: Queue, qpath: str) -> None:
    payload = b"payload " * 1000
    job, lease = _ack_one(q, payload)
    rel = only_object(qpath, job)
    assert rel.startswith("receipts/") and os.path.getsize(os.path.join(qpath, rel)) > 128
    stale = os.path.join(qpath, os.path.dirname(rel), names.make_compact_temp_name(os.urandom(16)))
    Path(stale).write_bytes(b"half a record")

    report = recover(q)
    no_errors(report)
    assert report.receipts_compacted == 1 and report.temp_files_deleted == 1
    assert not os.path.exists(stale)
    assert only_object(qpath, rel.split("/")[-1][:32]) == rel  # same path, same name (same tag)
    data = Path(qpath, rel).read_bytes()
    assert len(data) == 128
    record = CompactReceipt.decode(data)
    jn = authentic(q, rel, State.RECEIPT)
    bucket, shard = int(rel.split("/")[1], 16), int(rel.split("/")[2], 16)
    assert record.job_id == jn.job_id and record.lease_token == jn.lease_token == lease.token
    assert record.final_attempt == jn.attempt == lease.attempt
    assert record.bucket_start_ns == bucket * q.format.terminal_width_ns
    assert record.payload_length == len(payload) and record.envelope_digest == lease.envelope_digest
    fd = os.open(os.path.join(qpath, rel), os.O_RDONLY)
    try:
        info = verify_receipt(q.format, fd, rel.split("/")[-1], bucket, shard)
    finally:
        os.close(fd)
    assert info.compact
    assert q.ack(lease) is AckResult.ALREADY_ACKED
    again = recover(q)
    no_errors(again)
    assert again.receipts_compacted == 0 and Path(qpath, rel).read_bytes() == data


def test_invalid_or_locked_receipts_are_not_compacted(q: Queue, qpath: str) -> None:
    bad_job, _ = _ack_one(q, b"will be corrupted")
    busy_job, _ = _ack_one(q, b"held by fsck")
    bad_rel, busy_rel = only_object(qpath, bad_job), only_object(qpath, busy_job)
    flip_byte(qpath, bad_rel, os.path.getsize(os.path.join(qpath, bad_rel)) - 1)  # payload byte
    bad_bytes = Path(qpath, bad_rel).read_bytes()
    holder = os.open(os.path.join(qpath, busy_rel), os.O_RDWR)
    try:
        assert linux.ofd_lock(holder, exclusive=True)
        report = recover(q)
        assert [c for c, _ in report.errors] == ["receipt_compact_invalid"]
        assert report.receipts_compacted == 0 and report.quarantined == 0
        assert Path(qpath, bad_rel).read_bytes() == bad_bytes  # kept as it was
        assert os.path.getsize(os.path.join(qpath, busy_rel)) > 128  # busy: skipped silently
    finally:
        os.close(holder)
    report = recover(q)
    assert report.receipts_compacted == 1 and os.path.getsize(os.path.join(qpath, busy_rel)) == 128


# =========================================================================== phase 5: retention


def _move_receipt_to_bucket(q: Queue, rel: str, bucket: int) -> str:
    """Re-file a receipt into an older terminal bucket, re-tagged as ack would have."""
    _, _, shard_s, fname = rel.split("/")
    jn = names.parse_name(State.RECEIPT, fname)
    new_name = names.make_filename(
        q.format.queue_id, jn, shard=int(shard_s, 16), bucket=bucket, lease_width_ns=q.format.lease_width_ns
    )
    new_dir = f"receipts/{bucket:016x}/{shard_s}"
    q._ctx.tree.ensure_dir(new_dir)  # creates every shard directory of the bucket, like ack
    new_rel = f"{new_dir}/{new_name}"
    os.rename(os.path.join(q.path, rel), os.path.join(q.path, new_rel))
    return new_rel


def test_receipts_past_retention_are_deleted_with_their_directories(qpath: str) -> None:
    with Queue.init(qpath, shards=SHARDS) as q:
        width = q.format.terminal_width_ns
        now_b = names.terminal_bucket(q.wall_floor_ns(), width)
        keep_job, keep_lease = _ack_one(q, b"recent")
        old_job, old_lease = _ack_one(q, b"old")
        bad_job, _ = _ack_one(q, b"old and corrupt")
        old_rel = _move_receipt_to_bucket(q, only_object(qpath, old_job), now_b - 2)
        bad_rel = _move_receipt_to_bucket(q, only_object(qpath, bad_job), now_b - 3)
        flip_byte(qpath, bad_rel, os.path.getsize(os.path.join(qpath, bad_rel)) - 1)
        # With the default 7-day retention these buckets are still kept (only compacted).
        kept = recover(q)
        assert [c for c, _ in kept.errors] == ["receipt_compact_invalid"]
        assert (kept.receipts_compacted, kept.receipts_deleted, kept.directories_removed) == (2, 0, 0)
        assert os.path.getsize(os.path.join(qpath, old_rel)) == 128

    # Retention is a per-handle option: a handle with 60 s expires them.
    with Queue.open(qpath, receipt_retention=60) as q:
        report = recover(q)
        codes = sorted(c for c, _ in report.errors)
        assert codes == ["receipt_compact_invalid", "receipt_delete_invalid"], report.errors
        assert report.receipts_deleted == 1
        # Every shard of the old bucket and then the bucket itself; in the bucket
        # holding the corrupt receipt only its empty shard directories go.
        assert report.directories_removed == (SHARDS + 1) + (SHARDS - 1)
        assert not os.path.exists(os.path.join(qpath, os.path.dirname(os.path.dirname(old_rel))))
        assert objects_of(qpath, old_job) == []
        assert os.path.exists(os.path.join(qpath, bad_rel))  # unverifiable evidence is kept
        assert os.listdir(os.path.join(qpath, f"receipts/{now_b - 3:016x}")) == [bad_rel.split("/")[2]]
        assert only_object(qpath, keep_job).startswith(f"receipts/{now_b:016x}/")
        assert q.ack(keep_lease) is AckResult.ALREADY_ACKED  # compacted, within retention
        with pytest.raises(LeaseLost):
            q.ack(old_lease)  # its receipt expired: the ack can no longer be proven


# =========================================================================== budgets and cursor


def test_budget_exhaustion_and_resumption_one_op_at_a_time(q: Queue, qpath: str) -> None:
    jobs = [craft_lease(q, boot=OTHER_BOOT, deadline=1)[0] for _ in range(6)]
    # One lease whose reap keeps colliding: a persistent failure must not stall later entries.
    stuck_job, stuck_rel, stuck = craft_lease(q, boot=OTHER_BOOT, deadline=1)
    blocker = names.make_filename(
        q.format.queue_id,
        names.ready_name(stuck.job_id, stuck.generation + 1, stuck.attempt, stuck.max_attempts),
        shard=int(stuck_rel.split("/")[1], 16),
        lease_width_ns=q.format.lease_width_ns,
    )
    Path(qpath, os.path.dirname(stuck_rel), blocker).write_bytes(Path(qpath, stuck_rel).read_bytes())
    delayed = [q.enqueue(b"d", delay=30) for _ in range(2)]
    advance_watermark_to(qpath, (linux.realtime_ns() + 60 * SEC) // q.format.delayed_width_ns)
    qid = q.format.queue_id
    with Queue.open(qpath) as q2:
        totals = RecoveryReport()
        passes = exhausted = 0
        while True:
            passes += 1
            assert passes < 100, "recovery made no progress"
            r = run_recovery(q2._ctx, budget_ops=1, budget_ms=60_000)
            assert r.operations_attempted <= 1
            totals.leases_reaped += r.leases_reaped
            totals.delayed_promoted += r.delayed_promoted
            totals.errors += r.errors
            validate_cursor(cursor_bytes(qpath), qid)
            if not r.budget_exhausted:
                break
            exhausted += 1
            assert r.next_phase is not None and cursor_bytes(qpath) == reset_cursor_json(qid, r.next_phase)
    assert exhausted >= 8  # one op per pass: 6 reaps + 1 collision + 2 promotions
    assert totals.leases_reaped == 6 and totals.delayed_promoted == 2
    assert [c for c, _ in totals.errors] == ["reap_to_ready_collision"]
    for job in jobs + delayed:
        assert only_object(qpath, job).startswith("ready/")
    assert sorted(objects_of(qpath, stuck_job)) == sorted([stuck_rel, f"{os.path.dirname(stuck_rel)}/{blocker}"])
    assert cursor_bytes(qpath) == reset_cursor_json(qid, "reap_leases")


def test_time_budget_stops_the_pass(q: Queue, qpath: str, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [craft_lease(q, boot=OTHER_BOOT, deadline=1)[0] for _ in range(5)]
    q._ctx.wall.for_mutation()  # warm the floor cache so the fake clock below only drives the budget
    clock = [linux.monotonic_ns()]

    def fake_monotonic() -> int:
        clock[0] += 60_000_000  # every reading is 60 ms later
        return clock[0]

    monkeypatch.setattr(linux, "monotonic_ns", fake_monotonic)
    r = run_recovery(q._ctx, budget_ops=1000, budget_ms=100)
    monkeypatch.undo()
    assert r.budget_exhausted and r.leases_reaped < 5
    rest = recover(q)
    no_errors(rest)
    assert r.leases_reaped + rest.leases_reaped == 5
    assert all(only_object(qpath, j).startswith("ready/") for j in jobs)


@pytest.mark.parametrize(
    "kwargs", [{"budget_ops": 0}, {"budget_ms": 0}, {"budget_ops": True}, {"budget_ms": 1.5}, {"budget_ops": -1}]
)
def test_invalid_budget_is_refused_before_anything_happens(q: Queue, qpath: str, kwargs: dict) -> None:  # type: ignore[type-arg]
    job, rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=1)
    with pytest.raises(NotCommitted) as info:
        q.recover(**kwargs)
    assert info.value.kind is ErrorKind.INVALID_INPUT
    assert only_object(qpath, job) == rel
    assert not os.path.exists(os.path.join(qpath, "control", "recovery-cursor.json"))


def test_busy_recovery_lock_records_an_error_and_does_nothing(q: Queue, qpath: str) -> None:
    job, rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=1)
    holder = os.open(os.path.join(qpath, "control", "recovery.lock"), os.O_RDWR)
    try:
        assert linux.ofd_lock(holder, exclusive=True)  # OFD locks conflict even within one process
        r = q.recover()
        assert [c for c, _ in r.errors] == ["recovery_lock"]
        assert r.operations_attempted == 0 and r.changed == 0 and r.next_phase is None
        assert only_object(qpath, job) == rel
        assert not os.path.exists(os.path.join(qpath, "control", "recovery-cursor.json"))
    finally:
        os.close(holder)
    r = q.recover()
    no_errors(r)
    assert r.leases_reaped == 1


def test_missing_recovery_lock_file_is_recreated(q: Queue, qpath: str) -> None:
    os.unlink(os.path.join(qpath, "control", "recovery.lock"))
    no_errors(q.recover())
    st = os.stat(os.path.join(qpath, "control", "recovery.lock"))
    assert st.st_mode & 0o777 == 0o600


def test_poisoned_handle_refuses_recovery(q: Queue) -> None:
    q._ctx.poison("test")
    with pytest.raises(NotCommitted) as info:
        q.recover()
    assert info.value.kind is ErrorKind.QUEUE_POISONED


# One recovery process of the two-process test. Passes take the recovery lock,
# so they never run at once: what the test must prove is that the two loops
# did, taking turns. After its first pass that moved something, each process
# waits (BARRIER_S at most) at a barrier file until the other has moved
# something too, and records every pass as [start_ns, end_ns, moved, busy]
# on CLOCK_MONOTONIC, which all processes share.
BARRIER_S = 10
_WORKER = r"""
import json, os, sys, time
from steadqd import Queue
path, go, me, other = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
while not os.path.exists(go):
    time.sleep(0.001)
totals = {"reaped": 0, "promoted": 0, "busy": 0, "other_errors": [], "passes": [], "met": False}
met_by = None
deadline = time.monotonic() + 25
with Queue.open(path) as q:
    while time.monotonic() < deadline:
        start = time.monotonic_ns()
        r = q.recover(budget_ops=2, budget_ms=60000)
        codes = [c for c, _ in r.errors]
        moved = r.leases_reaped + r.delayed_promoted
        totals["passes"].append([start, time.monotonic_ns(), moved, "recovery_lock" in codes])
        totals["reaped"] += r.leases_reaped
        totals["promoted"] += r.delayed_promoted
        totals["busy"] += codes.count("recovery_lock")
        totals["other_errors"] += [e for e in r.errors if e[0] != "recovery_lock"]
        if moved and met_by is None:
            open(go + "." + me, "w").close()
            met_by = time.monotonic() + float(sys.argv[5])
            while not os.path.exists(go + "." + other) and time.monotonic() < met_by:
                time.sleep(0.001)
            totals["met"] = os.path.exists(go + "." + other)
        if not codes and not r.budget_exhausted:
            break
        if codes:
            time.sleep(0.001)  # the other process holds the lock
print(json.dumps(totals))
"""


def assert_overlapped(results: list[dict]) -> None:
    """Both processes moved jobs, and each moved its first while the other's loop was still running."""
    assert all(r["met"] for r in results), f"the processes never both moved a job within {BARRIER_S} s of each other"
    for mine, theirs in (results, results[::-1]):
        first_move = next(start for start, _end, moved, _busy in mine["passes"] if moved)
        assert first_move < theirs["passes"][-1][1], "a process started moving after the other had finished"


def test_two_concurrent_processes_never_double_move(q: Queue, qpath: str, tmp_path: Path) -> None:
    crafted = [craft_lease(q, boot=OTHER_BOOT, deadline=1) for _ in range(24)]
    delayed = [q.enqueue(b"d", delay=30) for _ in range(8)]
    advance_watermark_to(qpath, (linux.realtime_ns() + 60 * SEC) // q.format.delayed_width_ns)
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, qpath, str(go), me, other, str(BARRIER_S)], stdout=subprocess.PIPE, env=env
        )
        for me, other in (("0", "1"), ("1", "0"))
    ]
    time.sleep(0.3)
    go.write_text("go")
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=30)
        assert p.returncode == 0
        results.append(json.loads(out))
    assert all(r["other_errors"] == [] for r in results), results
    assert_overlapped(results)
    assert sum(r["reaped"] for r in results) == 24
    assert sum(r["promoted"] for r in results) == 8
    for job, _rel, old in crafted:
        jn = authentic(q, only_object(qpath, job), State.READY)
        assert jn.generation == old.generation + 1  # moved exactly once
    for job in delayed:
        assert only_object(qpath, job).startswith("ready/")


def _snapshot(root: str) -> dict[str, tuple[int, int, int]]:
    out = {}
    for dirpath, dirs, filenames in os.walk(root):
        for n in dirs + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            if rel == "control/wall-watermark":
                continue  # the wall floor may legitimately advance between passes
            st = os.lstat(p)
            out[rel] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def test_second_pass_is_a_no_op(q: Queue, qpath: str) -> None:
    craft_lease(q, boot=OTHER_BOOT, deadline=1)
    craft_lease(q, boot=OTHER_BOOT, deadline=1, legacy=True)
    _ack_one(q, b"receipt")
    d = f"tmp/{names.boot_dashed(OTHER_BOOT)}/0000"
    os.makedirs(os.path.join(qpath, d))
    Path(qpath, d, "x.tmp").write_bytes(b"")
    first = recover(q)
    no_errors(first)
    assert (first.leases_reaped, first.receipts_compacted, first.temp_files_deleted) == (2, 1, 1)
    before = _snapshot(qpath)
    second = recover(q)
    no_errors(second)
    assert second.changed == 0 and second.operations_attempted == 0
    assert _snapshot(qpath) == before  # not even the cursor file is rewritten


def test_cursor_is_written_in_the_exact_reset_form(q: Queue, qpath: str) -> None:
    qid = q.format.queue_id
    r = q.recover()
    no_errors(r)
    assert r.next_phase == "reap_leases"
    data = cursor_bytes(qpath)
    assert data == reset_cursor_json(qid, "reap_leases")
    assert data == (
        b'{"schema":"steadq-recovery-cursor","version":1,"queue_id":"' + qid.hex().encode() + b'",'
        b'"cursor":{"phase":"reap_leases","reap_leases":null,"promote_delayed":null,"cleanup_temp":null,'
        b'"compact_receipts":null,"delete_receipts":null,"hierarchy_retries":[],'
        b'"hierarchy_retry_frontiers":[],"hierarchy_retry_overflow":[]}}'
    )
    assert validate_cursor(data, qid)["cursor"]["phase"] == "reap_leases"
    st = os.stat(os.path.join(qpath, "control", "recovery-cursor.json"))
    assert st.st_mode & 0o777 == 0o600 and st.st_nlink == 1
    assert [f for f in os.listdir(os.path.join(qpath, "control")) if f.startswith(".recovery-cursor.")] == []
    Queue.open(qpath).close()  # our cursor never makes a queue unopenable


def test_reference_cursor_phase_and_position_are_honoured(q: Queue, qpath: str) -> None:
    qid = q.format.queue_id
    job, rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=1)
    r_job, _ = _ack_one(q, b"r")
    r_rel = only_object(qpath, r_job)
    _, bucket, shard, name = r_rel.split("/")
    position = {"first": list(bucket.encode()), "second": list(shard.encode()), "resume_after": list(name.encode())}
    doc = json.loads(reset_cursor_json(qid, "compact_receipts"))
    doc["cursor"]["compact_receipts"] = position
    Path(qpath, "control", "recovery-cursor.json").write_text(json.dumps(doc, separators=(",", ":")))
    first = q.recover()
    no_errors(first)
    # Due leases first, whatever the cursor says (issue 15 point 8); then from compact_receipts,
    # the receipt <= the position skipped, to the end of the cycle.
    assert (first.leases_reaped, first.receipts_compacted) == (1, 0)
    assert only_object(qpath, job) != rel and first.next_phase == "reap_leases"
    assert cursor_bytes(qpath) == reset_cursor_json(qid, "reap_leases")
    second = q.recover()
    no_errors(second)
    assert (second.leases_reaped, second.receipts_compacted) == (0, 1)


def test_invalid_cursor_stops_the_pass(q: Queue, qpath: str) -> None:
    job, rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=1)
    path = Path(qpath, "control", "recovery-cursor.json")
    path.write_bytes(reset_cursor_json(os.urandom(16)))  # another queue's id
    r = q.recover()
    assert [c for c, _ in r.errors] == ["recovery_cursor"] and r.operations_attempted == 0
    assert only_object(qpath, job) == rel
    path.unlink()
    assert q.recover().leases_reaped == 1
