"""Issue 32 #1 on a bucket queue: cancel without breaking "one terminal record, written by the tail holder".

A ready job is claimed by the canceller and buried with reason ``cancelled``; a held
one gets a cancel request (``outputs/.steadq-cancel/<id>``, application space the
reference never reads) that its holder carries out: it buries its own lease. The
race with the holder's ack has exactly one outcome: the request is carried out only
by a lease that can still be buried.
"""

from __future__ import annotations

import pytest

from steadqd.cli.main import main
from steadqd.constants import CancelResult, DeadReason
from steadqd.errors import LeaseLost, SteadQError
from steadqd.s3.backend import BucketBackend
from steadqd.s3.cancel import request_key
from steadqd.s3.layout import init_layout
from steadqd.s3.store.memory import ManualClock, MemoryStore

from .protocol_audit import audit
from .recovery_world import LEASE_S, MINUTE, SECOND, world

STORE: dict[int, MemoryStore] = {}


@pytest.fixture
def q() -> BucketBackend:
    store = MemoryStore(clock=ManualClock(step_ns=1000))
    backend = BucketBackend(init_layout(store, "farm/", worker_id="w", certify_store=False), url="s3://mem/farm")
    STORE[id(backend)] = store
    return backend


def _legal(q: BucketBackend) -> dict[bytes, str]:
    """The protocol's gates (one terminal record, by the tail) and this implementation's fsck: no finding."""
    report = q.fsck()
    assert report.exit_code == 0 and not report.findings, report.findings
    return audit(q, STORE[id(q)])


def _dead_reason(q: BucketBackend, job: str) -> int:
    (dead,) = [o for o in q.inspect_detailed(job) if o.state == "dead"]
    return int(dead.details["reason"])


def test_a_ready_job_is_claimed_and_buried_cancelled(q: BucketBackend) -> None:
    job = q.enqueue(b"x")
    c = q.cancel(job)
    assert (c.result, c.was) == (CancelResult.CANCELLED, "ready")
    assert _dead_reason(q, job) == DeadReason.CANCELLED
    assert q.lease() is None
    assert _legal(q) == {bytes.fromhex(job): "dead"}


def test_a_running_job_gets_a_request_its_holder_carries_out(q: BucketBackend) -> None:
    job = q.enqueue(b"x")
    lease = q.lease()
    assert lease is not None
    c = q.cancel(job)
    assert (c.result, c.was) == (CancelResult.REQUESTED, "leased")
    assert q.layout.exists(request_key(job))
    assert q.was_cancelled(lease)  # the holder's check: it buries its own lease
    assert _dead_reason(q, job) == DeadReason.CANCELLED
    assert not q.layout.exists(request_key(job))
    with pytest.raises(LeaseLost):
        q.ack(lease)
    assert _legal(q) == {bytes.fromhex(job): "dead"}


def test_ack_before_the_holder_sees_the_request_wins_and_the_request_is_dropped(q: BucketBackend) -> None:
    job = q.enqueue(b"x")
    lease = q.lease()
    assert lease is not None
    assert q.cancel(job).result is CancelResult.REQUESTED
    q.ack(lease)
    assert not q.was_cancelled(lease)  # the bury refuses: the job was acked; one terminal record
    assert {o.state for o in q.inspect(job)} == {"receipt"}
    assert not q.layout.exists(request_key(job))  # the holder found the job settled: the request went
    assert _legal(q) == {bytes.fromhex(job): "receipt"}


def test_a_cancel_that_finds_the_job_settled_deletes_a_request_left_for_it(q: BucketBackend) -> None:
    job = q.enqueue(b"x")
    lease = q.lease()
    assert lease is not None
    assert q.cancel(job).result is CancelResult.REQUESTED
    q.ack(lease)  # the holder settled before it looked for the request: it is left
    assert q.layout.exists(request_key(job))
    assert q.cancel(job).result is CancelResult.ALREADY_ACKED
    assert not q.layout.exists(request_key(job))
    assert _legal(q) == {bytes.fromhex(job): "receipt"}


def test_a_holder_whose_lease_was_taken_over_leaves_the_request_to_the_new_holder() -> None:
    w = world()
    job = w.q.enqueue(b"x")
    old = w.q.lease(duration=LEASE_S)
    assert old is not None
    assert w.q.cancel(job).result is CancelResult.REQUESTED
    w.advance(2 * MINUTE)  # the old lease expired; another worker claims the job
    other = w.handle("w2")
    new = other.lease(duration=LEASE_S)
    assert new is not None and new.job_id == job and new.generation == old.generation + 1
    assert not w.q.was_cancelled(old)  # not ours to bury any more, and the job is not settled
    assert w.q.layout.exists(request_key(job))
    assert other.was_cancelled(new)  # the new holder carries it out
    assert not w.q.layout.exists(request_key(job))
    assert {o.state for o in w.q.inspect(job)} >= {"dead"}


def test_gc_deletes_a_request_left_for_a_job_with_its_graph() -> None:
    w = world()
    job = w.q.enqueue(b"x")
    lease = w.q.lease(duration=LEASE_S)
    assert lease is not None
    assert w.q.cancel(job).result is CancelResult.REQUESTED
    w.q.ack(lease)  # no one looks for the request again
    assert w.keys(request_key(job)) == [request_key(job)]
    w.advance(121 * SECOND)  # past the world's receipt retention
    assert w.q.recover(phases=("delete_receipts",)).receipts_deleted == 1
    assert w.keys(request_key(job)) == []
    assert [k for k in w.keys() if job in k] == []


def test_settled_and_unknown_jobs(q: BucketBackend) -> None:
    job = q.enqueue(b"x")
    lease = q.lease()
    assert lease is not None
    q.bury(lease, reason=1)
    c = q.cancel(job)
    assert (c.result, c.reason) == (CancelResult.ALREADY_DEAD, DeadReason.CONSUMER_REJECTED)
    with pytest.raises(SteadQError):
        q.cancel("0" * 32)


def test_the_cli_on_a_bucket(
    q: BucketBackend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(q, "close", lambda: None)
    monkeypatch.setattr("steadqd.cli.common.open_backend", lambda target, **options: q)
    job = q.enqueue(b"x")
    assert main(["cancel", "s3://mem/farm", job[:8]]) == 0
    assert capsys.readouterr().out == f"{job} cancelled (was ready)\n"
    assert main(["cancel", "s3://mem/farm", "0" * 32]) == 1
    assert "not found" in capsys.readouterr().err
