"""Issue 32 #1: cancel on a filesystem queue, and its races with the holder's own settlement.

A cancel is one more exact-source rename of the job's current file to its dead
name (fs/cancel.py), so it and the holder's ack, retry, bury or renew rename the
same source: exactly one happens. Each race is run in both orders, pinned by
running the other side *inside* the first one's window (after it validated its
source, before its rename), and then freely from a barrier, many times; the tree
is checked by the format's oracle (tests/invariants.py, written from the spec
alone) after each: the reference's fsck sees nothing but legal objects.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from typing import Any

import pytest

from steadqd import Queue
from steadqd.constants import AckResult, CancelResult, DeadReason
from steadqd.errors import ErrorKind, LeaseLost, SteadQError
from steadqd.fs import cancel as fs_cancel
from steadqd.fs import settle as fs_settle
from tests.invariants import State, check_tree


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    return make_queue()


def _dead_reason(q: Queue, job: str) -> int:
    (dead,) = [o for o in q.inspect_detailed(job) if o.state == "dead"]
    return int(dead.details["reason"])


def _only_state(q: Queue, job: str) -> str:
    states = {o.state for o in q.inspect(job)}
    assert len(states) == 1, states
    return states.pop()


def test_a_ready_job_becomes_dead_cancelled(q: Queue, queue_path: str) -> None:
    job = q.enqueue(b"render frame 7")
    c = q.cancel(job)
    assert (c.result, c.was) == (CancelResult.CANCELLED, "ready")
    assert _only_state(q, job) == "dead"
    assert _dead_reason(q, job) == DeadReason.CANCELLED == 0x8000
    assert q.lease() is None  # nobody runs it
    ts = check_tree(queue_path)
    assert ts.state_of(job) is State.DEAD


def test_a_delayed_job_becomes_dead_cancelled(q: Queue, queue_path: str) -> None:
    job = q.enqueue(b"later", delay=3600)
    c = q.cancel(job)
    assert (c.result, c.was) == (CancelResult.CANCELLED, "delayed")
    assert _dead_reason(q, job) == DeadReason.CANCELLED
    assert check_tree(queue_path).state_of(job) is State.DEAD


def test_a_running_job_becomes_dead_and_its_holder_loses_the_lease(q: Queue, queue_path: str) -> None:
    job = q.enqueue(b"long")
    lease = q.lease()
    assert lease is not None
    c = q.cancel(job)
    assert (c.result, c.was) == (CancelResult.CANCELLED, "leased")
    assert q.was_cancelled(lease)
    with pytest.raises(LeaseLost):
        q.renew(lease, 30)
    with pytest.raises(LeaseLost):
        q.ack(lease)
    # The dead file is what a bury of that lease would have made: generation + 1, same attempt.
    (dead,) = [o for o in q.inspect(job) if o.state == "dead"]
    assert (dead.generation, dead.attempt) == (lease.generation + 1, lease.attempt)
    assert check_tree(queue_path).state_of(job) is State.DEAD


def test_a_lease_lost_otherwise_is_not_taken_for_a_cancel(q: Queue) -> None:
    q.enqueue(b"x")
    lease = q.lease()
    assert lease is not None
    q.bury(lease, reason=1)
    assert not q.was_cancelled(lease)


def test_settled_jobs_are_reported_and_left_alone(q: Queue, queue_path: str) -> None:
    acked = q.enqueue(b"a")
    lease = q.lease()
    assert lease is not None
    q.ack(lease)
    buried = q.enqueue(b"b")
    lease = q.lease()
    assert lease is not None
    q.bury(lease, reason=1)
    before = check_tree(queue_path).paths()
    assert q.cancel(acked).result is CancelResult.ALREADY_ACKED
    c = q.cancel(buried)
    assert (c.result, c.reason) == (CancelResult.ALREADY_DEAD, DeadReason.CONSUMER_REJECTED)
    assert check_tree(queue_path).paths() == before  # nothing changed


def test_cancelling_twice_says_already_dead_cancelled(q: Queue) -> None:
    job = q.enqueue(b"x")
    q.cancel(job)
    c = q.cancel(job)
    assert (c.result, c.reason) == (CancelResult.ALREADY_DEAD, DeadReason.CANCELLED)


def test_an_unknown_job_is_not_found(q: Queue) -> None:
    with pytest.raises(SteadQError) as e:
        q.cancel("0" * 32)
    assert "not found" in str(e.value)


def test_a_cancelled_job_can_be_requeued(q: Queue, queue_path: str) -> None:
    job = q.enqueue(b"again")
    q.cancel(job)
    q.requeue_dead(job)
    lease = q.lease()
    assert lease is not None and lease.job_id == job
    check_tree(queue_path)


# --- the race with ack, pinned in both orders ---------------------------------------------------------------


def test_ack_inside_the_cancels_window_wins_and_the_cancel_says_already_acked(
    q: Queue, queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel has opened and witnessed the leased file; the ack renames it first."""
    job = q.enqueue(b"x")
    lease = q.lease()
    assert lease is not None
    holder = Queue.open(queue_path)
    acked: list[AckResult] = []
    real = fs_cancel._move_into

    def ack_first(*args: Any, **kwargs: Any) -> None:
        if not acked:
            acked.append(holder.ack(lease))
        real(*args, **kwargs)

    monkeypatch.setattr(fs_cancel, "_move_into", ack_first)
    try:
        c = q.cancel(job)
    finally:
        holder.close()
    assert acked == [AckResult.ACKED]
    assert c.result is CancelResult.ALREADY_ACKED
    assert check_tree(queue_path).state_of(job) is State.RECEIPT


