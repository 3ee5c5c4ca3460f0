"""A quarantined *directory* is one quarantined object, not a place to look for more.

Claim isolates a directory planted under a job's name whole (reason 0x0008,
non-regular file). ``admin quarantine-list`` used to walk into it and list
whatever was inside, so an object the queue never quarantined could appear
in the listing (and be exported or removed by its id).
"""

from __future__ import annotations

import json
import os

from steadqd import Queue

from .helpers import steadq


def test_a_quarantined_directory_is_listed_as_one_object(qpath: str) -> None:
    with Queue.open(qpath) as q:  # a real job's name (tag and shard right), its file swapped for a directory
        (obj,) = q.inspect(q.enqueue(b"x"))
    planted = os.path.join(qpath, obj.path)
    os.unlink(planted)
    os.mkdir(planted)
    inner = "q" + "cd" * 16 + ".x0001.raw"
    with open(os.path.join(planted, inner), "wb") as f:
        f.write(b"not a quarantined object")
    with Queue.open(qpath) as q:
        assert q.lease() is None  # the scan isolates the directory and finds no job
    r = steadq("admin", "quarantine-list", qpath, "--json")
    assert r.code == 0, r.err
    items = json.loads(r.out)
    assert [i["reason"] for i in items] == [0x0008], items
    assert not items[0]["path"].endswith(inner), items
    assert steadq("admin", "quarantine-inspect", qpath, "cd" * 16).code == 1  # what is inside is not listed
    r = steadq("admin", "quarantine-inspect", qpath, items[0]["quarantine_id"])
    assert r.code == 0 and "reason=0x0008" in r.out, r


def test_a_quarantined_directory_nested_in_a_plain_directory_is_still_found(qpath: str) -> None:
    """Directories without a quarantine name are still walked (nested layouts are tolerated)."""
    nested = os.path.join(qpath, "quarantine", "older")
    os.makedirs(os.path.join(nested, "q" + "ef" * 16 + ".x0008.raw"))
    r = steadq("admin", "quarantine-list", qpath, "--json")
    assert r.code == 0, r.err
    assert [(i["quarantine_id"], i["reason"]) for i in json.loads(r.out)] == [("ef" * 16, 8)]


def _plant_directory(qpath: str, inner: bool) -> None:
    with Queue.open(qpath) as q:
        (obj,) = q.inspect(q.enqueue(b"x"))
    planted = os.path.join(qpath, obj.path)
    os.unlink(planted)
    os.mkdir(planted)
    if inner:
        with open(os.path.join(planted, "what-they-left"), "wb") as f:
            f.write(b"evidence")
    with Queue.open(qpath) as q:
        assert q.lease() is None


def test_purge_removes_an_empty_quarantined_directory_and_refuses_one_with_contents(qpath: str) -> None:
    _plant_directory(qpath, inner=False)
    _plant_directory(qpath, inner=True)
    assert len(json.loads(steadq("admin", "quarantine-list", qpath, "--json").out)) == 2
    r = steadq("admin", "purge", qpath, "quarantine")
    assert r.code != 0, r
    assert "is a directory with entries in it" in r.err and "rm -r -- " in r.err, r.err
    left = json.loads(steadq("admin", "quarantine-list", qpath, "--json").out)
    assert len(left) == 1  # the empty one is gone, the one with evidence stays for a person
    assert os.listdir(os.path.join(qpath, left[0]["path"])) == ["what-they-left"]
