"""The C ack against the Python it mirrors, on generated and hostile lease files (issue 35).

steadqd.fs.settle.ack is the specification; sq_ack (steadqd/fs/compiled/settle.c) takes its
happy path (validate_source's open, fstat and envelope checks, the header against the lease, the
payload digest, the witnessed no-replace rename into receipts/ and the directory fsyncs) and hands
every deviation back to it (settle._ack_fast). Each example takes one leased job of a prepared
queue (small, with an extension, a payload or extension past the first read), makes its file or
its receipt path hostile (changed bytes, a truncation, another inode, a symlink, a FIFO, a hard
link, gone, a receipt already there, a conflicting file at the receipt path, the receipt directory
removed), optionally arms one injected syscall fault, optionally batches, and acks once on each
path. Both must give the same result or error, the same poisoning, the same tree and, traced, the
same syscall sequence; the untraced runs check the libc table the same way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadqd import Queue
from steadqd.fs import settle
from steadqd.fs.compiled import bridge
from steadqd.fs.lease import Lease
from tests.integration.core_spy import observed, on_path, paths_agree, set_memo, spy_one_call
from tests.integration.test_claim_core import _normal_trace, _tree

pytestmark = pytest.mark.skipif(not bridge.available(), reason=bridge.path())

WALL = 1_800_000_000_000_000_000
JOBS = ("small", "ext", "large", "long_ext")
KINDS = (
    "valid", "payload_flip", "header_flip", "truncated", "replaced", "symlink", "fifo", "hardlink", "gone",
    "acked_before", "receipt_taken", "receipt_dir_removed", "lease_digest", "lease_length", "generation_max",
    "attempt_bool", "dev_float", "lease_negative", "digest_bytearray", "digest_long", "envelope_long",
    "envelope_none",
)  # fmt: skip
FAULT_OPS = ("open", "fstat", "read", "stat", "rename_noreplace", "fsync", "close", "openat2", "mkdir", "dup")


@pytest.fixture(scope="module")
def base() -> Iterator[tuple[str, dict[str, str]]]:
    """A queue (one shard) whose four jobs are leased; their handle files by job kind."""
    top = tempfile.mkdtemp(prefix="ackcore-")
    root = os.path.join(top, "base")
    Queue.init(root, shards=1, max_payload_length=20000, allow_unsupported_fs=True).close()
    handles = {}
    with Queue.open(root, allow_unsupported_fs=True) as q:
        q.enqueue(b"small payload")
        q.enqueue(b"with extension", content_type="text/plain", metadata={"k": "v"})
        q.enqueue(b"L" * 9000)
        q.enqueue(b"x", metadata={"k": "v" * 4000, "l": "w" * 1000})
        by_length = {13: "small", 14: "ext", 9000: "large", 1: "long_ext"}  # claimed in scan order, not this one
        for _ in JOBS:
            lease = q.lease(wait=0, duration=3600)
            assert lease is not None
            handles[by_length[lease.payload_length]] = lease.to_handle(root)
    assert sorted(handles) == sorted(JOBS)
    yield root, handles
    shutil.rmtree(top)


def _receipt_rel(q: Queue, lease: Lease) -> tuple[str, str]:
    """The receipt directory and file name the ack at WALL makes (settle.ack's own arithmetic)."""
    from steadqd.constants import State
    from steadqd.fs import names

    fmt = q._ctx.fmt
    bucket = names.terminal_bucket(WALL, fmt.terminal_width_ns)
    shard = names.shard_of(fmt.queue_id, lease.job_id_bytes, fmt.shard_count)
    target = names.make_filename(
        fmt.queue_id, settle._receipt_of(lease), shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns
    )
    return names.state_dir(State.RECEIPT, shard, bucket), target


def _spoil(root: str, q: Queue, lease: Lease, kind: str) -> None:
    """Make the leased file, the lease or the receipt path hostile (deterministic: each copy the same)."""
    path = os.path.join(root, lease.path)
    rel, target = _receipt_rel(q, lease)
    if kind == "payload_flip":
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 1]))
    elif kind == "header_flip":
        with open(path, "r+b") as f:
            f.seek(60)
            f.write(b"\xff")
    elif kind == "truncated":
        os.truncate(path, os.path.getsize(path) - 1)
    elif kind == "replaced":
        shutil.copyfile(path, path + ".new")
        os.rename(path + ".new", path)
    elif kind == "symlink":
        os.unlink(path)
        os.symlink("/etc/hostname", path)
    elif kind == "fifo":
        os.unlink(path)
        os.mkfifo(path)
        # The lease names the FIFO's inode (else a reused inode number decides which check fails first).
        lease.ino = os.lstat(path).st_ino
    elif kind == "hardlink":
        os.link(path, os.path.join(root, "tmp-hardlink"))
    elif kind == "gone":
        os.unlink(path)
    elif kind == "receipt_taken":
        with open(os.path.join(root, rel, target), "wb") as f:
            f.write(b"not a receipt")
    elif kind == "receipt_dir_removed":
        os.rmdir(os.path.join(root, rel))
    elif kind == "lease_digest":
        lease.payload_digest = bytes(32)
    elif kind == "lease_length":
        lease.payload_length += 1
    elif kind == "generation_max":  # next_generation refuses it before any syscall
        lease.generation = (1 << 64) - 1
    elif kind == "attempt_bool":  # equal to 1 but not an int: the Python's name checks judge it
        lease.attempt = True
    elif kind == "dev_float":  # equal to the file's device, not an int: the Python's comparison judges it
        lease.dev = float(lease.dev)
    elif kind == "lease_negative":  # no file has it; the core cannot take it (OverflowError): the Python's
        lease.payload_length = -1
    elif kind == "digest_bytearray":  # equal to the header's digest in Python, not bytes
        lease.payload_digest = bytearray(lease.payload_digest)  # type: ignore[assignment]
    elif kind == "digest_long":  # the header's digest and one byte more: C, copying 32 bytes, would match it
        lease.payload_digest += b"\0"
    elif kind == "envelope_long":
        lease.envelope_digest += b"\0"
    elif kind == "envelope_none":  # no length at all: the Python's comparison judges it
        lease.envelope_digest = None  # type: ignore[assignment]


