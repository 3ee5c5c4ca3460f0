"""A stop that arrives while a claim is under way: the claimed jobs run, nothing more is claimed.

The rule (docs/operations.md, section 7): a drain takes no new leases, but a
claim that was already made when the stop came is run to its end like the
running jobs. SteadQ/1 counted its attempt when it was claimed, so handing it
back unrun would waste that attempt and bury a job that was on its last one.
Since the free slots of a proven command are claimed together, that is up to
``concurrency`` jobs; an unproven command's claim is one job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from steadqd import Queue
from steadqd.daemon.service import Loop
from steadqd.daemon.worker.claim import Preparer
from tests.daemon.conftest import DEADLINE, worker_in_process


def _pump(loop: Loop, until: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not until():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        loop.run_once(0.05)


def _hold_claim(monkeypatch: pytest.MonkeyPatch, nth: int) -> tuple[threading.Event, threading.Event, list[int]]:
    """The ``nth`` request's claims are made and durable, then held before the loop hears of them."""
    claimed, release = threading.Event(), threading.Event()
    counts: list[int] = []
    real = Preparer._claim

    def claim(q: Any, jobs: list[Any], cfg: Any, credentials: Any, count: int) -> None:
        real(q, jobs, cfg, credentials, count)
        counts.append(sum(1 for j in jobs if j.lease is not None))
        if len(counts) == nth:
            claimed.set()
            release.wait(DEADLINE)

    monkeypatch.setattr(Preparer, "_claim", staticmethod(claim))
    return claimed, release, counts


def _states(qpath: str) -> dict[str, int]:
    with Queue.open(qpath) as q:
        return {k: v.objects for k, v in q.stats().items() if k in ("ready", "leased", "receipts", "dead")}


@pytest.mark.parametrize(("nth", "concurrency"), [(1, 4), (2, 4)], ids=["unproven-one-claim", "proven-batch"])
def test_a_drain_runs_the_jobs_claimed_when_it_came_and_claims_no_more(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch, nth: int, concurrency: int
) -> None:
    claimed, release, counts = _hold_claim(monkeypatch, nth)
    jobs = 12
    with worker_in_process(make_queue(shards=1), queue_path, jobs=jobs, concurrency=concurrency, lease=True) as (
        role,
        loop,
        out,
    ):
        _pump(loop, claimed.is_set, f"claim request {nth}")
        role.drain()  # the stop, while the request's claims are made but not yet handed over
        release.set()
        _pump(loop, role.drained, "the drain")
        loop.run_once(0.05)  # a fill the drain would wrongly allow would be scheduled by now
        assert role.drained() and not role.jobs
    ran = sum(counts)
    assert 1 <= counts[-1] <= (1 if nth == 1 else concurrency), counts  # what the held request may claim
    assert len(counts) == nth, f"a request was made after the drain began: {counts}"
    assert _states(queue_path) == {"ready": jobs - ran, "leased": 0, "receipts": ran, "dead": 0}
    assert out.getvalue().count("finished: ack") == ran
