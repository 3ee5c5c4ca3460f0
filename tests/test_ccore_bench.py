"""Issue 35's prototype (b), the envelope check in C (``benchmarks/ccore``), against the Python that defines it.

The product has no stand-alone C envelope check (it lost the measurement: docs/performance.md,
"Compiled hot path"; the C claim core, steadqd/fs/compiled, checks envelopes only inside a
whole claim); ``benchmarks.ccore.make_tree`` builds the measured tree, a
scratch copy of ``steadqd`` with the C hooked into ``verify``, and these tests import
that copy in place of the checkout's for the module's duration. The C only ever
accepts; whatever it does not accept runs through the Python on the same bytes. So
the property is: on any file, ``read_envelope`` and the payload check give the same
header, extension and payload, or the same error (type, quarantine reason, kind,
message), with and without the C; and the C accepts every file the Python accepts
whose extension came in the first read (else it would not be the fast path). Inputs
are valid job files, the same with one field set to a hostile value, a byte flipped,
truncated or extended, and plain garbage: job files are written by any member of the
queue's group.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import struct
import sys
import tempfile
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadqd.constants import ENVELOPE_READ_BYTES, HEADER_SIZE, MAX_EXTENSION_LENGTH
from steadqd.fs.records import build_header, envelope_digest

# One worker builds the copy once and runs every test of the module on it.
pytestmark = pytest.mark.xdist_group("ccore_bench")


@dataclass(frozen=True)
class Copy:
    """The scratch copy's modules (its own classes: its errors are not the checkout's) and the C's functions."""

    verify: types.ModuleType
    ccore: types.ModuleType
    errors: types.ModuleType
    linux: types.ModuleType
    steadqd: types.ModuleType
    lib: Any
    tree: str


def _ours(name: str) -> bool:
    return name == "steadqd" or name.startswith("steadqd.")


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Copy]:
    """``benchmarks.ccore``'s tree, imported as ``steadqd`` while this module runs; the checkout's after."""
    from cffi import VerificationError

    from benchmarks import ccore

    try:
        tree = ccore.make_tree(str(tmp_path_factory.mktemp("ccore") / "tree"))
    except VerificationError as e:  # no C compiler, or no OpenSSL headers (a CI run fails on this skip)
        pytest.skip(f"cannot build the C envelope core here (dev.sh installs gcc and libssl-dev): {e}")
    saved = {k: m for k, m in sys.modules.items() if _ours(k)}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, tree)
    try:
        importlib.invalidate_caches()
        verify = importlib.import_module("steadqd.fs.verify")
        ccore_mod = importlib.import_module("steadqd.fs.ccore")
        assert verify.__file__ is not None and verify.__file__.startswith(tree + os.sep), verify.__file__
        assert ccore_mod.LIB is not None, ccore_mod.core_path()
        yield Copy(
            verify=verify,
            ccore=ccore_mod,
            errors=importlib.import_module("steadqd.errors"),
            linux=importlib.import_module("steadqd.fs.linux"),
            steadqd=importlib.import_module("steadqd"),
            lib=ccore_mod.LIB,
            tree=tree,
        )
    finally:
        sys.path.remove(tree)
        for k in [k for k in sys.modules if _ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved)


_SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _job(job_id: bytes, attempts: int, created: int, extension: bytes, payload: bytes, minor: int) -> bytes:
    header = build_header(
        job_id=job_id,
        max_attempts=attempts,
        created_at_ns=created,
        extension=extension,
        payload_length=len(payload),
        payload_digest=hashlib.sha256(payload).digest(),
        minor=minor,
    )
    return header.encode() + extension + payload


