"""Issue 16, point 6: running jobs (leases) are visible, and the reference's ``stats`` lines stay as they are.

The reference counts a colocated lease as *ready*; ``watch`` adds a line
for the leases, and ``ls`` on a terminal ends with the totals.
"""

from __future__ import annotations

import json

from steadqd import Queue

from .helpers import steadq
from .test_tty import PtyRun


def test_watch_shows_the_running_jobs_and_stats_keeps_the_reference_lines(qpath: str) -> None:
    with Queue.open(qpath) as q:
        q.enqueue(b"a")
        q.enqueue(b"b")
        lease = q.lease(duration=60)
        assert lease is not None
        w = steadq("watch", qpath, "--count", "1")
        assert w.code == 0
        assert "running: 1 (leases, counted in ready above)" in w.out, w.out
        s = steadq("stats", qpath)
        assert [x.split(" ")[0] for x in s.out_lines] == [
            "dead:", "delayed:", "leased:", "quarantine:", "ready:", "receipts:",
        ]  # fmt: skip
        assert s.out_lines[4].startswith("ready: 2 ")  # the reference's count: the lease is in ready/
        doc = json.loads(steadq("stats", qpath, "--json").out)
        assert doc["running"]["objects"] == 1 and doc["ready"]["objects"] == 2
        assert doc["running"]["oldest_age_seconds"] is not None
        q.ack(lease)
        assert json.loads(steadq("stats", qpath, "--json").out)["running"]["objects"] == 0


def test_ls_on_a_terminal_ends_with_the_running_count(qpath: str) -> None:
    with Queue.open(qpath) as q:
        for p in (b"a", b"b", b"c"):
            q.enqueue(p)
        lease = q.lease(duration=60)
        assert lease is not None
        run = PtyRun("ls", qpath)
        assert run.finish() == 0
        assert b"3 jobs, 1 running (leased)" in run.output, run.output
        piped = steadq("ls", qpath)
        assert not any("running (leased)" in x for x in piped.out_lines)  # scripts get the table only
        q.ack(lease)
