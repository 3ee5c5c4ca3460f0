"""Issue 32 #1: ``steadq cancel`` of a job a ``steadqd worker`` is running.

The worker hears of it from its inotify watch on the ready shards (the leased name
it holds moved to dead/), not from a faster poll: the lease here is 10 minutes, so
its first renewal (which would also find the cancel) comes after 200 s, far past
the deadline the test waits for the stop.
The job's process group gets SIGTERM (SIGKILL after kill_grace for one that ignores
it), the job ends dead ``cancelled``, nothing is settled and no one runs it again.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from steadqd import Queue
from steadqd.cli.main import main
from steadqd.constants import DeadReason
from tests.invariants import State, check_tree

from .conftest import Daemon, Env, job_spec, live_group_members, wait_for


@pytest.mark.parametrize("ignore_term", [False, True], ids=["sigterm", "sigkill-after-grace"])
def test_a_running_job_is_stopped_at_once_and_ends_dead_cancelled(
    denv: Env, daemons: Callable[..., Daemon], ignore_term: bool
) -> None:
    denv.write_config(kill_grace="1s", lease="600s")
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(job_spec(sleep=1000, ignore_term=ignore_term))
    d = daemons(denv)
    d.ready()
    info = denv.started(job, 1)
    pgid = info["pgid"]
    assert main(["cancel", denv.queue_path, job[:8]]) == 0
    d.wait_log(rf"job {job[:8]} cancelled: stopping its command")
    d.wait_log(rf"job {job[:8]} cancelled \(killed by SIG(TERM|KILL)")
    wait_for(lambda: not live_group_members(pgid), what="the job's process group to be gone")
    if ignore_term:
        assert "sending SIGKILL" in d.log()
    with Queue.open(denv.queue_path) as q:
        (dead,) = [o for o in q.inspect_detailed(job) if o.state == "dead"]
        assert int(dead.details["reason"]) == DeadReason.CANCELLED
        assert {o.state for o in q.inspect(job)} == {"dead"}
    assert check_tree(denv.queue_path).state_of(job) is State.DEAD
    assert "finished" not in d.log() and "LEASE LOST" not in d.log()
    assert denv.results_of(job) == {}  # the command never finished a run
    assert not (denv.results / f"{job}.2.start").exists()  # and no one started it again
