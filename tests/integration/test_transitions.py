"""Behaviour of every public transition: success paths and each failure path.

Each test drives the public ``Queue`` API and then checks the tree itself
(names, directories, file bytes) against protocol.md, names.md and
records.md, because the filesystem is the only shared truth between
implementations: a result object that looks right while the name on disk is
wrong would break every other reader of the queue.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import re
import uuid
from pathlib import Path

import pytest

from steadqd import (
    AckResult,
    ErrorKind,
    InvalidInput,
    Lease,
    LeaseLost,
    NotCommitted,
    Queue,
    RetryPolicy,
    State,
    SteadQError,
)
from steadqd.fs import linux, names
from steadqd.fs.records import JobHeader, decode_extension

HEADER = 128
# --------------------------------------------------------------------------- helpers


def object_files(root: str) -> set[str]:
    """Every non-directory entry below the root except control/ (which the wall floor may rewrite)."""
    out: set[str] = set()
    for dirpath, _dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == "control" or rel.startswith("control/"):
            continue
        for f in filenames:
            out.add(os.path.normpath(os.path.join(rel, f)))
    return out


def shard_of_job(queue: Queue, job_hex: str) -> int:
    return names.shard_of(queue.format.queue_id, bytes.fromhex(job_hex), queue.shard_count)


def read_job(root: str, rel: str) -> tuple[bytes, JobHeader, bytes, bytes]:
    """(raw file, header, extension bytes, payload) of a job file, as another implementation would read it."""
    data = Path(root, rel).read_bytes()
    header = JobHeader.decode(data[:HEADER])
    ext = data[HEADER : HEADER + header.extension_length]
    payload = data[HEADER + header.extension_length :]
    return data, header, ext, payload


def only(items: list) -> object:  # type: ignore[type-arg]
    assert len(items) == 1, items
    return items[0]


def expect_not_committed(kind: ErrorKind, fn, *args, **kwargs) -> NotCommitted:  # type: ignore[no-untyped-def]
    with pytest.raises(NotCommitted) as info:
        fn(*args, **kwargs)
    assert info.value.kind is kind, (info.value.kind, info.value.message)
    return info.value


def spec_jitter_ms(base_ms: int, cap_ms: int, queue_id: bytes, job_id: bytes, attempt: int) -> int:
    """clocks.md "Retry backoff with deterministic jitter", written out from the spec text."""
    doubled = base_ms * 2 ** (attempt - 1)
    ceiling = min(cap_ms, doubled)
    lower = -(-ceiling // 2)
    span = ceiling - lower + 1
    threshold = (2**64 - span) % span
    for counter in range(64):
        h = hashlib.sha256(
            b"SteadQ-1-jitter\0" + queue_id + job_id + attempt.to_bytes(4, "big") + counter.to_bytes(4, "big")
        ).digest()
        x = int.from_bytes(h[:8], "big")
        if x >= threshold:
            return lower + x % span
    return lower + span // 2


# =========================================================================== enqueue


def test_enqueue_ready_name_bytes_and_created_at_is_wall_floor(queue: Queue, queue_path: str) -> None:
    w0 = queue.wall_floor_ns()
    job, rel = queue.enqueue_detailed(b"hello", max_attempts=5, content_type="text/plain")
    w1 = queue.wall_floor_ns()
    shard = shard_of_job(queue, job)
    parts = rel.split("/")
    assert parts[:2] == ["ready", f"{shard:04x}"]
    jn = names.parse_name(State.READY, parts[2])
    assert (jn.job_id.hex(), jn.generation, jn.attempt, jn.max_attempts) == (job, 0, 0, 5)
    assert names.authenticate(queue.format.queue_id, jn, shard=shard, lease_width_ns=queue.format.lease_width_ns)
    _, header, ext, payload = read_job(queue_path, rel)
    assert header.job_id.hex() == job and header.max_attempts == 5
    assert w0 <= header.created_at_ns <= w1
    assert payload == b"hello" and header.payload_digest == hashlib.sha256(b"hello").digest()
    decoded = decode_extension(ext)
    assert decoded.content_type == "text/plain"
    assert decoded.initial_not_before is None  # no not_before given: key 1 absent


@pytest.mark.parametrize(
    "payload",
    [b"bytes", bytearray(b"a bytearray"), memoryview(b"a memoryview"), memoryview(b"\x01\x02" * 3).cast("H")],
    ids=["bytes", "bytearray", "memoryview", "memoryview of u16"],
)
def test_enqueue_of_every_buffer_kind_stores_its_bytes(queue: Queue, queue_path: str, payload: object) -> None:
    """bytes are written as they are, other buffers through a byte view: the file holds the same bytes either way."""
    raw = bytes(payload)  # type: ignore[call-overload]
    job, rel = queue.enqueue_detailed(payload)
    _, header, _, stored = read_job(queue_path, rel)
    assert stored == raw and header.payload_length == len(raw)
    assert header.payload_digest == hashlib.sha256(raw).digest()
    lease = queue.lease(wait=0)
    assert lease is not None and lease.job_id == job and lease.payload() == raw


def test_enqueue_delayed_uses_exact_not_before_and_ceil_bucket(queue: Queue, queue_path: str) -> None:
    job, rel = queue.enqueue_detailed(b"later", delay=100.0)
    shard = shard_of_job(queue, job)
    top, bucket_s, shard_s, filename = rel.split("/")
    assert (top, shard_s) == ("delayed", f"{shard:04x}")
    jn = names.parse_name(State.DELAYED, filename)
    _, header, ext, _ = read_job(queue_path, rel)
    nb = jn.not_before
    assert nb is not None
    # .d is the exact instant: wall floor at enqueue (= created_at) + the delay, not a bucket start.
    assert nb == header.created_at_ns + 100 * 1_000_000_000
    assert decode_extension(ext).initial_not_before == nb
    width = queue.format.delayed_width_ns
    assert int(bucket_s, 16) == -(-nb // width)  # ceil
    assert names.authenticate(
        queue.format.queue_id, jn, shard=shard, bucket=int(bucket_s, 16), lease_width_ns=queue.format.lease_width_ns
    )
    assert queue.lease() is None  # delayed is not claimable
    assert only(queue.inspect(job)).state is State.DELAYED


def test_enqueue_not_before_in_past_lands_ready_but_records_key_1(queue: Queue, queue_path: str) -> None:
    past = queue.wall_floor_ns() - 3_600 * 1_000_000_000
    job, rel = queue.enqueue_detailed(b"now", not_before_ns=past)
    assert rel.startswith(f"ready/{shard_of_job(queue, job):04x}/")
    _, header, ext, _ = read_job(queue_path, rel)
    assert decode_extension(ext).initial_not_before == past
    # Deterministic CBOR: map header, then key 1 (0x01) with a u64 argument (0x1b + 8 bytes).
    assert ext[1:2] == b"\x01" and ext[2:3] == b"\x1b" and int.from_bytes(ext[3:11], "big") == past
    lease = queue.lease()
    assert lease is not None and lease.job_id == job


def test_enqueue_extension_fields_round_trip_through_lease(queue: Queue) -> None:
    meta = {"done": True, "active": False, "n": -5, "big": 2**63, "s": "text", "b": b"\x00\xff"}
    job = queue.enqueue(
        b"x", content_type="application/x-test", metadata=meta, producer_id="producer-7", trace_context=b"\x01trace"
    )
    lease = queue.lease()
    assert lease is not None and lease.job_id == job
    assert lease.content_type == "application/x-test"
    assert lease.metadata == meta
    assert lease.producer_id == "producer-7"
    assert lease.extension is not None and lease.extension.trace_context == b"\x01trace"
    assert lease.payload() == b"x"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"metadata": {"Bad-Key": 1}}, "metadata key"),
        ({"metadata": {"": 1}}, "metadata key"),
        ({"content_type": "text/plain\x07"}, "content_type"),
        ({"content_type": "text/\nplain"}, "content_type"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"delay": -1.0}, "delay"),
        ({"producer_id": "a\0b"}, "producer_id"),
        ({"trace_context": b"t" * 1025}, "trace_context"),
    ],
)
def test_enqueue_invalid_input_creates_nothing(queue: Queue, queue_path: str, kwargs: dict, needle: str) -> None:  # type: ignore[type-arg]
    before = object_files(queue_path)
    err = expect_not_committed(ErrorKind.INVALID_INPUT, queue.enqueue, b"payload", **kwargs)
    assert needle in err.message
    assert object_files(queue_path) == before
    assert queue.poisoned is None  # invalid input never poisons
    queue.enqueue(b"still usable")


def test_enqueue_payload_larger_than_queue_max(queue_path: str) -> None:
    with Queue.init(queue_path, shards=1, max_payload_length=10) as queue:
        before = object_files(queue_path)
        err = expect_not_committed(ErrorKind.INVALID_INPUT, queue.enqueue, b"x" * 11)
        assert "exceeds" in err.message and "10" in err.message
        # The streamed path finds out only while copying: still nothing published.
        err = expect_not_committed(ErrorKind.INVALID_INPUT, queue.enqueue, io.BytesIO(b"y" * 11))
        assert "exceeds" in err.message
        assert object_files(queue_path) == before
        queue.enqueue(b"x" * 10)  # the bound is inclusive
        assert len(object_files(queue_path)) == len(before) + 1


def test_streamed_payload_gives_identical_file(queue: Queue, queue_path: str, tmp_path: Path) -> None:
    data = os.urandom(5 * 1024 * 1024 + 17)
    src = tmp_path / "payload.bin"
    src.write_bytes(data)
    job_a, rel_a = queue.enqueue_detailed(data, content_type="application/x-blob", metadata={"k": 1})
    with open(src, "rb") as f:
        job_b, rel_b = queue.enqueue_detailed(f, content_type="application/x-blob", metadata={"k": 1})
    raw_a, ha, ext_a, pay_a = read_job(queue_path, rel_a)
    raw_b, hb, ext_b, pay_b = read_job(queue_path, rel_b)
    assert len(raw_a) == len(raw_b) == HEADER + len(ext_a) + len(data)
    assert ext_a == ext_b
    assert pay_a == pay_b == data
    assert (
        (ha.payload_length, ha.payload_digest)
        == (hb.payload_length, hb.payload_digest)
        == (
            len(data),
            hashlib.sha256(data).digest(),
        )
    )

    # Header bytes equal except job id (32..48), created_at (56..64) and envelope digest (96..128).
    def masked(raw: bytes) -> bytes:
        h = bytearray(raw[:HEADER])
        h[32:48] = bytes(16)
        h[56:64] = bytes(8)
        h[96:128] = bytes(32)
        return bytes(h)

    assert masked(raw_a) == masked(raw_b)
    got = {}
    for _ in range(2):
        lease = queue.lease()
        assert lease is not None
        got[lease.job_id] = lease.payload()
    assert got == {job_a: data, job_b: data}


def test_ready_shard_dir_deleted_is_recreated_by_enqueue(queue_path: str) -> None:
    Queue.init(queue_path, shards=1).close()
    os.rmdir(os.path.join(queue_path, "ready", "0000"))
    with Queue.open(queue_path) as queue:
        job, rel = queue.enqueue_detailed(b"back")
        assert os.path.isfile(os.path.join(queue_path, rel))
        lease = queue.lease()
        assert lease is not None and lease.job_id == job


# =========================================================================== lease


def test_lease_empty_returns_none(queue: Queue) -> None:
    assert queue.lease() is None
    assert queue.last_scan is not None and queue.last_scan.errors == [] and queue.last_scan.quarantined == []


@pytest.mark.parametrize("duration", [0.5, 8 * 86400.0, 0, -1.0])
def test_lease_duration_out_of_bounds(queue: Queue, duration: float) -> None:
    queue.enqueue(b"x")
    expect_not_committed(ErrorKind.INVALID_INPUT, queue.lease, duration=duration)
    lease = queue.lease(duration=1.0)  # inclusive lower bound, and the job was not touched
    assert lease is not None and lease.attempt == 1
    expect_not_committed(ErrorKind.INVALID_INPUT, queue.renew, lease, duration=duration)
    queue.renew(lease, duration=7 * 86400.0)  # inclusive upper bound


def test_identity_changes_over_a_life(queue: Queue) -> None:
    """protocol.md example life: g0 a0 → claim g1 a1 → renew g2 → retry_now g3 → claim g4 a2 → ack g5."""
    job = queue.enqueue(b"life", max_attempts=3)
    assert [(i.state, i.generation, i.attempt) for i in queue.inspect(job)] == [(State.READY, 0, 0)]
    lease = queue.lease()
    assert lease is not None and (lease.generation, lease.attempt, lease.max_attempts) == (1, 1, 3)
    assert [(i.state, i.generation, i.attempt) for i in queue.inspect(job)] == [(State.LEASED, 1, 1)]
    queue.renew(lease)
    assert lease.generation == 2 and lease.attempt == 1
    assert queue.retry(lease) == "ready"
    assert [(i.state, i.generation, i.attempt) for i in queue.inspect(job)] == [(State.READY, 3, 1)]
    lease2 = queue.lease()
    assert lease2 is not None and (lease2.generation, lease2.attempt) == (4, 2)
    assert lease2.token != lease.token  # a claim draws a new token
    assert queue.ack(lease2) is AckResult.ACKED
    assert [(i.state, i.generation, i.attempt) for i in queue.inspect(job)] == [(State.RECEIPT, 5, 2)]


def test_lease_name_fields(queue: Queue, queue_path: str) -> None:
    job = queue.enqueue(b"x")
    bt0 = linux.boottime_ns()
    w0 = queue.wall_floor_ns()
    lease = queue.lease(duration=60.0)
    assert lease is not None
    shard = shard_of_job(queue, job)
    parts = lease.path.split("/")
    assert parts[:2] == ["ready", f"{shard:04x}"]  # colocated with ready jobs
    jn = names.parse_name(State.LEASED, parts[2])
    assert jn.boot_id == uuid.UUID(queue.boot_id).bytes and lease.boot_id == queue.boot_id
    assert jn.lease_token == lease.token and len(lease.token) == 16
    assert jn.boottime_deadline == lease.boottime_deadline_ns >= bt0 + 60 * 10**9
    assert jn.wall_deadline == lease.wall_deadline_ns >= w0 + 60 * 10**9
    assert names.authenticate(queue.format.queue_id, jn, shard=shard, lease_width_ns=queue.format.lease_width_ns)
    st = os.stat(os.path.join(queue_path, lease.path))
    assert (st.st_dev, st.st_ino) == (lease.dev, lease.ino)


def test_exhausted_ready_job_goes_to_dead(queue: Queue, queue_path: str) -> None:
    """A ready name with attempt == maximum (written by another implementation) is dead-lettered (0x0004)."""
    job, rel = queue.enqueue_detailed(b"tired", max_attempts=2)
    original = Path(queue_path, rel).read_bytes()
    shard = shard_of_job(queue, job)
    fmt = queue.format
    crafted = names.make_filename(
        fmt.queue_id, names.ready_name(bytes.fromhex(job), 7, 2, 2), shard=shard, lease_width_ns=fmt.lease_width_ns
    )
    os.rename(os.path.join(queue_path, rel), os.path.join(queue_path, "ready", f"{shard:04x}", crafted))
    w0 = queue.wall_floor_ns()
    assert queue.lease() is None
    w1 = queue.wall_floor_ns()
    assert queue.last_scan is not None
    dead_rel = only(queue.last_scan.dead_lettered)
    top, bucket_s, shard_s, filename = dead_rel.split("/")
    assert (top, shard_s) == ("dead", f"{shard:04x}")
    bucket = int(bucket_s, 16)
    assert bucket in {
        names.terminal_bucket(w0, fmt.terminal_width_ns),
        names.terminal_bucket(w1, fmt.terminal_width_ns),
    }
    dn = names.parse_name(State.DEAD, filename)
    assert (dn.generation, dn.attempt, dn.max_attempts, dn.reason) == (8, 2, 2, 4)
    assert names.authenticate(fmt.queue_id, dn, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns)
    assert Path(queue_path, dead_rel).read_bytes() == original
    assert os.listdir(os.path.join(queue_path, "ready", f"{shard:04x}")) == []


# =========================================================================== renew


def test_renew_moves_deadlines_keeps_token_and_inode(queue: Queue, queue_path: str) -> None:
    queue.enqueue(b"x")
    lease = queue.lease(duration=10.0)
    assert lease is not None
    old = copy.copy(lease)
    same = queue.renew(lease, duration=600.0)
    assert same is lease
    assert lease.generation == old.generation + 1 and lease.attempt == old.attempt
    assert lease.token == old.token
    assert lease.boottime_deadline_ns > old.boottime_deadline_ns
    assert lease.wall_deadline_ns > old.wall_deadline_ns
    assert lease.path != old.path
    assert not os.path.exists(os.path.join(queue_path, old.path))
    st = os.stat(os.path.join(queue_path, lease.path))
    assert (st.st_dev, st.st_ino) == (old.dev, old.ino)  # a rename keeps the inode
    jn = names.parse_name(State.LEASED, lease.path.split("/")[-1])
    assert (jn.generation, jn.boottime_deadline, jn.lease_token) == (
        lease.generation,
        lease.boottime_deadline_ns,
        old.token,
    )
    # The snapshot from before the renewal no longer authorises anything.
    with pytest.raises(LeaseLost):
        queue.renew(old)
    with pytest.raises(LeaseLost):
        queue.ack(old)
    assert queue.poisoned is None
    assert queue.ack(lease) is AckResult.ACKED


# =========================================================================== ack


def test_ack_writes_receipt_and_second_ack_is_already_acked(queue: Queue, queue_path: str) -> None:
    job = queue.enqueue(b"done")
    lease = queue.lease()
    assert lease is not None
    fmt = queue.format
    w0 = queue.wall_floor_ns()
    assert queue.ack(lease) is AckResult.ACKED
    w1 = queue.wall_floor_ns()
    shard = shard_of_job(queue, job)
    assert not os.path.exists(os.path.join(queue_path, lease.path))
    expected_name = names.receipt_name(
        bytes.fromhex(job), lease.generation + 1, lease.attempt, lease.max_attempts, lease_token=lease.token
    )
    found = []
    for b in {names.terminal_bucket(w, fmt.terminal_width_ns) for w in (w0, w1)}:
        fn = names.make_filename(fmt.queue_id, expected_name, shard=shard, bucket=b, lease_width_ns=fmt.lease_width_ns)
        p = os.path.join(queue_path, "receipts", f"{b:016x}", f"{shard:04x}", fn)
        if os.path.exists(p):
            found.append(p)
    receipt = only(found)
    assert re.fullmatch(
        r"[0-9a-f]{32}\.g0{15}2\.a0{7}1\.m0{7}3\.t[0-9a-f]{32}\.k[0-9a-f]{16}\.rct", os.path.basename(receipt)
    )
    _, header, _, payload = read_job(os.path.dirname(receipt), os.path.basename(receipt))
    assert header.job_id.hex() == job and payload == b"done"  # a full receipt is the job file
    assert queue.ack(lease) is AckResult.ALREADY_ACKED
    assert queue.poisoned is None


def test_ack_of_removed_lease_without_receipt_is_lease_lost(queue: Queue, queue_path: str) -> None:
    queue.enqueue(b"x")
    lease = queue.lease()
    assert lease is not None
    os.unlink(os.path.join(queue_path, lease.path))
    with pytest.raises(LeaseLost):
        queue.ack(lease)
    assert queue.poisoned is None
    assert not os.path.exists(os.path.join(queue_path, "receipts")) or not [
        f for _, _, fs in os.walk(os.path.join(queue_path, "receipts")) for f in fs
    ]


def _flip_payload_byte(path: str) -> None:
    """Flip the low bit of the payload's third byte from the end: same size, wrong digest."""
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        b = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x01]))


