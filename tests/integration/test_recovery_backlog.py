"""Expired leases behind a maintenance backlog (issue 15, point 8).

A queue with thousands of uncompacted receipts kept every default pass in
``compact_receipts``: one-shot ``steadq recover`` runs restarted that phase
from its beginning (only the phase was written to the cursor), re-verified
the receipts the previous run had compacted, and never got round to reaping,
until their whole budget went into re-verification and they reported
``ops:0 (budget exhausted)``. These tests build that situation and check the
three fixes: every pass reaches due leases and due delayed jobs first, the
position of the backlog phase survives the process, and the time budget
cannot end a pass before it has done anything.

The one-shot runs are real ``steadq recover`` processes: what must survive
between them is the file, not anything in memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from steadqd import Queue, State
from steadqd.fs import linux, names
from steadqd.fs.json_records import reset_cursor_json, validate_cursor
from steadqd.fs.recovery import run_recovery
from tests.cli.helpers import steadq
from tests.fabricate import write_ready_jobs
from tests.fabricate_receipts import write_receipts
from tests.integration.test_recovery import (
    OTHER_BOOT,
    SEC,
    advance_watermark_to,
    craft_lease,
    cursor_bytes,
    files_under,
    only_object,
)

SHARDS = 4
# Enough full receipts that one default pass (1000 operations) cannot compact them all.
BACKLOG = 2500
COMPACT_SIZE = 128


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    return make_queue(shards=SHARDS)


def recover_once(root: str) -> dict[str, Any]:
    """One default ``steadq recover`` process; its JSON report."""
    r = steadq("recover", "--json", root, timeout=120)
    assert r.code == 0, r.err
    report: dict[str, Any] = json.loads(r.out)
    return report


def cursor_doc(root: str, q: Queue) -> dict[str, Any]:
    doc: dict[str, Any] = validate_cursor(cursor_bytes(root), q.format.queue_id)["cursor"]
    return doc


def compacted(root: str) -> set[str]:
    return {p for p in files_under(root, "receipts") if os.path.getsize(os.path.join(root, p)) == COMPACT_SIZE}


def is_ready(root: str, job: str) -> bool:
    """The job's one object is a ready job (a colocated lease is in ready/ too)."""
    rel = only_object(root, job)
    return rel.startswith("ready/") and names.looks_ready(rel.split("/")[-1])


def receipt_key(rel: str) -> tuple[bytes, ...]:
    """A receipt's position key (bucket, shard, entry), as the cursor orders them."""
    _, bucket, shard, name = rel.split("/")
    return (bucket.encode(), shard.encode(), name.encode())


def start_backlog(q: Queue) -> None:
    """A receipt backlog that the first default pass leaves unfinished in compaction."""
    write_receipts(q, BACKLOG)
    first = recover_once(q.path)
    assert first["budget_exhausted"] and first["receipts_compacted"] > 0, first
    assert cursor_doc(q.path, q)["phase"] == "compact_receipts"


def test_one_shot_runs_reap_expired_leases_behind_a_receipt_backlog(q: Queue) -> None:
    start_backlog(q)
    leases = [craft_lease(q, boot=OTHER_BOOT, deadline=1) for _ in range(4)]
    reaped = 0
    for _ in range(3):
        reaped += recover_once(q.path)["leases_reaped"]
    assert reaped == 4
    for job, _rel, old in leases:
        rel = only_object(q.path, job)
        assert rel.startswith("ready/")
        assert names.parse_name(State.READY, rel.split("/")[-1]).generation == old.generation + 1
    assert cursor_doc(q.path, q)["phase"] == "compact_receipts"  # the backlog is still being worked on


