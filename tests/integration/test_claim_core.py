"""The C claim core against the Python it mirrors, on generated and hostile candidates (issue 35).

steadqd.fs.claim is the specification; steadqd/fs/compiled/claim.c takes its happy path and
hands every deviation back to it (steadqd.fs.compiled.bridge). Each example plants one to four
candidates in ``ready/0000/`` of identical copies of one queue (valid jobs, with or without an
extension, large or small, and hostile ones: a bad tag, the wrong shard, no attempts left, a
truncated, oversized or corrupt envelope, a payload that does not match its digest, a corrupt
extension, a header naming another job, a symlink, a FIFO, a hard link), optionally arms one
injected syscall fault, and runs one claim scan on each path. Both must give the same lease (or
None, or the same error), the same report, the same tree afterwards and, traced, the same
syscall sequence; the untraced run checks the core's libc table the same way (outcome, report, tree).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadqd import Queue
from steadqd.constants import CLAIM_SCAN_CHUNK_BYTES, QuarantineReason
from steadqd.fs import claim as claim_mod
from steadqd.fs import linux, names
from steadqd.fs.compiled import bridge
from steadqd.fs.context import Context
from steadqd.fs.records import Extension, build_header, encode_extension
from tests.integration.core_spy import paths_agree, spy_claim

pytestmark = pytest.mark.skipif(not bridge.available(), reason=bridge.path())

SHARDS = 2
MAX_PAYLOAD = 6000
KINDS = (
    "valid", "valid_ext", "large", "bad_tag", "wrong_shard", "exhausted", "truncated", "short_header",
    "oversized", "corrupt_header", "payload_mismatch", "bad_extension", "name_mismatch", "symlink",
    "fifo", "hardlink", "leased_name", "long_extension",
    # Hostile names for the scan's read of the shard (scan.c): a byte past ASCII in a ready name, a
    # stray extension, the shape of a ready name that does not parse, a 255-byte name of that shape.
    "non_ascii", "stray", "ready_shaped", "long_name",
)  # fmt: skip
# The hostile names: a job's bytes under each (_plant), so only the name decides.
_NAMED = {
    "non_ascii": lambda name: name[:40].encode() + b"\xff" + name[41:].encode(),
    "stray": lambda name: (name + ".tmp").encode(),
    "ready_shaped": lambda name: b"a.b.c.d.e.sqj",
    "long_name": lambda name: b"a" * (255 - len(b".b.c.d.e.sqj")) + b".b.c.d.e.sqj",
}
FAULT_OPS = ("open", "fstat", "read", "stat", "rename_noreplace", "fsync", "close", "unlink", "link", "mkdir")
WALL = 1_800_000_000_000_000_000
BOOTTIME = 5_000_000_000_000
NONCE = bytes(range(16))


def _job_bytes(payload: bytes, job: bytes, max_attempts: int, extension: bytes) -> bytes:
    header = build_header(
        job_id=job,
        max_attempts=max_attempts,
        created_at_ns=1,
        extension=extension,
        payload_length=len(payload),
        payload_digest=hashlib.sha256(payload).digest(),
    )
    return header.encode() + extension + payload


def _job_for_shard(qid: bytes, seed: int, shard: int) -> bytes:
    """A job id (from ``seed``) whose shard is ``shard``."""
    for i in range(1000):
        job = hashlib.sha256(b"%d/%d" % (seed, i)).digest()[:16]
        if names.shard_of(qid, job, SHARDS) == shard:
            return job
    raise AssertionError("no job id for the shard")


def _plant(root: str, qid: bytes, lease_width: int, kinds: list[str]) -> None:
    """Write the candidates of ``kinds`` into ready/0000/ (deterministic: every copy gets the same bytes)."""
    d = os.path.join(root, "ready", "0000")
    for seed, kind in enumerate(kinds):
        job = _job_for_shard(qid, seed, 1 if kind == "wrong_shard" else 0)
        generation, attempt, max_attempts = seed, 0, 3
        if kind == "exhausted":
            attempt = 3
        name = names.make_filename(
            qid, names.ready_name(job, generation, attempt, max_attempts), shard=0, lease_width_ns=lease_width
        )
        if kind == "bad_tag":
            name = name[:72] + ("0" if name[72] != "0" else "1") + name[73:]
        if kind == "leased_name":
            name = name[:-4] + ".o00.sqj"
        payload = bytes([seed]) * (5000 if kind == "large" else 20 + seed)
        ext = b""
        if kind in ("valid_ext", "bad_extension", "payload_mismatch"):
            ext = encode_extension(Extension(content_type="text/plain", metadata={"k": "v"}))
        if kind == "long_extension":
            ext = encode_extension(Extension(content_type="text/plain", metadata={"k": "v" * 4000, "l": "w" * 1000}))
        if kind == "bad_extension":
            ext = b"\xff" + ext[1:]
        data = _job_bytes(payload, _job_for_shard(qid, seed + 100, 0) if kind == "name_mismatch" else job,
                          max_attempts, ext)  # fmt: skip
        if kind == "truncated":
            data = data[:-3]
        elif kind == "short_header":
            data = data[:100]
        elif kind == "oversized":
            payload = b"z" * (MAX_PAYLOAD + 1)
            data = _job_bytes(payload, job, max_attempts, ext)
        elif kind == "corrupt_header":
            data = data[:40] + bytes([data[40] ^ 1]) + data[41:]
        elif kind == "payload_mismatch":
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        path: str | bytes = os.path.join(d, name)
        if kind in _NAMED:
            path = os.path.join(os.fsencode(d), _NAMED[kind](name))
        if kind == "symlink":
            os.symlink("/etc/hostname", path)
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            with open(path, "wb") as f:
                f.write(data)
            if kind == "hardlink":
                os.link(path, os.path.join(root, f"tmp-hardlink-{seed}"))


# Names as anyone who may write ready/ can make them: any bytes but "/" and NUL (and not "." or ".."),
# up to the 255 a name may hold, and names of a ready name's shape (names.looks_ready) or nearly, of
# ASCII (the candidates: every count of dots) or not (ignored).
def _part(dots: bool, ascii_only: bool = False) -> st.SearchStrategy[bytes]:
    banned = "/\0" if dots else "/\0."
    ascii_ = st.text(st.characters(min_codepoint=1, max_codepoint=127, blacklist_characters=banned), max_size=40)
    if ascii_only:
        return ascii_.map(str.encode)
    return ascii_.map(str.encode) | st.binary(max_size=40).filter(lambda b: not any(c in b for c in banned.encode()))


_ANY_NAME = (
    _part(True) | st.binary(min_size=41, max_size=255).filter(lambda b: b"/" not in b and b"\0" not in b)
).filter(lambda b: b not in (b"", b".", b".."))
_SHAPED = st.builds(
    lambda parts, tail: b".".join(parts) + tail,
    st.lists(_part(False, ascii_only=True), min_size=4, max_size=7) | st.lists(_part(False), min_size=1, max_size=8),
    st.sampled_from([b".sqj", b".sqj", b".sqj", b".sqj.", b".SQJ", b".sq", b"sqj", b""]),
).filter(lambda b: 0 < len(b) <= 255 and b not in (b".", b".."))  # fmt: skip


def _read_shard(scan: claim_mod._Scan, dir_fd: int) -> list[list[str]]:
    """Every chunk _Scan._read_ready reads from the start of ``dir_fd`` to its end."""
    os.lseek(dir_fd, 0, os.SEEK_SET)
    chunks = []
    while (names := scan._read_ready(dir_fd, "ready/0000")) is not None:
        chunks.append(names)
    return chunks


def _chunks_agree(root: str, raw_names: list[bytes], traced: bool) -> list[list[str]]:
    """The shard's chunks and ignored names as the core reads them and as the Python does, traced or not:
    the same chunks, report and (traced) syscall sequence. The chunks returned."""
    d = tempfile.mkdtemp(dir=root)
    try:
        for raw in raw_names:
            with open(os.path.join(os.fsencode(d), raw), "wb"):
                pass
        q = Queue.open(root, allow_unsupported_fs=True)
        dir_fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            seen = {}
            for pure in (True, False):
                scan = claim_mod._Scan(q._ctx, 30 * 10**9, q)
                assert scan.core is not None
                if pure:
                    scan.core = None
                with linux.trace() if traced else contextlib.nullcontext() as events:
                    chunks = _read_shard(scan, dir_fd)
                seen[pure] = (chunks, scan.report.ignored, _normal_trace(events or []))
            assert seen[False] == seen[True]
            return seen[False][0]
        finally:
            os.close(dir_fd)
            q.close()
    finally:
        shutil.rmtree(d)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw_names=st.lists(_ANY_NAME | _SHAPED, unique=True, max_size=24), traced=st.booleans())
def test_the_cores_read_of_a_shard_is_the_pythons(
    base: tuple[str, bytes, int], raw_names: list[bytes], traced: bool
) -> None:
    """sq_read_ready against linux.read_dir_chunk and _Scan._ready_looking on hostile names: the same
    candidates in the same order, the same names past ASCII reported, the same getdents calls."""
    _chunks_agree(base[0], raw_names, traced)


@pytest.mark.parametrize("traced", [False, True])
def test_the_cores_read_of_a_deep_shard_is_the_pythons(base: tuple[str, bytes, int], traced: bool) -> None:
    """Names of 255 bytes, ready-shaped, stray and past ASCII, more than one chunk holds: chunk by chunk the same."""
    raw_names = []
    for i in range(300):
        stem = b"%03d" % i + (b"\xe9" if i % 7 == 0 else b"") + b"x" * 200
        tail = b".b.c.d.e.sqk" if i % 3 == 0 else b"..b.c.d.e.sqj" if i % 5 == 0 else b".b.c.d.e.sqj"
        raw_names.append(stem[: 255 - len(tail)] + tail)
    chunks = _chunks_agree(base[0], raw_names, traced)
    assert len(chunks) > 1  # more than one getdents
    shaped = [n for n in raw_names if n.endswith(b".sqj") and n.count(b".") == 5 and b"\xe9" not in n]
    assert sum(map(len, chunks)) == len(shaped) > 100


@pytest.mark.parametrize("traced", [False, True])
def test_a_failed_read_of_a_shard_raises_what_the_python_raises(
    base: tuple[str, bytes, int], tmp_path: Any, traced: bool
) -> None:
    """getdents on a descriptor that is no directory: the same OSError (errno, message) on both paths."""
    q = Queue.open(base[0], allow_unsupported_fs=True)
    fd = os.open(tmp_path / "file", os.O_RDONLY | os.O_CREAT)
    try:
        seen = {}
        for pure in (True, False):
            scan = claim_mod._Scan(q._ctx, 30 * 10**9, q)
            if pure:
                scan.core = None
            with linux.trace() if traced else contextlib.nullcontext(), pytest.raises(OSError) as e:
                scan._read_ready(fd, "ready/0000")
            seen[pure] = (type(e.value), e.value.errno, e.value.strerror, e.value.filename, scan.report.ignored)
        assert seen[False] == seen[True]
        assert seen[True][1] == errno.ENOTDIR
    finally:
        os.close(fd)
        q.close()


def test_the_core_reads_a_chunk_of_the_claim_scans_size() -> None:
    """sq_read_ready's buffer is the chunk the Python path reads (CLAIM_SCAN_CHUNK_BYTES)."""
    assert bridge.lib.SQ_CHUNK_BYTES == CLAIM_SCAN_CHUNK_BYTES


