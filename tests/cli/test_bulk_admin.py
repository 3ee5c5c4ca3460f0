"""``steadq admin requeue`` and ``admin purge`` over many jobs: selection, dry run, counts, interruption.

Ages are what ``ls`` shows (the file's mtime), so a test makes a job old by
setting its mtime, and an interruption test signals the installed script at
random moments and holds every job to "done and counted, or untouched".
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.fs import names
from tests.fabricate import plant_in_dead
from tests.invariants import check_tree
from tests.spec_oracle import State  # check_tree keys its states by the oracle's own enum

from .helpers import STEADQ, steadq

DAY = 86400


@pytest.fixture
def tmp_path(fast_tmp_path: Path) -> Path:
    """The session's RAM-backed ext4 (tests/conftest.py): burying 6 x 300 jobs, each transition
    fsynced, was most of the interrupted-runs test (47 s on /tmp, 22 s here, measured alone)."""
    return fast_tmp_path


def _bury_many(qpath: str, reasons: list[int], *, age_seconds: float = 0.0) -> list[str]:
    """One dead job per reason, in order; their files made ``age_seconds`` old."""
    ids = []
    with Queue.open(qpath) as q:
        for reason in reasons:
            job = q.enqueue(b"payload")
            lease = q.lease()
            assert lease is not None and lease.job_id == job
            q.bury(lease, reason=reason)
            ids.append(job)
            if age_seconds:
                (obj,) = q.inspect(job)
                then = time.time() - age_seconds
                os.utime(os.path.join(qpath, obj.path), (then, then))
    return ids


def _states(qpath: str) -> dict[State, frozenset[str]]:
    return check_tree(qpath, allow_quarantine=False).by_state()


def test_requeue_by_reason_and_age_with_a_dry_run_first(qpath: str) -> None:
    old_rejected = _bury_many(qpath, [1, 1], age_seconds=2 * DAY)
    old_exhausted = _bury_many(qpath, [4], age_seconds=2 * DAY)
    new_rejected = _bury_many(qpath, [1])
    before = _states(qpath)
    r = steadq("admin", "requeue", qpath, "--reason", "consumer_rejected", "--older-than", "1d", "--dry-run")
    assert r.code == 0, r.err
    assert sorted(line.split()[2] for line in r.out_lines) == sorted(old_rejected)
    assert all(
        line.startswith("would requeue ") and " reason=consumer_rejected age=2d " in line for line in r.out_lines
    )
    assert r.err_lines == ["would be requeued: 2 of 2 dead jobs selected"]
    assert _states(qpath) == before  # a dry run changes nothing
    r = steadq("admin", "requeue", qpath, "--reason", "1", "--older-than", "1d")
    assert r.code == 0, r.err
    assert sorted(line.split()[1] for line in r.out_lines) == sorted(old_rejected)
    assert all(" -> ready/" in line for line in r.out_lines)
    after = _states(qpath)
    assert after[State.READY] == set(old_rejected)
    assert after[State.DEAD] == set(old_exhausted + new_rejected)
    r = steadq("admin", "requeue", qpath, "--all", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert (doc["selected"], doc["requeued"], doc["untouched"], doc["interrupted"]) == (2, 2, 0, None)
    assert {o["id"] for o in doc["objects"]} == set(old_exhausted + new_rejected)
    assert _states(qpath)[State.DEAD] == set()


def test_requeue_several_job_ids_and_the_single_form_kept(qpath: str) -> None:
    a, b, c = _bury_many(qpath, [1, 1, 1])
    r = steadq("admin", "requeue", qpath, a)
    assert r.code == 0 and r.out_lines[0] == f"job_id: {a}" and r.err_lines == ["requeued"], r
    r = steadq("admin", "requeue", qpath, b, "0" * 32)
    assert r.code == 1 and r.err_lines == [f"not found: no dead object for job {'0' * 32}", "nothing was changed"], r
    assert _states(qpath)[State.DEAD] == {b, c}
    r = steadq("admin", "requeue", qpath, b, c)
    assert r.code == 0 and r.err_lines == ["requeued: 2 of 2 dead jobs selected"], r


def test_bulk_selection_errors_name_the_fix(qpath: str) -> None:
    r = steadq("admin", "requeue", qpath)
    assert r.code == 1 and "name the jobs: JOB_ID..., --all, --reason CODE or --older-than DURATION" in r.err
    r = steadq("admin", "requeue", qpath, "--all", "--reason", "1")
    assert r.code == 1 and "--all selects every dead job; give it alone" in r.err
    r = steadq("admin", "requeue", qpath, "--reason", "tired")
    assert r.code == 1 and "invalid reason 'tired': expected a number (4, 0x0004) or one of unspecified," in r.err
    r = steadq("admin", "purge", qpath, "everything")
    assert r.code == 1 and "invalid choice: 'everything'" in r.err
    r = steadq("admin", "purge", qpath, "dead", "--older-than", "soon")
    assert r.code == 1 and "soon" in r.err


def test_purge_dead_and_quarantine_by_age_and_reason(qpath: str) -> None:
    old = _bury_many(qpath, [1, 4], age_seconds=8 * DAY)
    young = _bury_many(qpath, [1])
    r = steadq("admin", "purge", qpath, "dead", "--older-than", "7d")
    assert r.code == 0, r.err
    assert sorted(line.split()[1] for line in r.out_lines) == sorted(old)
    assert r.err_lines == ["removed: 2 of 2 dead jobs selected"]
    assert check_tree(qpath).by_state()[State.DEAD] == set(young)
    with Queue.open(qpath) as q:  # two corrupt jobs, quarantined by the claim that meets them
        for _ in range(2):
            (obj,) = q.inspect(q.enqueue(b"will rot"))
            path = os.path.join(qpath, obj.path)
            data = bytearray(open(path, "rb").read())
            data[-1] ^= 1
            with open(path, "wb") as f:
                f.write(data)
        assert q.lease() is None
        assert [o.reason for o in q.list_quarantine()] == [2, 2]
    r = steadq("admin", "purge", qpath, "quarantine", "--reason", "envelope_corrupt")
    assert r.code == 0 and r.err_lines == ["removed: 0 of 0 quarantined objects selected"], r
    r = steadq("admin", "purge", qpath, "quarantine", "--reason", "payload_corrupt", "--dry-run")
    assert r.code == 0 and len(r.out_lines) == 2 and all("reason=payload_corrupt" in x for x in r.out_lines), r
    r = steadq("admin", "purge", qpath, "quarantine")
    assert r.code == 0 and r.err_lines == ["removed: 2 of 2 quarantined objects selected"], r
    assert json.loads(steadq("admin", "quarantine-list", qpath, "--json").out) == []


def test_stats_ls_requeue_and_purge_agree_on_what_a_dead_job_is(qpath: str) -> None:
    """Issue 30: with a symlink, a FIFO, a garbage name and a wrongly tagged name planted beside one dead job,
    ``stats`` said 5 dead jobs while purge and requeue selected 1. Every view now says 1, and stats shows the
    four others as strays; purging removes the job and leaves the strays for fsck."""
    (job,) = _bury_many(qpath, [1])
    with Queue.open(qpath) as q:
        (dead,) = q.list_dead()
        planted = plant_in_dead(q, dead.path)
    doc = json.loads(steadq("stats", qpath, "--json").out)
    assert (doc["dead"]["objects"], doc["stray"]["objects"]) == (1, 4)
    assert "steadq_dead_objects 1" in steadq("stats", qpath, "--prometheus").out.splitlines()
    assert [e["job_id"] for e in json.loads(steadq("ls", qpath, "dead", "--json").out)] == [job]
    for args in (("requeue", qpath, "--all"), ("purge", qpath, "dead")):
        r = steadq("admin", *args, "--dry-run")
        assert r.code == 0 and [line.split()[2] for line in r.out.splitlines()] == [job], r
        assert "1 of 1 dead jobs selected" in r.err
    r = steadq("admin", "purge", qpath, "dead")
    assert r.code == 0 and r.out.split()[1] == job, r
    assert all(os.path.lexists(os.path.join(qpath, rel)) for rel in planted.values())
    doc = json.loads(steadq("stats", qpath, "--json").out)
    assert (doc["dead"]["objects"], doc["stray"]["objects"]) == (0, 4)


_SUMMARY = re.compile(r"(requeued|removed): (\d+) of (\d+) dead jobs selected")


def _signal_at(args: list[str], delay: float, signum: int, *, after_first: bool = False) -> tuple[int, list[str], str]:
    """Run ``steadq args`` and signal it ``delay`` s after its start, or after its first change (``after_first``).

    Each change is printed (and flushed) as it is made, so the first line says the changes have begun: the
    timed signal covers a signal before the start and after the end, the other one the middle."""
    assert STEADQ is not None
    # Unbuffered: readline() then reads its line byte by byte, never past it. A buffered reader reads ahead,
    # and communicate() reads the pipe itself, so a line read ahead was lost: a run that said "removed: 13"
    # printed only 12 ids here (issue 30 B); the command had printed all 13.
    p = subprocess.Popen([STEADQ, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         bufsize=0)  # fmt: skip
    first = b""
    if after_first:
        assert p.stdout is not None
        first = p.stdout.readline()
    time.sleep(delay)
    if p.poll() is None:
        p.send_signal(signum)
    out, err = p.communicate(timeout=120)
    return p.returncode, (first + out).decode().splitlines(), err.decode()


def test_bulk_requeue_and_purge_interrupted_leave_each_job_done_or_untouched(tmp_path: Path) -> None:
    """Each run: the jobs it printed are exactly the ones that moved, the summary counts them, the rest stay dead.

    A phase is one queue of 300 dead jobs, requeued (or purged) by runs signalled at random until none is left."""
    rng = random.Random()
    runs = interrupted = 0
    # The timed signal's moment adapts: a run that finished before it makes the next ones earlier, one
    # signalled before it began makes them later (a dry run's time is only a guess when another test shares
    # the CPU). The first run of each phase is signalled just after its first change, so that every phase
    # has a run stopped in the middle whatever the machine's load.
    scale = 1.0
    for phase in range(6):
        command = ("requeue", "purge")[phase % 2]
        qpath = str(tmp_path / f"q{phase}")
        Queue.init(qpath, shards=4).close()
        _bury_many(qpath, [1] * 300)
        args = ["admin", command, qpath, *(("--all",) if command == "requeue" else ("dead",))]
        start = time.monotonic()
        assert steadq(*args, "--dry-run").code == 0
        listing = time.monotonic() - start  # start-up and selection: the changes begin about then
        first_run = True
        while _states(qpath)[State.DEAD]:
            before = _states(qpath)
            signum = (signal.SIGINT, signal.SIGTERM)[runs % 2]
            if first_run:
                code, out, err = _signal_at(args, rng.uniform(0.0, 0.01), signum, after_first=True)
                first_run = False
            else:
                code, out, err = _signal_at(args, scale * rng.uniform(0.5 * listing, 2.5 * listing), signum)
            runs += 1
            now = _states(qpath)
            gone = before[State.DEAD] - now[State.DEAD]
            m = _SUMMARY.search(err)
            if m is None:  # the signal came before the command began (even in Python's start-up): nothing was touched
                assert code != 0 and out == [] and gone == set(), (code, err)
                scale *= 1.5
                continue
            printed = {line.split()[1] for line in out}
            assert printed == gone and int(m.group(2)) == len(gone), err
            assert now[State.READY] - before[State.READY] == (gone if command == "requeue" else set())
            if f"interrupted by {signal.Signals(signum).name}:" in err:
                interrupted += 1
                assert code == 128 + signum, (code, err)
                assert f"{int(m.group(3)) - len(gone)} untouched" in err
            else:  # it had finished: a signal after the summary may still end the process, and changes nothing
                assert now[State.DEAD] == set(), err
                scale *= 0.5
    assert interrupted >= 3, f"only {interrupted} of {runs} runs were interrupted mid-way"


# A run of the CLI whose backend call sends ``signum`` to the process itself on its ``after``-th return: the
# object is removed (or requeued) and its line is not printed yet, the window a signal must not open.
_SIGNAL_AFTER_CHANGE = """
import os, sys
from steadqd.cli.main import main
from steadqd.fs.handle import Queue
after, signum, method = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
real = getattr(Queue, method)
calls = 0
def signalled_after(self, key, *args, **kwargs):
    global calls
    result = real(self, key, *args, **kwargs)
    calls += 1
    if calls == after:
        os.kill(os.getpid(), signum)  # its handler runs here, before the return: the change made, not reported
    return result