def _run(
    base: str,
    handle: str,
    tag: str,
    kind: str,
    *,
    pure: bool,
    traced: bool,
    fault: Any,
    batch: bool,
    warm_ids: bool,
    memo: bool = False,
) -> dict[str, Any]:
    root = os.path.join(os.path.dirname(base), tag)
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base, root, symlinks=True)
    lease, _ = Lease.from_handle(handle)
    st_ = os.lstat(os.path.join(root, lease.path))
    lease.dev, lease.ino = st_.st_dev, st_.st_ino  # the copy's inode
    set_memo(os.path.join(root, lease.path), 20000, memo)  # before the spoiling, as after the claim
    with on_path(pure, WALL):
        q = Queue.open(root, allow_unsupported_fs=True)
        try:
            assert (q._ctx.c_core is None) == pure
            tree = q._ctx.tree
            rel, _ = _receipt_rel(q, lease)
            # Both directories open, as after the first ack into a bucket (the core's precondition).
            src = tree.dir(lease.path.rsplit("/", 1)[0])
            dst = tree.ensure_dir(rel)
            if warm_ids:
                tree._same_dir(src, dst)
            if kind == "acked_before":
                q.ack(Lease.from_handle(handle)[0].__class__(**{**vars(lease)}))
            _spoil(root, q, lease, kind)
            with observed(traced, fault, q.batch() if batch else None) as events:
                try:
                    result: Any = repr(q.ack(lease))
                except Exception as e:
                    result = (type(e).__name__, str(e).replace(root, "<root>"))
            poisoned = q._ctx.poisoned
        finally:
            with contextlib.suppress(Exception):
                q.close()
    return {
        "result": result,
        "poisoned": None if poisoned is None else str(poisoned).replace(root, "<root>"),
        "tree": _tree(root),
        "trace": _normal_trace(events),
    }


faults = st.none() | st.tuples(
    st.none() | st.sampled_from(FAULT_OPS),  # None: the nth syscall of any op
    st.integers(1, 12),
    st.sampled_from([errno.EIO, errno.ENOENT, errno.EACCES, errno.ENOSPC, errno.EEXIST]),
    st.booleans(),
)


