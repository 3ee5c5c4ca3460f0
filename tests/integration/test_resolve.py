"""resolve: deciding what an indeterminate transition did (errors.md "resolve").

Real tickets come from OutcomeUnknown: a fault is injected into the first
fsync after the linearizing rename of claim, renew, ack, retry (now/later)
and bury, and the ticket is then resolved (after a JSON round trip, as the
CLI would) both from the poisoned handle and from a fresh one. Hand-built
tickets cover every other row of the combination table: the transition that
never happened (source observed), neither, both (a separate copy at the
source path, not a hard link), conflicts of many shapes at either path,
I/O errors, conflict-over-error precedence, and stabilisation.

Path derivation is checked byte for byte against vectors.md (a stub context
with the vector FORMAT: queue ids of real queues are random) and against
names built with steadqd.fs.names for a real queue.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from steadqd import (  # noqa: E402
    ErrorKind,
    InvalidInput,
    Lease,
    OutcomeUnknown,
    Queue,
    SteadQError,
)
from steadqd.constants import DEAD_DIR, DELAYED_DIR, HEADER_SIZE, READY_DIR, RECEIPTS_DIR, Resolution  # noqa: E402
from steadqd.fs import linux  # noqa: E402
from steadqd.fs.json_records import (  # noqa: E402
    DeadLocation,
    DelayedLocation,
    LeasedLocation,
    Location,
    ReadyLocation,
    ReceiptLocation,
    TransitionTicket,
)
from steadqd.fs.names import (  # noqa: E402
    bucket_dir,
    dead_name,
    delayed_bucket,
    delayed_name,
    leased_name,
    make_filename,
    ready_name,
    receipt_name,
    shard_dir,
    shard_of,
    terminal_bucket,
)
from steadqd.fs.records import FormatRecord, JobHeader  # noqa: E402
from steadqd.fs.resolve import ResolveResult, ticket_paths  # noqa: E402
from tests.invariants import check_tree  # noqa: E402
from tests.spec_vectors import CLAIM_TICKET_JSON as VECTOR_CLAIM_TICKET  # noqa: E402

SHARDS = 4
HOUR_NS = 3600 * 1_000_000_000
LATER_S = 3600.0
PAYLOAD = b"resolve me \x00\xff" * 7


# --------------------------------------------------------------------------- helpers


def _init(path: str) -> Queue:
    """One-hour delayed/terminal widths keep bucket boundaries out of any single call."""
    return Queue.init(path, shards=SHARDS, delayed_width_ns=HOUR_NS, terminal_width_ns=HOUR_NS)


def _abs(q: Queue, rel: str) -> str:
    return os.path.join(q.path, rel)


def _precreate(q: Queue) -> None:
    """Create every bucket directory the operation under test could use, and warm
    the wall floor, so the first fsync of the operation is the one after its rename."""
    ctx = q._ctx
    wall = ctx.wall.for_mutation()
    fmt = ctx.fmt
    s0 = shard_dir(0)
    tb = terminal_bucket(wall, fmt.terminal_width_ns)
    db = delayed_bucket(wall + int(LATER_S * 1e9), fmt.delayed_width_ns)
    for top, b in ((RECEIPTS_DIR, tb), (DEAD_DIR, tb), (DELAYED_DIR, db)):
        for bb in (b, b + 1):
            ctx.tree.ensure_dir(f"{top}/{bucket_dir(bb)}/{s0}")
    ctx.wall.for_mutation()


def _header(q: Queue, rel: str) -> JobHeader:
    with open(_abs(q, rel), "rb") as f:
        return JobHeader.decode(f.read(HEADER_SIZE))


def _ticket(
    q: Queue,
    operation: str,
    *,
    job_id: str,
    generation: int,
    attempt: int,
    max_attempts: int,
    token: bytes,
    header: JobHeader,
    source: Location,
    destination: Location,
    queue_id: bytes | None = None,
) -> TransitionTicket:
    """A hand-built ticket, validated like one read from disk."""
    t = TransitionTicket(
        queue_id=queue_id if queue_id is not None else bytes.fromhex(q.queue_id),
        operation=operation,
        phase="linearized",
        job_id=bytes.fromhex(job_id),
        generation=generation,
        attempt=attempt,
        maximum_attempts=max_attempts,
        lease_token=token,
        envelope_digest=header.envelope_digest,
        payload_length=header.payload_length,
        source=source,
        destination=destination,
    )
    t.validate()
    return t


def _lease_ticket(q: Queue, lease: Lease, operation: str, destination: Location) -> TransitionTicket:
    """A ticket for settling/renewing ``lease`` (source = the lease as it is now)."""
    return _ticket(
        q,
        operation,
        job_id=lease.job_id,
        generation=lease.generation,
        attempt=lease.attempt,
        max_attempts=lease.max_attempts,
        token=lease.token,
        header=_header(q, lease.path),
        source=LeasedLocation(lease.boot_id, lease.boottime_deadline_ns, lease.wall_deadline_ns),
        destination=destination,
    )


def _now_bucket(q: Queue) -> int:
    return terminal_bucket(q._ctx.wall.peek(), q.format.terminal_width_ns)


def _leased(q: Queue) -> tuple[str, Lease]:
    job = q.enqueue(PAYLOAD, max_attempts=3)
    lease = q.lease(duration=60)
    assert lease is not None and lease.job_id == job
    return job, lease


# --------------------------------------------------------------------------- real tickets


def _run_claim(q: Queue, lease: Lease | None) -> Any:
    return q.lease(duration=60)


OPS: dict[str, tuple[str, Callable[[Queue, Any], Any], str]] = {
    # key: (ticket operation, action, destination state)
    "claim": ("claim", _run_claim, "leased"),
    "renew": ("renew", lambda q, lease: q.renew(lease, 120), "leased"),
    "ack": ("acknowledge", lambda q, lease: q.ack(lease), "receipt"),
    "retry_now": ("retry_now", lambda q, lease: q.retry(lease), "ready"),
    "retry_later": ("retry_later", lambda q, lease: q.retry(lease, LATER_S), "delayed"),
    "bury": ("bury", lambda q, lease: q.bury(lease, 3), "dead"),
}


def _indeterminate(q: Queue, key: str, nth: int = 1) -> tuple[str, TransitionTicket]:
    """Run ``key`` with the ``nth`` fsync failing; returns (job id, ticket)."""
    operation, action, _ = OPS[key]
    job = q.enqueue(PAYLOAD, max_attempts=3)
    lease = None if key == "claim" else q.lease(duration=60)
    _precreate(q)
    with linux.trace() as events, linux.inject(nth=nth, errno=errno.EIO, op="fsync") as fault:
        with pytest.raises(OutcomeUnknown) as ei:
            action(q, lease)
    assert fault.fired
    ops = [e.op for e in events]
    assert "rename_noreplace" in ops, "the fault must hit a barrier after the rename"
    assert ops.index("rename_noreplace") < ops.index("fsync"), ops
    ticket = ei.value.ticket
    assert isinstance(ticket, TransitionTicket), ticket
    assert ticket.operation == operation and ticket.job_id.hex() == job
    assert q.poisoned is not None
    return job, ticket


@pytest.mark.parametrize("key", list(OPS))
def test_real_ticket_resolves_to_destination(queue_path: str, key: str) -> None:
    q = _init(queue_path)
    try:
        job, ticket = _indeterminate(q, key)
        assert ticket.phase == "linearized"
        parsed = TransitionTicket.from_json(ticket.to_json())  # what lease --ticket-out / resolve do
        assert parsed == ticket
        # The poisoned handle that raised it may still ask (resolve does not mutate).
        assert q.resolve(parsed).outcome is Resolution.DESTINATION_OBSERVED
    finally:
        q.close()
    with Queue.open(queue_path) as fresh:
        src, dst = fresh.ticket_paths(parsed)
        state = check_tree(queue_path, allow_quarantine=False)
        obj = state.get(job)
        assert obj is not None and obj.state.value == OPS[key][2]
        assert obj.path == dst, (obj.path, dst)
        assert not os.path.lexists(_abs(fresh, src))
        assert fresh.resolve(parsed) == ResolveResult(Resolution.DESTINATION_OBSERVED, src, dst, None)
        with linux.trace() as events:
            r = fresh.resolve(parsed, stabilize=True)
        assert r == ResolveResult(Resolution.DESTINATION_STABILIZED, src, dst, None)
        assert [e.op for e in events].count("fsync") == 2  # the file, then its directory
        assert fresh.poisoned is None
        # Resolving changed nothing.
        assert check_tree(queue_path, allow_quarantine=False).paths() == state.paths()


@pytest.mark.parametrize("key", ["ack", "retry_later", "bury"])
def test_source_directory_barrier_failure_resolves_to_destination(queue_path: str, key: str) -> None:
    """Cross-directory moves: the second fsync (source dir) fails after the destination is durable."""
    q = _init(queue_path)
    try:
        _, ticket = _indeterminate(q, key, nth=2)
        assert ticket.phase == "destination_directory_durable"
    finally:
        q.close()
    with Queue.open(queue_path) as fresh:
        assert fresh.resolve(ticket).outcome is Resolution.DESTINATION_OBSERVED


# --------------------------------------------------------------------------- hand-built tickets


def test_transition_that_never_happened_is_source_observed(queue: Queue) -> None:
    job, lease = _leased(queue)
    ticket = _lease_ticket(queue, lease, "acknowledge", ReceiptLocation(_now_bucket(queue)))
    src, dst = queue.ticket_paths(ticket)
    assert src == lease.path
    assert queue.resolve(ticket) == ResolveResult(Resolution.SOURCE_OBSERVED, src, dst, None)
    with linux.trace() as events:
        assert queue.resolve(ticket, stabilize=True).outcome is Resolution.SOURCE_STABILIZED
    assert [e.op for e in events].count("fsync") == 2
    # The lease is untouched and still works.
    assert queue.ack(lease).value == "acked"
    assert queue.resolve(ticket).outcome is Resolution.DESTINATION_OBSERVED


def test_claim_ticket_for_a_ready_job_is_source_observed(queue: Queue) -> None:
    job = queue.enqueue(PAYLOAD)
    (info,) = queue.inspect(job)
    token = os.urandom(16)
    ticket = _ticket(
        queue,
        "claim",
        job_id=job,
        generation=0,
        attempt=0,
        max_attempts=3,
        token=token,
        header=_header(queue, info.path),
        source=ReadyLocation(),
        destination=LeasedLocation(queue.boot_id, 10**12, 1_700_000_000 * 10**9),
    )
    src, dst = queue.ticket_paths(ticket)
    assert src == info.path
    assert queue.resolve(ticket).outcome is Resolution.SOURCE_OBSERVED
    assert queue.resolve(ticket, stabilize=True).outcome is Resolution.SOURCE_STABILIZED


def test_neither_observed(queue: Queue) -> None:
    _, lease = _leased(queue)
    header = _header(queue, lease.path)
    bucket = _now_bucket(queue)
    queue.ack(lease)
    good = _ticket(queue, "acknowledge", job_id=lease.job_id, generation=lease.generation, attempt=lease.attempt,
                   max_attempts=lease.max_attempts, token=lease.token, header=header,
                   source=LeasedLocation(lease.boot_id, lease.boottime_deadline_ns, lease.wall_deadline_ns),
                   destination=ReceiptLocation(bucket))  # fmt: skip
    assert queue.resolve(good).outcome is Resolution.DESTINATION_OBSERVED  # hand-built receipt ticket matches
    # Only the single receipt path of the ticket's bucket is probed (open-questions 5).
    other_bucket = TransitionTicket(**{**good.__dict__, "destination": ReceiptLocation(bucket + 7)})
    r = queue.resolve(other_bucket)
    assert r.outcome is Resolution.NEITHER_OBSERVED and r.error is None
    with linux.trace() as events:
        assert queue.resolve(other_bucket, stabilize=True).outcome is Resolution.NEITHER_OBSERVED
    assert "fsync" not in [e.op for e in events]


def test_both_observed_with_a_separate_copy_at_the_source(queue_path: str) -> None:
    q = _init(queue_path)
    try:
        _, lease = _leased(q)
        with open(_abs(q, lease.path), "rb") as f:
            original = f.read()
        _precreate(q)
        with linux.inject(nth=1, errno=errno.EIO, op="fsync"), pytest.raises(OutcomeUnknown) as ei:
            q.ack(lease)
        ticket = ei.value.ticket
    finally:
        q.close()
    with Queue.open(queue_path) as fresh:
        src, dst = fresh.ticket_paths(ticket)
        assert os.path.exists(_abs(fresh, dst))
        with open(_abs(fresh, src), "xb") as f:  # a distinct inode with the same bytes
            f.write(original)
        r = fresh.resolve(ticket)
        assert r.outcome is Resolution.BOTH_OBSERVED, r
        assert fresh.resolve(ticket, stabilize=True).outcome is Resolution.BOTH_OBSERVED
        with pytest.raises(AssertionError):  # the independent checker agrees: one job, two places
            check_tree(queue_path)
        # A hard link instead of a copy is a different violation: neither path is a
        # singly linked file any more, so both are conflicts.
        os.unlink(_abs(fresh, src))
        os.link(_abs(fresh, dst), _abs(fresh, src))
        r = fresh.resolve(ticket)
        assert r.outcome is Resolution.CONFLICTING_OBJECT and r.error and "singly linked" in r.error


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _another_jobs_file(q: Queue) -> bytes:
    other = q.enqueue(b"someone else entirely")
    (info,) = q.inspect(other)
    with open(_abs(q, info.path), "rb") as f:
        return f.read()


CONFLICTS: dict[str, Callable[[Queue, str, str], None]] = {
    "garbage": lambda q, src, dst: _write(_abs(q, dst), b"\x42" * 300),
    "short": lambda q, src, dst: _write(_abs(q, dst), b"SDQJOB1\0tiny"),
    "empty": lambda q, src, dst: _write(_abs(q, dst), b""),
    "symlink": lambda q, src, dst: (
        os.makedirs(os.path.dirname(_abs(q, dst)), exist_ok=True),
        os.symlink(_abs(q, src), _abs(q, dst)),
    ),  # fmt: skip
    "directory": lambda q, src, dst: os.makedirs(_abs(q, dst)),
    "fifo": lambda q, src, dst: (os.makedirs(os.path.dirname(_abs(q, dst)), exist_ok=True), os.mkfifo(_abs(q, dst))),
    "other_job": lambda q, src, dst: _write(_abs(q, dst), _another_jobs_file(q)),
    "same_job_bytes": lambda q, src, dst: _write(_abs(q, dst), open(_abs(q, src), "rb").read()),  # noqa: SIM115
}


@pytest.mark.parametrize("dest_kind", ["dead", "receipt"])
@pytest.mark.parametrize("shape", list(CONFLICTS))
def test_conflicting_object_at_destination(queue: Queue, shape: str, dest_kind: str) -> None:
    _, lease = _leased(queue)
    bucket = _now_bucket(queue)
    if dest_kind == "dead":
        ticket = _lease_ticket(queue, lease, "bury", DeadLocation(bucket, 1))
    else:
        ticket = _lease_ticket(queue, lease, "acknowledge", ReceiptLocation(bucket))
    src, dst = queue.ticket_paths(ticket)
    CONFLICTS[shape](queue, src, dst)
    r = queue.resolve(ticket)
    if shape == "same_job_bytes":
        # A separate copy of the very job at the expected name authenticates (a full
        # receipt is the job file itself): both paths hold the job, which is
        # corruption of another kind, never a clean "destination observed".
        assert r.outcome is Resolution.BOTH_OBSERVED, r
        return
    assert r.outcome is Resolution.CONFLICTING_OBJECT, r
    assert r.error and dst in r.error
    assert queue.resolve(ticket, stabilize=True).outcome is Resolution.CONFLICTING_OBJECT


def test_corrupt_source_is_a_conflict(queue: Queue) -> None:
    _, lease = _leased(queue)
    ticket = _lease_ticket(queue, lease, "retry_now", ReadyLocation())
    path = _abs(queue, lease.path)
    with open(path, "r+b") as f:  # flip the last payload byte: header fine, digest wrong
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    r = queue.resolve(ticket)
    assert r.outcome is Resolution.CONFLICTING_OBJECT and "digest" in (r.error or "")


def test_io_error_is_resolution_failed_and_conflict_wins(queue: Queue) -> None:
    _, lease = _leased(queue)
    ticket = _lease_ticket(queue, lease, "bury", DeadLocation(_now_bucket(queue), 1))
    src, dst = queue.ticket_paths(ticket)
    with linux.inject(nth=1, errno=errno.EIO, op="openat2"):  # the source directory
        r = queue.resolve(ticket)
    assert r.outcome is Resolution.RESOLUTION_FAILED and r.error and "open" in r.error
    with linux.inject(nth=1, errno=errno.EIO, op="read"):  # reading the source header
        assert queue.resolve(ticket).outcome is Resolution.RESOLUTION_FAILED
    _write(_abs(queue, dst), b"junk" * 40)
    with linux.inject(nth=1, errno=errno.EIO, op="openat2"):
        r = queue.resolve(ticket)
    assert r.outcome is Resolution.CONFLICTING_OBJECT, r  # conflict takes precedence over error
    os.unlink(_abs(queue, dst))
    assert queue.resolve(ticket).outcome is Resolution.SOURCE_OBSERVED


def test_stabilize_fsync_failure_is_resolution_failed(queue: Queue) -> None:
    _, lease = _leased(queue)
    ticket = _lease_ticket(queue, lease, "renew", LeasedLocation(lease.boot_id, 10**13, 10**18))
    for nth in (1, 2):  # the file fsync, then the directory fsync
        with linux.inject(nth=nth, errno=errno.EIO, op="fsync") as fault:
            r = queue.resolve(ticket, stabilize=True)
        assert fault.fired
        assert r.outcome is Resolution.RESOLUTION_FAILED and "fsync" in (r.error or "")
    assert queue.resolve(ticket, stabilize=True).outcome is Resolution.SOURCE_STABILIZED


def test_tickets_of_another_queue_or_invalid_are_refused(queue: Queue, tmp_path: Any) -> None:
    _, lease = _leased(queue)
    ticket = _lease_ticket(queue, lease, "retry_now", ReadyLocation())
    with Queue.init(str(tmp_path / "other"), shards=SHARDS) as other:
        with pytest.raises(InvalidInput, match="queue_id differs"):
            other.ticket_paths(ticket)
        with pytest.raises(InvalidInput):
            other.resolve(ticket)
    bad = TransitionTicket(**{**ticket.__dict__, "attempt": 4})  # attempt > maximum_attempts
    with pytest.raises(SteadQError) as ei:
        queue.resolve(bad)
    assert ei.value.kind is ErrorKind.INVALID_TICKET
    wrong_states = TransitionTicket(**{**ticket.__dict__, "operation": "bury"})  # bury must go to dead
    with pytest.raises(SteadQError) as ei:
        queue.ticket_paths(wrong_states)
    assert ei.value.kind is ErrorKind.INVALID_TICKET


# --------------------------------------------------------------------------- path derivation


_J = "f0e1d2c3b4a5968778695a4b3c2d1e0f"
_LEASE_B = "o12345678123412341234123456789abc"
_TOK = "t00112233445566778899aabbccddeeff"
VECTOR_PATHS = {
    "ready": f"ready/000a/{_J}.g0000000000000000.a00000000.m00000003.k02d0612ad4b6cfc9.sqj",
    "claimed": f"ready/000a/{_J}.g0000000000000001.a00000001.m00000003.{_LEASE_B}.b000000efd0c8bc00"
    f".w17979d065c539e00.{_TOK}.keafd49285a49db42.sqj",
    "renewed": f"ready/000a/{_J}.g0000000000000002.a00000001.m00000003.{_LEASE_B}.b000000f478e08400"
    f".w17979d0b046b6600.{_TOK}.ka7f95f8c5881c72b.sqj",
    "receipt": f"receipts/000000000007349e/000a/{_J}.g0000000000000003.a00000001.m00000003.{_TOK}"
    ".kbc5a89da2b2fd450.rct",
    "delayed": f"delayed/000000000a21fe8b/000a/{_J}.g0000000000000002.a00000001.m00000003.d17979d157ea0e801"
    ".kb00be335756af11d.sqj",
    "dead": f"dead/000000000007349e/000a/{_J}.g0000000000000002.a00000001.m00000003.x0001.k4ee0e206d543aa40.sqj",
}


def _vector_context() -> Any:
    """ticket_paths needs only the FORMAT facts of the handle's context; real queue ids are random."""
    fmt = FormatRecord(
        queue_id=bytes.fromhex("000102030405060708090a0b0c0d0e0f"),
        created_at_ns=1_700_000_000_000_000_000,
        shard_count=64,
        lease_width_ns=10_000_000_000,
        delayed_width_ns=10_000_000_000,
        terminal_width_ns=3_600_000_000_000,
        max_payload_length=(1 << 40) - 1,
    )
    return SimpleNamespace(fmt=fmt, queue_id=fmt.queue_id)


