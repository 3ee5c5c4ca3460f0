"""The fault injector: each kind of failure means exactly what its outcome class promises."""

from __future__ import annotations

import hashlib

import pytest

from steadqd.errors import AlreadyExists, InvalidInput, NotCommitted, NotFound, OutcomeUnknown
from steadqd.s3.store.base import PendingWrite, StoreProfile
from steadqd.s3.store.faults import Fault, FaultKind, FaultyStore
from steadqd.s3.store.memory import MemoryStore


def _faulty() -> tuple[MemoryStore, FaultyStore]:
    inner = MemoryStore()
    return inner, FaultyStore(inner)


def test_before_send_is_not_committed_and_nothing_happened() -> None:
    inner, store = _faulty()
    with store.armed(Fault(FaultKind.BEFORE_SEND, op="put_if_absent")) as (fault,):
        with pytest.raises(NotCommitted, match="before the request was sent"):
            store.put_if_absent("k", b"x")
    assert fault.fired == 1 and inner.snapshot() == {}
    store.put_if_absent("k", b"x")  # disarmed when the block ended
    assert inner.snapshot() == {"k": b"x"}


@pytest.mark.parametrize("kind", [FaultKind.TIMEOUT, FaultKind.CONNECTION_LOST, FaultKind.SERVER_ERROR])
@pytest.mark.parametrize("applied", [False, True])
def test_after_send_is_outcome_unknown_and_the_key_tells(kind: FaultKind, applied: bool) -> None:
    inner, store = _faulty()
    with store.armed(Fault(kind, op="put_if_absent", applied=applied)):
        with pytest.raises(OutcomeUnknown) as info:
            store.put_if_absent("q/claims/0000/j/00000001", b"claim")
    ticket = info.value.ticket
    assert isinstance(ticket, PendingWrite) and ticket.op == "put_if_absent"
    assert ticket.key == "q/claims/0000/j/00000001" and ticket.sha256 == hashlib.sha256(b"claim").digest()
    # Resolution: read the key and compare with the ticket's digest.
    try:
        landed = hashlib.sha256(store.get(ticket.key).body).digest() == ticket.sha256
    except NotFound:
        landed = False
    assert landed is applied


def test_a_lost_response_to_a_losing_create_changes_nothing() -> None:
    inner, store = _faulty()
    store.put_if_absent("k", b"winner")
    with store.armed(Fault(FaultKind.TIMEOUT, op="put_if_absent", applied=True)):
        with pytest.raises(OutcomeUnknown):
            store.put_if_absent("k", b"loser")
    assert inner.get("k").body == b"winner"


def test_cas_and_delete_after_send() -> None:
    inner, store = _faulty()
    etag = store.put_if_absent("wm", b"1").etag
    with store.armed(Fault(FaultKind.CONNECTION_LOST, op="put_if_match", applied=True)):
        with pytest.raises(OutcomeUnknown) as info:
            store.put_if_match("wm", b"2", etag)
    assert info.value.ticket.if_match == etag and inner.get("wm").body == b"2"
    with store.armed(Fault(FaultKind.SERVER_ERROR, op="delete", applied=False, status=500)):
        with pytest.raises(OutcomeUnknown, match="HTTP 500"):
            store.delete("wm")
    assert inner.get("wm").body == b"2"
    with store.armed(Fault(FaultKind.TIMEOUT, op="delete", applied=True)):
        with pytest.raises(OutcomeUnknown):
            store.delete("wm")
    assert inner.snapshot() == {}


@pytest.mark.parametrize("op", ["get", "head", "list", "get_if_none_match"])
@pytest.mark.parametrize("kind", [FaultKind.BEFORE_SEND, FaultKind.TIMEOUT, FaultKind.SERVER_ERROR])
def test_a_failed_read_is_never_outcome_unknown(op: str, kind: FaultKind) -> None:
    _, store = _faulty()
    etag = store.put_if_absent("k", b"x").etag
    calls = {
        "get": lambda: store.get("k"),
        "head": lambda: store.head("k"),
        "list": lambda: store.list_page(""),
        "get_if_none_match": lambda: store.get_if_none_match("k", etag),
    }
    with store.armed(Fault(kind, op=op)):
        with pytest.raises(NotCommitted, match="retry it|before the request"):
            calls[op]()
    assert calls["get_if_none_match"]() is None


def test_slow_answers_wait_through_the_given_sleep_and_then_succeed() -> None:
    slept: list[float] = []
    inner = MemoryStore()
    store = FaultyStore(inner, sleep=slept.append)
    with store.armed(Fault(FaultKind.SLOW, op="get", delay_s=2.5, times=None)):
        store.put_if_absent("k", b"x")
        assert store.get("k").body == b"x" and store.get("k").body == b"x"
    assert slept == [2.5, 2.5]


