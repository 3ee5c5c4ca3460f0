"""The lease keeper (steadqd/daemon/worker/renew.py): what one renewal became, on both backends.

The spawner, `steadq work` and the Python worker API all renew through it,
so its four outcomes are pinned here, beside the module: renewed (and, on a
bucket, the new generation to use from then on), not committed (the lease
still ours), lost, and unknown (a poisoned handle).
"""

from __future__ import annotations

import errno

import pytest

from steadqd import Queue
from steadqd.daemon.worker import renew
from steadqd.errors import LeaseLost, NotCommitted
from steadqd.fs import syscall_hook
from steadqd.s3.backend import BucketBackend
from steadqd.s3.layout import init_layout
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import ManualClock, MemoryStore


def test_interval_is_a_third_of_the_lease_unless_the_caller_says() -> None:
    assert renew.interval(30.0) == 10.0
    assert renew.interval(30.0, 15.0) == 15.0


@pytest.fixture
def fs_q(queue: Queue) -> Queue:
    return queue


def test_a_filesystem_renewal_extends_the_same_lease(fs_q: Queue) -> None:
    fs_q.enqueue(b"job")
    lease = fs_q.lease(duration=5.0)
    assert lease is not None
    r = renew.renew(fs_q, lease, 60.0)
    assert r.error is None and not (r.lost or r.unknown or r.not_committed)
    assert r.lease.job_id == lease.job_id
    fs_q.ack(r.lease)


def test_a_refused_rename_is_not_committed_and_the_lease_is_still_ours(fs_q: Queue) -> None:
    fs_q.enqueue(b"job")
    lease = fs_q.lease(duration=30.0)
    assert lease is not None
    with syscall_hook.inject(nth=1, errno=errno.ENOSPC, op="rename_noreplace") as fault:
        r = renew.renew(fs_q, lease, 60.0)
    assert fault.fired
    assert r.not_committed and not r.lost and r.lease is lease
    again = renew.renew(fs_q, lease, 60.0)  # a full disk may clear: the caller tries again
    assert again.error is None
    fs_q.ack(again.lease)


def test_a_lease_someone_else_settled_is_lost(fs_q: Queue) -> None:
    fs_q.enqueue(b"job")
    lease = fs_q.lease(duration=30.0)
    assert lease is not None
    fs_q.ack(lease)
    r = renew.renew(fs_q, lease, 60.0)
    assert r.lost and isinstance(r.error, LeaseLost)


def _bucket(store: object) -> BucketBackend:
    return BucketBackend(init_layout(store, "farm/", worker_id="w", certify_store=False), url="s3://mem/farm")  # type: ignore[arg-type]


def test_a_bucket_renewal_is_a_new_generation_and_the_old_lease_is_fenced() -> None:
    q = _bucket(MemoryStore(clock=ManualClock(step_ns=1000)))
    q.enqueue(b"job")
    lease = q.lease(duration=30.0)
    assert lease is not None
    r = renew.renew(q, lease, 60.0)
    assert r.error is None and r.lease is not lease
    assert r.lease.generation == lease.generation + 1  # type: ignore[attr-defined]
    # The old generation is fenced off: settling with it fails, so the caller must replace its handle.
    with pytest.raises((LeaseLost, NotCommitted)):
        q.ack(lease)
    q.ack(r.lease)


def test_a_bucket_renewal_whose_answer_was_lost_is_unknown() -> None:
    store = FaultyStore(MemoryStore(clock=ManualClock(step_ns=1000)), sleep=lambda _s: None)
    q = _bucket(store)
    q.enqueue(b"job")
    lease = q.lease(duration=30.0)
    assert lease is not None
    # The create went through but its answer was lost, and every read that could resolve it fails too.
    with store.armed(Fault(FaultKind.TIMEOUT, applied=True, times=None, key_prefix="farm/claims/")):
        r = renew.renew(q, lease, 60.0)
    assert r.unknown and not r.lost and r.lease is lease