def _compare(
    base: tuple[str, dict[str, str]],
    job: str,
    kind: str,
    fault: Any,
    batch: bool,
    warm_ids: bool,
    memo: bool = False,
) -> None:
    root, handles = base
    paths_agree(
        lambda tag, pure, traced: _run(
            root,
            handles[job],
            tag,
            kind,
            pure=pure,
            traced=traced,
            fault=fault if traced else None,
            batch=batch,
            warm_ids=warm_ids,
            memo=memo,
        )
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    job=st.sampled_from(JOBS),
    kind=st.sampled_from(KINDS),
    fault=faults,
    batch=st.booleans(),
    warm_ids=st.booleans(),
    memo=st.booleans(),
)
def test_core_and_python_agree(
    base: tuple[str, dict[str, str]], job: str, kind: str, fault: Any, batch: bool, warm_ids: bool, memo: bool
) -> None:
    _compare(base, job, kind, fault, batch, warm_ids, memo)


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("after", [False, True])
@pytest.mark.parametrize("nth", range(1, 13))
@pytest.mark.parametrize("job", ["ext", "large"])
def test_a_fault_at_each_syscall_of_an_ack(
    base: tuple[str, dict[str, str]], job: str, nth: int, after: bool, batch: bool
) -> None:
    """Every position of a valid ack's syscall sequence failing (EIO, before or after its effect), in
    Queue.batch() too (the core stops before the barriers, which the tree postpones and the batch's
    end makes: its fstat, dup and fsyncs are in the sequence)."""
    _compare(base, job, "valid", (None, nth, errno.EIO, after), batch, nth % 2 == 0, nth % 3 == 0)


@pytest.mark.parametrize("memo", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("job", JOBS)
def test_each_kind_alone(base: tuple[str, dict[str, str]], job: str, kind: str, memo: bool) -> None:
    """Each kind with verify.py's memo empty, and holding the file's bytes as verified before it was spoiled."""
    _compare(base, job, kind, None, False, False, memo)


def test_a_valid_ack_is_the_cores(base: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A small valid job is acked by the core in one call (no replay), with the pinned ack's syscalls;
    in a batch, up to the barriers."""
    stages, made = spy_one_call(monkeypatch, "ack")
    root, handles = base
    stages.clear()
    made.clear()
    out = _run(root, handles["ext"], "fast", "valid", pure=False, traced=False, fault=None, batch=True,
               warm_ids=False)  # fmt: skip
    assert "ACKED" in out["result"]
    assert stages == [bridge.MOVED_BARRIER_LEFT]  # in a batch: the barriers are the tree's
    assert made == ["open", "fstat", "read", "stat", "rename_noreplace", "stat"]
    for warm, fstats in ((False, ["fstat", "fstat"]), (True, [])):
        stages.clear()
        made.clear()
        out = _run(root, handles["ext"], "fast", "valid", pure=False, traced=False, fault=None, batch=False,
                   warm_ids=warm)  # fmt: skip
        assert out["result"] == "<AckResult.ACKED: 'acked'>" or "ACKED" in out["result"]
        assert stages == [bridge.ACKED]
        assert made == ["open", "fstat", "read", "stat", "rename_noreplace", "stat", "fsync", *fstats, "fsync"]


@pytest.mark.parametrize("pure", [False, True])
def test_an_ack_forgets_its_leases_memo_entries(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, pure: bool) -> None:
    """An acked lease's verified envelope (verify.py's memo) and path facts (lease.py's) are dropped, on the
    core's ack and the Python's alike: no read can need them, and kept until a memo fills they are what makes
    the cyclic GC run every few dozen lifecycles. A lease not yet acked keeps both; payload() and a repeated
    ack still work without them."""
    from steadqd.fs import lease as lease_mod
    from steadqd.fs import verify

    if pure:
        monkeypatch.setenv(bridge.SWITCH, "1")
    else:
        monkeypatch.delenv(bridge.SWITCH, raising=False)
    path = str(tmp_path / "q")
    Queue.init(path, allow_unsupported_fs=True).close()

    def facts_of(lease: Lease) -> list[Any]:
        return [k for k in lease_mod._FACTS if k[3] == lease.path]

    with Queue.open(path, allow_unsupported_fs=True) as q:
        q.enqueue(b"acked")
        q.enqueue(b"kept")
        first, second = q.lease(wait=0), q.lease(wait=0)
        assert first is not None and second is not None
        for lease in (first, second):
            assert lease.payload() in (b"acked", b"kept")
            assert verify._VERIFIED.get((lease.dev, lease.ino)) is not None
            assert len(facts_of(lease)) == 1
        assert "ACKED" in repr(q.ack(first))
        assert verify._VERIFIED.get((first.dev, first.ino)) is None
        assert facts_of(first) == []
        assert verify._VERIFIED.get((second.dev, second.ino)) is not None
        assert len(facts_of(second)) == 1
        assert "ACKED" in repr(q.ack(first))  # the repeated ack finds the receipt, without the memos
        assert second.payload() in (b"acked", b"kept")
        assert "ACKED" in repr(q.ack(second))
        assert verify._VERIFIED.get((second.dev, second.ino)) is None and facts_of(second) == []
