"""The service loop's timers: cancelled ones do not pile up in its heap.

A worker cancels each job's renewal (due a ``renew_interval`` later) and exit check when the job ends in
milliseconds; a cancelled timer used to stay in the heap until its time came, so at hundreds of jobs a
second the heap held thousands of dead entries that every push and pop walked.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from steadqd.daemon import service
from steadqd.daemon.service import Loop


def test_cancelled_timers_are_swept_out_of_the_heap() -> None:
    loop = Loop()
    try:
        for _ in range(10_000):
            loop.call_later(60.0, lambda: None).cancel()
        assert len(loop._timers) <= 2 * service.TIMERS_COMPACT_MIN
    finally:
        loop.close()


def test_live_timers_survive_a_sweep_and_fire_in_order() -> None:
    loop = Loop()
    fired: list[int] = []
    try:
        for i in range(3 * service.TIMERS_COMPACT_MIN):
            t = loop.call_later(0.0 if i % 3 == 0 else 60.0, lambda i=i: fired.append(i))
            if i % 3:
                t.cancel()
        loop.run_once(0)
        assert fired == list(range(0, 3 * service.TIMERS_COMPACT_MIN, 3))
        assert all(t.cancelled for _, _, t in loop._timers)
        assert len(loop._timers) <= 2 * service.TIMERS_COMPACT_MIN
    finally:
        loop.close()


def test_a_reader_removed_by_an_earlier_callback_of_the_same_batch_is_not_called() -> None:
    """Readers are the loop's own epoll and dict (not a ``selectors`` selector): the rules stay the same."""
    loop = Loop()
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    called: list[int] = []
    try:

        def first() -> None:
            called.append(1)
            loop.remove_reader(r1)
            loop.remove_reader(r2)

        def second() -> None:
            called.append(2)
            loop.remove_reader(r1)
            loop.remove_reader(r2)

        loop.add_reader(r1, first)
        loop.add_reader(r2, second)
        with pytest.raises(KeyError):
            loop.add_reader(r1, first)
        os.write(w1, b"x")
        os.write(w2, b"x")
        loop.run_once(1.0)
        assert called in ([1], [2]), "whichever ran first removed the other before its turn"
        loop.add_reader(r1, first)
        os.close(r1)
        loop.remove_reader(r1)  # closed already: silent
        loop.remove_reader(12345)  # never watched: silent
        os.close(w1)
        os.write(w2, b"y")
        loop.add_reader(r2, lambda: called.append(3))
        loop.run_once(1.0)
        assert called[-1] == 3
    finally:
        for fd in (r2, w2):
            os.close(fd)
        loop.close()


def test_named_timers_fire_through_the_guard_once_and_replaced_or_cancelled_ones_never() -> None:
    """A job's :class:`Timers`: the guard wraps a callback when it fires (not when it is set), a name set
    again replaces its timer, a cancel (one name or all) keeps it from firing, and equal times fire in order."""
    loop = Loop()
    fired: list[str] = []
    guarded: list[str] = []

    def guard(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            guarded.append(getattr(fn, "__name__", "?"))
            try:
                fn()
            except ValueError as e:
                fired.append(f"caught {e}")

        return run

    def named(name: str, *, fail: bool = False) -> Callable[[], None]:
        def fn() -> None:
            fired.append(name)
            if fail:
                raise ValueError(name)

        fn.__name__ = name
        return fn

    try:
        timers = service.Timers(loop, guard)
        timers.set("a", 0.0, named("a1"))
        timers.set("a", 0.0, named("a2"))  # replaces a1
        timers.set("b", 0.0, named("b", fail=True))
        timers.set("c", 0.0, named("c"))
        timers.set("d", 60.0, named("d"))
        timers.cancel("c")
        timers.cancel("missing")
        assert guarded == [] and bool(timers)
        loop.run_once(0)
        assert fired == ["a2", "b", "caught b"] and guarded == ["a2", "b"]
        timers.set("e", 0.0, named("e"))
        timers.cancel_all()
        assert not timers
        loop.run_once(0)
        assert fired == ["a2", "b", "caught b"]
        assert all(t.cancelled for _, _, t in loop._timers) and loop._size == len(loop._timers)
    finally:
        loop.close()


def test_the_heap_size_the_loop_keeps_is_the_heaps() -> None:
    loop = Loop()
    try:
        timers = service.Timers(loop, lambda fn: fn)
        for i in range(5 * service.TIMERS_COMPACT_MIN):
            timers.set(str(i % 7), 60.0 if i % 2 else 0.0, lambda: None)
            if i % 3 == 0:
                loop.call_later(0.0, lambda: None)
            if i % 11 == 0:
                loop.run_once(0)
            assert loop._size == len(loop._timers)
        assert len(loop._timers) <= 2 * service.TIMERS_COMPACT_MIN
    finally:
        loop.close()


def test_call_soon_runs_at_the_end_of_the_pass_in_order_and_one_asked_then_runs_in_the_next() -> None:
    """``call_soon`` is ``call_later(0.0)`` without a heap entry: after the pass's readers and due timers,
    in the order asked; cancelled, never; asked by the end itself, in the next pass, which does not wait."""
    loop = Loop()
    r, w = os.pipe()
    order: list[str] = []
    try:

        def reader() -> None:
            os.read(r, 1)
            order.append("reader")
            loop.call_soon(lambda: order.append("soon 1"))
            loop.call_soon(lambda: order.append("cancelled")).cancel()
            loop.call_soon(lambda: (order.append("soon 2"), loop.call_soon(lambda: order.append("next pass"))))

        loop.add_reader(r, reader)
        loop.call_later(0.0, lambda: order.append("timer"))
        os.write(w, b"x")
        loop.run_once(5.0)
        assert order == ["reader", "timer", "soon 1", "soon 2"]
        assert loop.call_soon(lambda: None).when == float("-inf")
        t0 = loop.now()
        loop.run_once(5.0)  # no event, no timer: only the pending soon ones, without waiting
        assert order[-1] == "next pass" and loop.now() - t0 < 1.0
    finally:
        loop.remove_reader(r)
        os.close(r)
        os.close(w)
        loop.close()


def test_a_named_timer_set_at_a_past_time_fires_now_and_a_later_one_waits() -> None:
    loop = Loop()
    fired: list[str] = []
    try:
        timers = service.Timers(loop, lambda fn: fn)
        timers.set_at("past", loop.now() - 5.0, lambda: fired.append("past"))
        timers.set_at("later", loop.now() + 60.0, lambda: fired.append("later"))
        timers.set_at("past", loop.now() - 1.0, lambda: fired.append("replaced"))  # replaces the first
        loop.run_once(0)
        assert fired == ["replaced"]
        timers.cancel_all()
        timers.cancel_all()  # nothing left: nothing to do
        assert not timers and all(t.cancelled for _, _, t in loop._timers)
    finally:
        loop.close()