def test_ack_of_corrupted_payload_is_refused_and_poisons(queue: Queue, queue_path: str) -> None:
    queue.enqueue(b"0123456789")
    lease = queue.lease()
    assert lease is not None
    path = os.path.join(queue_path, lease.path)
    _flip_payload_byte(path)
    expect_not_committed(ErrorKind.PAYLOAD_CORRUPT, queue.ack, lease)
    assert queue.poisoned is not None
    assert os.path.exists(path)  # ack does not quarantine, nor write a receipt
    expect_not_committed(ErrorKind.QUEUE_POISONED, queue.enqueue, b"y")


# =========================================================================== retry / bury


def test_retry_now(queue: Queue, queue_path: str) -> None:
    job = queue.enqueue(b"again")
    lease = queue.lease()
    assert lease is not None
    assert queue.retry(lease) == "ready"
    info = only(queue.inspect(job))
    assert (info.state, info.generation, info.attempt) == (State.READY, 2, 1)
    assert info.path.startswith(f"ready/{shard_of_job(queue, job):04x}/")
    assert not os.path.exists(os.path.join(queue_path, lease.path))
    with pytest.raises(LeaseLost):
        queue.retry(lease)


def test_retry_later_with_delay(queue: Queue) -> None:
    job = queue.enqueue(b"later")
    lease = queue.lease()
    assert lease is not None
    w0 = queue.wall_floor_ns()
    assert queue.retry(lease, delay=120.0) == "delayed"
    w1 = queue.wall_floor_ns()
    info = only(queue.inspect(job))
    assert (info.state, info.generation, info.attempt) == (State.DELAYED, 2, 1)
    nb = info.name.not_before
    assert w0 + 120 * 10**9 <= nb <= w1 + 120 * 10**9
    assert info.path.split("/")[1] == f"{-(-nb // queue.format.delayed_width_ns):016x}"
    assert queue.lease() is None


