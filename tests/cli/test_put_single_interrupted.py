"""A single ``steadq put`` stopped by SIGINT or SIGTERM says whether its job was committed.

The reported defect: ^C during a put printed nothing, so the operator could
not tell whether to put the payload again. Stopped while it still reads the
payload, nothing can have been committed; stopped after, the job is there
and its id is printed.
"""

from __future__ import annotations

import fcntl
import io
import os
import signal
import struct
import subprocess
import sys
import termios
import time
from typing import Any

import pytest

from steadqd.cli import main as cli_main
from steadqd.cli import put_cmd
from tests.invariants import check_tree

from .helpers import STEADQ


def _unread(fd: int) -> int:
    """Bytes still in the pipe of ``fd`` (FIONREAD works on either end of a Linux pipe)."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_put_stopped_while_reading_its_payload_says_nothing_was_enqueued(qpath: str, sig: signal.Signals) -> None:
    assert STEADQ is not None
    p = subprocess.Popen([STEADQ, "put", qpath], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdin is not None
    try:
        p.stdin.write(b"the first part of a payload")
        p.stdin.flush()
        deadline = time.monotonic() + 60
        while _unread(p.stdin.fileno()) and time.monotonic() < deadline:  # read: the enqueue is under way
            time.sleep(0.01)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + sig, err
    assert err.decode().splitlines() == [f"put: interrupted by {sig.name}: not committed: nothing was enqueued"]
    assert out == b""
    tree = check_tree(qpath)
    assert not tree.all_ids


class _SignalledDuringCommit:
    """The real queue, with SIGINT arriving after the payload was read, while the job is being committed."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def enqueue_detailed(self, payload: Any, **options: Any) -> tuple[str, str]:
        data = payload.read()
        assert payload.read() == b""
        os.kill(os.getpid(), signal.SIGINT)
        return self.real.enqueue_detailed(data, **options)

    def pause_state(self) -> Any:
        return self.real.pause_state()

    def close(self) -> None:
        self.real.close()


def test_put_stopped_after_its_payload_was_read_commits_and_says_so(
    qpath: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    real_open = put_cmd.open_queue
    monkeypatch.setattr(put_cmd, "open_queue", lambda path, **kw: _SignalledDuringCommit(real_open(path, **kw)))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"payload")))
    code = cli_main.main(["put", qpath, "-"])
    out, err = capsys.readouterr()
    [job_id] = check_tree(qpath).all_ids
    assert code == 128 + signal.SIGINT, err
    assert err.splitlines() == [f"put: interrupted by SIGINT: job {job_id} was committed"]
    assert out.splitlines()[0] == f"job_id: {job_id}"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
