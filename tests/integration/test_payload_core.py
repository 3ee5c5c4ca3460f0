"""The C payload() against the Python it mirrors, on generated and hostile lease files (issue 35).

Queue.read_payload's Python (lease.validate_source, then verify.read_payload; a payload that fails its
digest is quarantined) is the specification; sq_read_payload (steadqd/fs/compiled/lease.c) takes its
happy path after checked_path's pure checks (the open, fstat, first read and envelope checks, the header
against the lease, the stat that proves the path still names the file, the payload digest of a payload
the first read holds) and hands every deviation back to it (lease.core_payload, replayed). Each example
takes one leased job of a prepared queue (small, with an extension, empty, at the first read's edge, just
past it, an extension pushing the payload past it, an extension or payload past it), makes its file or
its lease hostile (changed payload, header or extension bytes, a truncation, a byte appended, another
inode, a symlink, a FIFO, a hard link, gone, lease fields no file has or of other types, a bad path),
optionally arms one injected syscall fault, optionally opens the lease's directory first and batches,
and reads the payload once on each path. Both must give the same payload or error, the same poisoning,
the same tree (quarantine included) and, traced, the same syscall sequence; the untraced runs check the
libc table the same way.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadqd import Queue
from steadqd.constants import ENVELOPE_READ_BYTES, HEADER_SIZE
from steadqd.fs import linux, verify
from steadqd.fs.compiled import bridge
from steadqd.fs.context import Context
from steadqd.fs.lease import Lease
from tests.integration.core_spy import observed, on_path, paths_agree, set_memo, spy_one_call
from tests.integration.test_claim_core import _normal_trace, _tree

pytestmark = pytest.mark.skipif(not bridge.available(), reason=bridge.path())

WALL = 1_800_000_000_000_000_000
# The longest payload whole in the first read, with the extension every job has (its content type, 28 bytes).
EDGE = ENVELOPE_READ_BYTES - HEADER_SIZE - 28
# job kind -> (payload, enqueue keywords)
JOB_SPECS: dict[str, tuple[bytes, dict[str, Any]]] = {
    "small": (b"small payload", {}),
    "ext": (b"with extension", {"content_type": "text/plain", "metadata": {"k": "v"}}),
    "empty": (b"", {"metadata": {"e": "mpty"}}),
    "edge": (b"E" * EDGE, {}),
    "past_edge": (b"P" * (EDGE + 1), {}),
    "ext_pushes": (b"X" * 3900, {"metadata": {"k": "v" * 300}}),
    "large": (b"L" * 9000, {}),
    "long_ext": (b"x", {"metadata": {"k": "v" * 4000, "l": "w" * 1000}}),
}
JOBS = tuple(JOB_SPECS)
KINDS = (
    "valid", "payload_flip", "header_flip", "ext_flip", "truncated", "appended", "replaced", "symlink", "fifo",
    "hardlink", "gone", "lease_digest", "lease_envelope", "lease_length", "lease_ino", "lease_negative",
    "dev_float", "digest_bytearray", "digest_long", "envelope_long", "attempt_bool", "path_other_shard",
)  # fmt: skip
FAULT_OPS = ("open", "fstat", "read", "stat", "close", "rename_noreplace", "fsync", "openat2", "mkdir", "dup")


@pytest.fixture(scope="module")
def base() -> Iterator[tuple[str, dict[str, str]]]:
    """A queue (one shard) whose jobs are leased; their handle files by job kind."""
    top = tempfile.mkdtemp(prefix="payloadcore-")
    try:
        root = os.path.join(top, "base")
        Queue.init(root, shards=1, max_payload_length=20000, allow_unsupported_fs=True).close()
        handles = {}
        with Queue.open(root, allow_unsupported_fs=True) as q:
            by_payload = {}
            for kind, (payload, kw) in JOB_SPECS.items():
                q.enqueue(payload, **kw)
                by_payload[payload] = kind
            for _ in JOBS:  # claimed in scan order, not this one
                lease = q.lease(wait=0, duration=3600)
                assert lease is not None
                handles[by_payload[lease.payload()]] = lease.to_handle(root)
            edge = Lease.from_handle(handles["edge"])[0]
            assert os.path.getsize(os.path.join(root, edge.path)) == ENVELOPE_READ_BYTES  # the edge is the edge
        assert sorted(handles) == sorted(JOBS)
        yield root, handles
    finally:
        shutil.rmtree(top)


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset, os.SEEK_SET if offset >= 0 else os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))


def _spoil(root: str, lease: Lease, kind: str) -> None:
    """Make the leased file or the lease hostile (deterministic: each copy the same)."""
    path = os.path.join(root, lease.path)
    if kind == "payload_flip":
        _flip(path, -1)
    elif kind == "header_flip":
        _flip(path, 60)
    elif kind == "ext_flip":
        _flip(path, HEADER_SIZE)
    elif kind == "truncated":
        os.truncate(path, os.path.getsize(path) - 1)
    elif kind == "appended":
        with open(path, "ab") as f:
            f.write(b"\0")
    elif kind == "replaced":
        shutil.copyfile(path, path + ".new")
        os.rename(path + ".new", path)
    elif kind == "symlink":
        os.unlink(path)
        os.symlink("/etc/hostname", path)
    elif kind == "fifo":
        os.unlink(path)
        os.mkfifo(path)
        lease.ino = os.lstat(path).st_ino  # the lease names the FIFO's inode: the file-type check decides
    elif kind == "hardlink":
        os.link(path, os.path.join(root, "tmp-hardlink"))
    elif kind == "gone":
        os.unlink(path)
    elif kind == "lease_digest":
        lease.payload_digest = bytes(32)
    elif kind == "lease_envelope":
        lease.envelope_digest = bytes(32)
    elif kind == "lease_length":
        lease.payload_length += 1
    elif kind == "lease_ino":
        lease.ino += 1
    elif kind == "lease_negative":  # no file has it; the core cannot take it (OverflowError): the Python's
        lease.payload_length = -1
    elif kind == "dev_float":  # equal to the file's device, not an int: the Python's comparison judges it
        lease.dev = float(lease.dev)
    elif kind == "digest_bytearray":
        lease.payload_digest = bytearray(lease.payload_digest)  # type: ignore[assignment]
    elif kind == "digest_long":  # the header's digest and one byte more: C, copying 32 bytes, would match it
        lease.payload_digest += b"\0"
    elif kind == "envelope_long":
        lease.envelope_digest += b"\0"
    elif kind == "attempt_bool":  # equal to 1 (the first attempt) but not an int; the core never reads it
        lease.attempt = True
    elif kind == "path_other_shard":  # refused by checked_path before any syscall
        lease.path = lease.path.replace("/0000/", "/0001/")


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
    warm_dir: bool,
    memo: bool = False,
) -> dict[str, Any]:
    root = os.path.join(os.path.dirname(base), tag)
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base, root, symlinks=True)
    lease, _ = Lease.from_handle(handle)
    st_ = os.lstat(os.path.join(root, lease.path))
    lease.dev, lease.ino = st_.st_dev, st_.st_ino  # the copy's inode
    set_memo(os.path.join(root, lease.path), 20000, memo)  # before the spoiling, as after the claim
    counter = itertools.count(1)
    with on_path(pure, WALL) as m:
        m.setattr(Context, "random", lambda self, n=16: next(counter).to_bytes(n, "big"))  # quarantine names
        q = Queue.open(root, allow_unsupported_fs=True)
        try:
            assert (q._ctx.c_core is None) == pure
            lease._reader = q
            if warm_dir:  # the lease's directory open in the tree, as after the claim (the core's precondition)
                q._ctx.tree.dir(lease.path.rsplit("/", 1)[0])
            _spoil(root, lease, kind)
            with observed(traced, fault, q.batch() if batch else None) as events:
                try:
                    result: Any = lease.payload()
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
    st.integers(1, 10),
    st.sampled_from([errno.EIO, errno.ENOENT, errno.EACCES, errno.ENOSPC, errno.EINTR]),
    st.booleans(),
)


def _compare(
    base: tuple[str, dict[str, str]], job: str, kind: str, fault: Any, batch: bool, warm_dir: bool, memo: bool
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
            warm_dir=warm_dir,
            memo=memo,
        )
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    job=st.sampled_from(JOBS),
    kind=st.sampled_from(KINDS),
    fault=faults,
    batch=st.booleans(),
    warm_dir=st.booleans(),
    memo=st.booleans(),
)
def test_core_and_python_agree(
    base: tuple[str, dict[str, str]], job: str, kind: str, fault: Any, batch: bool, warm_dir: bool, memo: bool
) -> None:
    _compare(base, job, kind, fault, batch, warm_dir, memo)


@pytest.mark.parametrize("after", [False, True])
@pytest.mark.parametrize("nth", range(1, 7))
@pytest.mark.parametrize("job", ["small", "ext_pushes", "large"])
def test_a_fault_at_each_syscall_of_a_payload_read(
    base: tuple[str, dict[str, str]], job: str, nth: int, after: bool
) -> None:
    """Every position of a valid payload()'s syscall sequence (open fstat read stat close) failing, before or
    after its effect: on the core's whole read, on one it hands off after the stat, on one it never takes."""
    _compare(base, job, "valid", (None, nth, errno.EIO, after), False, True, nth % 2 == 0)


