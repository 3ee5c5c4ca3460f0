"""Slots (issue 32 #3): each running job has ``STEADQ_SLOT`` (0 … concurrency-1), never one held by
another running job, and ``worker.slots`` maps it to ``STEADQ_SLOT_VALUE`` (a GPU id, say)."""

from __future__ import annotations

import itertools

from steadqd import Queue
from tests.daemon.conftest import Env, job_spec, wait_for
from tests.invariants import live_tree


def test_slots_are_never_shared_by_two_running_jobs(denv: Env, daemons) -> None:
    gpus = ["GPU-a", "GPU-b", "2", "3"]
    denv.write_config(concurrency=4, slots=gpus)
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        jobs = [q.enqueue(job_spec(sleep=0.05 * (i % 5))) for i in range(32)]
    d.ready()
    runs = {job: denv.result(job, 1) for job in jobs}
    wait_for(lambda: live_tree(denv.queue_path).receipts == set(jobs), what="every job acked")
    seen = set()
    for run in runs.values():
        slot = int(run["env"]["STEADQ_SLOT"])
        assert 0 <= slot < 4, run["env"]
        assert run["env"]["STEADQ_SLOT_VALUE"] == gpus[slot]
        seen.add(slot)
    assert len(seen) > 1  # concurrency 4 with 32 jobs: more than one slot was used
    # Never more than 4 commands at once (a spawn in flight holds its slot): the most runs overlapping one's start.
    for run in runs.values():
        at_once = sum(1 for other in runs.values() if other["start"] <= run["start"] < other["end"])
        assert at_once <= 4, (run, at_once)
    for a, b in itertools.combinations(runs.values(), 2):
        if a["env"]["STEADQ_SLOT"] == b["env"]["STEADQ_SLOT"]:
            # one slot, one running job: the two runs never overlap in time
            assert a["end"] <= b["start"] or b["end"] <= a["start"], (a["env"]["STEADQ_SLOT"], a, b)


def test_without_slot_values_only_the_slot_number_is_exported(denv: Env, daemons) -> None:
    denv.write_config(concurrency=2)
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(job_spec())
    d.ready()
    env = denv.result(job, 1)["env"]
    assert env["STEADQ_SLOT"] in ("0", "1") and "STEADQ_SLOT_VALUE" not in env
