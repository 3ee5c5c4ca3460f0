"""Crash lab lane 1 for empty-bucket removal: a crash anywhere loses nothing.

Issue 15, point 12: recovery removes empty delayed buckets (rmdir of each
shard directory, one fsync of the bucket, rmdir of the bucket, one fsync of
``delayed/``), and a publisher makes a removed bucket again before linking
into it. The workload records one recovery pass that removes empty buckets
(two past ones, and one future bucket that a negative grace makes count as
past), then an enqueue into that very bucket, so the recorded log has the
removals followed by the re-creation and the link. Every crash state must
recover and pass the gates: the delayed and ready jobs of the setup are
untouched, and the new job is either absent (the crash came before its
enqueue returned) or delayed, never half there.

Not part of ``WORKLOADS``: that table's totals are pinned by
``test_crash_states.py``; this lane runs the same recorder and gates.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from steadqd.constants import NS_PER_SECOND
from steadqd.fs.names import bucket_dir, shard_dir
from steadqd.fs.recovery import buckets
from tests.lab import bugs
from tests.lab.lab import check_recorded, format_report, record_workload
from tests.lab.recorder import Mkdir, Rmdir
from tests.lab.workloads import Driver, Workload


def _aged_bucket(d: Driver, bucket: int) -> str:
    """An empty bucket, all shards, unchanged for two hours (its jobs long promoted)."""
    name = bucket_dir(bucket)
    d.q._ctx.tree.ensure_dir(f"delayed/{name}/{shard_dir(0)}")
    then = time.time() - 7200
    top = os.path.join(d.root, "delayed", name)
    for sub in [*(os.path.join(top, s) for s in os.listdir(top)), top]:
        os.utime(sub, (then, then))
    return name


def setup(d: Driver) -> dict[str, Any]:
    width = d.q.format.delayed_width_ns
    now = d.q.wall_floor_ns() // width
    for back in (1000, 999):
        _aged_bucket(d, now - back)
    target = now + 60
    _aged_bucket(d, target)
    d.enqueue(b"delayed, elsewhere", delay=3600)
    d.enqueue(b"ready")
    return {"not_before": target * width}


def run(d: Driver, s: dict[str, Any]) -> None:
    saved = buckets.GRACE_NS
    buckets.GRACE_NS = -3600 * NS_PER_SECOND  # the target bucket counts as past: it is removed
    try:
        d.call("recover", d.q.recover, 100_000, 60_000)
    finally:
        buckets.GRACE_NS = saved
    d.enqueue(b"into the removed bucket", not_before_ns=s["not_before"])


WORKLOAD = Workload("bucket_removal", setup, run)


def test_every_crash_state_of_bucket_removal_recovers() -> None:
    with tempfile.TemporaryDirectory(prefix="steadq-crash-buckets-") as workdir:
        rec = record_workload(WORKLOAD, workdir)
    ops = rec.model.ops
    removed = [i for i, op in enumerate(ops) if isinstance(op, Rmdir)]
    assert len(removed) >= 3 * 5, f"the pass removed {len(removed)} directories, not three buckets"
    remade = [i for i, op in enumerate(ops) if isinstance(op, Mkdir) and i > removed[-1]]
    assert remade, "the enqueue did not make the removed bucket again"
    r = check_recorded(rec)
    assert r.states > 0, "no crash state was checked"
    assert r.failed == 0, f"{r.failed} of {r.states} crash states fail the gates\n{format_report(r)}"


def test_the_lane_catches_a_bucket_made_again_without_its_parent_barrier() -> None:
    """The lane can fail here: re-creating the removed bucket without fsyncing
    ``delayed/`` lets a crash after the enqueue returned lose the job."""
    with tempfile.TemporaryDirectory(prefix="steadq-crash-buckets-bug-") as workdir:
        rec = record_workload(WORKLOAD, workdir, mutate=bugs.dirs_without_parent_barrier)
    r = check_recorded(rec, keep=10_000)
    assert r.failed > 0, f"the injected bug went unnoticed\n{format_report(r)}"
    msgs = [m for f in r.failures for m in f["failures"]]  # type: ignore[attr-defined]
    assert any("allowed: ['delayed']" in m for m in msgs), msgs[:5]