_valid = st.builds(
    _job,
    st.binary(min_size=16, max_size=16),
    st.integers(1, 2**32 - 1),
    st.integers(0, 2**64 - 1),
    # mostly small; sometimes past the first 4 KiB read (the Python's second pread), or at the limit
    st.one_of(st.binary(max_size=64), st.binary(min_size=3960, max_size=4200), st.just(b"e" * MAX_EXTENSION_LENGTH)),
    st.one_of(st.binary(max_size=300), st.binary(min_size=3900, max_size=5000)),
    st.integers(0, 2**16 - 1),
)

# (offset, struct format) of every header field a writer could set to a hostile value
_FIELDS = [(8, ">H"), (10, ">H"), (12, ">I"), (16, ">Q"), (24, ">I"), (28, ">B"), (29, ">B"), (31, ">B"), (48, ">I"),
           (52, ">I"), (55, ">B"), (56, ">Q")]  # fmt: skip
_HOSTILE = [0, 1, 2, 255, 65535, 65536, 65537, 2**31, 2**32 - 1, 2**40 - 1, 2**40, 2**63, 2**64 - 1]


def _redigest(data: bytearray) -> None:
    """Store the envelope digest of the (mutated) header: it is not keyed, so any writer can."""
    ext_len = min(struct.unpack_from(">I", data, 12)[0], max(0, len(data) - HEADER_SIZE))
    data[96:128] = envelope_digest(bytes(data[:HEADER_SIZE]), bytes(data[HEADER_SIZE : HEADER_SIZE + ext_len]))


@st.composite
def _field_set(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(_valid))
    off, fmt = draw(st.sampled_from(_FIELDS))
    limit = 2 ** (8 * struct.calcsize(fmt)) - 1
    value = draw(st.one_of(st.sampled_from([v for v in _HOSTILE if v <= limit]), st.integers(0, limit)))
    struct.pack_into(fmt, data, off, value)
    if draw(st.booleans()):
        _redigest(data)
    return bytes(data)


@st.composite
def _flipped(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(_valid))
    i = draw(st.integers(0, len(data) - 1))
    data[i] ^= draw(st.integers(1, 255))
    if i < 96 and draw(st.booleans()):
        _redigest(data)
    return bytes(data)


@st.composite
def _resized(draw: st.DrawFn) -> bytes:
    data = draw(_valid)
    if draw(st.booleans()):
        return data[: draw(st.integers(0, len(data)))]
    return data + draw(st.binary(min_size=1, max_size=64))


_files = st.one_of(_valid, _field_set(), _flipped(), _resized(), st.binary(max_size=400))
_max_payload = st.one_of(st.just(1 << 40), st.integers(0, 6000))


def _outcome(copy: Copy, fn: Callable[[], object]) -> tuple[object, ...]:
    try:
        return ("ok", fn())
    except copy.errors.CorruptObject as e:
        return ("error", type(e), e.reason, e.kind, e.payload, str(e))


def _read(copy: Copy, fd: int, max_payload: int, lib: object) -> tuple[object, ...]:
    """read_envelope then read_payload (and verify_payload) with ``lib`` as the compiled core (None: Python)."""
    verify = copy.verify
    saved = verify.LIB
    verify.LIB = lib
    try:
        got = _outcome(copy, lambda: verify.read_envelope(fd, max_payload))
        if got[0] != "ok":
            return got
        env = got[1]
        assert isinstance(env, verify.Envelope)
        if lib is None:
            assert not env.payload_ok
        payload = _outcome(copy, lambda: verify.read_payload(fd, env))
        verified = _outcome(copy, lambda: verify.verify_payload(fd, env))
        return ("ok", env.header, env.extension, env.size, env.witness, env.head, payload, verified)
    finally:
        verify.LIB = saved


