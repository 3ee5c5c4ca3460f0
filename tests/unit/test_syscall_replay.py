"""syscall_hook.replay: the C claim core's syscalls served back to the Python that continues after it."""

from __future__ import annotations

import errno
import os

import pytest

from steadqd.fs import linux, syscall_hook


def test_replayed_calls_return_the_recorded_results_untraced_then_go_live(tmp_path: object) -> None:
    fd = os.open(str(tmp_path), os.O_RDONLY)
    try:
        real = os.fstat(fd)
        with linux.trace() as events, syscall_hook.replay([("fstat", "recorded"), ("read", b"abc")]) as pending:
            assert linux.fstat(fd) == "recorded"
            assert linux.pread(fd, 3, 0) == b"abc"
            assert pending == []
            assert linux.fstat(fd).st_ino == real.st_ino  # live again, and traced
        assert [e.op for e in events] == ["fstat"]
    finally:
        os.close(fd)
    assert syscall_hook._replays == {} and syscall_hook._traces == []


def test_a_recorded_error_is_raised_where_the_python_makes_the_call() -> None:
    err = OSError(errno.EIO, os.strerror(errno.EIO))
    with syscall_hook.replay([("fsync", err)]), pytest.raises(OSError) as info:
        linux.fsync(12345)
    assert info.value is err


def test_another_call_than_the_recorded_one_is_a_mismatch() -> None:
    with syscall_hook.replay([("stat", None)]), pytest.raises(syscall_hook.ReplayMismatch):
        linux.fsync(12345)
    assert syscall_hook._replays == {} and syscall_hook._traces == []


def test_a_replay_serves_only_its_own_thread() -> None:
    import threading

    seen: list[object] = []
    with syscall_hook.replay([("clock", 7)]):
        t = threading.Thread(target=lambda: seen.append(linux.monotonic_ns()))
        t.start()
        t.join()
        assert linux.monotonic_ns() == 7
    assert seen and seen[0] != 7
