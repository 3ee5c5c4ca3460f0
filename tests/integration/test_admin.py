"""Admin operations on dead letters and quarantine (steadqd.fs.admin: dead, quarantine, files).

Dead letters: list/find only report authenticated names, export copies the
exact bytes (whole file or the verified payload only) atomically and
durably, remove unlinks and fsyncs, and requeue_dead puts a job back into
circulation with a fresh set of attempts -- after which the job can be
leased and acknowledged and the independent tree checker still passes.
Quarantine: list (nested layouts too), inspect, export, remove, bad ids and
missing objects.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from steadqd import (  # noqa: E402
    AckResult,
    DeadReason,
    ErrorKind,
    InvalidInput,
    Lease,
    NotCommitted,
    OutcomeUnknown,
    QuarantineReason,
    Queue,
    State,
    SteadQError,
)
from steadqd.constants import HEADER_SIZE  # noqa: E402
from steadqd.fs import linux  # noqa: E402
from steadqd.fs.admin import DeadJob, QuarantinedObject  # noqa: E402
from steadqd.fs.json_records import EnqueueTicket  # noqa: E402
from steadqd.fs.names import make_quarantine_name, parse_name  # noqa: E402
from steadqd.fs.records import JobHeader  # noqa: E402
from tests.invariants import check_tree  # noqa: E402

PAYLOAD = b"dead letter payload \x00\x01\xfe" * 11


def _abs(q: Queue, rel: str) -> str:
    return os.path.join(q.path, rel)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _buried(q: Queue, payload: bytes = PAYLOAD, reason: int = 7, max_attempts: int = 3) -> tuple[str, Lease]:
    job = q.enqueue(payload, max_attempts=max_attempts, metadata={"k": "v"})
    lease = q.lease(duration=60)
    assert lease is not None and lease.job_id == job
    q.bury(lease, reason)
    return job, lease


def _flip_last_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x55]))


def _no_temps(directory: Path) -> None:
    leftovers = [p.name for p in directory.iterdir() if ".tmp." in p.name]
    assert not leftovers, leftovers


# --------------------------------------------------------------------------- dead: list / find


def test_list_and_find_dead(queue: Queue) -> None:
    job, lease = _buried(queue, reason=7)
    other, _ = _buried(queue, payload=b"other", reason=DeadReason.ADMINISTRATIVE_BURY)
    dead = list(queue.list_dead())
    assert {d.job_id for d in dead} == {job, other}
    assert dead == sorted(dead, key=lambda d: d.path)  # shard-by-shard bytewise order within one bucket
    found = queue.find_dead(job)
    assert found is not None and found in dead
    assert found == DeadJob(job, lease.generation + 1, lease.attempt, 3, 7, found.path)
    assert found.path.startswith("dead/") and os.path.isfile(_abs(queue, found.path))
    state = check_tree(queue.path)
    assert state.dead == {job, other} and state.get(job).path == found.path  # type: ignore[union-attr]
    assert queue.find_dead("0" * 32) is None
    with pytest.raises(InvalidInput):
        queue.find_dead("NOT-A-JOB-ID")


def test_list_dead_skips_strays_and_unauthenticated_names(queue: Queue) -> None:
    job, _ = _buried(queue)
    found = queue.find_dead(job)
    assert found is not None
    shard_dir_abs = os.path.dirname(_abs(queue, found.path))
    name = os.path.basename(found.path)
    # A forged tag (same identity, wrong tag), a garbage name, and a good name in the wrong shard.
    forged = name.replace(".x0007.k", ".x0008.k")
    Path(shard_dir_abs, forged).write_bytes(b"x")
    Path(shard_dir_abs, "README").write_text("not a job")
    wrong_shard = next(d for d in os.listdir(os.path.dirname(shard_dir_abs)) if d != os.path.basename(shard_dir_abs))
    Path(os.path.dirname(shard_dir_abs), wrong_shard, name).write_bytes(_read(_abs(queue, found.path)))
    Path(queue.path, "dead", "not-a-bucket").mkdir()
    assert [d.job_id for d in queue.list_dead()] == [job]
    assert queue.find_dead(job) == found


def test_list_dead_on_empty_and_missing_dead_dir(queue: Queue) -> None:
    assert list(queue.list_dead()) == []
    os.rmdir(_abs(queue, "dead"))
    assert list(queue.list_dead()) == []
    assert queue.find_dead("1" * 32) is None


# --------------------------------------------------------------------------- dead: export


def test_export_dead_whole_file_and_payload_only(queue: Queue, tmp_path: Path) -> None:
    job, _ = _buried(queue)
    found = queue.find_dead(job)
    assert found is not None
    raw = _read(_abs(queue, found.path))
    out = tmp_path / "exported.sqj"
    with linux.trace() as events:
        n = queue.export_dead(job, str(out))
    assert n == len(raw) and out.read_bytes() == raw  # header + extension + payload, byte for byte
    header = JobHeader.decode(raw[:HEADER_SIZE])
    assert raw.endswith(PAYLOAD) and len(raw) == HEADER_SIZE + header.extension_length + len(PAYLOAD)
    ops = [e.op for e in events]
    # Durable and atomic: file fsync, then rename into place, then the directory fsync.
    assert ops.count("fsync") == 2 and ops.index("fsync") < ops.index("rename") < len(ops) - 1 - ops[::-1].index(
        "fsync"
    )
    pay = tmp_path / "payload.bin"
    old_umask = os.umask(0o022)
    try:
        assert queue.export_dead(job, str(pay), payload_only=True) == len(PAYLOAD)
    finally:
        os.umask(old_umask)
    assert pay.read_bytes() == PAYLOAD
    # Both backends export 0600 whatever the umask: a payload from a group-only queue is not handed to all.
    assert stat.S_IMODE(pay.stat().st_mode) == stat.S_IMODE(out.stat().st_mode) == 0o600
    # An existing output is replaced whole, never appended to or left partial.
    pay.write_bytes(b"old content that is much longer than nothing" * 100)
    assert queue.export_dead(job, str(pay), payload_only=True) == len(PAYLOAD)
    assert pay.read_bytes() == PAYLOAD
    _no_temps(tmp_path)
    assert _read(_abs(queue, found.path)) == raw  # export is read-only


def test_export_dead_corrupt_payload(queue: Queue, tmp_path: Path) -> None:
    job, _ = _buried(queue)
    found = queue.find_dead(job)
    assert found is not None
    _flip_last_byte(_abs(queue, found.path))
    out = tmp_path / "p.bin"
    with pytest.raises(SteadQError) as ei:
        queue.export_dead(job, str(out), payload_only=True)
    assert ei.value.kind is ErrorKind.PAYLOAD_CORRUPT
    assert not out.exists()
    _no_temps(tmp_path)
    # The whole-file export is evidence and copies the (corrupt) bytes as they are.
    whole = tmp_path / "whole.sqj"
    assert queue.export_dead(job, str(whole)) == os.path.getsize(_abs(queue, found.path))
    assert whole.read_bytes() == _read(_abs(queue, found.path))


def test_export_dead_not_found_and_failures_leave_no_output(queue: Queue, tmp_path: Path) -> None:
    out = tmp_path / "x"
    with pytest.raises(SteadQError) as ei:
        queue.export_dead("2" * 32, str(out))
    assert ei.value.kind is ErrorKind.NOT_FOUND
    job, _ = _buried(queue)
    with linux.inject(nth=1, errno=errno.EIO, op="fsync"), pytest.raises(SteadQError) as ei:
        queue.export_dead(job, str(out))
    assert ei.value.kind is ErrorKind.IO_FAILURE and not out.exists()
    with linux.inject(nth=1, errno=errno.ENOSPC, op="write"), pytest.raises(SteadQError) as ei:
        queue.export_dead(job, str(out))
    assert ei.value.kind is ErrorKind.RESOURCE_EXHAUSTED and not out.exists()
    _no_temps(tmp_path)
    with pytest.raises(SteadQError):
        queue.export_dead(job, str(tmp_path / "missing-dir" / "x"))


# --------------------------------------------------------------------------- dead: remove


def test_remove_dead(queue: Queue) -> None:
    job, _ = _buried(queue)
    keep, _ = _buried(queue, payload=b"keep")
    found = queue.find_dead(job)
    assert found is not None
    with linux.trace() as events:
        queue.remove_dead(job)
    ops = [e.op for e in events]
    assert "unlink" in ops and "fsync" in ops[ops.index("unlink") :]
    assert not os.path.exists(_abs(queue, found.path))
    assert queue.find_dead(job) is None
    assert check_tree(queue.path).dead == {keep}
    with pytest.raises(NotCommitted) as ei:
        queue.remove_dead(job)
    assert ei.value.kind is ErrorKind.NOT_FOUND
    with pytest.raises(NotCommitted) as ei:
        queue.remove_dead("bad")
    assert ei.value.kind is ErrorKind.INVALID_INPUT


def test_remove_dead_barrier_failure_is_outcome_unknown(queue_path: str) -> None:
    q = Queue.init(queue_path, shards=4)
    try:
        job, _ = _buried(q)
        with linux.inject(nth=1, errno=errno.EIO, op="fsync"), pytest.raises(OutcomeUnknown):
            q.remove_dead(job)
        assert q.poisoned is not None
        with pytest.raises(NotCommitted) as ei:
            q.remove_dead(job)
        assert ei.value.kind is ErrorKind.QUEUE_POISONED
    finally:
        q.close()


# --------------------------------------------------------------------------- dead: requeue


def test_requeue_dead_then_lease_and_ack(queue: Queue) -> None:
    job, lease = _buried(queue, reason=1)
    dead = queue.find_dead(job)
    assert dead is not None
    path = queue.requeue_dead(job)
    name = parse_name(State.READY, os.path.basename(path))
    assert path.startswith("ready/") and (name.generation, name.attempt, name.max_attempts) == (
        dead.generation + 1, 0, 3,
    )  # fmt: skip
    state = check_tree(queue.path, allow_quarantine=False)
    assert state.ready == {job} and not state.dead and state.get(job).path == path  # type: ignore[union-attr]
    assert queue.find_dead(job) is None
    again = queue.lease(duration=60)
    assert again is not None and again.job_id == job
    assert (again.generation, again.attempt) == (dead.generation + 2, 1)
    assert again.payload() == PAYLOAD and again.metadata == {"k": "v"}  # header and extension untouched
    assert queue.ack(again) is AckResult.ACKED
    state = check_tree(queue.path, allow_quarantine=False)
    assert state.receipts == {job} and not state.ready


def test_requeue_exhausted_job_gets_a_fresh_attempt(queue: Queue) -> None:
    job = queue.enqueue(PAYLOAD, max_attempts=1)
    lease = queue.lease(duration=60)
    assert lease is not None
    assert queue.retry(lease) == "dead"  # no attempts left: buried with reason 4
    dead = queue.find_dead(job)
    assert (
        dead is not None
        and dead.reason == DeadReason.ATTEMPTS_EXHAUSTED
        and (dead.attempt, dead.max_attempts) == (1, 1)
    )
    with pytest.raises(NotCommitted) as ei:  # keeping the used-up attempt would only bury it again
        queue.requeue_dead(job, max_attempts_reset=False)
    assert ei.value.kind is ErrorKind.INVALID_INPUT
    assert queue.find_dead(job) == dead
    queue.requeue_dead(job)  # with the default reset the job gets a fresh set of attempts
    again = queue.lease(duration=60)
    assert again is not None and again.job_id == job and again.attempt == 1
    assert queue.ack(again) is AckResult.ACKED
    check_tree(queue.path, allow_quarantine=False)


def test_requeue_without_reset_keeps_the_attempt(queue: Queue) -> None:
    job, lease = _buried(queue, max_attempts=3)
    path = queue.requeue_dead(job, max_attempts_reset=False)
    assert parse_name(State.READY, os.path.basename(path)).attempt == lease.attempt == 1
    again = queue.lease(duration=60)
    assert again is not None and again.attempt == 2


def test_requeue_corrupt_dead_job_is_quarantined(queue: Queue) -> None:
    job, _ = _buried(queue)
    dead = queue.find_dead(job)
    assert dead is not None
    raw_before = _read(_abs(queue, dead.path))
    _flip_last_byte(_abs(queue, dead.path))
    with pytest.raises(NotCommitted) as ei:
        queue.requeue_dead(job)
    assert ei.value.kind is ErrorKind.PAYLOAD_CORRUPT and "quarantined" in ei.value.message
    assert queue.find_dead(job) is None
    (obj,) = queue.list_quarantine()
    assert obj.reason == QuarantineReason.PAYLOAD_CORRUPT and obj.size == len(raw_before)
    state = check_tree(queue.path)
    assert job not in state.all_ids and not state.ready
    assert queue.poisoned is None


def test_requeue_missing_and_poisoned(queue_path: str) -> None:
    q = Queue.init(queue_path, shards=4)
    try:
        with pytest.raises(NotCommitted) as ei:
            q.requeue_dead("3" * 32)
        assert ei.value.kind is ErrorKind.NOT_FOUND
        with pytest.raises(NotCommitted) as ei:
            q.requeue_dead("nope")
        assert ei.value.kind is ErrorKind.INVALID_INPUT
        job, _ = _buried(q)
        q._ctx.ready_dir(0)  # ready shard dirs exist; the first fsync is the destination barrier
        with (
            linux.trace() as events,
            linux.inject(nth=1, errno=errno.EIO, op="fsync") as fault,
            pytest.raises(OutcomeUnknown) as ou,
        ):
            q.requeue_dead(job)
        assert fault.fired
        ops = [e.op for e in events]
        assert ops.index("rename_noreplace") < ops.index("fsync")
        ticket = ou.value.ticket
        assert isinstance(ticket, EnqueueTicket) and ticket.state == "ready" and ticket.job_id.hex() == job
        assert os.path.isfile(_abs(q, ticket.path))  # the rename happened; only its barrier failed
        header = JobHeader.decode(_read(_abs(q, ticket.path))[:HEADER_SIZE])
        assert ticket.envelope_digest == header.envelope_digest
        assert q.poisoned is not None
        with pytest.raises(NotCommitted) as ei:
            q.requeue_dead(job)
        assert ei.value.kind is ErrorKind.QUEUE_POISONED
    finally:
        q.close()
    with Queue.open(queue_path) as fresh:
        state = check_tree(queue_path, allow_quarantine=False)
        assert state.ready == {job}
        lease = fresh.lease(duration=60)
        assert lease is not None and fresh.ack(lease) is AckResult.ACKED


def test_requeue_collision_is_not_committed(queue: Queue) -> None:
    """An object already at the ready name: nothing moves, the dead job stays."""
    job, _ = _buried(queue)
    dead = queue.find_dead(job)
    assert dead is not None
    path = queue.requeue_dead(job)
    data = _read(_abs(queue, path))
    # Put the job back where it was (dead), and leave a copy at the ready name.
    with open(_abs(queue, dead.path), "xb") as f:
        f.write(data)
    with pytest.raises(NotCommitted) as ei:
        queue.requeue_dead(job)
    assert ei.value.kind is ErrorKind.QUEUE_CORRUPT
    assert os.path.isfile(_abs(queue, dead.path)) and os.path.isfile(_abs(queue, path))


# --------------------------------------------------------------------------- quarantine


def _quarantine_by_claim(q: Queue) -> tuple[str, int, bytes]:
    """Corrupt a ready job's header; the claim scan isolates it. Returns (id, reason, raw bytes)."""
    job = q.enqueue(b"soon corrupt")
    (info,) = q.inspect(job)
    path = _abs(q, info.path)
    raw = bytearray(_read(path))
    raw[40] ^= 0xFF  # inside created_at: the envelope digest no longer matches
    with open(path, "r+b") as f:
        f.write(raw)
    assert q.lease() is None
    assert q.last_scan is not None
    ((_orig, reason, qname),) = q.last_scan.quarantined
    return qname[1:33], reason, bytes(raw)


