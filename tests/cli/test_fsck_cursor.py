"""A recovery cursor that stops every open: the error names the fix, and ``steadq fsck --repair`` applies it.

The cursor (control/recovery-cursor.json) only records where maintenance
stands, and removing it is always safe (records.md); but a malformed one
makes the open refuse the queue, as the reference's does. A power cut on a
disk whose fsync lies leaves it empty (the crash lab's lying-fsync lane
found exactly that), and a group member can write anything there. Either
way the operator needs one command out, which must remove nothing else and
never follow what a group member planted.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.errors import BadRecoveryCursor, ErrorKind
from steadqd.fs.json_records import cursor_json
from tests.invariants import check_tree
from tests.lab.killrig import STEADQD

from .helpers import steadq

CURSOR = os.path.join("control", "recovery-cursor.json")
FIX = "`steadq fsck --repair` removes it"


def _queue_with_jobs(qpath: str) -> set[str]:
    with Queue.open(qpath) as q:
        return {q.enqueue(b"job %d" % i) for i in range(3)}


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b'{"schema":"steadq-recovery-cursor","version":2}', b"x" * 16_385],
    ids=["empty", "truncated", "wrong-version", "oversized"],
)
def test_a_bad_cursor_names_the_fix_and_fsck_repair_removes_it_and_nothing_else(qpath: str, content: bytes) -> None:
    jobs = _queue_with_jobs(qpath)
    Path(qpath, CURSOR).write_bytes(content)

    with pytest.raises(BadRecoveryCursor) as info:
        Queue.open(qpath)
    assert "control/recovery-cursor.json" in info.value.message and FIX in info.value.message

    r = steadq("stats", qpath)
    assert r.code == ErrorKind.QUEUE_CORRUPT.exit_code and FIX in r.err, r.err
    r = steadq("fsck", qpath)  # without --repair: the same refusal, nothing touched
    assert r.code == ErrorKind.QUEUE_CORRUPT.exit_code and FIX in r.err
    assert Path(qpath, CURSOR).read_bytes() == content

    r = steadq("fsck", qpath, "--repair")
    assert r.code == 3, r.err  # an ERROR was found, even though it was repaired (cli.md)
    (line,) = r.out_lines
    assert line.startswith("ERROR control/recovery-cursor.json: recovery_cursor_invalid (") and "removed" in line
    assert not os.path.lexists(Path(qpath, CURSOR))
    assert steadq("fsck", qpath).code == 0
    assert check_tree(qpath).ready == jobs
    with Queue.open(qpath) as q:
        q.recover()  # recovery starts over and writes a sound cursor again
    with Queue.open(qpath) as q:
        assert {q.lease(30).job_id for _ in jobs} == jobs


def test_fsck_repair_leaves_a_sound_cursor_and_reports_it_in_json(qpath: str) -> None:
    with Queue.open(qpath) as q:
        sound = cursor_json(bytes.fromhex(q.queue_id), "promote_delayed")
    Path(qpath, CURSOR).write_bytes(sound)
    r = steadq("fsck", qpath, "--repair")
    assert (r.code, r.out) == (0, "")
    assert Path(qpath, CURSOR).read_bytes() == sound

    Path(qpath, CURSOR).write_bytes(b"")
    r = steadq("fsck", qpath, "--repair", "--json")
    assert r.code == 3
    (finding,) = json.loads(r.out)["findings"]
    assert (finding["severity"], finding["path"], finding["finding_type"]) == (
        "ERROR",
        "control/recovery-cursor.json",
        "recovery_cursor_invalid",
    )


def test_a_planted_symlink_fifo_or_hard_link_is_removed_without_touching_what_it_names(
    qpath: str, tmp_path: Path
) -> None:
    """A group member's plant: the repair unlinks the entry itself, never its target or the other name."""
    target = tmp_path / "victim"
    target.write_bytes(b"not the queue's")
    cursor = Path(qpath, CURSOR)

    cursor.symlink_to(target)
    assert steadq("fsck", qpath, "--repair").code == 3
    assert not os.path.lexists(cursor) and target.read_bytes() == b"not the queue's"

    os.mkfifo(cursor)  # never opened for writing, so nothing blocks (the call has a deadline)
    r = steadq("fsck", qpath, "--repair", timeout=30)
    assert r.code == 3 and "FIFO" in r.out
    assert not os.path.lexists(cursor)

    os.link(target, cursor)  # a second name: open's single-link rule refuses it
    assert steadq("fsck", qpath, "--repair").code == 3
    assert not os.path.lexists(cursor) and target.read_bytes() == b"not the queue's"
    assert steadq("fsck", qpath).code == 0


def test_a_directory_at_the_cursor_is_refused_not_deleted(qpath: str) -> None:
    Path(qpath, CURSOR).mkdir()
    Path(qpath, CURSOR, "inside").write_bytes(b"kept")
    r = steadq("fsck", qpath, "--repair")
    assert r.code == ErrorKind.QUEUE_CORRUPT.exit_code
    assert "is a directory: move it out of the queue by hand" in r.err and "Traceback" not in r.err
    assert Path(qpath, CURSOR, "inside").read_bytes() == b"kept"


def test_a_daemon_refused_by_a_bad_cursor_says_the_fix_in_one_line(qpath: str, tmp_path: Path) -> None:
    Path(qpath, CURSOR).write_bytes(b"")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "q.yaml").write_text(f"queue: {qpath}\n")
    p = subprocess.run(
        [STEADQD, "--config-dir", str(conf), "sweeper", "q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 78, p.stderr  # RestartPreventExitStatus: systemd does not restart it
    (line,) = p.stderr.splitlines()
    assert FIX in line
