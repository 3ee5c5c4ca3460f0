"""Empty delayed buckets are removed by recovery, and publishing survives it.

Issue 15, point 12: promotion empties ``delayed/<B>/`` but nothing ever
removed the bucket or its shard directories (953 after ten minutes of load).
Recovery now removes buckets that are empty and at least an hour behind the
due instant (``steadqd/fs/recovery/buckets.py`` says why an hour), and a
publisher or a retry that finds its directory removed makes it again and
links there. The race tests remove the directory at the worst moment (after
the job file is written, right before its link or rename) and, in threads,
while a producer publishes into fresh buckets: no job is lost, none fails.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from steadqd import Queue
from steadqd.constants import NS_PER_SECOND
from steadqd.fs import linux
from steadqd.fs.names import bucket_dir, shard_dir
from steadqd.fs.recovery import buckets
from tests.invariants import check_tree

SHARDS = 4
GRACE_BUCKETS = buckets.GRACE_NS // (10 * NS_PER_SECOND)  # with the default 10 s delayed buckets


def delayed(root: str, *parts: str) -> Path:
    return Path(root, "delayed", *parts)


def bucket_names(root: str) -> set[str]:
    return set(os.listdir(delayed(root)))


def make_bucket(q: Queue, bucket: int, *, aged: bool = True) -> str:
    """An empty bucket exactly as a publisher leaves it once its jobs are promoted;
    ``aged``: nothing changed in it for two hours, as after its last job was promoted."""
    name = bucket_dir(bucket)
    q._ctx.tree.ensure_dir(f"delayed/{name}/{shard_dir(0)}")
    if aged:
        age(delayed(q.path, name))
    return name


def age(d: Path, seconds: float = 7200) -> None:
    then = time.time() - seconds
    for sub in [*d.iterdir(), d]:
        if sub.is_dir() and not sub.is_symlink():
            os.utime(sub, (then, then), follow_symlinks=False)


def due_bucket(q: Queue) -> int:
    return q.wall_floor_ns() // q.format.delayed_width_ns


def remove_bucket(root: str, name: str) -> None:
    """What recovery does to an empty bucket (here at the moment a test chooses)."""
    for s in os.listdir(delayed(root, name)):
        os.rmdir(delayed(root, name, s))
    os.rmdir(delayed(root, name))


# --------------------------------------------------------------------------- removal


def test_empty_buckets_well_in_the_past_are_removed(make_queue: Callable[..., Queue], queue_path: str) -> None:
    q = make_queue(shards=SHARDS)
    now = due_bucket(q)
    old = {make_bucket(q, now - GRACE_BUCKETS - 1 - i) for i in range(20)}
    recent = make_bucket(q, now - GRACE_BUCKETS + 6)  # due less than an hour ago: a late producer may still aim here
    in_use = make_bucket(q, now - GRACE_BUCKETS - 30, aged=False)  # made again a moment ago by such a producer
    later = q.enqueue(b"later", delay=600)
    before = bucket_names(queue_path)
    report = q.recover(budget_ms=60_000)
    assert report.ok, report.errors
    left = bucket_names(queue_path)
    assert not old & left, f"{len(old & left)} of {len(old)} empty past buckets left"
    assert left == before - old and {recent, in_use} <= left
    assert report.directories_removed == len(old) * (SHARDS + 1)
    assert check_tree(queue_path).state_of(later) == "delayed"


def test_only_empty_shard_directories_go_and_a_bucket_holding_anything_stays(
    make_queue: Callable[..., Queue], queue_path: str, tmp_path: Path
) -> None:
    q = make_queue(shards=SHARDS)
    now = due_bucket(q)
    stray_file = make_bucket(q, now - GRACE_BUCKETS - 3)
    delayed(queue_path, stray_file, shard_dir(2), "notes.txt").write_bytes(b"evidence")
    age(delayed(queue_path, stray_file))
    stray_dir = make_bucket(q, now - GRACE_BUCKETS - 2)
    delayed(queue_path, stray_dir, "not-a-shard").mkdir()
    age(delayed(queue_path, stray_dir))
    delayed(queue_path, "lost+found").mkdir()
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / shard_dir(0)).mkdir(parents=True)
    os.symlink(elsewhere, delayed(queue_path, bucket_dir(now - GRACE_BUCKETS - 1)))  # never followed
    report = q.recover(budget_ms=60_000)
    assert sorted(os.listdir(delayed(queue_path, stray_file))) == [shard_dir(2)]
    assert delayed(queue_path, stray_file, shard_dir(2), "notes.txt").read_bytes() == b"evidence"
    assert sorted(os.listdir(delayed(queue_path, stray_dir))) == ["not-a-shard"]
    assert delayed(queue_path, "lost+found").is_dir()
    assert delayed(queue_path, bucket_dir(now - GRACE_BUCKETS - 1)).is_symlink()
    assert (elsewhere / shard_dir(0)).is_dir()
    assert report.directories_removed == (SHARDS - 1) + SHARDS
    assert not [e for e in report.errors if e[0].startswith("rmdir")], report.errors


def test_a_backlog_of_empty_buckets_is_worked_off_over_passes_within_the_budget(
    make_queue: Callable[..., Queue], queue_path: str
) -> None:
    q = make_queue(shards=SHARDS)
    now = due_bucket(q)
    old = {make_bucket(q, now - GRACE_BUCKETS - 1 - i) for i in range(60)}  # 300 directories
    removed = []
    for _ in range(20):
        report = q.recover(budget_ops=50, budget_ms=60_000)
        assert report.operations_attempted <= 50
        removed.append(report.directories_removed)
        if not old & bucket_names(queue_path):
            break
    assert not old & bucket_names(queue_path), removed
    assert sum(removed) == len(old) * (SHARDS + 1) and max(removed) <= 50


def test_a_promoted_bucket_is_removed_once_past_the_grace(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole life of a bucket: a job delayed into it, promoted, the empty bucket removed."""
    monkeypatch.setattr(buckets, "GRACE_NS", 0)  # the hour and the minute are the policy; here the mechanism
    monkeypatch.setattr(buckets, "QUIET_NS", 0)
    q = make_queue(shards=SHARDS, delayed_width_ns=NS_PER_SECOND)
    job = q.enqueue(b"soon", delay=0.05)
    (name,) = bucket_names(queue_path)
    deadline = time.monotonic() + 10
    while check_tree(queue_path).state_of(job) != "ready":
        assert time.monotonic() < deadline, "the delayed job was never promoted"
        time.sleep(0.05)
        q.recover()
    # A job can be promoted by its own not_before before its bucket is due; the
    # bucket goes once it is due (at most one width later).
    while name in bucket_names(queue_path):
        assert time.monotonic() < deadline, "the emptied bucket was never removed"
        time.sleep(0.05)
        q.recover()
    lease = q.lease()
    assert lease is not None and lease.job_id == job


