"""Settling a finished run: the worker keeps trying on a full disk, and logs what really happened.

Issue 15, point 13: on a full disk the worker gave up acknowledging a
successful run after five one-second tries and let the lease expire, so a
finished job ran again; and ``job finished: ack`` was logged before the ack,
also for a run whose ack then failed with LeaseLost. The full disk is a real
one (a tiny loop-mounted ext4), because where ENOSPC strikes during an ack is
the filesystem's choice; the jobs wait on a barrier file the test creates, so
each run ends exactly when the test is ready for it.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.constants import State
from steadqd.fs.names import parse_name
from tests.daemon.conftest import DEADLINE, Daemon, Env, job_spec, wait_for
from tests.invariants import check_tree
from tests.loopfs import loop_filesystem

# The old worker gave up after five tries one second apart; failing for longer
# than this proves the worker no longer gives up while its lease is renewable.
OLD_GIVE_UP = 5.0


def _release(env: Env, tag: str) -> None:
    """Let the jobs waiting on barrier ``tag`` finish (the job script waits for a second marker)."""
    (env.results / f"{tag}-test.here").touch()


def _held(tag: str, jobs: int = 1) -> bytes:
    """A job that waits until ``jobs`` runs of barrier ``tag`` started and the test released them."""
    return job_spec(barrier={"tag": tag, "n": jobs + 1, "timeout": 3 * DEADLINE})


def _leased_file(queue: str, job_id: str) -> Path:
    def find() -> Path | None:
        for shard in Path(queue, "ready").iterdir():
            for f in shard.iterdir():
                if f.name.startswith(job_id):
                    try:
                        parse_name(State.LEASED, f.name)
                    except Exception:
                        continue
                    return f
        return None

    found = wait_for(find, what=f"the leased file of {job_id}")
    assert isinstance(found, Path)
    return found


def _fill(path: str) -> None:
    """Write ``path`` until the filesystem refuses, down to 1 KiB, so the next allocation fails."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 20, 64 << 10, 1 << 10):
            while True:
                try:
                    os.write(fd, b"\xa5" * chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
        try:
            os.fsync(fd)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    finally:
        os.close(fd)


@pytest.fixture
def tiny() -> Iterator[str]:
    with loop_filesystem("ext4", 16) as mnt:
        yield mnt


@pytest.mark.loopfs
def test_a_full_disk_delays_the_ack_but_never_throws_the_run_away(
    tiny: str, tmp_path: Path, daemons: Callable[..., Daemon]
) -> None:
    queue = os.path.join(tiny, "queue")
    Queue.init(queue, shards=1).close()
    env = Env(tmp_path, queue)  # config, results and payload copies stay on the big disk
    env.write_config(lease="4s", renew_every="1s")
    d = daemons(env)
    with Queue.open(queue) as q:
        job = q.enqueue(_held("full"))
    d.ready()
    env.started(job, 1)
    fillers = [os.path.join(tiny, "filler"), os.path.join(tiny, "filler2")]
    try:
        for f in fillers:
            _fill(f)  # the second catches what the first one's metadata left free
        _release(env, "full")
        env.result(job, 1)
        first = d.wait_log(rf"settling not committed.*STEADQ_JOB_ID={job}")[0]
        assert "space" in first.group(0).lower(), first.group(0)
        # Longer than the old give-up; the lease is renewed meanwhile, so the run is kept.
        time.sleep(OLD_GIVE_UP + 3.0)
        assert "giving up" not in d.log(), d.log()
    finally:
        for f in fillers:
            os.unlink(f)
    d.wait_log(rf"^<6>worker\[testq\]: job {job[:8]} finished: ack \(exit 0, .*STEADQ_JOB_ID={job} STEADQ_VERDICT=ack$")
    tree = check_tree(queue)
    assert tree.receipts == {job}
    assert set(env.results_of(job)) == {1}  # it ran once: the finished run was never thrown away
    assert "LEASE LOST" not in d.log()


def test_job_finished_ack_is_logged_only_for_an_ack_that_succeeded(denv: Env, daemons) -> None:
    # Renewals far apart: the lease is lost under the finished run, not under a renewal.
    denv.write_config(concurrency=2, lease="60s", renew_every="50s")
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        lost = q.enqueue(_held("lost", 2))
        kept = q.enqueue(_held("lost", 2))
    d.ready()
    denv.started(lost, 1)
    denv.started(kept, 1)
    # Whoever holds the queue's files can take the lease away from under the run.
    _leased_file(denv.queue_path, lost).unlink()
    _release(denv, "lost")
    d.wait_log(rf"^<6>worker\[testq\]: job {kept[:8]} finished: ack .*STEADQ_JOB_ID={kept} STEADQ_VERDICT=ack$")
    line = d.wait_log(
        rf"^<3>worker\[testq\]: job {lost[:8]} finished \(exit 0, .*\), but its ack failed: the lease was lost.*{lost}"
    )[0]
    assert "may run again" in line.group(0), line.group(0)
    assert not [m for m in d.log().splitlines() if " finished: ack" in m and lost in m], d.log()
