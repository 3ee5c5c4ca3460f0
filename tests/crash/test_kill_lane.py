"""Crash lab lane 3: SIGKILL of producers, ``steadqd run`` and job commands on ext4, XFS and btrfs.

Why: lane 1 checks computed crash states of the protocol; this lane checks the
deployed processes on the real filesystems, where a killed process leaves
exactly what the kernel has (open O_TMPFILEs vanish, renames are atomic,
leases of a dead worker must expire and be reaped). Every committed enqueue
must end as exactly one receipt or dead entry, nothing partial or duplicated,
fsck clean, no temps, and the queue must still work. The rig and the gates
live in :mod:`tests.lab.killrig`; ``python -m tests.lab.killrig kill``
runs the long version (docs/crash-lab.md).
"""

from __future__ import annotations

import os

import pytest

from tests.lab.killrig import kill_lane, rig
from tests.lab.lanereport import emit

SEED = int(os.environ.get("STEADQ_CRASH_SEED", "8"))


@pytest.mark.parametrize("fs", ["ext4", "xfs", "btrfs"])
def test_sigkill_lane(fs: str, request: pytest.FixtureRequest) -> None:
    """2 producers x 60 jobs, concurrency 4, 10 random SIGKILLs, then settle and check the gates."""
    rep = kill_lane(fs, jobs=60, rounds=10, seed=SEED)
    emit(request, "lane 3", rep.line())
    assert sum(rep.kills.values()) == 10
    assert rep.committed + rep.inflight_lost + rep.inflight_kept == 120  # every serial begun exactly once
    assert rep.receipts + rep.dead == rep.committed + rep.inflight_kept


def test_gates_catch_a_lost_and_a_duplicated_job() -> None:
    """The gates can fail: a receipt removed after settling is reported lost; a second
    enqueue of a serial (what a producer retrying an in-flight enqueue would do) is a duplicate."""
    from steadqd import Queue
    from tests.lab.killrig import make_payload

    with rig("ext4", producers=2, concurrency=2, seed=SEED) as r:
        r.run("5", rounds=0)
        r.settle()
        r.check()  # clean so far
        with Queue.open(r.root) as q:
            q.enqueue(make_payload(0), metadata={"serial": 0})
            lease = q.lease()
            assert lease is not None
            q.bury(lease)  # a dead entry keeps its payload, so the walker reads serial 0 twice
        with pytest.raises(AssertionError, match="enqueued twice"):
            r.check()
        for dirpath, _, files in os.walk(os.path.join(r.root, "receipts")):
            for n in files:
                os.unlink(os.path.join(dirpath, n))
        with pytest.raises(AssertionError, match="committed enqueues lost"):
            r.check()