def test_nth_counts_matching_calls_only_and_key_prefix_narrows_them() -> None:
    inner, store = _faulty()
    fault = store.inject(Fault(FaultKind.BEFORE_SEND, op="put_if_absent", nth=2, key_prefix="q/claims/"))
    store.put_if_absent("q/jobs/a", b"")  # no match: another prefix
    store.put_if_absent("q/claims/1", b"")  # match 1
    store.get("q/claims/1")  # no match: another op
    with pytest.raises(NotCommitted):
        store.put_if_absent("q/claims/2", b"")  # match 2: fires
    store.put_if_absent("q/claims/3", b"")  # fired once already
    assert fault.seen == 3 and fault.fired == 1
    assert sorted(inner.snapshot()) == ["q/claims/1", "q/claims/3", "q/jobs/a"]
    store.clear()


def test_every_call_fires_with_times_none_and_one_fault_per_call() -> None:
    inner, store = _faulty()
    every = store.inject(Fault(FaultKind.BEFORE_SEND, times=None))
    second = store.inject(Fault(FaultKind.TIMEOUT))
    for _ in range(3):
        with pytest.raises(NotCommitted):
            store.put_if_absent("k", b"")
    assert every.fired == 3 and second.fired == 0 and second.seen == 0  # a taken call is not counted again
    store.clear()
    store.put_if_absent("k", b"")
    assert inner.snapshot() == {"k": b""}


def test_the_trace_numbers_every_call_with_its_outcome() -> None:
    _, store = _faulty()
    store.put_if_absent("a", b"")
    with pytest.raises(AlreadyExists):
        store.put_if_absent("a", b"")
    with store.armed(Fault(FaultKind.BEFORE_SEND, op="head")):
        with pytest.raises(NotCommitted):
            store.head("a")
    store.list_page("")
    assert [(c.n, c.op, c.fault, c.outcome) for c in store.trace] == [
        (1, "put_if_absent", None, "ok"),
        (2, "put_if_absent", None, "AlreadyExists"),
        (3, "head", FaultKind.BEFORE_SEND, "NotCommitted"),
        (4, "list", None, "ok"),
    ]
    assert store.count() == 4 and store.count("put_if_absent") == 2


def test_a_fault_at_every_position_of_a_sequence() -> None:
    """The pattern the protocol's fault tests follow: count the calls, then fail each one in turn."""

    def transition(store: FaultyStore) -> None:
        store.put_if_absent("q/payload", b"p")
        store.put_if_absent("q/job", b"j")

    probe = FaultyStore(MemoryStore())
    transition(probe)
    positions = probe.count()
    assert positions == 2
    for nth in range(1, positions + 1):
        inner = MemoryStore()
        store = FaultyStore(inner)
        with store.armed(Fault(FaultKind.BEFORE_SEND, nth=nth)):
            with pytest.raises(NotCommitted):
                transition(store)
        # A failed k-th call leaves exactly the first k-1 writes.
        assert sorted(inner.snapshot()) == sorted(["q/payload", "q/job"][: nth - 1])


def test_stale_listings_only_where_the_profile_allows_them() -> None:
    _, strong = _faulty()
    with pytest.raises(InvalidInput, match="promises list-after-write"):
        strong.inject(Fault(FaultKind.STALE_LIST))
    weak = FaultyStore(MemoryStore(profile=StoreProfile("lagging", granularity_ns=1, strong_listing=False)))
    for key in ("p/1", "p/2", "p/3"):
        weak.put_if_absent(key, b"")
    with weak.armed(Fault(FaultKind.STALE_LIST, lag=2)):
        assert [m.key for m in weak.list_page("p/").items] == ["p/1"]
    assert [m.key for m in weak.list_page("p/").items] == ["p/1", "p/2", "p/3"]
    assert weak.trace[-2].outcome == "stale"


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (lambda: Fault(FaultKind.TIMEOUT, op="rename"), "not one of"),
        (lambda: Fault(FaultKind.TIMEOUT, nth=0), "counted from 1"),
        (lambda: Fault(FaultKind.TIMEOUT, times=0), "at least 1"),
        (lambda: Fault(FaultKind.STALE_LIST, op="get"), "list calls only"),
        (lambda: Fault(FaultKind.BEFORE_SEND, applied=True), "never gets there"),
        (lambda: Fault(FaultKind.SERVER_ERROR, status=404), "5xx"),
    ],
)
def test_a_bad_script_is_refused_with_what_to_change(fault: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        fault()  # type: ignore[operator]
