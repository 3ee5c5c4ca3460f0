"""Crash lab lane 4: a queue on a tiny real ext4 that fills up (ENOSPC).

Why: a full disk is the most common storage fault in production, and the
protocol's promise is that it costs availability, never integrity: every
mutation fails *before* its commit point with NotCommitted(RESOURCE_EXHAUSTED)
(errors.md), nothing half-written becomes visible, a lease survives a failed
ack, and freeing space is the whole repair. A real filesystem is used, not an
injected errno, because where ENOSPC strikes (O_TMPFILE data blocks, a new
directory block for a link, mkdir of a new bucket) is the filesystem's choice.
EIO at every syscall position is covered by tests/integration/test_faults.py.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from typing import Any

import pytest

from steadqd import NotCommitted, Queue
from steadqd.errors import ErrorKind
from steadqd.fs.settle import AckResult
from tests.invariants import check_tree
from tests.lab.lanereport import emit
from tests.loopfs import loop_filesystem

PAYLOAD = 16 * 1024


def fill(path: str) -> int:
    """Write ``path`` until the filesystem refuses (ENOSPC) at 1 KiB granularity; fsync; return bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    total = 0
    try:
        for chunk in (1 << 20, 64 << 10, 1 << 10):
            block = b"\xa5" * chunk
            while True:
                try:
                    total += os.write(fd, block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
        try:
            os.fsync(fd)
        except OSError as e:  # late allocation failure: the data that failed is simply not there
            if e.errno != errno.ENOSPC:
                raise
    finally:
        os.close(fd)
    return total


def assert_exhausted(e: NotCommitted) -> None:
    """The error says what happened: resource exhausted, and the message names the cause."""
    assert e.kind is ErrorKind.RESOURCE_EXHAUSTED, (e.kind, str(e))
    assert "space" in str(e).lower() or "ENOSPC" in str(e), str(e)


def assert_scan_failed_for_space(e: NotCommitted) -> None:
    """A claim's scan reports its errors as IoFailure whatever the errno (spec errors.md), naming the cause."""
    assert e.kind is ErrorKind.IO_FAILURE, (e.kind, str(e))
    assert str(e).startswith("scan completed with errors") and "No space left on device" in str(e), str(e)


@pytest.fixture
def tiny() -> Iterator[str]:
    with loop_filesystem("ext4", 16) as mnt:
        yield mnt


def test_enospc_lane(tiny: str, request: pytest.FixtureRequest) -> None:
    root = os.path.join(tiny, "queue")
    filler = os.path.join(tiny, "filler")
    q = Queue.init(root, shards=4)
    try:
        seed_jobs = [q.enqueue(b"seed %d" % i) for i in range(3)]
        held_ack = q.lease()
        held_retry = q.lease()
        assert held_ack is not None and held_retry is not None
        fill(filler)

        # 1. Give back a little room, then enqueue until the filesystem is full again.
        os.truncate(filler, max(0, os.path.getsize(filler) - 512 * 1024))
        committed: list[str] = []
        with pytest.raises(NotCommitted) as exc:
            for i in range(10_000):
                committed.append(q.enqueue(os.urandom(PAYLOAD), metadata={"i": str(i)}))
        assert_exhausted(exc.value)
        assert committed, "no enqueue fitted in the freed room: the test proves nothing"
        assert not q.poisoned
        fill(filler + "2")  # whatever the failed enqueue released: the fs is full again

        # 2. Nothing partial is visible: every committed job verifies, no temps, nothing quarantined.
        ts = check_tree(root, allow_temps=False, allow_quarantine=False)
        assert set(committed) | set(seed_jobs) - {held_ack.job_id, held_retry.job_id} <= ts.ready | ts.leased
        assert {held_ack.job_id, held_retry.job_id} <= ts.leased

        # 3. Settling into new bucket directories while full fails cleanly; the leases stay valid.
        outcomes: dict[str, Any] = {}
        try:
            outcomes["ack"] = q.ack(held_ack)
        except NotCommitted as e:
            assert_exhausted(e)
            outcomes["ack"] = "NotCommitted(RESOURCE_EXHAUSTED)"
        try:
            outcomes["retry"] = q.retry(held_retry, delay=3600)
        except NotCommitted as e:
            assert_exhausted(e)
            outcomes["retry"] = "NotCommitted(RESOURCE_EXHAUSTED)"
        assert outcomes["ack"] == "NotCommitted(RESOURCE_EXHAUSTED)", outcomes  # a new receipts bucket needs space
        try:  # a lease is a rename in place: it may work or fail cleanly
            extra = q.lease()
            outcomes["lease"] = "ok" if extra is not None else "none"
        except NotCommitted as e:
            assert_scan_failed_for_space(e)
            outcomes["lease"] = "NotCommitted(IO_FAILURE: no space)"
            extra = None
        assert not q.poisoned
        ts = check_tree(root, allow_temps=False, allow_quarantine=False)
        assert ts.state_of(held_ack.job_id).value == "leased"
        if outcomes["retry"] != "delayed":
            assert ts.state_of(held_retry.job_id).value == "leased"
            try:  # a renew is a rename to a longer name: it may need a directory block
                q.renew(held_retry, duration=60)
                outcomes["renew"] = "ok"
            except NotCommitted as e:
                assert_exhausted(e)
                outcomes["renew"] = "NotCommitted(RESOURCE_EXHAUSTED)"
            assert (
                check_tree(root, allow_temps=False, allow_quarantine=False).state_of(held_retry.job_id).value
                == "leased"
            )

        # 4. Free the space: everything works again with the same handle and leases.
        os.unlink(filler)
        os.unlink(filler + "2")
        assert q.ack(held_ack) is AckResult.ACKED
        if outcomes["retry"] != "delayed":
            assert q.retry(held_retry, delay=3600) == "delayed"
        if extra is not None:
            assert q.ack(extra) is AckResult.ACKED
        after = q.enqueue(b"after freeing")
        drained = []
        while (lease := q.lease()) is not None:
            drained.append(lease.job_id)
            assert q.ack(lease) is AckResult.ACKED
        assert after in drained
        ts = check_tree(root, allow_temps=False, allow_quarantine=False)
        assert set(committed) | {after, held_ack.job_id} <= ts.receipts
        assert ts.state_of(held_retry.job_id).value == "delayed"
        assert not q.fsck().errors
    finally:
        q.close()
    emit(
        request,
        "lane 4",
        f"ext4 16 MB: {len(committed)} x {PAYLOAD // 1024} KiB enqueues fitted, then "
        f"NotCommitted(RESOURCE_EXHAUSTED); while full: {outcomes}; after freeing: all acked, fsck clean",
    )