def test_quarantine_list_inspect_export_remove(queue: Queue, tmp_path: Path) -> None:
    qid, reason, raw = _quarantine_by_claim(queue)
    (obj,) = list(queue.list_quarantine())
    assert obj == QuarantinedObject(
        qid, reason, f"quarantine/{make_quarantine_name(bytes.fromhex(qid), reason)}", len(raw)
    )
    assert reason == QuarantineReason.ENVELOPE_CORRUPT
    assert queue.inspect_quarantine(qid) == obj
    out = tmp_path / "q.raw"
    with linux.trace() as events:
        assert queue.export_quarantine(qid, str(out)) == len(raw)
    assert out.read_bytes() == raw
    assert [e.op for e in events].count("fsync") == 2
    _no_temps(tmp_path)
    with linux.trace() as events:
        queue.remove_quarantine(qid)
    ops = [e.op for e in events]
    assert "unlink" in ops and "fsync" in ops[ops.index("unlink") :]  # unlike the reference, durable
    assert list(queue.list_quarantine()) == []
    assert not os.path.lexists(_abs(queue, obj.path))
    with pytest.raises(NotCommitted) as ei:
        queue.remove_quarantine(qid)
    assert ei.value.kind is ErrorKind.NOT_FOUND


def test_quarantine_nested_strays_and_symlinks(queue: Queue, tmp_path: Path) -> None:
    qdir = Path(queue.path, "quarantine")
    a, b, c = os.urandom(16), os.urandom(16), os.urandom(16)
    (qdir / make_quarantine_name(a, 1)).write_bytes(b"top level")
    nested = qdir / "old-layout" / "deeper"
    nested.mkdir(parents=True)
    (nested / make_quarantine_name(b, 0x0103)).write_bytes(b"nested object!")
    (qdir / "notes.txt").write_text("not quarantine")
    (qdir / (make_quarantine_name(c, 2) + ".bak")).write_bytes(b"almost")
    link_id = os.urandom(16)
    secret = tmp_path / "secret"
    secret.write_bytes(b"outside the queue")
    (qdir / make_quarantine_name(link_id, QuarantineReason.NON_REGULAR_FILE)).symlink_to(secret)
    listed = {o.quarantine_id: o for o in queue.list_quarantine()}
    assert set(listed) == {a.hex(), b.hex(), link_id.hex()}
    assert listed[b.hex()] == QuarantinedObject(
        b.hex(), 0x0103, f"quarantine/old-layout/deeper/{make_quarantine_name(b, 0x0103)}", 14
    )
    out = tmp_path / "nested.raw"
    assert queue.export_quarantine(b.hex(), str(out)) == 14 and out.read_bytes() == b"nested object!"
    # A quarantined symlink is listed but never followed.
    with pytest.raises(InvalidInput, match="symlink"):
        queue.export_quarantine(link_id.hex(), str(tmp_path / "link.raw"))
    assert not (tmp_path / "link.raw").exists()
    queue.remove_quarantine(link_id.hex())
    assert secret.read_bytes() == b"outside the queue"  # the link target is never touched
    assert not os.path.lexists(qdir / make_quarantine_name(link_id, QuarantineReason.NON_REGULAR_FILE))
    queue.remove_quarantine(b.hex())
    assert {o.quarantine_id for o in queue.list_quarantine()} == {a.hex()}


