"""The service loop's timers: cancelled ones do not pile up in its heap.

A worker cancels each job's renewal (due a ``renew_interval`` later) and exit check when the job ends in
milliseconds; a cancelled timer used to stay in the heap until its time came, so at hundreds of jobs a
second the heap held thousands of dead entries that every push and pop walked.
"""

from __future__ import annotations

import os

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
