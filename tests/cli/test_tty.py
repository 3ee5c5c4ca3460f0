"""``steadq`` on a pseudo-terminal: bulk-put progress bar, ``watch`` refresh and ^C, flat memory.

Why a pty: both features change behaviour on a terminal (``\\r`` progress on
stderr, ANSI home+clear frames on stdout) and must stay quiet otherwise, so
only a real terminal device can show that they work. ^C is delivered as
SIGINT to the process, as the terminal driver would.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from steadqd import Queue
from tests.invariants import check_tree

from .helpers import STEADQ, payload_dir, steadq


class PtyRun:
    """A child whose stdin/stdout/stderr are one pty; output is drained continuously."""

    def __init__(self, *args: str | os.PathLike[str]) -> None:
        assert STEADQ is not None
        self.master, slave = os.openpty()
        # A terminal's child gets SIGINT's default action; a test runner started as a
        # background job of a non-interactive shell passes SIG_IGN on instead (POSIX),
        # and Python keeps an inherited SIG_IGN, so ^C tests would not test ^C.
        self.proc = subprocess.Popen(
            [STEADQ, *map(str, args)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        os.close(slave)
        self.output = b""
        self.code: int | None = None
        self.maxrss_kb = 0

    def pump(self, timeout: float) -> None:
        """Read whatever is available for up to ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ready, _, _ = select.select([self.master], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                return
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every slave end is closed (the child exited)
                return
            if not chunk:
                return
            self.output += chunk

    def wait_for(self, pattern: bytes, count: int = 1, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while self.output.count(pattern) < count:
            assert time.monotonic() < end, f"timed out waiting for {pattern!r}: {self.output[-500:]!r}"
            assert self.proc.poll() is None, f"exited early: {self.output[-500:]!r}"
            self.pump(0.2)

    def finish(self, timeout: float = 120) -> int:
        """Drain until the child exits; reap it with wait4 to learn its peak RSS."""
        end = time.monotonic() + timeout
        while True:
            self.pump(0.2)
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > end:
                self.proc.kill()
                raise AssertionError(f"timed out: {self.output[-500:]!r}")
        self.pump(0.2)
        os.close(self.master)
        self.code = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.code  # reaped by wait4; keep Popen from waiting again
        self.maxrss_kb = usage.ru_maxrss
        return self.code


def _check_bulk_on_pty(qpath: str, tmp_path: Path, n: int) -> PtyRun:
    d = payload_dir(tmp_path, n)
    run = PtyRun("put", qpath, "--dir", d)
    assert run.finish() == 0, run.output[-2000:]
    text = run.output.decode()
    assert "\r[" in text  # progress bar redrawn in place
    assert f"{n}/{n} 100%" in text
    assert re.search(rf"enqueued {n} jobs \(\d+ bytes\) from files of ", text)
    assert len(check_tree(qpath).ready) == n
    return run


def test_bulk_put_progress_bar_on_a_pty(qpath: str, tmp_path: Path) -> None:
    _check_bulk_on_pty(qpath, tmp_path, 400)


@pytest.mark.slow
def test_bulk_put_10000_payloads_on_a_pty(qpath: str, tmp_path: Path) -> None:
    """Flat memory: 10,000 files cost about what 400 do (names only, one payload stream at a time).

    Compared with a small run from this same test process, because the child is forked from it
    (a pty wants a controlling terminal) and Linux keeps the fork's peak RSS across exec: an
    absolute bound measured the size of pytest's worker (160 MB late in a CI run), not steadq's.
    """
    small = tmp_path / "small"
    small.mkdir()
    Queue.init(small / "queue", shards=4).close()
    base = _check_bulk_on_pty(str(small / "queue"), small, 400)
    run = _check_bulk_on_pty(qpath, tmp_path, 10_000)
    growth_kb = run.maxrss_kb - base.maxrss_kb
    assert growth_kb < 32 * 1024, (base.maxrss_kb, run.maxrss_kb)


def test_single_put_streams_a_large_payload(qpath: str, tmp_path: Path) -> None:
    """128 MiB through ``put FILE`` must not be held in memory: peak RSS grows by
    far less than the payload over a tiny put's peak (holding it would add >= 128 MiB)."""
    tiny = tmp_path / "tiny.bin"
    tiny.write_bytes(b"x")
    base = PtyRun("put", qpath, tiny)
    assert base.finish() == 0, base.output
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        for _ in range(128):
            f.write(os.urandom(1 << 20))
    run = PtyRun("put", qpath, big)
    assert run.finish() == 0, run.output
    growth_kb = run.maxrss_kb - base.maxrss_kb
    assert growth_kb < 48 * 1024, (base.maxrss_kb, run.maxrss_kb)
    job = re.search(rb"job_id: ([0-9a-f]{32})", run.output).group(1).decode()  # type: ignore[union-attr]
    assert job in check_tree(qpath).ready


def test_watch_refreshes_on_a_pty_and_exits_cleanly_on_sigint(qpath: str) -> None:
    for _ in range(3):
        assert steadq("put", qpath, stdin=b"x").code == 0
    run = PtyRun("watch", qpath, "--interval", "0.2")
    run.wait_for(b"\x1b[H\x1b[2J", count=3)  # at least three refreshes (home + clear)
    run.proc.send_signal(signal.SIGINT)
    code = run.finish(timeout=10)
    assert code in (0, 130)
    text = run.output.decode()
    assert re.search(r"ready\s+3\s", text)
    assert "throughput:" in text and "Traceback" not in text
    last_frame = text.split("\x1b[H\x1b[2J")[-1]
    assert "press Ctrl-C to quit" in last_frame and "\r\r\n" not in text
    assert "\x1b[?25h" in text  # cursor restored
