"""A dead job's reason by name where an operator lists dead jobs: ``ls dead`` and ``admin dead-inspect --json``."""

from __future__ import annotations

import json

from steadqd import Queue

from .helpers import steadq


def _bury(qpath: str, reason: int) -> str:
    with Queue.open(qpath) as q:
        job = q.enqueue(b"x")
        lease = q.lease()
        assert lease is not None and lease.job_id == job
        q.bury(lease, reason=reason)
    return job


def test_ls_dead_has_a_reason_column_by_name(qpath: str) -> None:
    rejected, private = _bury(qpath, 1), _bury(qpath, 0x8001)
    r = steadq("ls", qpath, "dead")
    assert r.code == 0, r.err
    header, *rows = r.out_lines
    assert header.split() == ["STATE", "JOB_ID", "ATTEMPT", "AGE", "REASON"]
    got = {row.split()[1]: row.split()[-1] for row in rows}
    assert got == {rejected: "consumer_rejected", private: "private_0x8001"}
    docs = json.loads(steadq("ls", qpath, "dead", "--json").out)
    assert {d["job_id"]: (d["reason"], d["reason_name"]) for d in docs} == {
        rejected: (1, "consumer_rejected"),
        private: (0x8001, "private_0x8001"),
    }
    assert steadq("ls", qpath).out_lines[0].split()[-1] == "DEADLINE"  # other listings keep their deadline


def test_dead_inspect_json_includes_the_reason(qpath: str) -> None:
    job = _bury(qpath, 3)
    r = steadq("admin", "dead-inspect", qpath, job, "--json")
    assert r.code == 0, r.err
    (doc,) = json.loads(r.out)
    assert (doc["reason"], doc["reason_name"], doc["state"]) == (3, "administrative_bury", "dead")
    plain = steadq("admin", "dead-inspect", qpath, job)
    assert plain.out.startswith("gen=2 attempt=1/3 dead/")  # the reference's plain line is unchanged