@pytest.mark.parametrize("bad", ["", "xyz", "A" * 32, "q" + "a" * 32, "a" * 31, "a" * 33, "g" * 32])
def test_quarantine_bad_ids(queue: Queue, bad: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="invalid quarantine_id"):
        queue.inspect_quarantine(bad)
    with pytest.raises(InvalidInput, match="invalid quarantine_id"):
        queue.export_quarantine(bad, str(tmp_path / "o"))
    with pytest.raises(NotCommitted) as ei:
        queue.remove_quarantine(bad)
    assert ei.value.kind is ErrorKind.INVALID_INPUT


def test_quarantine_not_found_and_missing_dir(queue: Queue, tmp_path: Path) -> None:
    missing = "4" * 32
    with pytest.raises(SteadQError) as ei:
        queue.inspect_quarantine(missing)
    assert ei.value.kind is ErrorKind.NOT_FOUND
    with pytest.raises(SteadQError) as ei:
        queue.export_quarantine(missing, str(tmp_path / "o"))
    assert ei.value.kind is ErrorKind.NOT_FOUND
    os.rmdir(_abs(queue, "quarantine"))
    assert list(queue.list_quarantine()) == []
    with pytest.raises(SteadQError) as ei:
        queue.inspect_quarantine(missing)
    assert ei.value.kind is ErrorKind.NOT_FOUND