@pytest.mark.parametrize("memo", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("job", JOBS)
def test_each_kind_alone(base: tuple[str, dict[str, str]], job: str, kind: str, memo: bool) -> None:
    """Each kind with verify.py's memo empty, and holding the file's bytes as verified before it was spoiled
    (a spoiled read is no longer the remembered one: checked in full on both paths)."""
    _compare(base, job, kind, None, False, True, memo)


def _stat_swapping(leased: str) -> Any:
    """linux.stat_at that first renames a copy of ``leased`` over it, at its first stat of that name only
    (the replay of the core's stat must not swap again)."""
    real = linux.stat_at
    swapped: list[bool] = []

    def stat_at(dir_fd: int, name: str) -> Any:
        if name == os.path.basename(leased) and not swapped:
            swapped.append(True)
            shutil.copyfile(leased, leased + ".new")
            os.rename(leased + ".new", leased)
        return real(dir_fd, name)

    return stat_at


@pytest.mark.parametrize("job", ["small", "ext"])
def test_the_path_replaced_between_the_open_and_the_stat(base: tuple[str, dict[str, str]], job: str) -> None:
    """A group member renames another file over the leased name after the open: validate_source's stat
    sees another inode, on both paths (traced: the core's stat is then linux.stat_at, which swaps first)."""
    root, handles = base
    runs = {}
    for tag, pure in (("py", True), ("c", False)):
        leased = os.path.join(os.path.dirname(root), tag, Lease.from_handle(handles[job])[0].path)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(linux, "stat_at", _stat_swapping(leased))
            runs[tag] = _run(root, handles[job], tag, "valid", pure=pure, traced=True, fault=None, batch=False,
                             warm_dir=True)  # fmt: skip
    assert runs["py"]["result"] == ("QueueCorrupt", "leased path was replaced while validating")
    for key in ("result", "poisoned", "tree", "trace"):
        assert runs["c"][key] == runs["py"][key], key


def test_a_valid_small_payload_is_the_cores(base: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A small valid job is read by the core in one call (no replay) with the Python's syscalls; a payload
    no first read can hold never reaches it; one its extension pushes past stops the core after the stat."""
    stages, made = spy_one_call(monkeypatch, "read_payload")
    root, handles = base
    for job in ("small", "empty", "edge"):
        stages.clear()
        made.clear()
        out = _run(root, handles[job], "fast", "valid", pure=False, traced=True, fault=None, batch=False, warm_dir=True)
        assert out["result"] == JOB_SPECS[job][0]
        assert stages == [bridge.PAYLOAD_READ]
        assert made == ["open", "fstat", "read", "stat"]
        assert [e[0] for e in out["trace"]] == ["open", "fstat", "read", "stat", "close"]
    handoff = [bridge.lib.SQ_STOP_HANDOFF]
    for job, want in (("past_edge", handoff), ("ext_pushes", handoff), ("large", [])):
        stages.clear()
        out = _run(
            root, handles[job], "fast", "valid", pure=False, traced=False, fault=None, batch=False, warm_dir=True
        )
        assert out["result"] == JOB_SPECS[job][0]
        assert stages == want, job
    stages.clear()  # the lease's directory not open in the tree: the Python opens it, the core is not asked
    _run(root, handles["small"], "fast", "valid", pure=False, traced=False, fault=None, batch=False, warm_dir=False)
    assert stages == []


def test_the_core_reads_verifys_memo_as_the_python_does(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify.py's memo, as the Python reads it: after the fast claim verified the file whole, payload() and
    the ack find their first read byte for byte the remembered one and hash nothing again (head_known); a
    file changed in place (same inode, same size) is not the remembered read: checked in full, refused, its
    payload quarantined. The core never fills the memo: the claim's entry stays the same object."""
    from steadqd.errors import CorruptObject

    known_flags: list[int] = []
    for method in ("read_payload", "ack"):
        real = getattr(bridge.Core, method)

        def spy(self: bridge.Core, *a: Any, _real: Any = real) -> Any:
            out = _real(self, *a)
            known_flags.append(out[1].head_known)
            return out

        monkeypatch.setattr(bridge.Core, method, spy)
    path = str(tmp_path / "q")
    Queue.init(path, shards=1, allow_unsupported_fs=True).close()  # one receipt directory
    with Queue.open(path, allow_unsupported_fs=True) as q:
        assert q._ctx.c_core is not None
        q.enqueue(b"remembered")
        lease = q.lease(wait=0)
        assert lease is not None
        known = verify._VERIFIED.get((lease.dev, lease.ino))
        assert known is not None, "the fast claim remembers the file it verified"
        assert lease.payload() == b"remembered"
        assert verify._VERIFIED.get((lease.dev, lease.ino)) is known
        assert known_flags == [1]
        _flip(os.path.join(path, lease.path), -1)  # same inode, same size, last payload byte changed
        with pytest.raises(CorruptObject, match="payload digest mismatch"):
            lease.payload()
        assert known_flags == [1, 0]
        assert verify._VERIFIED.get((lease.dev, lease.ino)) is known  # only verified bytes are ever remembered
        assert len(os.listdir(os.path.join(path, "quarantine"))) == 1
        q.enqueue(b"acked")
        other = q.lease(wait=0)
        assert other is not None
        q.ack(other)  # the receipt directory is not open yet: the Python acks (and opens it)
        q.enqueue(b"acked too")
        third = q.lease(wait=0)
        assert third is not None
        q.ack(third)
        assert known_flags == [1, 0, 1]
