"""Delays are precise (issue 16, point 3): a job runs when its own not_before passes.

Before, the promoter slept until the end of the job's 10 s delayed bucket, so
``steadq put --delay 2s`` ran up to 10 s late and a retry with
``backoff_base: 1s`` waited for the next :x0. These tests use the default
10 s bucket width and place each job several seconds before its bucket's
end: waiting for the bucket would be seconds late, promotion at not_before is
not. The bounds separate those two behaviours; they do not measure speed
(benchmarks/promotion_lateness.py does).

The promoter also judges "due" by the wall recovery uses (the floor bounded
by the local clock + ``sweeper.max_clock_skew``, steadqd.fs.clock): with a
watermark far ahead it must neither promote early nor back off.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from steadqd import Queue
from steadqd.constants import NS_PER_SECOND, State
from steadqd.fs import linux
from tests.daemon.conftest import Daemon, Env, job_spec, wait_for
from tests.invariants import check_tree, live_tree

SEC = NS_PER_SECOND
WIDTH = 10 * SEC  # the default delayed bucket width
# Kernel file timestamps come from the coarse clock (a tick behind at most).
CTIME_SLACK_NS = 50_000_000


@pytest.fixture
def env(tmp_path: Path, make_queue, queue_path: str) -> Env:
    make_queue(delayed_width_ns=WIDTH).close()
    return Env(tmp_path, queue_path)


@pytest.fixture
def started(env: Env):
    daemons: list[Daemon] = []

    def start(role: str) -> Daemon:
        d = Daemon(env, role)
        daemons.append(d)
        d.wait_log(rf"^<5>{role}\[.*\]: started")
        return d

    yield start
    for d in daemons:
        d.stop()


def configure(env: Env, **sections: dict[str, object]) -> None:
    doc: dict[str, object] = {"queue": env.queue_path, **sections}
    (env.config_dir / f"{env.name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def inside_a_bucket(seconds_before_end: float, *, at_least: float) -> int:
    """A not_before ``seconds_before_end`` before the end of a bucket, at least ``at_least`` s away."""
    earliest = linux.realtime_ns() + round(at_least * SEC)
    end = -(-(earliest + round(seconds_before_end * SEC)) // WIDTH) * WIDTH
    return end - round(seconds_before_end * SEC)


def promoted_at(qpath: str, job: str) -> int:
    """When the job's ready name came into being: the promotion rename sets the inode's ctime."""
    obj = live_tree(qpath).get(job)
    assert obj is not None and obj.state == State.READY, obj
    return os.stat(os.path.join(qpath, obj.path)).st_ctime_ns


def test_promoter_promotes_at_not_before_not_at_the_bucket_end(env: Env, started) -> None:
    configure(env, promoter={"max_sleep": "60s"})
    d = started("promoter")
    first = inside_a_bucket(7.0, at_least=1.0)
    second = first + 5 * SEC  # the same bucket, 2 s before its end
    with Queue.open(env.queue_path) as q:
        a = q.enqueue(b"a", not_before_ns=first)
        b = q.enqueue(b"b", not_before_ns=second)
    wait_for(lambda: live_tree(env.queue_path).state_of(a) == State.READY, 30, "the first job's promotion")
    assert live_tree(env.queue_path).state_of(b) == State.DELAYED  # same bucket, not due yet
    at = promoted_at(env.queue_path, a)
    assert at >= first - CTIME_SLACK_NS, "promoted before its not_before"
    assert at < first + 4 * SEC, f"promoted {(at - first) / SEC:.1f} s late: waited for the bucket?\n{d.log()}"
    wait_for(lambda: live_tree(env.queue_path).state_of(b) == State.READY, 30, "the second job's promotion")
    assert promoted_at(env.queue_path, b) >= second - CTIME_SLACK_NS
    check_tree(env.queue_path)


def test_retry_backoff_of_one_second_is_not_rounded_up_to_a_bucket(env: Env, started) -> None:
    """``steadqd run``: exit 75 retries after backoff_base 1 s (no jitter), not at the next :x0."""
    configure(
        env,
        worker={
            "command": env.command(),
            "lease": "10s",
            "exit_status": {"retry": [75]},
            "retry": {"backoff_base": "1s", "backoff_max": "1s", "jitter": False},
        },
    )
    d = started("run")
    # Attempt 1 runs about 8 s before its bucket ends, so its retry (about 1 s
    # later) lands in that bucket too, far from the bucket's end.
    nb = inside_a_bucket(8.5, at_least=1.5)
    with Queue.open(env.queue_path) as q:
        job = q.enqueue(job_spec(exit={"1": 75, "default": 0}), not_before_ns=nb)
    first = env.result(job, 1)
    second = env.started(job, 2)
    gap = second["start"] - first["end"]
    assert gap >= 0.9, f"retried after {gap:.2f} s, before the 1 s backoff"
    assert gap < 4.0, f"retried after {gap:.2f} s: rounded up to a bucket?\n{d.log()}"
    assert first["start"] * SEC >= nb - CTIME_SLACK_NS
    env.result(job, 2)


def test_promoter_judges_due_by_the_skew_bounded_wall(env: Env, started, monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer with its clock an hour ahead raised the watermark. With ``max_clock_skew: 1s``
    the promoter's handle trusts the floor only to the local clock + 1 s: the job is promoted
    about 1 s before its not_before by the local clock, not at once (the default 5 min bound),
    and not after a back-off that grew while the raw floor said "due" and the pass moved nothing."""
    configure(env, sweeper={"max_clock_skew": "1s"}, promoter={"max_sleep": "60s"})
    with Queue.open(env.queue_path) as q:
        job = q.enqueue(b"x", delay=10.0)
        (info,) = q.inspect(job)
        nb = info.name.not_before
    real = linux.realtime_ns
    with monkeypatch.context() as m:  # faketime -f +1h steadq put
        m.setattr(linux, "realtime_ns", lambda: real() + 3600 * SEC)
        with Queue.open(env.queue_path) as producer:
            producer.enqueue(b"from the future")
    d = started("promoter")
    wait_for(lambda: live_tree(env.queue_path).state_of(job) == State.READY, 30, "the promotion")
    at = promoted_at(env.queue_path, job)
    assert at >= nb - SEC - CTIME_SLACK_NS, f"promoted {(nb - at) / SEC:.1f} s early: the skew bound was not used"
    assert at < nb + 2 * SEC, f"promoted {(at - nb) / SEC:.1f} s late: backed off?\n{d.log()}"
    assert "is due but nothing in it was promoted" not in d.log()