def test_retry_with_policy_uses_spec_jitter(queue: Queue) -> None:
    job = queue.enqueue(b"backoff")
    lease = queue.lease()
    assert lease is not None and lease.attempt == 1
    expected_ms = spec_jitter_ms(1000, 300_000, queue.format.queue_id, bytes.fromhex(job), 1)
    assert 500 <= expected_ms <= 1000
    w0 = queue.wall_floor_ns()
    assert queue.retry(lease, policy=RetryPolicy(base_ms=1000, cap_ms=300_000)) == "delayed"
    w1 = queue.wall_floor_ns()
    nb = only(queue.inspect(job)).name.not_before
    assert w0 <= nb - expected_ms * 1_000_000 <= w1


def test_retry_of_exhausted_lease_buries_with_reason_4(queue: Queue) -> None:
    job = queue.enqueue(b"once", max_attempts=1)
    lease = queue.lease()
    assert lease is not None and lease.attempt == lease.max_attempts == 1
    assert queue.retry(lease) == "dead"
    info = only(queue.inspect(job))
    assert (info.state, info.generation, info.attempt, info.name.reason) == (State.DEAD, 2, 1, 4)
    assert ".x0004." in info.path


@pytest.mark.parametrize("reason", [0, 3, 0x0100, 0xFFFF])
def test_bury_reasons(queue: Queue, queue_path: str, reason: int) -> None:
    job = queue.enqueue(b"bad")
    lease = queue.lease()
    assert lease is not None
    queue.bury(lease, reason=reason)
    info = only(queue.inspect(job))
    assert (info.state, info.generation, info.attempt, info.name.reason) == (State.DEAD, 2, 1, reason)
    assert f".x{reason:04x}.k" in info.path
    assert Path(queue_path, info.path).read_bytes()[HEADER:].endswith(b"bad")
    assert not os.path.exists(os.path.join(queue_path, lease.path))


