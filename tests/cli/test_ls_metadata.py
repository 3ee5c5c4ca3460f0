"""``steadq ls --meta KEY`` and ``--filter KEY=VALUE`` (issue 33 #8).

The reported defect: the Python worker docs said ``ls`` shows a task's
``task=`` metadata, but ``ls`` read names only and had no metadata column,
so an operator could not tell which task's jobs were piling up.
"""

from __future__ import annotations

import json

from steadqd import Queue

from .helpers import steadq


def test_ls_shows_the_metadata_asked_for_and_filters_by_it(qpath: str) -> None:
    with Queue.open(qpath) as q:
        thumb = q.enqueue(b"a", metadata={"task": "media.thumbnail", "user": "ann"})
        video = q.enqueue(b"b", metadata={"task": "media.transcode"})
        plain = q.enqueue(b"c")
        hostile = q.enqueue(b"d", metadata={"task": "x\x1b[2Jy"})
    r = steadq("ls", qpath, "--meta", "task", "--meta", "user")
    assert r.code == 0, r
    assert r.out_lines[0].split() == ["STATE", "JOB_ID", "ATTEMPT", "AGE", "TASK", "USER", "DEADLINE"]
    rows = {line.split()[1]: line.split() for line in r.out_lines[1:]}
    assert rows[thumb][4:6] == ["media.thumbnail", "ann"]
    assert rows[video][4:6] == ["media.transcode", "-"] and rows[plain][4:6] == ["-", "-"]
    assert "\x1b" not in r.out and rows[hostile][4] == "x\\x1b[2Jy"

    r = steadq("ls", qpath, "--filter", "task=media.thumbnail")
    assert r.code == 0 and [line.split()[1] for line in r.out_lines[1:]] == [thumb], r
    assert r.out_lines[0].split() == ["STATE", "JOB_ID", "ATTEMPT", "AGE", "DEADLINE"]
    r = steadq("ls", qpath, "ready", "--filter", "task=media.transcode", "--filter", "user=ann")
    assert r.code == 0 and r.out_lines[1:] == [], r  # every filter must match

    docs = json.loads(steadq("ls", qpath, "--meta", "task", "--json").out)
    assert {d["job_id"]: d["metadata"] for d in docs}[thumb] == {"task": "media.thumbnail"}
    assert {d["job_id"]: d["metadata"] for d in docs}[plain] == {}
    assert "metadata" not in json.loads(steadq("ls", qpath, "--json").out)[0]  # the shape only adds, when asked

    r = steadq("ls", qpath, "--filter", "task")
    assert r.code == 1 and "--filter" in r.err and "KEY=VALUE" in r.err, r