@_SETTINGS
@given(_files, _max_payload)
def test_read_envelope_and_payload_agree_with_the_python(copy: Copy, data: bytes, max_payload: int) -> None:
    python = _compare(copy, data, max_payload)
    if python[0] == "ok":
        head = data[: min(len(data), ENVELOPE_READ_BYTES)]
        ext_len = struct.unpack_from(">I", data, 12)[0]
        accepted = copy.lib.sq_envelope(head, len(head), len(data), max_payload)
        fits = HEADER_SIZE + ext_len <= len(head)
        assert bool(accepted) == fits, "the C must accept every valid envelope read whole (else no fast path)"
        if fits:
            payload_in_head = len(data) <= len(head)
            assert accepted == (2 if payload_in_head and python[6][0] == "ok" else 1)


def _compare(copy: Copy, data: bytes, max_payload: int) -> tuple[object, ...]:
    with tempfile.NamedTemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as f:
        f.write(data)
        f.flush()
        fd = os.open(f.name, os.O_RDONLY)
        try:
            python = _read(copy, fd, max_payload, None)
            compiled = _read(copy, fd, max_payload, copy.lib)
        finally:
            os.close(fd)
    assert compiled == python
    return python


def test_every_hostile_field_value_with_a_recomputed_digest_agrees(copy: Copy) -> None:
    """Each field set to each boundary value, the envelope digest stored anew (random draws rarely hit these)."""
    valid = _job(b"j" * 16, 3, 5, b"ext", b"payload", 1)
    rejected = 0
    for off, fmt in _FIELDS:
        limit = 2 ** (8 * struct.calcsize(fmt)) - 1
        for value in [v for v in _HOSTILE if v <= limit]:
            data = bytearray(valid)
            struct.pack_into(fmt, data, off, value)
            _redigest(data)
            for max_payload in (1 << 40, 7, 6):
                rejected += _compare(copy, bytes(data), max_payload)[0] == "error"
    assert rejected > 100  # most of them are refused, by the same check on both paths


@_SETTINGS
@given(
    st.binary(max_size=600), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.binary(min_size=32, max_size=32)
)
def test_payload_check_stays_inside_its_buffer(
    copy: Copy, data: bytes, offset: int, length: int, digest: bytes
) -> None:
    """Any offset and length (u64, overflowing their sum): 1 only for the bytes in range whose digest matches."""
    inside = offset <= len(data) and length <= len(data) - offset
    expected = inside and hashlib.sha256(data[offset : offset + length]).digest() == digest
    assert copy.lib.sq_payload(data, len(data), offset, length, digest) == expected
    if inside:
        real = hashlib.sha256(data[offset : offset + length]).digest()
        assert copy.lib.sq_payload(data, len(data), offset, length, real) == 1


def test_envelope_check_refuses_a_head_shorter_than_its_length_says(copy: Copy) -> None:
    """The length argument bounds every read: a valid file passed with one byte too few is refused."""
    data = _job(bytes(16), 1, 0, b"ext", b"payload", 1)
    assert copy.lib.sq_envelope(data, len(data), len(data), 1 << 40) == 2
    assert copy.lib.sq_envelope(data, len(data) - 1, len(data), 1 << 40) == 1  # the payload is no longer all there
    assert copy.lib.sq_envelope(data, HEADER_SIZE + 2, len(data), 1 << 40) == 0  # nor the extension
    assert copy.lib.sq_envelope(data, HEADER_SIZE - 1, len(data), 1 << 40) == 0  # nor the header


def test_envelope_check_refuses_an_extension_over_the_limit_even_when_read_whole(copy: Copy) -> None:
    """read_envelope reads at most 4 KiB first, so only a direct call can show the 64 KiB limit holds in C."""
    at_limit = _job(bytes(16), 1, 0, b"e" * MAX_EXTENSION_LENGTH, b"p", 1)
    assert copy.lib.sq_envelope(at_limit, len(at_limit), len(at_limit), 1 << 40) == 2
    over = bytearray(_job(bytes(16), 1, 0, b"e" * MAX_EXTENSION_LENGTH, b"", 1) + b"ep")  # one byte more of each
    struct.pack_into(">IQ", over, 12, MAX_EXTENSION_LENGTH + 1, 1)
    _redigest(over)
    assert copy.lib.sq_envelope(bytes(over), len(over), len(over), 1 << 40) == 0