@pytest.mark.parametrize("reason", [-1, 0x10000, True, "1", 1.0])
def test_bury_invalid_reason(queue: Queue, queue_path: str, reason: object) -> None:
    queue.enqueue(b"x")
    lease = queue.lease()
    assert lease is not None
    err = expect_not_committed(ErrorKind.INVALID_INPUT, queue.bury, lease, reason=reason)
    assert "reason" in err.message
    assert os.path.exists(os.path.join(queue_path, lease.path))
    assert queue.poisoned is None


# =========================================================================== handle files


def test_handle_round_trip_and_ack_from_another_queue_handle(queue: Queue, queue_path: str) -> None:
    queue.enqueue(b"handoff", content_type="text/plain")
    lease = queue.lease()
    assert lease is not None
    text = lease.to_handle(queue_path)
    doc = json.loads(text)
    assert doc["exact_source_path"] == lease.path and doc["expected_inode"] == lease.ino
    loaded, qid = Lease.from_handle(text)
    assert qid == queue.queue_id
    for field in (
        "job_id", "generation", "attempt", "max_attempts", "token", "boot_id", "boottime_deadline_ns",
        "wall_deadline_ns", "dev", "ino", "path", "envelope_digest", "payload_length", "payload_digest",
        "content_type", "queue_id",
    ):  # fmt: skip
        assert getattr(loaded, field) == getattr(lease, field), field
    with Queue.open(queue_path) as other:
        assert other.read_payload(loaded) == b"handoff"
        assert other.ack(loaded) is AckResult.ACKED
    assert queue.ack(lease) is AckResult.ALREADY_ACKED