def test_ticket_paths_match_vectors_byte_for_byte() -> None:
    ctx = _vector_context()
    claim = TransitionTicket.from_json(VECTOR_CLAIM_TICKET)
    assert ticket_paths(ctx, claim) == (VECTOR_PATHS["ready"], VECTOR_PATHS["claimed"])
    step2 = LeasedLocation("12345678-1234-1234-1234-123456789abc", 1_030_000_000_000, 1_700_000_035_000_000_000)
    step3 = LeasedLocation("12345678-1234-1234-1234-123456789abc", 1_050_000_000_000, 1_700_000_055_000_000_000)
    base = {**claim.__dict__, "generation": 1, "attempt": 1, "source": step2}
    cases = [
        ({"operation": "renew", "destination": step3}, "claimed", "renewed"),
        ({"operation": "acknowledge", "generation": 2, "source": step3, "destination": ReceiptLocation(0x7349E)},
         "renewed", "receipt"),
        ({"operation": "retry_later", "destination": DelayedLocation(1_700_000_100_000_000_001)}, "claimed", "delayed"),
        ({"operation": "bury", "destination": DeadLocation(0x7349E, 1)}, "claimed", "dead"),
    ]  # fmt: skip
    for change, src, dst in cases:
        t = TransitionTicket(**{**base, **change})
        t.validate()
        assert ticket_paths(ctx, t) == (VECTOR_PATHS[src], VECTOR_PATHS[dst]), change["operation"]


