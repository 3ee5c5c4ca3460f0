"""The service loop's timers: cancelled ones do not pile up in its heap.

A worker cancels each job's renewal (due a ``renew_interval`` later) and exit check when the job ends in
milliseconds; a cancelled timer used to stay in the heap until its time came, so at hundreds of jobs a
second the heap held thousands of dead entries that every push and pop walked.
"""

from __future__ import annotations

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