def _handle_doc(q: Queue, qpath: str) -> tuple[dict, Lease]:  # type: ignore[type-arg]
    q.enqueue(b"x")
    lease = q.lease()
    assert lease is not None
    return json.loads(lease.to_handle(qpath)), lease


def test_forged_handle_is_queue_corrupt(queue: Queue, queue_path: str) -> None:
    doc, lease = _handle_doc(queue, queue_path)
    doc["expected_inode"] = 0
    forged, _ = Lease.from_handle(json.dumps(doc))
    with Queue.open(queue_path) as other:
        expect_not_committed(ErrorKind.QUEUE_CORRUPT, other.ack, forged)
        assert other.poisoned is not None  # QueueCorrupt while validating a lease source poisons
    assert os.path.exists(os.path.join(queue_path, lease.path))
    assert queue.ack(lease) is AckResult.ACKED


def test_handle_of_another_queue_is_invalid_input(queue: Queue, queue_path: str) -> None:
    doc, lease = _handle_doc(queue, queue_path)
    doc["queue_id"] = "ab" * 16
    foreign, qid = Lease.from_handle(json.dumps(doc))
    assert qid == "ab" * 16
    expect_not_committed(ErrorKind.INVALID_INPUT, queue.ack, foreign)
    assert queue.poisoned is None
    assert queue.ack(lease) is AckResult.ACKED


