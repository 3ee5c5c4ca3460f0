"""Issue 32 #1: ``steadq cancel QUEUE JOB...`` on the command line.

Before it, ``steadq cancel`` was "invalid choice": an operator had no way to stop a
queued or running job but to wait for it. Now a ready, delayed or running job becomes
dead with reason ``cancelled`` (a name ``show``, ``ls dead`` and ``admin requeue
--reason`` take), a settled job is reported and left alone, an unknown id is "not
found" (exit 1), an ambiguous prefix lists the candidates.
"""

from __future__ import annotations

import json

from steadqd import Queue

from .helpers import steadq

TWIN_A = "abcdef01" + "1" * 24
TWIN_B = "abcdef02" + "2" * 24


def test_cancel_a_ready_a_delayed_and_a_running_job(qpath: str) -> None:
    with Queue.open(qpath) as q:
        ready = q.enqueue(b"r")
        delayed = q.enqueue(b"d", delay=3600)
        running = q.enqueue(b"x")
        lease = q.lease()
        assert lease is not None
        if lease.job_id != running:  # the lease took another: keep the roles straight
            ready, running = running, ready
            if lease.job_id != running:
                delayed, running = running, delayed
    r = steadq("cancel", qpath, ready[:8], delayed, running)
    assert r.code == 0, r.err
    assert r.out_lines == [
        f"{ready} cancelled (was ready)",
        f"{delayed} cancelled (was delayed)",
        f"{running} cancelled (was running)",
    ]
    r = steadq("ls", qpath, "dead")
    assert r.code == 0, r.err
    assert r.out.count("cancelled") == 3, r.out
    r = steadq("show", qpath, ready, "--no-journal")
    assert r.code == 0 and "cancelled" in r.out, r.out


def test_admin_requeue_selects_cancelled_jobs_by_name(qpath: str) -> None:
    with Queue.open(qpath) as q:
        job = q.enqueue(b"r")
        other = q.enqueue(b"s", max_attempts=1)
        q.cancel(job)
        lease = q.lease()
        assert lease is not None and lease.job_id == other
        q.bury(lease, reason=1)
    r = steadq("admin", "requeue", qpath, "--reason", "cancelled")
    assert r.code == 0, r.err
    assert job in r.out and other not in r.out


def test_settled_jobs_are_reported_truthfully_and_unchanged(qpath: str) -> None:
    with Queue.open(qpath) as q:
        acked = q.enqueue(b"a")
        lease = q.lease()
        assert lease is not None
        q.ack(lease)
        cancelled = q.enqueue(b"c")
        q.cancel(cancelled)
    r = steadq("cancel", qpath, acked)
    assert (r.code, r.out_lines) == (1, [f"{acked} already acked: nothing changed"]), r.err
    r = steadq("cancel", qpath, cancelled)
    assert (r.code, r.out_lines) == (0, [f"{cancelled} already cancelled: nothing changed"]), r.err
    r = steadq("--json", "cancel", qpath, cancelled)
    assert json.loads(r.out) == [
        {"job_id": cancelled, "result": "already_dead", "was": "dead", "reason": 0x8000, "reason_name": "cancelled"}
    ]


def test_an_unknown_id_exits_1_not_found(qpath: str) -> None:
    r = steadq("cancel", qpath, "0" * 32)
    assert r.code == 1
    assert "not found" in r.err


def test_an_ambiguous_prefix_lists_the_candidates_and_cancels_nothing(qpath: str) -> None:
    with Queue.open(qpath) as q:
        q.enqueue(b"a", job_id=TWIN_A)
        q.enqueue(b"b", job_id=TWIN_B)
    r = steadq("cancel", qpath, "abcdef")
    assert r.code == 1
    assert "ambiguous" in r.err and TWIN_A in r.err and TWIN_B in r.err
    with Queue.open(qpath) as q:
        assert {o.state for o in q.inspect(TWIN_A) + q.inspect(TWIN_B)} == {"ready"}
