"""Running jobs (leases) in every view, under one word (issue 16 #6, issue 33 #6).

A job whose lease is held is *running*: ``stats`` (a ``running:`` line and
gauge beside the reference's lines, which stay as they are: the reference
counts a colocated lease as *ready* and *leased* is only the legacy tree),
``watch`` (a ``running`` row; its ``ready`` row is the jobs waiting),
``ls`` (the STATE column; ``ls Q running``), ``show`` (the headline) and
``status`` (the RUNNING column) all say it the same way. The JSON shapes
keep their fields and values (a state of ``"leased"``) and only add.
"""

from __future__ import annotations

import json

from steadqd import Queue

from .helpers import steadq
from .test_tty import PtyRun


def _rows(frame: str) -> dict[str, int]:
    """The STATE/OBJECTS rows of one ``watch`` frame."""
    rows: dict[str, int] = {}
    for line in frame.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            rows[parts[0]] = int(parts[1])
    return rows


def test_a_running_job_is_running_in_stats_watch_ls_show_and_status(qpath: str) -> None:
    with Queue.open(qpath) as q:
        q.enqueue(b"a")
        q.enqueue(b"b")
        lease = q.lease(duration=60)
        assert lease is not None
        running = lease.job_id

        s = steadq("stats", qpath)
        assert s.code == 0, s
        assert [x.split(" ")[0] for x in s.out_lines] == [
            "dead:", "delayed:", "leased:", "quarantine:", "ready:", "receipts:", "running:",
        ]  # fmt: skip
        assert s.out_lines[4].startswith("ready: 2 ")  # the reference's count: the lease is in ready/
        assert s.out_lines[2] == "leased: 0"  # the reference's: the legacy tree only
        assert s.out_lines[6].startswith("running: 1 (oldest ")
        prom = steadq("stats", qpath, "--prometheus").out_lines
        assert "steadq_running_objects 1" in prom and "steadq_ready_objects 2" in prom
        assert "# TYPE steadq_running_oldest_age_seconds gauge" in prom
        doc = json.loads(steadq("stats", qpath, "--json").out)
        assert doc["running"]["objects"] == 1 and doc["ready"]["objects"] == 2  # the shape only adds
        assert doc["running"]["oldest_age_seconds"] is not None

        w = steadq("watch", qpath, "--count", "1")
        assert w.code == 0, w
        rows = _rows(w.out)
        assert rows["running"] == 1 and rows["ready"] == 1, w.out  # ready: the job waiting
        assert "leased" not in rows and "(leases, counted in ready above)" not in w.out, w.out

        table = steadq("ls", qpath).out_lines
        assert [line.split()[0] for line in table[1:]].count("running") == 1, table
        assert not any(line.startswith("leased") for line in table), table
        only = steadq("ls", qpath, "running").out_lines
        assert len(only) == 2 and only[1].split()[:2] == ["running", running], only
        leased = steadq("ls", qpath, "leased").out_lines  # the spec's word still selects them
        # the same rows; the AGE column may have ticked between the two listings
        assert [line.split()[:3] for line in leased] == [line.split()[:3] for line in only]
        assert json.loads(steadq("ls", qpath, "running", "--json").out)[0]["state"] == "leased"

        shown = steadq("show", qpath, running, "--no-journal")
        assert shown.out_lines[0] == f"job {running}: running", shown
        assert json.loads(steadq("show", qpath, running, "--json", "--no-journal").out)["state"] == "leased"

        st = steadq("status", qpath)
        assert "running: 1" in st.out_lines and "ready: 1" in st.out_lines, st

        q.ack(lease)
        assert json.loads(steadq("stats", qpath, "--json").out)["running"]["objects"] == 0
        assert steadq("stats", qpath).out_lines[-1] == "running: 0"


def test_ls_on_a_terminal_ends_with_the_running_count(qpath: str) -> None:
    with Queue.open(qpath) as q:
        for p in (b"a", b"b", b"c"):
            q.enqueue(p)
        lease = q.lease(duration=60)
        assert lease is not None
        run = PtyRun("ls", qpath)
        assert run.finish() == 0
        assert b"3 jobs, 1 running\r\n" in run.output, run.output
        piped = steadq("ls", qpath)
        assert not any(x.startswith("3 jobs") for x in piped.out_lines)  # scripts get the table only
        q.ack(lease)