def test_lease_of_another_boot_is_invalid_input(queue: Queue, queue_path: str) -> None:
    doc, lease = _handle_doc(queue, queue_path)
    other_boot = uuid.UUID(bytes=os.urandom(16))
    while str(other_boot) == queue.boot_id:
        other_boot = uuid.UUID(bytes=os.urandom(16))
    own_raw = uuid.UUID(queue.boot_id).hex
    assert f".o{own_raw}." in doc["exact_source_path"]
    doc["exact_source_path"] = doc["exact_source_path"].replace(f".o{own_raw}.", f".o{other_boot.hex}.")
    doc["boot_id"] = str(other_boot)
    stale, _ = Lease.from_handle(json.dumps(doc))
    for op in (queue.ack, queue.renew, queue.retry, queue.bury):
        err = expect_not_committed(ErrorKind.INVALID_INPUT, op, stale)
        assert "boot" in err.message
    assert queue.poisoned is None
    assert queue.ack(lease) is AckResult.ACKED


# =========================================================================== deferred mode, batches, poisoning


def _record_fsync_targets(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Wrap linux.fsync to log the (dev, ino) each call targets; fd numbers alone are ambiguous (dups)."""
    seen: list[tuple[int, int]] = []
    real = linux.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        seen.append((st.st_dev, st.st_ino))
        real(fd)

    monkeypatch.setattr(linux, "fsync", fsync)
    return seen


def test_batch_defers_directory_barriers_to_one_sync(queue_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    Queue.init(queue_path, shards=1).close()
    st = os.stat(os.path.join(queue_path, "ready", "0000"))
    shard_dir_id = (st.st_dev, st.st_ino)
    with Queue.open(queue_path) as queue:
        queue.enqueue(b"warm-up")
        seen = _record_fsync_targets(monkeypatch)
        with queue.batch():
            ids = [queue.enqueue(f"job {i}".encode()) for i in range(3)]
            inside = seen.count(shard_dir_id)
            file_fsyncs = len(seen)
            for job in ids:  # linked already; durable only once the batch's barrier ran
                assert os.path.isfile(os.path.join(queue_path, only(queue.inspect(job)).path))
        after = seen.count(shard_dir_id)
    assert inside == 0
    assert file_fsyncs >= 3  # file fsyncs are never deferred
    assert after == 1  # one directory barrier for the whole batch
    assert len(set(ids)) == 3


def test_deferred_mode_enqueue_then_sync(queue_path: str) -> None:
    Queue.init(queue_path, shards=1).close()
    with Queue.open(queue_path, deferred=True) as queue:
        ids = [queue.enqueue(b"d1"), queue.enqueue(b"d2")]
        for job in ids:
            assert only(queue.inspect(job)).state is State.READY
        assert queue._ctx.tree.pending_barriers >= 1
        queue.sync()
        assert queue._ctx.tree.pending_barriers == 0
        lease = queue.lease()
        assert lease is not None and lease.job_id in ids
        assert queue.ack(lease) is AckResult.ACKED


def test_poisoned_handle_refuses_everything(queue: Queue, queue_path: str) -> None:
    queue.enqueue(b"a")
    queue.enqueue(b"b")
    good = queue.lease()
    assert good is not None
    doc = json.loads(good.to_handle(queue_path))
    doc["expected_dev"] = 0
    forged, _ = Lease.from_handle(json.dumps(doc))
    expect_not_committed(ErrorKind.QUEUE_CORRUPT, queue.renew, forged)
    assert queue.poisoned
    expect_not_committed(ErrorKind.QUEUE_POISONED, queue.enqueue, b"c")
    expect_not_committed(ErrorKind.QUEUE_POISONED, queue.lease)
    expect_not_committed(ErrorKind.QUEUE_POISONED, queue.renew, good)
    expect_not_committed(ErrorKind.QUEUE_POISONED, queue.ack, good)
    expect_not_committed(ErrorKind.QUEUE_POISONED, queue.retry, good)
    expect_not_committed(ErrorKind.QUEUE_POISONED, queue.bury, good)
    # Nothing moved: the lease is still exactly where it was.
    assert os.path.exists(os.path.join(queue_path, good.path))
    # Poisoning is per handle, never on disk.
    with Queue.open(queue_path) as fresh:
        assert fresh.ack(good) is AckResult.ACKED


def test_closed_handle_refuses_reads_and_writes(tmp_path) -> None:
    """A closed handle's descriptor numbers may be reused by another queue:
    every use afterwards is refused, nothing is written anywhere."""
    from steadqd import InvalidInput, Queue

    a = Queue.init(str(tmp_path / "a"), shards=2)
    job = a.enqueue(b"x")
    lease = a.lease()
    assert lease is not None
    a.close()
    b = Queue.init(str(tmp_path / "b"), shards=2)
    try:
        with pytest.raises(NotCommitted) as info:
            a.enqueue(b"evil")
        assert info.value.kind is ErrorKind.QUEUE_POISONED
        with pytest.raises(InvalidInput):
            a.inspect(job)
        with pytest.raises(InvalidInput):
            lease.payload()
        assert b.lease() is None and b.inspect(job) == []
    finally:
        b.close()


def test_copy_payload_of_a_corrupted_payload_writes_it_then_raises_and_quarantines(
    queue: Queue, queue_path: str
) -> None:
    queue.enqueue(b"0123456789")
    lease = queue.lease()
    assert lease is not None
    path = os.path.join(queue_path, lease.path)
    _flip_payload_byte(path)
    out = io.BytesIO()
    with pytest.raises(SteadQError) as ei:
        lease.copy_payload_to(out)
    assert ei.value.kind is ErrorKind.PAYLOAD_CORRUPT
    assert out.getvalue() == b"0123456" + bytes([ord("7") ^ 0x01]) + b"89"  # written, then refused
    assert not os.path.exists(path)
    assert len([f for _, _, fs in os.walk(os.path.join(queue_path, "quarantine")) for f in fs]) == 1
    assert queue.poisoned is None


def test_copy_payload_copies_a_verified_payload_and_refuses_a_closed_handle(queue: Queue, queue_path: str) -> None:
    with Queue.open(queue_path) as q:
        q.enqueue(b"")
        q.enqueue(b"payload")
        copied = []
        for _ in range(2):
            lease = q.lease()
            assert lease is not None
            out = io.BytesIO()
            copied.append((lease.copy_payload_to(out), out.getvalue()))
        assert sorted(copied) == [(0, b""), (7, b"payload")]
    with pytest.raises(InvalidInput):
        lease.copy_payload_to(io.BytesIO())
