"""Promotion at each job's own not_before (issue 16, point 3), against a real tree.

The reference promotes ``delayed/<B>/`` only once ``B × width`` has passed, so
with 10 s buckets a job delayed by 2 s runs up to 10 s late. Recovery now
also looks into the current bucket (``floor(wall / width) + 1``) and promotes
the jobs there whose not_before has passed, and only those: the others are
not even opened, so a corrupt one is still quarantined only once due.

The wall is moved by replacing the library's CLOCK_REALTIME reading
(``linux.realtime_ns``) in this process, so the instants are exact and no test
sleeps.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from steadqd import Queue
from steadqd.constants import NS_PER_SECOND, State
from steadqd.fs import linux, names
from steadqd.fs.recovery import run_recovery
from tests.invariants import check_tree

SEC = NS_PER_SECOND
WIDTH = 10 * SEC  # the default delayed bucket width


def state_of(root: str, job: str) -> str | None:
    """The state directory holding ``job`` (by name only: the tree holds a corrupt file on purpose)."""
    found = {
        os.path.relpath(d, root).split(os.sep)[0]
        for d, _, files in os.walk(root)
        if any(f.startswith(job) for f in files)
    }
    assert len(found) <= 1, found
    return found.pop() if found else None


def test_recovery_promotes_each_job_of_the_current_bucket_at_its_not_before(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_queue(delayed_width_ns=WIDTH).close()
    start = (linux.realtime_ns() // WIDTH + 100) * WIDTH  # a bucket start well in the future
    with Queue.open(queue_path) as q:
        early, early_rel = q.enqueue_detailed(b"early", not_before_ns=start + 3 * SEC)
        late, late_rel = q.enqueue_detailed(b"late", not_before_ns=start + 5 * SEC)
        bad, bad_rel = q.enqueue_detailed(b"corrupt", not_before_ns=start + 6 * SEC)
    bucket = names.delayed_bucket(start + 3 * SEC, WIDTH)
    assert {rel.split("/")[1] for rel in (early_rel, late_rel, bad_rel)} == {names.bucket_dir(bucket)}
    with open(os.path.join(queue_path, bad_rel), "r+b") as f:  # its envelope no longer authenticates
        f.seek(60)
        byte = f.read(1)
        f.seek(60)
        f.write(bytes([byte[0] ^ 0xFF]))

    monkeypatch.setattr(linux, "realtime_ns", lambda: start + 4 * SEC)
    with Queue.open(queue_path) as q:
        assert q.wall_floor_ns() // WIDTH == bucket - 1  # the bucket itself is not due yet
        report = run_recovery(q._ctx)
    assert report.errors == [], report.errors
    assert (report.delayed_promoted, report.quarantined) == (1, 0)
    assert state_of(queue_path, early) == State.READY.value
    assert state_of(queue_path, late) == State.DELAYED.value  # its not_before is still ahead
    assert os.path.exists(os.path.join(queue_path, bad_rel))  # not due: never opened

    monkeypatch.setattr(linux, "realtime_ns", lambda: start + 5 * SEC)  # exactly the late job's instant
    with Queue.open(queue_path) as q:
        report = run_recovery(q._ctx, phases=("promote_delayed",))
    assert (report.delayed_promoted, report.quarantined) == (1, 0), report.errors
    assert state_of(queue_path, late) == State.READY.value
    assert os.path.exists(os.path.join(queue_path, bad_rel))

    monkeypatch.setattr(linux, "realtime_ns", lambda: start + 6 * SEC)  # the corrupt job claims to be due
    with Queue.open(queue_path) as q:
        report = run_recovery(q._ctx, phases=("promote_delayed",))
        lease = q.lease()
        assert lease is not None and lease.job_id in (early, late)
    assert (report.delayed_promoted, report.quarantined) == (0, 1)
    assert not os.path.exists(os.path.join(queue_path, bad_rel))
    check_tree(queue_path)


def test_a_job_due_exactly_at_its_bucket_end_is_promoted_with_the_bucket(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """not_before = B × width lands in bucket B (the ceiling); one ns before it, nothing moves."""
    make_queue(delayed_width_ns=WIDTH).close()
    start = (linux.realtime_ns() // WIDTH + 100) * WIDTH
    with Queue.open(queue_path) as q:
        job, rel = q.enqueue_detailed(b"edge", not_before_ns=start)
    assert rel.split("/")[1] == names.bucket_dir(start // WIDTH)
    for now, state in ((start - 1, State.DELAYED), (start, State.READY)):
        monkeypatch.setattr(linux, "realtime_ns", lambda now=now: now)
        with Queue.open(queue_path) as q:
            run_recovery(q._ctx, phases=("promote_delayed",))
        assert state_of(queue_path, job) == state.value, now - start
