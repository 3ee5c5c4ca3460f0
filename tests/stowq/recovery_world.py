"""A bucket queue on the in-memory store, with the store time moved by the test, for the recovery tests."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from steadqd.s3 import keys
from steadqd.s3.backend import BucketBackend
from steadqd.s3.layout import DEFAULT_FORMAT, init_layout, open_layout
from steadqd.s3.records import FormatRecord
from steadqd.s3.store.faults import FaultyStore
from steadqd.s3.store.memory import ManualClock, MemoryStore

SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
PREFIX = "q/"
URL = "s3://test/q"
LEASE_S = 5.0
# Shorter retentions than the defaults, so a test moves the clock by hours, not weeks.
RETENTION: dict[str, Any] = {"receipt_retention": 120.0, "temp_ttl": 60.0}


@dataclass
class World:
    clock: ManualClock
    memory: MemoryStore
    store: FaultyStore
    q: BucketBackend

    def handle(self, worker_id: str, **options: Any) -> BucketBackend:
        """Another participant on the same queue (another sweeper, another worker)."""
        layout = open_layout(self.store, PREFIX, worker_id=worker_id, certify_store=False)
        return BucketBackend(layout, url=URL, floor_staleness_s=0, **{**RETENTION, **options})

    def keys(self, plane: str = "") -> list[str]:
        return [k[len(PREFIX) :] for k in self.memory.keys(PREFIX + plane)]

    def advance(self, ns: int) -> None:
        self.clock.advance(ns)

    def shard(self, job_id: str) -> int:
        return keys.shard_of(self.q.layout.queue_id, bytes.fromhex(job_id), self.q.layout.format.shard_count)

    def put(self, rel: str, body: bytes = b"") -> None:
        """An object written behind the protocol's back (a foreign writer, a corruption)."""
        self.memory.put_if_absent(PREFIX + rel, body)

    def delete(self, rel: str) -> None:
        self.memory.delete(PREFIX + rel)


def world(fmt: FormatRecord = DEFAULT_FORMAT, **options: Any) -> World:
    clock = ManualClock(step_ns=1000)
    memory = MemoryStore(clock=clock)
    store = FaultyStore(memory)
    layout = init_layout(store, PREFIX, worker_id="w1", certify_store=False, fmt=replace(fmt, shard_count=4))
    q = BucketBackend(layout, url=URL, floor_staleness_s=0, **{**RETENTION, **options})
    return World(clock, memory, store, q)


def drain_recovery(q: BucketBackend, passes: int = 50, **budget: Any) -> list[Any]:
    """Run recovery passes until one changes nothing and is not cut short; returns every pass's report."""
    reports = []
    for _ in range(passes):
        report = q.recover(**budget)
        reports.append(report)
        if not report.changed and not report.budget_exhausted and not report.errors:
            return reports
    raise AssertionError(f"recovery did not settle in {passes} passes: {reports[-1]}")


def total(reports: list[Any], name: str) -> int:
    return sum(getattr(r, name) for r in reports)