setattr(Queue, method, signalled_after)
sys.exit(main(sys.argv[4:]))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize(
    ("command", "method"),
    [("requeue", "requeue_dead"), ("purge dead", "remove_dead"), ("purge quarantine", "remove_quarantine")],
)
def test_a_signal_between_a_change_and_its_line_still_prints_every_change(
    qpath: str, command: str, method: str, signum: signal.Signals
) -> None:
    """Issue 30 B, without timing: the signal lands exactly after the 3rd change and before its line. Every
    printed id is a changed object, every changed object is printed, the summary counts them, the rest stay."""
    if command == "purge quarantine":
        for _ in range(6):
            Path(qpath, "quarantine", names.make_quarantine_name(os.urandom(16), 2)).write_bytes(b"q")
        args = ["admin", "purge", qpath, "quarantine"]
    else:
        _bury_many(qpath, [1] * 6)
        args = ["admin", "requeue", qpath, "--all"] if command == "requeue" else ["admin", "purge", qpath, "dead"]
    place = "quarantine" if command == "purge quarantine" else "dead"

    def left() -> set[str]:
        with Queue.open(qpath) as q:
            if place == "quarantine":
                return {o.quarantine_id for o in q.list_quarantine()}
            return {j.job_id for j in q.list_dead()}

    before = left()
    r = subprocess.run([sys.executable, "-c", _SIGNAL_AFTER_CHANGE, "3", str(int(signum)), method, *args],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)  # fmt: skip
    changed = before - left()
    printed = [line.split()[1] for line in r.stdout.splitlines()]
    assert len(changed) == 3 and sorted(printed) == sorted(changed), (r.stdout, r.stderr)
    what = "quarantined objects" if place == "quarantine" else "dead jobs"
    assert f": 3 of 6 {what} selected; 3 untouched" in r.stderr, r.stderr
    assert f"interrupted by {signum.name}:" in r.stderr and r.returncode == 128 + signum, (r.returncode, r.stderr)