def _traced_ops(copy: Copy, root: Path, lib: object, corrupt: bytes | None) -> list[str]:
    """The syscalls of enqueue, lease, payload() and ack of one job (``corrupt``: its payload's last byte
    overwritten after enqueue, so the lease quarantines it), with ``lib`` as the compiled core."""
    verify, queue, linux = copy.verify, copy.steadqd.Queue, copy.linux
    saved = verify.LIB
    verify.LIB = lib
    try:
        # Hour-wide buckets: the wall watermark advances (and a receipt bucket is made) once per bucket, so with
        # the default one-second width a run crossing a second would trace that, whichever path it took.
        hour = 3600 * 10**9
        queue.init(
            str(root), shards=1, delayed_width_ns=hour, terminal_width_ns=hour, allow_unsupported_fs=True
        ).close()
        with queue.open(str(root), allow_unsupported_fs=True) as q, linux.trace() as events:
            q.enqueue(b"p" * 100)
            if corrupt is not None:
                (job,) = [Path(d, f) for d, _, fs in os.walk(root / "ready") for f in fs]
                with open(job, "r+b") as f:
                    f.seek(-1, os.SEEK_END)
                    f.write(corrupt)
            lease = q.lease(wait=0)
            if lease is not None:
                lease.payload()
                q.ack(lease)
        return [e.op for e in events]
    finally:
        verify.LIB = saved


@pytest.mark.parametrize("corrupt", [None, b"q"], ids=["lifecycle", "payload-corrupt"])
def test_the_syscalls_are_the_same_on_both_paths(copy: Copy, tmp_path: Path, corrupt: bytes | None) -> None:
    """The C makes no system call: the hook sees the same operations, in order, with and without it."""
    python = _traced_ops(copy, tmp_path / "python", None, corrupt)
    compiled = _traced_ops(copy, tmp_path / "compiled", copy.lib, corrupt)
    assert compiled == python
    assert python.count("fsync") >= (5 if corrupt is None else 2)


def test_pure_python_is_forced_by_the_environment(copy: Copy, monkeypatch: pytest.MonkeyPatch) -> None:
    ccore = copy.ccore
    monkeypatch.setenv(ccore.PURE_PYTHON_ENV, "1")
    assert ccore._load() == (None, "python (STEADQ_PURE_PYTHON=1)")
    monkeypatch.setenv(ccore.PURE_PYTHON_ENV, "0")
    loaded, why = ccore._load()
    assert loaded is not None and why.startswith("compiled (_core.")
    # As if it were not built: the package has no such attribute, and its import fails.
    monkeypatch.delattr(sys.modules["steadqd.fs"], "_core")
    monkeypatch.setitem(sys.modules, "steadqd.fs._core", None)
    loaded, why = ccore._load()
    assert loaded is None and why.startswith("python (the compiled core is not built: ")


def test_the_benchmark_children_run_the_copy_with_and_without_the_c(copy: Copy) -> None:
    """``lifecycle_cpu --ccore``'s two sides: the copy loading exactly ``_core``, and the copy loading no ``.so``."""
    from benchmarks import lifecycle_cpu

    c = lifecycle_cpu.one(copy.tree, "/dev/shm", 5, warm=5, compiled=("_core",), env={"STEADQ_PURE_PYTHON": "0"})
    pure = lifecycle_cpu.one(copy.tree, "/dev/shm", 5, warm=5, compiled=(), env={"STEADQ_PURE_PYTHON": "1"})
    assert c["jobs_per_s"] > 0 and pure["jobs_per_s"] > 0
    with pytest.raises(SystemExit, match="extension modules loaded"):
        lifecycle_cpu.one(copy.tree, "/dev/shm", 1, warm=0, compiled=(), env={"STEADQ_PURE_PYTHON": "0"})