def test_dirent_records_are_what_the_kernel_lays_out(tmp_path: Any) -> None:
    """The hooked table's records (bridge.dirent_records) hold the names the kernel's did, in as many bytes."""
    names_ = [b"a", b"b" * 255, b"\xff.sqj", b"x" * 13]
    for n in names_:
        (tmp_path / os.fsdecode(n)).touch()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        got = linux.read_dir_chunk(fd, 32768)
        os.lseek(fd, 0, os.SEEK_SET)
        raw = bridge.ffi.new("unsigned char[]", 32768)
        n = bridge.lib.sq_direct_table().getdents(fd, raw, 32768)
    finally:
        os.close(fd)
    assert sorted(got) == sorted(names_)
    assert len(bridge.dirent_records(got)) == n - 2 * 24  # the kernel's, but "." and ".."


def _tree(root: str) -> list[tuple[str, str, str]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in sorted(dirnames + filenames):
            p = os.path.join(dirpath, n)
            mode = os.lstat(p).st_mode
            digest = ""
            if stat.S_ISREG(mode):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out.append((os.path.relpath(p, root), stat.filemode(mode)[0], digest))
    return sorted(out)


def _normal_trace(events: list[linux.TraceEvent]) -> list[tuple[Any, ...]]:
    """Descriptors renumbered by first appearance: each run opens its own handle."""
    fds: dict[int, int] = {}

    def fd(x: Any) -> Any:
        return fds.setdefault(x, len(fds)) if type(x) is int else x

    out = []
    for e in events:
        d = list(e.detail)
        if d:
            d[0] = fd(d[0])
        if e.op in ("rename_noreplace", "rename") and len(d) > 2:
            d[2] = fd(d[2])
        out.append((e.op, tuple(d), e.failed))
    return out


@contextlib.contextmanager
def _fixed_clocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    counter = itertools.count(1)
    with monkeypatch.context() as m:
        m.setattr(linux, "boottime_ns", lambda: BOOTTIME)
        m.setattr(claim_mod._Scan, "wall_floor", lambda self: WALL)
        m.setattr(Context, "random", lambda self, n=16: next(counter).to_bytes(n, "big"))
        yield


def _run(
    root: str, monkeypatch: pytest.MonkeyPatch, *, pure: bool, traced: bool, fault: Any, batch: bool = False
) -> dict[str, Any]:
    """One claim scan of the copy at ``root``; everything observable about it."""
    with monkeypatch.context() as m:
        if pure:
            m.setenv(bridge.SWITCH, "1")
        else:
            m.delenv(bridge.SWITCH, raising=False)
        q = Queue.open(root, allow_unsupported_fs=True)
        q._ctx.nonce, q._ctx.scan_round = NONCE, 0  # one scan order for every run
        try:
            events: list[linux.TraceEvent] = []
            result: Any
            with _fixed_clocks(monkeypatch), contextlib.ExitStack() as stack:
                if traced:
                    events = stack.enter_context(linux.trace())
                if batch:  # barriers postponed (Queue.batch): the core leaves the barrier to the Python
                    q._ctx.tree.batching += 1
                    stack.callback(lambda: setattr(q._ctx.tree, "batching", q._ctx.tree.batching - 1))
                if fault is not None:
                    op, nth, err, after = fault
                    stack.enter_context(linux.inject(nth=nth, errno=err, op=op, after=after))
                scan = claim_mod._Scan(q._ctx, 30 * 10**9, q)
                assert (scan.core is None) == pure
                try:
                    lease = scan.run()
                    result = None if lease is None else {
                        k: v for k, v in vars(lease).items() if k not in ("dev", "ino", "_reader")
                    }  # fmt: skip
                except Exception as e:  # the same error on both paths is the claim
                    result = (type(e).__name__, str(e).replace(root, "<root>"))
            report = scan.report
            rep = (report.errors, report.quarantined, report.dead_lettered, report.ignored)
        finally:
            with contextlib.suppress(Exception):
                q.close()
    return {
        "result": result,
        "report": repr(rep).replace(root, "<root>"),
        "tree": _tree(root),
        "trace": _normal_trace(events),
    }


@pytest.fixture(scope="module")
def base() -> Iterator[tuple[str, bytes, int]]:
    top = tempfile.mkdtemp(prefix="compiled-")
    root = os.path.join(top, "base")
    q = Queue.init(root, shards=SHARDS, max_payload_length=MAX_PAYLOAD, allow_unsupported_fs=True)
    fmt = q.format
    q.close()
    yield root, fmt.queue_id, fmt.lease_width_ns
    shutil.rmtree(top)


def _planted(base: str, tag: str, qid: bytes, lease_width: int, kinds: list[str]) -> str:
    """A copy of the queue at ``base`` named ``tag``, with the candidates of ``kinds`` planted (_plant)."""
    dst = os.path.join(os.path.dirname(base), tag)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(base, dst, symlinks=True)
    _plant(dst, qid, lease_width, kinds)
    return dst


faults = st.none() | st.tuples(
    st.sampled_from(FAULT_OPS),
    st.integers(1, 8),
    st.sampled_from([errno.EIO, errno.ENOENT, errno.EACCES, errno.ENOSPC]),
    st.booleans(),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=4), fault=faults, batch=st.booleans())