# --------------------------------------------------------------------------- publishing meets a removed bucket


def _remove_before_first(monkeypatch: pytest.MonkeyPatch, attr: str, root: str, name: str) -> list[int]:
    """Wrap ``linux.<attr>`` so that the bucket is removed right before its first call."""
    real = getattr(linux, attr)
    calls: list[int] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not calls and delayed(root, name).exists():
            remove_bucket(root, name)
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(linux, attr, wrapper)
    return calls


@pytest.mark.parametrize("named", [False, True], ids=["tmpfile", "named-temp"])
def test_enqueue_links_into_a_bucket_removed_after_the_job_was_written(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch, named: bool
) -> None:
    q = make_queue(shards=SHARDS)
    if named:
        q._ctx.publication = "named"  # what ZFS gets
    not_before = q.wall_floor_ns() + 600 * NS_PER_SECOND
    name = make_bucket(q, -(-not_before // q.format.delayed_width_ns))
    calls = _remove_before_first(monkeypatch, "rename_noreplace" if named else "link_tmpfile", queue_path, name)
    job = q.enqueue(b"late", not_before_ns=not_before)
    monkeypatch.undo()
    assert len(calls) == 2, "the first link or rename met the removed directory and was made again"
    ts = check_tree(queue_path)
    assert ts.state_of(job) == "delayed" and ts.objects[job].path.startswith(f"delayed/{name}/")
    assert q.enqueue(b"and the handle goes on", not_before_ns=not_before)
    assert len(check_tree(queue_path).delayed) == 2


def test_enqueue_into_a_bucket_whose_cached_directories_were_removed(
    make_queue: Callable[..., Queue], queue_path: str
) -> None:
    """The handle's cached bucket and shard fds name removed directories: it makes them again."""
    q = make_queue(shards=SHARDS)
    width = q.format.delayed_width_ns
    jobs = []
    for i in range(12):  # each job's shard is random: some meet the cached shard fd, some the cached bucket
        not_before = q.wall_floor_ns() + (600 + 20 * i) * NS_PER_SECOND
        name = make_bucket(q, -(-not_before // width))
        remove_bucket(queue_path, name)
        jobs.append(q.enqueue(b"x", not_before_ns=not_before))
    assert check_tree(queue_path).delayed == frozenset(jobs)


def test_retry_later_moves_into_a_bucket_removed_under_it(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_queue(shards=SHARDS)
    job = q.enqueue(b"again")
    lease = q.lease(duration=60)
    assert lease is not None
    not_before = q.wall_floor_ns() + 600 * NS_PER_SECOND
    name = make_bucket(q, -(-not_before // q.format.delayed_width_ns))
    delay = (not_before - q.wall_floor_ns()) / NS_PER_SECOND
    calls = _remove_before_first(monkeypatch, "rename_noreplace", queue_path, name)
    assert q.retry(lease, delay=delay) == "delayed"
    monkeypatch.undo()
    assert len(calls) == 2
    assert check_tree(queue_path).state_of(job) == "delayed"


# --------------------------------------------------------------------------- the race, for real


def test_producers_and_recovery_race_on_the_same_buckets_and_nothing_is_lost(
    make_queue: Callable[..., Queue], queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two producers (O_TMPFILE and named temps) publish one job into each of 300
    empty, long unchanged buckets while recovery removes every such bucket it
    sees (a negative grace makes these future buckets count as past): a
    publication finds its directory there, gone, or going under it."""
    monkeypatch.setattr(buckets, "GRACE_NS", -(10**6) * NS_PER_SECOND)
    per_producer = 150
    width = 10 * NS_PER_SECOND
    q0 = make_queue(shards=SHARDS)
    base = (q0.wall_floor_ns() // width + 3600) * width
    starts = {False: base, True: base + 10**5 * width}
    for start in starts.values():
        for i in range(per_producer):
            make_bucket(q0, start // width + i)
    q0.close()
    jobs: list[str] = []
    failures: list[BaseException] = []
    recoveries: list[Any] = []
    stop = threading.Event()

    def produce(named: bool) -> None:
        try:
            with Queue.open(queue_path) as q:
                if named:
                    q._ctx.publication = "named"
                for i in range(per_producer):
                    jobs.append(q.enqueue(b"%d" % i, not_before_ns=starts[named] + i * width))
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    def recover() -> None:
        try:
            with Queue.open(queue_path) as q:
                while not stop.is_set():
                    recoveries.append(q.recover(budget_ops=10_000, budget_ms=10_000))
        except BaseException as e:
            failures.append(e)

    sweeper = threading.Thread(target=recover)
    producers = [threading.Thread(target=produce, args=(named,)) for named in starts]
    sweeper.start()
    for t in producers:
        t.start()
    for t in producers:
        t.join(timeout=300)
    stop.set()
    sweeper.join(timeout=60)
    assert not failures, failures
    assert len(jobs) == 2 * per_producer
    errors = [e for r in recoveries for e in r.errors]
    assert not errors, errors[:5]
    assert sum(r.directories_removed for r in recoveries) > 0, "recovery never removed a directory"
    assert check_tree(queue_path).delayed == frozenset(jobs)