def test_ticket_paths_match_steadqd_names_for_a_real_queue(queue: Queue) -> None:
    qid = bytes.fromhex(queue.queue_id)
    fmt = queue.format
    job = os.urandom(16)
    shard = shard_of(qid, job, fmt.shard_count)
    s = shard_dir(shard)
    token = os.urandom(16)
    boot = bytes.fromhex(queue.boot_id.replace("-", ""))
    header = JobHeader(job, 5, 0, 0, 3, bytes(32), bytes(32))

    def fn(name: Any, bucket: int | None = None) -> str:
        return make_filename(qid, name, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns)

    leased = LeasedLocation(queue.boot_id, 123 * 10**9, 1_800_000_000 * 10**9)
    src_leased = f"{READY_DIR}/{s}/" + fn(
        leased_name(job, 7, 2, 5, boot_id=boot, boottime_deadline=123 * 10**9, wall_deadline=1_800_000_000 * 10**9,
                    lease_token=token))  # fmt: skip
    nb = 1_800_000_000 * 10**9 + 1
    db = delayed_bucket(nb, fmt.delayed_width_ns)
    expected = {
        "retry_now": (ReadyLocation(), f"{READY_DIR}/{s}/" + fn(ready_name(job, 8, 2, 5))),
        "retry_later": (
            DelayedLocation(nb),
            f"{DELAYED_DIR}/{bucket_dir(db)}/{s}/" + fn(
                delayed_name(job, 8, 2, 5, not_before=nb), db),
        ),
        "acknowledge": (ReceiptLocation(99), f"{RECEIPTS_DIR}/{bucket_dir(99)}/{s}/"
                        + fn(receipt_name(job, 8, 2, 5, lease_token=token), 99)),
        "bury": (DeadLocation(98, 0x0104), f"{DEAD_DIR}/{bucket_dir(98)}/{s}/"
                 + fn(dead_name(job, 8, 2, 5, reason=0x0104), 98)),
    }  # fmt: skip
    for operation, (dest, path) in expected.items():
        t = _ticket(queue, operation, job_id=job.hex(), generation=7, attempt=2, max_attempts=5, token=token,
                    header=header, source=leased, destination=dest)  # fmt: skip
        assert queue.ticket_paths(t) == (src_leased, path), operation
    claim = _ticket(queue, "claim", job_id=job.hex(), generation=6, attempt=1, max_attempts=5, token=token,
                    header=header, source=ReadyLocation(), destination=leased)  # fmt: skip
    assert queue.ticket_paths(claim) == (f"{READY_DIR}/{s}/" + fn(ready_name(job, 6, 1, 5)), src_leased)