def test_core_and_python_agree(
    base: tuple[str, bytes, int], monkeypatch: pytest.MonkeyPatch, kinds: list[str], fault: Any, batch: bool
) -> None:
    root, qid, width = base

    def run(tag: str, pure: bool, traced: bool) -> dict[str, Any]:
        copy = _planted(root, tag, qid, width, kinds)
        return _run(copy, monkeypatch, pure=pure, traced=traced, fault=fault if traced else None, batch=batch)

    paths_agree(run, ("result", "report", "tree"))


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_alone(base: tuple[str, bytes, int], monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Every hostile kind on its own, untraced (the libc table) and traced, with the outcome the Python gives."""
    root, qid, width = base
    runs = paths_agree(
        lambda tag, pure, traced: _run(
            _planted(root, tag, qid, width, [kind]), monkeypatch, pure=pure, traced=traced, fault=None
        ),
        ("result", "report", "tree"),
    )
    claimed = runs["c0"]["result"] is not None
    assert claimed == (kind in ("valid", "valid_ext", "large", "long_extension"))
    if kind == "payload_mismatch":
        assert repr(QuarantineReason.PAYLOAD_CORRUPT) in runs["c0"]["report"]


@pytest.mark.parametrize(
    ("kind", "last_stage", "claimed"),
    [
        ("valid_ext", bridge.MOVED, True),
        ("large", bridge.MOVED_PAYLOAD_LEFT, True),  # the payload past the first read: claim_open's end
        ("payload_mismatch", bridge.MOVED_PAYLOAD_LEFT, False),  # the same end quarantines it
    ],
)
def test_the_fast_path_takes_a_valid_job_in_two_calls(
    base: tuple[str, bytes, int], monkeypatch: pytest.MonkeyPatch, kind: str, last_stage: int, claimed: bool
) -> None:
    """A valid job is claimed by the core (verified, then moved), not handed back to the Python, and its
    libc table makes the claim's syscalls of the pinned lease sequence (tests/integration/test_faults.py)."""
    root, qid, width = base
    stages, made = spy_claim(monkeypatch)  # made: the syscalls the libc table made (untraced), in order
    copy = _planted(root, "fast", qid, width, [kind])
    out = _run(copy, monkeypatch, pure=False, traced=False, fault=None)
    assert (out["result"] is not None) == claimed
    assert stages == [bridge.VERIFIED, last_stage]
    assert made == ["open", "fstat", "read", "stat", "rename_noreplace", "stat", "fstat", "read", "fsync"]


@pytest.mark.parametrize("kind", ["valid_ext", "large", "payload_mismatch"])
def test_a_batched_claim_is_the_cores_up_to_the_barrier(
    base: tuple[str, bytes, int], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """In Queue.batch() (the worker daemon's claims) the core verifies, moves and re-reads, and stops
    before the barrier (MOVED_BARRIER_LEFT); the Python goes on from there (the tree postpones the
    barrier: fstat, dup) with claim_open's end, and does not replay the candidate."""
    root, qid, width = base
    stages, made = spy_claim(monkeypatch)
    replays: list[str] = []
    real_claim_open, real_consider = claim_mod._Scan.claim_open, claim_mod._Scan.consider

    def claim_open(self: Any, *a: Any, **k: Any) -> Any:
        replays.append("claim_open")
        return real_claim_open(self, *a, **k)

    def consider(self: Any, *a: Any, **k: Any) -> Any:
        replays.append("consider")
        return real_consider(self, *a, **k)

    monkeypatch.setattr(claim_mod._Scan, "claim_open", claim_open)
    monkeypatch.setattr(claim_mod._Scan, "consider", consider)
    runs = {}
    for tag, pure in (("py", True), ("c", False)):
        copy = _planted(root, "batched-" + tag, qid, width, [kind])
        stages.clear()
        made.clear()
        replays.clear()
        runs[tag] = _run(copy, monkeypatch, pure=pure, traced=True, fault=None, batch=True)
    assert stages == [bridge.VERIFIED, bridge.MOVED_BARRIER_LEFT]
    assert made == ["open", "fstat", "read", "stat", "rename_noreplace", "stat", "fstat", "read"]
    assert replays == []  # the Python's claim of the candidate never ran
    c, py = runs["c"], runs["py"]
    assert (c["result"] is not None) == (kind != "payload_mismatch")
    for key in ("result", "report", "tree", "trace"):
        assert c[key] == py[key], key
    ops = [e[0] for e in c["trace"]]
    moved = ops.index("rename_noreplace")
    assert ops[moved + 1 : moved + 6] == ["stat", "fstat", "read", "fstat", "dup"]  # the barrier postponed
    assert "fsync" not in ops


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("after", [False, True])
@pytest.mark.parametrize("nth", range(1, 23))  # the whole traced scan, close included
@pytest.mark.parametrize("kind", ["valid_ext", "large"])
def test_a_fault_at_each_syscall_of_a_claim(
    base: tuple[str, bytes, int], monkeypatch: pytest.MonkeyPatch, kind: str, nth: int, after: bool, batch: bool
) -> None:
    """Every position of a valid claim's syscall sequence failing (EIO, before or after its effect), in
    Queue.batch() too (the core stops before the barrier, which the tree postpones: its fstat and dup
    are in the sequence): the same outcome, error, report, tree and syscalls on both paths."""
    root, qid, width = base
    runs = {}
    for tag, pure in (("py", True), ("c", False)):
        copy = _planted(root, tag, qid, width, [kind])
        runs[tag] = _run(copy, monkeypatch, pure=pure, traced=True, fault=(None, nth, errno.EIO, after), batch=batch)
    for key in ("result", "report", "tree", "trace"):
        assert runs["c"][key] == runs["py"][key], key


def test_a_fast_claim_leaves_its_verified_bytes_to_payload_and_ack(tmp_path: Any) -> None:
    """The core's whole-file re-read verified every byte: payload() and the ack find them in verify.py's
    memo (as after the Python claim's payload check) and do not decode and hash them again; a file
    changed in place after the claim is still checked in full and refused."""
    from steadqd.errors import CorruptObject
    from steadqd.fs import verify

    path = str(tmp_path / "q")
    Queue.init(path, allow_unsupported_fs=True).close()
    with Queue.open(path, allow_unsupported_fs=True) as q:
        q.enqueue(b"remembered")
        lease = q.lease(wait=0)
        assert lease is not None
        known = verify._VERIFIED.get((lease.dev, lease.ino))
        assert known is not None, "the fast claim did not remember the file it verified"
        decodes: list[bytes] = []
        real_decode = verify.JobHeader.decode

        def counting(raw: bytes) -> Any:
            decodes.append(raw)
            return real_decode(raw)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(verify.JobHeader, "decode", staticmethod(counting))
            assert lease.payload() == b"remembered"
        assert decodes == []
        q.enqueue(b"changed after the claim")
        other = q.lease(wait=0)
        assert other is not None
        leased = os.path.join(path, other.path)
        with open(leased, "r+b") as f:  # same inode, same size, last payload byte changed
            f.seek(-1, os.SEEK_END)
            f.write(b"!")
        with pytest.raises(CorruptObject):
            other.payload()


def test_a_batched_fast_claim_checks_the_payload_it_reread_and_leaves_it_to_the_copy(tmp_path: Any) -> None:
    """In Queue.batch() (the worker's claims) the core checks the digest of a payload its re-read holds
    before it stops at the barrier: the Python does not check it again (check_claimed_payload), and
    verify.py's memo holds the file, so the worker's copy neither decodes nor hashes it; a payload
    changed in place after the claim is still refused by the copy."""
    import io

    from steadqd.errors import SteadQError
    from steadqd.fs import verify

    path = str(tmp_path / "q")
    Queue.init(path, allow_unsupported_fs=True).close()
    with Queue.open(path, allow_unsupported_fs=True) as q:
        q.enqueue(b"copied")
        q.enqueue(b"changed after the claim")
        checks: list[object] = []
        real_check = claim_mod._Scan.check_claimed_payload

        def check(self: Any, *a: Any, **k: Any) -> Any:
            checks.append(a[0])
            return real_check(self, *a, **k)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(claim_mod._Scan, "check_claimed_payload", check)
            with q.batch():
                leases = [q.lease(wait=0), q.lease(wait=0)]
        assert None not in leases and checks == []
        by_payload = {}
        for lease in leases:
            assert lease is not None and verify._VERIFIED.get((lease.dev, lease.ino)) is not None
            by_payload[lease.payload_length] = lease
        hashed: list[bytes] = []
        real_sha256 = verify.hashlib.sha256

        def counting(data: bytes = b"") -> Any:
            hashed.append(data)
            return real_sha256(data)

        out = io.BytesIO()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(verify.hashlib, "sha256", counting)
            assert by_payload[6].copy_payload_to(out) == 6 and out.getvalue() == b"copied"
        assert hashed == []
        changed = by_payload[len(b"changed after the claim")]
        with open(os.path.join(path, changed.path), "r+b") as f:  # same inode, same size, last byte changed
            f.seek(-1, os.SEEK_END)
            f.write(b"!")
        with pytest.raises(SteadQError):
            changed.copy_payload_to(io.BytesIO())