def test_one_shot_runs_promote_due_delayed_jobs_behind_a_receipt_backlog(q: Queue) -> None:
    start_backlog(q)
    delayed = [q.enqueue(b"d", delay=30) for _ in range(3)]
    advance_watermark_to(q.path, (linux.realtime_ns() + 60 * SEC) // q.format.delayed_width_ns)
    assert sum(recover_once(q.path)["delayed_promoted"] for _ in range(3)) == 3
    assert all(is_ready(q.path, job) for job in delayed)


def test_one_shot_runs_resume_compaction_where_the_last_process_stopped(q: Queue) -> None:
    start_backlog(q)
    done = compacted(q.path)
    for _ in range(3):
        position = cursor_doc(q.path, q)["compact_receipts"]
        assert position is not None, "the cursor must keep the backlog phase's position"
        after = (position["first"], position["second"], position["resume_after"])
        report = recover_once(q.path)
        now = compacted(q.path)
        fresh = now - done
        assert report["receipts_compacted"] == len(fresh) > 0
        # Nothing at or before the position was looked at again: every new one comes after it.
        assert min(receipt_key(rel) for rel in fresh) > after
        done = now


def test_a_reference_position_is_honoured_after_the_due_phases(q: Queue) -> None:
    """A reference-written cursor at compact_receipts with a position: the due
    lease is reaped first, the receipt at the position is not looked at again
    (the successor of test_recovery's check of the same cursor, which predates
    due-first reaping)."""
    qid = q.format.queue_id
    job, _rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=1)
    write_receipts(q, 1)
    (receipt,) = files_under(q.path, "receipts")
    bucket, shard, name = receipt_key(receipt)
    doc = json.loads(reset_cursor_json(qid, "compact_receipts"))
    doc["cursor"]["compact_receipts"] = {"first": list(bucket), "second": list(shard), "resume_after": list(name)}
    Path(q.path, "control", "recovery-cursor.json").write_text(json.dumps(doc, separators=(",", ":")))
    first = q.recover()
    assert first.errors == [] and (first.leases_reaped, first.receipts_compacted) == (1, 0)
    assert is_ready(q.path, job) and first.next_phase == "reap_leases"
    assert cursor_bytes(q.path) == reset_cursor_json(qid, "reap_leases")
    second = q.recover()
    assert second.errors == [] and (second.leases_reaped, second.receipts_compacted) == (0, 1)


def test_a_complete_cycle_writes_the_reset_form_again(q: Queue) -> None:
    write_receipts(q, 30)
    for _ in range(20):
        report = run_recovery(q._ctx, budget_ops=7, budget_ms=60_000)
        if not report.budget_exhausted:
            break
        validate_cursor(cursor_bytes(q.path), q.format.queue_id)
    assert not report.budget_exhausted and len(compacted(q.path)) == 30
    assert cursor_bytes(q.path) == reset_cursor_json(q.format.queue_id, "reap_leases")


def test_due_phases_get_at_most_half_the_operations(q: Queue) -> None:
    """A flood of expired leases cannot stop the backlog phase from moving."""
    write_receipts(q, 20)
    Path(q.path, "control", "recovery-cursor.json").write_bytes(
        reset_cursor_json(q.format.queue_id, "compact_receipts")
    )
    jobs = [craft_lease(q, boot=OTHER_BOOT, deadline=1)[0] for _ in range(10)]
    report = run_recovery(q._ctx, budget_ops=6, budget_ms=60_000)
    assert report.budget_exhausted
    assert report.leases_reaped == 3 and report.receipts_compacted == 3
    reaped = 3
    for _ in range(10):
        reaped += run_recovery(q._ctx, budget_ops=6, budget_ms=60_000).leases_reaped
    assert reaped == 10 and all(is_ready(q.path, job) for job in jobs)


class SlowClock:
    """CLOCK_MONOTONIC where every reading is ``step_ms`` later than the one before:
    each budget check finds the whole default budget (100 ms) spent."""

    def __init__(self, step_ms: int) -> None:
        self.now = linux.monotonic_ns()
        self.step = step_ms * 1_000_000

    def __call__(self) -> int:
        self.now += self.step
        return self.now


@pytest.mark.parametrize("cursor_phase", ["reap_leases", "compact_receipts"])
def test_a_pass_whose_budget_is_gone_before_any_work_still_does_some(
    q: Queue, monkeypatch: pytest.MonkeyPatch, cursor_phase: str
) -> None:
    jobs = [craft_lease(q, boot=OTHER_BOOT, deadline=1)[0] for _ in range(3)]
    Path(q.path, "control", "recovery-cursor.json").write_bytes(reset_cursor_json(q.format.queue_id, cursor_phase))
    q._ctx.wall.for_mutation()  # warm the floor cache: the slow clock below only drives the budget
    monkeypatch.setattr(linux, "monotonic_ns", SlowClock(200))
    reaped = 0
    for _ in range(6):
        report = run_recovery(q._ctx)
        assert not (report.budget_exhausted and report.operations_attempted == 0), report
        reaped += report.leases_reaped
        if reaped == 3:
            break
    monkeypatch.undo()
    assert reaped == 3 and all(is_ready(q.path, job) for job in jobs)


def test_ready_jobs_do_not_use_up_the_search_for_expired_leases(q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """The due scan of ``ready/`` passes over ready jobs without spending the budget on them."""
    write_ready_jobs(q, 2000)
    last = f"{SHARDS - 1:04x}"
    while True:  # one expired lease, behind every ready job of the shards before its own
        job, rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=1)
        if rel.split("/")[1] == last:
            break
        os.unlink(os.path.join(q.path, rel))
    q._ctx.wall.for_mutation()
    monkeypatch.setattr(linux, "monotonic_ns", SlowClock(200))
    report = run_recovery(q._ctx)
    monkeypatch.undo()
    assert report.leases_reaped == 1 and is_ready(q.path, job)
