"""The fault injector at every store operation of every StowQ/1 transition, with the protocol's gates afterwards.

Each case fails the n-th store call a transition makes, for every n until
the transition makes fewer calls, in each way a network fails: before
transmit (NotCommitted), after transmit with the write not applied or
applied (OutcomeUnknown from the store), and a 5xx after the write. The
transition must then either succeed (its resolution read the key), or
raise NotCommitted (nothing happened) or OutcomeUnknown (naming the key),
and a repeat of it after the fault must finish the job. Afterwards the
audit of :mod:`tests.stowq.protocol_audit` holds (no two admissible claims,
no stale settle) and a clean worker drains the queue: every committed job
ends with exactly one receipt or dead record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from steadqd.constants import AckResult
from steadqd.errors import LeaseLost, NotCommitted, OutcomeUnknown
from steadqd.s3.handle import BucketQueue
from steadqd.s3.lease import Lease
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import ManualClock, MemoryStore
from tests.stowq.protocol_audit import audit, drain

SECOND = 1_000_000_000
LEASE_S = 5
PREFIX = "q/"
JOB = bytes(range(16)).hex()
BIG = b"d" * 70_000  # detached: above the default inline limit

FAULTS = [
    pytest.param(FaultKind.BEFORE_SEND, False, id="before-send"),
    pytest.param(FaultKind.TIMEOUT, False, id="timeout-not-applied"),
    pytest.param(FaultKind.TIMEOUT, True, id="timeout-applied"),
    pytest.param(FaultKind.SERVER_ERROR, True, id="5xx-applied"),
]


@dataclass
class World:
    """One queue on a faulty in-memory store (test_lease_many's too); ``lease`` is what a transition case holds."""

    clock: ManualClock
    memory: MemoryStore
    store: FaultyStore
    q: BucketQueue
    lease: Lease | None = None


def _world() -> World:
    clock = ManualClock(step_ns=1000)
    memory = MemoryStore(clock=clock)
    store = FaultyStore(memory)
    q = BucketQueue.init(store, PREFIX, worker_id="w1", certify_store=False, floor_staleness_s=0)
    return World(clock, memory, store, q)


def _leased(payload: bytes = b"p") -> World:
    w = _world()
    w.q.enqueue(payload, job_id=JOB)
    w.lease = w.q.lease(duration=LEASE_S)
    assert w.lease is not None
    return w


# Each transition: how to build the world before it, and the call itself.
Setup = Callable[[], World]
Step = Callable[[World], object]


def _enqueue(w: World) -> object:
    return w.q.enqueue(b"p", job_id=JOB)


def _enqueue_detached(w: World) -> object:
    return w.q.enqueue(BIG, job_id=JOB)


def _enqueue_delayed(w: World) -> object:
    return w.q.enqueue(b"p", job_id=JOB, delay=30)


def _claim(w: World) -> object:
    w.lease = w.q.lease(duration=LEASE_S)
    return w.lease


def _takeover(w: World) -> object:
    return _claim(w)


def _renew(w: World) -> object:
    assert w.lease is not None
    w.lease = w.q.renew(w.lease, duration=LEASE_S)
    return w.lease


def _ack(w: World) -> object:
    assert w.lease is not None
    return w.q.ack(w.lease)


def _retry(w: World) -> object:
    assert w.lease is not None
    return w.q.retry(w.lease, delay=1)


def _bury(w: World) -> object:
    assert w.lease is not None
    w.q.bury(w.lease, 0x0101)
    return None


def _enqueued() -> World:
    w = _world()
    w.q.enqueue(b"p", job_id=JOB)
    return w


def _expired() -> World:
    w = _leased()
    w.clock.advance((LEASE_S + 1) * SECOND)
    w.q = BucketQueue.open(w.store, PREFIX, worker_id="w2", certify_store=False, floor_staleness_s=0)
    return w


TRANSITIONS: list[tuple[str, Setup, Step]] = [
    ("enqueue", _world, _enqueue),
    ("enqueue-detached", _world, _enqueue_detached),
    ("enqueue-delayed", _world, _enqueue_delayed),
    ("claim", _enqueued, _claim),
    ("takeover", _expired, _takeover),
    ("renew", _leased, _renew),
    ("ack", _leased, _ack),
    ("ack-detached", lambda: _leased(BIG), _ack),
    ("retry", _leased, _retry),
    ("bury", _leased, _bury),
]


def _settle_after(w: World, step: Step) -> None:
    """What a caller does after the transition: finish the job, whatever it was given."""
    if step in (_enqueue, _enqueue_detached, _enqueue_delayed, _claim, _takeover):
        return  # drain takes it from here
    if w.lease is None:
        return
    try:
        if step is _renew:
            w.q.ack(w.lease)
        elif step is _ack:
            assert w.q.ack(w.lease) in (AckResult.ACKED, AckResult.ALREADY_ACKED)
    except LeaseLost:
        pass


@pytest.mark.parametrize(("kind", "applied"), FAULTS)
@pytest.mark.parametrize(("name", "setup", "step"), TRANSITIONS, ids=[t[0] for t in TRANSITIONS])
def test_a_fault_at_every_store_call_keeps_the_gates(
    name: str, setup: Setup, step: Step, kind: FaultKind, applied: bool
) -> None:
    n = 1
    while True:
        w = setup()
        fault = w.store.inject(Fault(kind, nth=n, applied=applied))
        outcome: object
        try:
            outcome = step(w)
        except NotCommitted:
            outcome = "not-committed"
        except OutcomeUnknown as exc:
            assert exc.ticket is not None and exc.ticket.key.startswith(PREFIX), "OutcomeUnknown must name the key"
            outcome = "unknown"
        w.store.clear()
        if outcome in ("not-committed", "unknown"):
            # The caller repeats the transition: that must be safe.
            try:
                step(w)
            except LeaseLost:
                pass  # e.g. a repeated renewal whose first try won, then acked
        _settle_after(w, step)
        audit(w.q, w.memory)
        drain(w.q, w.clock, step_ns=LEASE_S * SECOND)
        states = audit(w.q, w.memory)
        assert set(states.values()) <= {"receipt", "dead"} and states, f"{name} call {n}: {states}"
        if not fault.fired:
            break
        n += 1
    assert n > 1, f"{name} made no store call"