def test_cancel_inside_the_acks_window_wins_and_the_ack_finds_the_lease_lost(
    q: Queue, queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ack has validated its source and is hashing the payload; the cancel renames it first."""
    job = q.enqueue(b"x")
    lease = q.lease()
    assert lease is not None
    canceller = Queue.open(queue_path)
    cancels: list[CancelResult] = []
    real = fs_settle.verify_payload

    def cancel_first(*args: Any) -> None:
        if not cancels:
            cancels.append(canceller.cancel(job).result)
        real(*args)

    monkeypatch.setattr(fs_settle, "verify_payload", cancel_first)
    try:
        with pytest.raises(LeaseLost):
            q.ack(lease)
    finally:
        canceller.close()
    assert cancels == [CancelResult.CANCELLED]
    assert check_tree(queue_path).state_of(job) is State.DEAD


def test_renewal_inside_the_cancels_window_makes_it_look_again_and_cancel_the_new_file(
    q: Queue, queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = q.enqueue(b"x")
    lease = q.lease()
    assert lease is not None
    holder = Queue.open(queue_path)
    renewed: list[int] = []
    real = fs_cancel._move_into

    def renew_first(*args: Any, **kwargs: Any) -> None:
        if not renewed:
            renewed.append(holder.renew(lease, 30).generation)
        real(*args, **kwargs)

    monkeypatch.setattr(fs_cancel, "_move_into", renew_first)
    try:
        c = q.cancel(job)
        assert (c.result, c.was) == (CancelResult.CANCELLED, "leased")
        assert q.was_cancelled(lease)  # of the renewed generation
        with pytest.raises(LeaseLost):
            holder.ack(lease)
    finally:
        holder.close()
    check_tree(queue_path)


@pytest.mark.parametrize("settle", ["ack", "retry", "bury"])
def test_cancel_and_settle_from_a_barrier_give_exactly_one_outcome(q: Queue, queue_path: str, settle: str) -> None:
    """Free races, both sides released together, many times: one outcome, reported truthfully by both."""
    holder = Queue.open(queue_path)
    canceller = Queue.open(queue_path)
    wins = {"cancel": 0, settle: 0}
    try:
        for _ in range(40):
            job = holder.enqueue(b"x", max_attempts=5)
            lease = holder.lease()
            assert lease is not None and lease.job_id == job
            barrier = threading.Barrier(2)
            got: dict[str, Any] = {}

            def settling(lease: Any = lease, barrier: threading.Barrier = barrier, got: dict[str, Any] = got) -> None:
                barrier.wait()
                try:
                    got["settle"] = getattr(holder, settle)(lease)
                except LeaseLost as e:
                    got["settle"] = e

            t = threading.Thread(target=settling)
            t.start()
            barrier.wait()
            c = canceller.cancel(job)
            t.join()
            ts = check_tree(queue_path)
            lost = isinstance(got["settle"], LeaseLost)
            if c.result is CancelResult.CANCELLED and lost:  # the cancel renamed the leased file first
                wins["cancel"] += 1
                assert c.was == "leased"
            else:  # the settle renamed it first; the cancel reports where the job went
                wins[settle] += 1
                assert not lost
                expected = {
                    "ack": (CancelResult.ALREADY_ACKED, "receipt"),
                    "bury": (CancelResult.ALREADY_DEAD, "dead"),
                    "retry": (CancelResult.CANCELLED, "ready"),  # ready again: cancelled there
                }[settle]
                assert (c.result, c.was) == expected
            if c.result is CancelResult.CANCELLED:
                assert ts.state_of(job) is State.DEAD and _dead_reason(canceller, job) == DeadReason.CANCELLED
            assert q.lease() is None  # nobody runs it again
    finally:
        holder.close()
        canceller.close()
    assert sum(wins.values()) == 40


@pytest.mark.parametrize("plant", ["fifo", "garbage", "another_jobs_file"])
def test_a_fifo_or_corrupt_object_at_the_jobs_name_is_refused_and_nothing_moves(
    q: Queue, queue_path: str, plant: str
) -> None:
    """A queue member plants something at a ready job's name: the cancel must neither hang nor move it."""
    job = q.enqueue(b"the job")
    other = q.enqueue(b"another job, valid on its own")
    (obj,) = q.inspect_detailed(job)
    path = os.path.join(queue_path, obj.path)
    os.unlink(path)
    if plant == "fifo":
        os.mkfifo(path, 0o660)  # opening it for reading without O_NONBLOCK would wait for a writer forever
    elif plant == "garbage":
        with open(path, "wb") as f:
            f.write(b"\x00not an envelope" * 64)
    else:
        (theirs,) = q.inspect_detailed(other)
        shutil.copyfile(os.path.join(queue_path, theirs.path), path)  # a valid envelope, of another job
    outcome: list[BaseException | object] = []
    t = threading.Thread(target=lambda: outcome.append(_attempt(q, job)), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the cancel hangs on what was planted"
    (e,) = outcome
    assert isinstance(e, SteadQError) and e.kind is ErrorKind.QUEUE_CORRUPT, e
    assert "cancel refused" in e.message and "fsck --repair" in e.message
    assert os.path.lexists(path)  # left where it was, for fsck to quarantine
    assert not [o for o in q.inspect(job) if o.state == "dead"]  # nothing moved to dead/
    assert q.cancel(other).result is CancelResult.CANCELLED  # the handle is still usable


def _attempt(q: Queue, job: str) -> BaseException | object:
    try:
        return q.cancel(job)
    except BaseException as e:  # what the cancel raised is the test's subject
        return e
