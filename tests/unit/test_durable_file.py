"""The one durable writer (steadqd/durable_file.py): all or nothing, by descriptor, through a table of calls."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd.durable_file import OS_CALLS, StepFailed, export_durably, replace_durably, stream_durably


def _dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def test_stream_writes_every_chunk_and_replaces_the_target(tmp_path: Path) -> None:
    (tmp_path / "out").write_bytes(b"old")
    fd = _dir(tmp_path)
    try:
        n = stream_durably(fd, ".out.tmp", "out", iter([b"ab", b"", b"cde"]))
    finally:
        os.close(fd)
    assert n == 5 and (tmp_path / "out").read_bytes() == b"abcde"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_source_that_fails_at_its_end_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    (tmp_path / "out").write_bytes(b"old")

    def chunks() -> Iterator[bytes]:
        yield b"partial"
        raise OSError(errno.EIO, "the source failed")

    fd = _dir(tmp_path)
    try:
        with pytest.raises(StepFailed) as ei:
            stream_durably(fd, ".out.tmp", "out", chunks())
    finally:
        os.close(fd)
    assert ei.value.step == "read" and ei.value.errno == errno.EIO
    assert (tmp_path / "out").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_planted_temp_symlink_is_refused_and_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / ".out.tmp").symlink_to(victim)
    with pytest.raises(StepFailed) as ei:
        replace_durably(".out.tmp", "out", b"x", dir_fd=_dir_kept(tmp_path))
    assert ei.value.step == "create" and ei.value.errno == errno.EEXIST
    assert victim.read_bytes() == b"keep" and not (tmp_path / "out").exists()
    assert os.path.islink(tmp_path / ".out.tmp")  # left alone, not removed: it is not ours


_kept: list[int] = []


def _dir_kept(path: Path) -> int:
    fd = _dir(path)
    _kept.append(fd)
    return fd


@pytest.fixture(autouse=True)
def _close_kept() -> Iterator[None]:
    yield
    while _kept:
        os.close(_kept.pop())


def test_an_export_is_0600_whatever_the_umask_and_its_directory_is_fsynced(tmp_path: Path) -> None:
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> object:
            real = getattr(OS_CALLS, name)

            def call(*args: object) -> object:
                calls.append(name)
                return real(*args)

            return call

    old = os.umask(0o022)
    try:
        fd = _dir_kept(tmp_path)
        assert export_durably(fd, "evidence.sqj", [b"payload"], calls=Counting()) == 7  # type: ignore[arg-type]
    finally:
        os.umask(old)
    st = os.stat(tmp_path / "evidence.sqj")
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert calls == ["open_at", "fchmod", "write_all", "fsync", "rename_at", "fsync"]
