"""The ready watch is not read while the claiming thread claims or the settling thread settles: their own
renames do not wake the loop.

Each claim renames a ready name to a leased one in a watched shard, and each ack removes a leased name;
read at once, those events woke the loop about once a job each (a pass of its own, the GIL taken from
the thread in the middle of its work). They are read with the claim's or the settle's results instead,
or ``READY_DEFER`` later at the latest, so a cancel or a pause that comes during a long copy or a slow
barrier is still heard that soon.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from steadqd import Queue
from steadqd.daemon.service import Loop
from steadqd.daemon.worker import role as role_module
from steadqd.daemon.worker.claim import Preparer
from steadqd.daemon.worker.settle import Settler
from tests.daemon.conftest import DEADLINE, worker_in_process


def _pump(loop: Loop, until: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not until():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        loop.run_once(0.05)


def _hold_first_claim(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """The first request's claims are made (their renames done), then held before the loop hears of them."""
    claimed, release = threading.Event(), threading.Event()
    real = Preparer._claim

    def claim(q: Any, jobs: list[Any], cfg: Any, credentials: Any, count: int) -> None:
        real(q, jobs, cfg, credentials, count)
        if not claimed.is_set():
            claimed.set()
            release.wait(DEADLINE)

    monkeypatch.setattr(Preparer, "_claim", staticmethod(claim))
    return claimed, release


def _count_reads(role: Any) -> list[int]:
    reads = [0]
    real = role._ready.read

    def read(*a: Any, **kw: Any) -> Any:
        reads[0] += 1
        return real(*a, **kw)

    role._ready.read = read
    return reads


def test_a_claims_own_renames_are_read_with_its_results(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(role_module, "READY_DEFER", 3600.0, raising=False)
    claimed, release = _hold_first_claim(monkeypatch)
    with worker_in_process(make_queue(shards=1), queue_path, jobs=2, concurrency=1, lease=True) as (role, loop, out):
        reads = _count_reads(role)
        _pump(loop, claimed.is_set, "the first claim")
        for _ in range(10):  # its rename's events are in the watch: they must not wake the loop
            loop.run_once(0.02)
        assert reads[0] == 0
        release.set()
        _pump(loop, lambda: "started" in out.getvalue(), "the claimed job's start")
        assert reads[0] >= 1, "the watch is read again with the claim's results"


def test_a_long_claim_leaves_the_watch_unread_for_ready_defer_at_most(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(role_module, "READY_DEFER", 0.05)
    claimed, release = _hold_first_claim(monkeypatch)
    with worker_in_process(make_queue(shards=1), queue_path, jobs=2, concurrency=1, lease=True) as (role, loop, out):
        try:
            reads = _count_reads(role)
            _pump(loop, claimed.is_set, "the first claim")
            _pump(loop, lambda: reads[0] >= 1, "the watch read while the claim is still held")
        finally:
            release.set()
        _pump(loop, lambda: "started" in out.getvalue(), "the claimed job's start")


class _HeldSettle:
    """The settling thread's first group waits before its verdicts are applied (``go``) and after (``release``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.go, self.applied, self.release = (threading.Event() for _ in range(4))
        real = Settler._settle

        def settle(settler: Settler, group: Any) -> None:
            first = not self.entered.is_set()
            self.entered.set()
            if first:
                self.go.wait(DEADLINE)
            real(settler, group)
            if first:
                self.applied.set()
                self.release.wait(DEADLINE)

        monkeypatch.setattr(Settler, "_settle", settle)

    def apply_then_hold(self, loop: Loop, role: Any) -> list[int]:
        """Once the settle is held and the claim after it done, count the watch's reads from the ack on."""
        _pump(loop, self.entered.is_set, "the first settle")
        _pump(loop, lambda: not role._prep.busy, "the claim that follows the freed slot")
        for _ in range(5):  # whatever that claim's pass left for the loop
            loop.run_once(0.01)
        reads = _count_reads(role)
        self.go.set()
        assert self.applied.wait(DEADLINE), "the settle's verdict applied"
        return reads


def test_a_settles_own_renames_are_read_with_its_results(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(role_module, "READY_DEFER", 3600.0)
    held = _HeldSettle(monkeypatch)
    with worker_in_process(make_queue(shards=1), queue_path, jobs=1, concurrency=1, lease=True) as (role, loop, out):
        try:
            reads = held.apply_then_hold(loop, role)
            for _ in range(10):  # the ack's removal is in the watch: it must not wake the loop
                loop.run_once(0.02)
            assert reads[0] == 0
        finally:
            held.release.set()
        _pump(loop, lambda: "finished: ack" in out.getvalue(), "the settled job's report")
        assert reads[0] >= 1, "the watch is read again with the settle's results"


def test_a_long_settle_leaves_the_watch_unread_for_ready_defer_at_most(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(role_module, "READY_DEFER", 0.05)
    held = _HeldSettle(monkeypatch)
    with worker_in_process(make_queue(shards=1), queue_path, jobs=1, concurrency=1, lease=True) as (role, loop, out):
        try:
            reads = held.apply_then_hold(loop, role)
            _pump(loop, lambda: reads[0] >= 1, "the watch read while the settle is still held")
        finally:
            held.release.set()
        _pump(loop, lambda: "finished: ack" in out.getvalue(), "the settled job's report")
