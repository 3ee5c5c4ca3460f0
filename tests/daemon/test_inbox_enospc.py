"""A watch folder on a full filesystem: files wait, nothing half written remains, intake resumes.

A real ENOSPC: the folder is on a small loop-device ext4 filled to the last block by a file
root writes (root may use the reserved blocks too), so the daemon's intent record cannot be
written. The queue is elsewhere and has room.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from steadqd.daemon.inbox.intent import STATE_DIR
from tests.daemon.conftest import Daemon, Env
from tests.daemon.test_inbox import jobs, write_config
from tests.loopfs import loop_filesystem

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a loop device")


def fill(path: Path) -> None:
    """Write ``path`` until the filesystem has no block left."""
    chunk = b"\0" * (1 << 16)
    with open(path, "wb", buffering=0) as f:
        for _ in range(1 << 12):  # 256 MB at most: far more than the image
            try:
                f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
        while True:  # the last partial block
            try:
                f.write(b"\0")
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return


def test_a_full_disk_makes_files_wait_and_intake_resumes_when_space_returns(denv: Env) -> None:
    with loop_filesystem("ext4", 16) as mnt:
        inbox = Path(mnt) / "inbox"
        inbox.mkdir()
        write_config(denv, {"path": str(inbox), "settle": "0.1s", "payload": "content", "after": "delete"})
        d = Daemon(denv, "inbox")
        try:
            d.wait_log(r"^<5>inbox\[testq\]: started")
            (inbox / "a.dat").write_bytes(b"first")
            d.wait_log(r"a\.dat enqueued as job")
            fill(Path(mnt) / ".filler")
            (inbox / "b.dat").write_bytes(b"")  # an empty file needs no block
            d.wait_log(r"b\.dat .*No space left on device.*trying again every")
            assert d.proc.poll() is None and "stopped" not in d.log()
            assert os.listdir(inbox / STATE_DIR) == []  # no intent, not even an empty one
            os.unlink(Path(mnt) / ".filler")
            d.wait_log(r"b\.dat enqueued as job")
            (inbox / "c.dat").write_bytes(b"third")
            d.wait_log(r"c\.dat enqueued as job")
        finally:
            d.stop()
        assert os.listdir(inbox / STATE_DIR) == [] and os.listdir(inbox) == [STATE_DIR]
    assert sorted(body for _, body, _ in jobs(denv.queue_path)) == [b"", b"first", b"third"]
