"""Tests for steadqd.fs.linux: the syscall wrappers and the fault-injection/trace point."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd.fs import libc
from steadqd.fs import linux as L

IS_ROOT = os.geteuid() == 0


@pytest.fixture
def dfd(tmp_path: Path) -> Iterator[int]:
    fd = L.open_dir(L.AT_FDCWD, str(tmp_path))
    yield fd
    os.close(fd)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


# --- Constants. ---


def test_constants() -> None:
    assert L.RENAME_NOREPLACE == 1
    assert (L.RESOLVE_BENEATH, L.RESOLVE_NO_SYMLINKS, L.RESOLVE_NO_MAGICLINKS) == (0x08, 0x04, 0x02)
    assert (L.AT_EMPTY_PATH, L.AT_SYMLINK_FOLLOW) == (0x1000, 0x400)
    assert L.O_TMPFILE == os.O_TMPFILE


# --- renameat2 / renameat. ---


def test_rename_noreplace_moves_inode(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "a").write_bytes(b"A")
    ino = os.stat(tmp_path / "a").st_ino
    L.rename_noreplace(dfd, "a", dfd, b"b")
    assert not (tmp_path / "a").exists()
    assert os.stat(tmp_path / "b").st_ino == ino


def test_rename_noreplace_eexist_leaves_target(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "b").write_bytes(b"B")
    with pytest.raises(OSError) as ei:
        L.rename_noreplace(dfd, "a", dfd, "b")
    assert ei.value.errno == errno.EEXIST
    assert (tmp_path / "a").read_bytes() == b"A"
    assert (tmp_path / "b").read_bytes() == b"B"


def test_rename_noreplace_enoent(dfd: int) -> None:
    with pytest.raises(OSError) as ei:
        L.rename_noreplace(dfd, "missing", dfd, "b")
    assert ei.value.errno == errno.ENOENT


def test_rename_noreplace_across_dirs(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "a").write_bytes(b"A")
    xfd = L.open_dir(dfd, "x")
    try:
        L.rename_noreplace(dfd, "a", xfd, "a2")
    finally:
        L.close(xfd)
    assert (tmp_path / "x" / "a2").read_bytes() == b"A"


def test_rename_noreplace_raw_syscall_path(tmp_path: Path, dfd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if libc._SYS_RENAMEAT2 is None:
        pytest.skip("no renameat2 syscall number for this architecture")
    monkeypatch.setattr(libc, "_renameat2_fn", None)  # as on glibc < 2.28
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "b").write_bytes(b"B")
    with pytest.raises(FileExistsError):
        L.rename_noreplace(dfd, "a", dfd, "b")
    L.rename_noreplace(dfd, "a", dfd, "c")
    assert (tmp_path / "c").read_bytes() == b"A" and (tmp_path / "b").read_bytes() == b"B"


def test_rename_replace_replaces(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "a").write_bytes(b"A")
    (tmp_path / "b").write_bytes(b"B")
    L.rename_replace(dfd, "a", dfd, b"b")
    assert not (tmp_path / "a").exists()
    assert (tmp_path / "b").read_bytes() == b"A"


# --- Fault injection. ---


def test_fault_before_has_no_side_effect(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "a").write_bytes(b"A")
    with L.inject(nth=1, errno=errno.EIO, op="rename_noreplace") as fault:
        assert not fault.fired
        with pytest.raises(OSError) as ei:
            L.rename_noreplace(dfd, "a", dfd, "b")
    assert ei.value.errno == errno.EIO
    assert fault.fired and fault.fired_op == "rename_noreplace" and fault.calls_seen == 1
    assert (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_fault_after_side_effect_happened(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "a").write_bytes(b"A")
    with L.inject(nth=1, errno=errno.EIO, op="rename_noreplace", after=True) as fault:
        with pytest.raises(OSError) as ei:
            L.rename_noreplace(dfd, "a", dfd, "b")
    assert ei.value.errno == errno.EIO
    assert fault.fired and fault.fired_op == "rename_noreplace"
    assert not (tmp_path / "a").exists() and (tmp_path / "b").read_bytes() == b"A"


def test_fault_after_real_failure_propagates_real_error(dfd: int) -> None:
    with L.inject(nth=1, errno=errno.EIO, op="unlink", after=True) as fault:
        with pytest.raises(FileNotFoundError):
            L.unlink_at(dfd, "missing")
    assert not fault.fired and fault.calls_seen == 1


def test_fault_after_open_creates_file_without_leaking_fd(tmp_path: Path, dfd: int) -> None:
    before = _open_fds()
    with L.inject(nth=1, errno=errno.ENOSPC, op="open", after=True) as fault:
        with pytest.raises(OSError) as ei:
            L.open_at(dfd, "new", os.O_RDWR | os.O_CREAT | os.O_EXCL)
    assert ei.value.errno == errno.ENOSPC and fault.fired
    assert (tmp_path / "new").exists()
    assert _open_fds() == before


def test_fault_after_close_really_closes(tmp_path: Path, dfd: int) -> None:
    fd = L.open_at(dfd, "f", os.O_RDWR | os.O_CREAT)
    with L.inject(nth=1, errno=errno.EINTR, op="close", after=True):
        with pytest.raises(InterruptedError):
            L.close(fd)
    with pytest.raises(OSError) as ei:
        os.fstat(fd)
    assert ei.value.errno == errno.EBADF


def test_nth_counts_per_op(tmp_path: Path, dfd: int) -> None:
    with L.inject(nth=2, errno=errno.EACCES, op="mkdir") as fault:
        assert L.mkdir_at(dfd, "a")
        L.stat_at(dfd, "a")
        L.fsync(dfd)
        with pytest.raises(PermissionError):
            L.mkdir_at(dfd, "b")
        assert L.mkdir_at(dfd, "c")  # fires once only
    assert fault.fired and fault.fired_op == "mkdir" and fault.calls_seen == 3
    assert (tmp_path / "a").is_dir() and not (tmp_path / "b").exists() and (tmp_path / "c").is_dir()


def test_nth_counts_globally(tmp_path: Path, dfd: int) -> None:
    with L.inject(nth=3, errno=errno.EIO) as fault:
        L.mkdir_at(dfd, "a")  # 1
        L.stat_at(dfd, "a")  # 2
        with pytest.raises(OSError) as ei:
            L.fsync(dfd)  # 3
        L.fsync(dfd)
    assert ei.value.errno == errno.EIO
    assert fault.fired_op == "fsync" and fault.calls_seen == 4


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC, errno.EINTR, errno.EACCES])
def test_injected_errno_values(dfd: int, code: int) -> None:
    fd = L.open_at(dfd, "f", os.O_RDWR | os.O_CREAT)
    try:
        with L.inject(nth=1, errno=code, op="write") as fault:
            with pytest.raises(OSError) as ei:
                L.write_all(fd, b"hello")
        assert ei.value.errno == code and ei.value.strerror == os.strerror(code)
        assert fault.fired and os.fstat(fd).st_size == 0
    finally:
        L.close(fd)


def test_fault_disarmed_on_exit(dfd: int) -> None:
    with L.inject(nth=5, errno=errno.EIO, op="fsync") as fault:
        L.fsync(dfd)
    assert not fault.fired and fault.calls_seen == 1
    for _ in range(6):
        L.fsync(dfd)
    assert fault.calls_seen == 1
    with pytest.raises(ValueError), L.inject(nth=1, errno=errno.EIO):
        raise ValueError
    L.fsync(dfd)  # disarmed even when the block raised


def test_only_one_fault_at_a_time() -> None:
    with L.inject(nth=1, errno=errno.EIO, op="fsync"):
        with pytest.raises(RuntimeError), L.inject(nth=1, errno=errno.EIO):
            pass
    with pytest.raises(ValueError):
        with L.inject(nth=0, errno=errno.EIO):
            pass
    with pytest.raises(ValueError):
        with L.inject(nth=1, errno=errno.EIO, op="nonsense"):
            pass


def test_fault_fires_once_across_threads(dfd: int) -> None:
    failures: list[int] = []

    def worker() -> None:
        for _ in range(50):
            try:
                L.fstat(dfd)
            except OSError as e:
                failures.append(e.errno or 0)

    with L.inject(nth=77, errno=errno.EIO, op="fstat") as fault:
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == [errno.EIO] and fault.fired and fault.calls_seen == 200


def test_getrandom_retries_injected_eintr() -> None:
    with L.inject(nth=1, errno=errno.EINTR, op="getrandom") as fault, L.trace() as events:
        data = L.getrandom(32)
    assert fault.fired and len(data) == 32 and data != bytes(32)
    assert [e.op for e in events] == ["getrandom", "getrandom"]


# --- Trace. ---


def test_trace_records_ops_and_details(tmp_path: Path, dfd: int) -> None:
    with L.trace() as outer:
        assert L.mkdir_at(dfd, "d")
        with L.trace() as inner:
            fd = L.open_at(dfd, "d/f", os.O_RDWR | os.O_CREAT, 0o600)
            L.write_all(fd, b"abc")
            L.fsync(fd)
            L.close(fd)
        L.rename_noreplace(dfd, "d", dfd, "e")
    assert [e.op for e in inner] == ["open", "write", "fsync", "close"]
    assert [e.op for e in outer] == ["mkdir", "open", "write", "fsync", "close", "rename_noreplace"]
    assert outer[0] == L.TraceEvent("mkdir", (dfd, "d", 0o700))
    assert outer[1].detail[:2] == (dfd, "d/f") and outer[1].detail[2] & os.O_CLOEXEC
    assert outer[-1].detail == (dfd, "d", dfd, "e")
    assert all(e.op in L.OPS for e in outer)
    L.fsync(dfd)
    assert len(outer) == 6  # inactive after exit


def test_trace_notes_the_errno_of_a_call_that_really_failed(dfd: int) -> None:
    """The fault matrix relies on it to know where an after-fault can fire."""
    appended: list[L.TraceEvent] = []

    class AppendOnly:  # a hook that only receives appends, as the crash lab's recorder does
        def append(self, event: L.TraceEvent) -> None:
            appended.append(event)

    hook = AppendOnly()
    with L.trace() as events:
        with L._lock:
            L._traces.append(hook)  # type: ignore[arg-type]
        try:
            assert L.mkdir_at(dfd, "d")
            assert not L.mkdir_at(dfd, "d")  # EEXIST: the directory was there already
            with L.inject(nth=1, errno=errno.EIO, op="fsync"), pytest.raises(OSError):
                L.fsync(dfd)
        finally:
            with L._lock:
                L._traces.remove(hook)  # type: ignore[arg-type]
    assert [(e.op, e.failed) for e in events] == [("mkdir", 0), ("mkdir", errno.EEXIST), ("fsync", 0)]
    assert [e.op for e in appended] == ["mkdir", "mkdir", "fsync"]  # the hook got every event, unchanged


def test_unfired_fault_counts_positions(dfd: int) -> None:
    with L.inject(nth=10**9, errno=errno.EIO) as fault, L.trace() as events:
        L.mkdir_at(dfd, "d")
        L.close(L.open_dir(dfd, "d"))
    assert not fault.fired and fault.calls_seen == len(events) == 3


def test_faulted_call_is_traced(dfd: int) -> None:
    with L.trace() as events, L.inject(nth=1, errno=errno.EIO, op="fsync"):
        with pytest.raises(OSError):
            L.fsync(dfd)
    assert events == [L.TraceEvent("fsync", (dfd,))]


# --- open_beneath. ---


@pytest.fixture(params=["openat2", "walk"])
def beneath_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _beneath(mode: str, rootfd: int, relpath: str, flags: int, fmode: int = 0) -> int:
    """Call open_beneath natively, or with an injected ENOSYS forcing the component walk."""
    if mode == "walk":
        with L.inject(nth=1, errno=errno.ENOSYS, op="openat2"):
            return L.open_beneath(rootfd, relpath, flags, fmode)
    return L.open_beneath(rootfd, relpath, flags, fmode)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_bytes(b"data")
    (tmp_path / "outside").mkdir()
    (tmp_path / "a" / "link").symlink_to("b")
    (tmp_path / "a" / "b" / "flink").symlink_to("f")
    return tmp_path


def test_open_beneath_nested_path(tree: Path, dfd: int, beneath_mode: str) -> None:
    before = _open_fds()
    fd = _beneath(beneath_mode, dfd, "a/b/f", os.O_RDONLY)
    try:
        assert os.read(fd, 10) == b"data"
        assert os.get_inheritable(fd) is False
    finally:
        L.close(fd)
    dirfd = _beneath(beneath_mode, dfd, "a/b", os.O_RDONLY | os.O_DIRECTORY)
    L.close(dirfd)
    assert _open_fds() == before  # the walk closes its intermediate fds


def test_open_beneath_creates(tree: Path, dfd: int, beneath_mode: str) -> None:
    fd = _beneath(beneath_mode, dfd, "a/b/new", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    L.close(fd)
    assert os.stat(tree / "a" / "b" / "new").st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("relpath", "codes"),
    [
        ("a/link/f", {errno.ELOOP, errno.ENOTDIR}),  # symlinked intermediate directory
        ("a/b/flink", {errno.ELOOP}),  # final symlink
        ("../x", {errno.EXDEV}),
        ("a/../../outside", {errno.EXDEV}),
        ("/etc/passwd", {errno.EXDEV}),
        ("a//b", {errno.EINVAL}),
        ("", {errno.EINVAL}),
    ],
)
def test_open_beneath_refuses(tree: Path, dfd: int, beneath_mode: str, relpath: str, codes: set[int]) -> None:
    with pytest.raises(OSError) as ei:
        _beneath(beneath_mode, dfd, relpath, os.O_RDONLY)
    assert ei.value.errno in codes


def test_open_beneath_uses_openat2(tree: Path, dfd: int) -> None:
    if libc.openat2_missing:
        pytest.skip("kernel without openat2")
    with L.trace() as events:
        L.close(L.open_beneath(dfd, "a/b/f", os.O_RDONLY))
    assert [e.op for e in events] == ["openat2", "close"]
    assert events[0].detail[3] == L.RESOLVE_BENEATH | L.RESOLVE_NO_SYMLINKS | L.RESOLVE_NO_MAGICLINKS


def test_open_beneath_walk_ops(tree: Path, dfd: int) -> None:
    with L.trace() as events:
        L.close(_beneath("walk", dfd, "a/b/f", os.O_RDONLY))
    ops = [e.op for e in events]
    prefix = [] if libc.openat2_missing else ["openat2"]
    assert ops == [*prefix, "open", "open", "close", "open", "close", "close"]


# --- Directories and metadata. ---


def test_mkdir_at(tmp_path: Path, dfd: int) -> None:
    assert L.mkdir_at(dfd, "d") is True
    assert L.mkdir_at(dfd, b"d") is False
    assert os.stat(tmp_path / "d").st_mode & 0o777 == 0o700
    with pytest.raises(FileNotFoundError):
        L.mkdir_at(dfd, "missing/d")


def test_stat_at_does_not_follow(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "l").symlink_to("f")
    assert os.path.islink(tmp_path / "l")
    import stat

    assert stat.S_ISLNK(L.stat_at(dfd, "l").st_mode)
    assert stat.S_ISREG(L.stat_at(dfd, b"f").st_mode)
    fd = L.open_at(dfd, "f", os.O_RDONLY)
    try:
        assert L.fstat(fd).st_ino == os.stat(tmp_path / "f").st_ino
    finally:
        L.close(fd)


def test_open_dir_refuses_symlink(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to("d")
    with pytest.raises(OSError) as ei:
        L.open_dir(dfd, "l")
    assert ei.value.errno in (errno.ELOOP, errno.ENOTDIR)


def test_unlink_and_rmdir(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    with pytest.raises(OSError) as ei:
        L.rmdir_at(dfd, "d")
    assert ei.value.errno in (errno.ENOTEMPTY, errno.EEXIST)
    L.unlink_at(dfd, "d/f")
    L.rmdir_at(dfd, "d")
    assert not (tmp_path / "d").exists()
    with pytest.raises(FileNotFoundError):
        L.unlink_at(dfd, "d")


def test_fchmod_and_fsync(tmp_path: Path, dfd: int) -> None:
    fd = L.open_at(dfd, "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        L.fchmod(fd, 0o400)
        L.fsync(fd)
    finally:
        L.close(fd)
    assert os.stat(tmp_path / "f").st_mode & 0o777 == 0o400


def test_list_dir_sorted_bytes_and_repeatable(tmp_path: Path, dfd: int) -> None:
    names = [b"b", b"B", b"a.sqj", b"\xc3\xa9", b"\xff", b"0000"]
    for n in names:
        with open(os.path.join(os.fsencode(tmp_path), n), "wb"):
            pass
    (tmp_path / "sub").mkdir()
    expected = sorted([*names, b"sub"])
    assert L.list_dir(dfd) == expected
    assert L.list_dir(dfd) == expected
    assert all(isinstance(n, bytes) for n in expected)
    assert L.stat_at(dfd, "sub")  # caller's fd still usable


# --- Reading and writing. ---


def test_write_all_pread_read_exact(dfd: int) -> None:
    fd = L.open_at(dfd, "f", os.O_RDWR | os.O_CREAT)
    try:
        L.write_all(fd, b"0123456789")
        L.write_all(fd, memoryview(bytearray(b"ab")))
        L.pwrite_all(fd, b"XY", 3)
        assert L.pread(fd, 100, 0) == b"012XY56789ab"
        assert L.pread(fd, 4, 10) == b"ab"
        assert L.read_exact(fd, 3, 2) == b"2XY"
        with pytest.raises(L.ShortRead) as ei:
            L.read_exact(fd, 5, 9)
        assert (ei.value.expected, ei.value.got) == (5, 3)
    finally:
        L.close(fd)


def test_write_all_accepts_non_byte_memoryview(dfd: int) -> None:
    import array

    fd = L.open_at(dfd, "f", os.O_RDWR | os.O_CREAT)
    try:
        L.write_all(fd, memoryview(array.array("I", [1, 2])))
        assert L.fstat(fd).st_size == 8
    finally:
        L.close(fd)


def test_write_all_loops_on_short_writes(dfd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write, real_pwrite = os.write, os.pwrite
    monkeypatch.setattr(os, "write", lambda fd, b: real_write(fd, bytes(b[:3])))
    monkeypatch.setattr(os, "pwrite", lambda fd, b, off: real_pwrite(fd, bytes(b[:4]), off))
    fd = L.open_at(dfd, "f", os.O_RDWR | os.O_CREAT)
    try:
        with L.trace() as events:
            L.write_all(fd, b"abcdefgh")
            L.pwrite_all(fd, b"0123456789", 8)
        assert [e.op for e in events] == ["write"] * 3 + ["pwrite"] * 3
        assert [e.detail[2] for e in events if e.op == "pwrite"] == [8, 12, 16]
        assert L.pread(fd, 100, 0) == b"abcdefgh0123456789"
    finally:
        L.close(fd)


def test_zero_byte_write_is_eio(dfd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "write", lambda fd, b: 0)
    monkeypatch.setattr(os, "pwrite", lambda fd, b, off: 0)
    fd = L.open_at(dfd, "f", os.O_RDWR | os.O_CREAT)
    try:
        for call in (lambda: L.write_all(fd, b"x"), lambda: L.pwrite_all(fd, b"x", 0)):
            with pytest.raises(OSError) as ei:
                call()
            assert ei.value.errno == errno.EIO
        L.write_all(fd, b"")  # nothing to write is not an error
    finally:
        L.close(fd)


def test_write_all_real_enospc() -> None:
    fd = L.open_at(L.AT_FDCWD, "/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as ei:
            L.write_all(fd, b"x")
        assert ei.value.errno == errno.ENOSPC
    finally:
        L.close(fd)


# --- O_TMPFILE publication. ---


def _tmpfile_with(dfd: int, data: bytes) -> int:
    fd = L.open_tmpfile(dfd)
    L.write_all(fd, data)
    assert L.fstat(fd).st_nlink == 0
    return fd


@pytest.mark.skipif(not IS_ROOT, reason="AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH")
def test_link_tmpfile_direct(tmp_path: Path, dfd: int) -> None:
    fd = _tmpfile_with(dfd, b"direct")
    try:
        with L.trace() as events:
            assert L.link_tmpfile(fd, dfd, "job.sqj") == "direct"
        assert [e.op for e in events] == ["link"] and events[0].detail[0] == "direct"
    finally:
        L.close(fd)
    assert (tmp_path / "job.sqj").read_bytes() == b"direct"
    assert os.stat(tmp_path / "job.sqj").st_mode & 0o777 == 0o600


def test_link_tmpfile_proc(tmp_path: Path, dfd: int) -> None:
    fd = _tmpfile_with(dfd, b"proc")
    try:
        assert L.link_tmpfile(fd, dfd, b"job.sqj", prefer_proc=True) == "proc"
        assert L.fstat(fd).st_nlink == 1
    finally:
        L.close(fd)
    assert (tmp_path / "job.sqj").read_bytes() == b"proc"


def test_link_tmpfile_eexist(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "job.sqj").write_bytes(b"old")
    for prefer_proc in (False, True):
        fd = _tmpfile_with(dfd, b"new")
        try:
            with L.trace() as events, pytest.raises(FileExistsError):
                L.link_tmpfile(fd, dfd, "job.sqj", prefer_proc=prefer_proc)
            assert len(events) == 1  # EEXIST propagates at once, no second form
        finally:
            L.close(fd)
    assert (tmp_path / "job.sqj").read_bytes() == b"old"


def test_link_tmpfile_falls_back_to_proc_on_einval(tmp_path: Path, dfd: int) -> None:
    fd = _tmpfile_with(dfd, b"x")
    try:
        with L.inject(nth=1, errno=errno.EINVAL, op="link"), L.trace() as events:
            assert L.link_tmpfile(fd, dfd, "job.sqj") == "proc"
        assert [e.detail[0] for e in events] == ["direct", "proc"]
    finally:
        L.close(fd)
    assert (tmp_path / "job.sqj").exists()


@pytest.mark.skipif(not IS_ROOT, reason="AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH")
def test_link_tmpfile_proc_enosys_tries_direct(tmp_path: Path, dfd: int) -> None:
    fd = _tmpfile_with(dfd, b"x")
    try:
        with L.inject(nth=1, errno=errno.ENOSYS, op="link"):
            assert L.link_tmpfile(fd, dfd, "job.sqj", prefer_proc=True) == "direct"
    finally:
        L.close(fd)


def test_link_tmpfile_direct_enosys_gives_up(tmp_path: Path, dfd: int) -> None:
    fd = _tmpfile_with(dfd, b"x")
    try:
        with L.inject(nth=1, errno=errno.ENOSYS, op="link"), L.trace() as events:
            with pytest.raises(L.TmpfileLinkUnsupported) as ei:
                L.link_tmpfile(fd, dfd, "job.sqj")
        assert len(events) == 1 and ei.value.attempts == (("direct", errno.ENOSYS),)
    finally:
        L.close(fd)
    assert not (tmp_path / "job.sqj").exists()


def test_link_tmpfile_other_errno_propagates(dfd: int) -> None:
    fd = _tmpfile_with(dfd, b"x")
    try:
        with L.inject(nth=1, errno=errno.ENOSPC, op="link"), pytest.raises(OSError) as ei:
            L.link_tmpfile(fd, dfd, "job.sqj")
        assert ei.value.errno == errno.ENOSPC
    finally:
        L.close(fd)


def test_link_tmpfile_deleted_destination_raises_enoent(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "gone").mkdir()
    gone = L.open_dir(dfd, "gone")
    fd = _tmpfile_with(dfd, b"x")
    try:
        L.rmdir_at(dfd, "gone")
        with pytest.raises(FileNotFoundError):
            L.link_tmpfile(fd, gone, "job.sqj")
    finally:
        L.close(fd)
        L.close(gone)


def test_link_unlinked_regular_file_is_unsupported(tmp_path: Path, dfd: int) -> None:
    # A deleted non-O_TMPFILE inode can never be linked back: both forms give ENOENT.
    fd = L.open_at(dfd, "plain", os.O_RDWR | os.O_CREAT)
    try:
        L.unlink_at(dfd, "plain")
        with pytest.raises(L.TmpfileLinkUnsupported) as ei:
            L.link_tmpfile(fd, dfd, "job.sqj")
        assert [form for form, _ in ei.value.attempts] == ["direct", "proc"]
    finally:
        L.close(fd)


def test_open_tmpfile_error_raised_as_is(tmp_path: Path, dfd: int) -> None:
    (tmp_path / "f").write_bytes(b"")
    ffd = L.open_at(dfd, "f", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as ei:
            L.open_tmpfile(ffd)
        assert ei.value.errno == errno.ENOTDIR
    finally:
        L.close(ffd)


# --- OFD locks. ---


def test_ofd_locks_conflict_between_opens(tmp_path: Path) -> None:
    p = str(tmp_path / "lock")
    a = L.open_at(L.AT_FDCWD, p, os.O_RDWR | os.O_CREAT)
    b = L.open_at(L.AT_FDCWD, p, os.O_RDWR)
    c = L.open_at(L.AT_FDCWD, p, os.O_RDONLY)
    try:
        assert L.ofd_lock(a, exclusive=True) is True
        assert L.ofd_lock(b, exclusive=True) is False
        assert L.ofd_lock(c, exclusive=False) is False
        L.close(a)
        a = L.open_at(L.AT_FDCWD, p, os.O_RDONLY)
        assert L.ofd_lock(c, exclusive=False) is True  # released on close
        assert L.ofd_lock(a, exclusive=False) is True  # shared + shared
        assert L.ofd_lock(b, exclusive=True) is False  # exclusive blocked by shared
    finally:
        for fd in (a, b, c):
            L.close(fd)


def test_ofd_lock_errors_propagate(tmp_path: Path) -> None:
    fd = L.open_at(L.AT_FDCWD, str(tmp_path / "lock"), os.O_RDONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError) as ei:
            L.ofd_lock(fd, exclusive=True)  # write lock on a read-only fd
        assert ei.value.errno == errno.EBADF
        with L.inject(nth=1, errno=errno.EAGAIN, op="lock"):
            assert L.ofd_lock(fd, exclusive=False) is False
    finally:
        L.close(fd)


# --- statfs. ---


def test_fstatfs_type(tmp_path: Path, dfd: int) -> None:
    assert L.fstatfs_type(dfd) == 0xEF53
    assert L.statfs_type("/work") == 0xEF53
    if os.path.isdir("/dev/shm"):
        assert L.statfs_type("/dev/shm") == 0x01021994
        shm = L.open_dir(L.AT_FDCWD, "/dev/shm")
        try:
            assert L.fstatfs_type(shm) == 0x01021994
        finally:
            L.close(shm)
    with pytest.raises(FileNotFoundError):
        L.statfs_type(str(tmp_path / "missing"))


# --- Clocks, randomness, boot id. ---


def test_clocks() -> None:
    with L.trace() as events:
        m1 = L.monotonic_ns()
        b = L.boottime_ns()
        r = L.realtime_ns()
        m2 = L.monotonic_ns()
    assert m1 <= m2 and b >= m1
    assert abs(r - time.time_ns()) < 10 * 10**9
    assert [e.detail for e in events] == [("monotonic",), ("boottime",), ("realtime",), ("monotonic",)]
    assert {e.op for e in events} == {"clock"}


def test_getrandom() -> None:
    a, b = L.getrandom(16), L.getrandom(16)
    assert len(a) == 16 and a != b
    assert L.getrandom(0) == b""
    with L.inject(nth=1, errno=errno.EIO, op="getrandom"), pytest.raises(OSError):
        L.getrandom(16)