def test_the_delayed_watch_knows_the_earliest_not_before_inside_a_bucket(env: Env) -> None:
    """The watch's due time is the earliest job's not_before, also for a job that arrives later
    in the same bucket (an event: ``earlier``), not the bucket's end."""
    later = inside_a_bucket(2.0, at_least=60.0)
    sooner = later - 5 * SEC
    problems: list[tuple[str, str]] = []
    with Queue.open(env.queue_path) as q:
        q.enqueue(b"later", not_before_ns=later)
        watch = q.delayed_watch(lambda code, message: problems.append((code, message)))
        try:
            watch.scan(q.wall_floor_ns())
            assert (watch.next_due_ns, watch.count) == (later, 1)
            q.enqueue(b"sooner", not_before_ns=sooner)
            news = wait_for(lambda: (n := watch.read()).earlier and n, 10, "the arrival event")
            assert not news.rescan
            assert (watch.next_due_ns, watch.count) == (sooner, 2)
            q.enqueue(b"after", not_before_ns=later + 1)
            time.sleep(0.1)  # let the event arrive: it must not move the due time
            assert not watch.read().earlier and watch.next_due_ns == sooner
            watch.scan(q.wall_floor_ns())
            assert (watch.next_due_ns, watch.count) == (sooner, 3)
        finally:
            watch.close()
    assert problems == []
