"""``inbox.unique``: the file's name (or name, size and mtime) as the job's unique key (issue 32 #5).

The real daemon takes the files (``steadqd inbox``); the crash points are
driven in process, as in test_inbox_ledger.py, since what must hold there is
the exactly-one-job protocol with the key's id in the intent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.daemon.inbox.files import DONE_BEFORE, ENQUEUED, REFUSED, Folder, unique_key
from steadqd.daemon.inbox.intent import STATE_DIR, Intent
from steadqd.queue_control import unique_job_id
from tests.daemon.conftest import Env
from tests.daemon.test_inbox import QUICK_SETTLE, jobs, running, write_config
from tests.daemon.test_inbox_ledger import Crash, drain_jobs, folder_for, take

ENQUEUED_LINE = r"^<5>inbox\[testq\]: watch folder: (\S+) enqueued as job ([0-9a-f]{32})"
REFUSED_LINE = r"^<4>inbox\[testq\]: watch folder: (\S+) refused: it (.*)"


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    inbox, done = tmp_path / "inbox", tmp_path / "done"
    inbox.mkdir()
    done.mkdir()
    return inbox, done


def test_the_same_name_dropped_twice_makes_one_job(denv: Env, folders: tuple[Path, Path]) -> None:
    inbox, done = folders
    write_config(
        denv,
        {"path": str(inbox), "settle": QUICK_SETTLE, "after": "move", "move_to": str(done), "unique": "name"},
    )
    with running(denv) as d:
        (inbox / "report.pdf").write_bytes(b"first")
        job_id = d.wait_log(ENQUEUED_LINE)[0].group(2)
        assert (done / "report.pdf").read_bytes() == b"first"
        (inbox / "report.pdf").write_bytes(b"second, another upload of the same name")
        refused = d.wait_log(REFUSED_LINE)[0]
        log = d.log()
    assert job_id == unique_job_id(Queue.open(denv.queue_path).queue_id, f"inbox:{inbox}/report.pdf")
    assert refused.group(1) == "report.pdf"
    assert f"has the same name as job {job_id}, which is still in the queue (inbox.unique: name)" in refused.group(2)
    assert f"STEADQ_JOB_ID={job_id}" in refused.group(0)
    assert log.count("refused") == 1  # once, not once per event or per scan
    assert [j for j, _, _ in jobs(denv.queue_path)] == [job_id]
    # Left where it was: nothing lost, and its uploader sees it was not taken.
    assert (inbox / "report.pdf").read_bytes() == b"second, another upload of the same name"
    assert (done / "report.pdf").read_bytes() == b"first"


def test_with_identity_a_changed_file_makes_a_new_job_and_an_unchanged_one_does_not(
    denv: Env, folders: tuple[Path, Path]
) -> None:
    inbox, _ = folders
    write_config(
        denv,
        {"path": str(inbox), "settle": QUICK_SETTLE, "after": "delete", "payload": "content", "unique": "identity"},
    )
    with running(denv) as d:
        (inbox / "a.txt").write_bytes(b"one")
        os.utime(inbox / "a.txt", ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
        first = d.wait_log(ENQUEUED_LINE)[0].group(2)
        # The same file again (rsync -t keeps the mtime): a duplicate, refused and left in place.
        (inbox / "a.txt").write_bytes(b"one")
        os.utime(inbox / "a.txt", ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
        refused = d.wait_log(REFUSED_LINE)[0].group(2)
        assert f"same name, size and modification time as job {first}" in refused
        # Changed content (and mtime): a new key, a new job.
        (inbox / "a.txt").write_bytes(b"two, longer")
        second = d.wait_log(ENQUEUED_LINE, count=2)[1].group(2)
    assert second != first
    assert sorted(body for _, body, _ in jobs(denv.queue_path)) == [b"one", b"two, longer"]
    assert not (inbox / "a.txt").exists()


def test_off_keeps_taking_every_upload_of_a_name(denv: Env, folders: tuple[Path, Path]) -> None:
    inbox, done = folders
    write_config(denv, {"path": str(inbox), "settle": QUICK_SETTLE, "after": "move", "move_to": str(done)})
    with running(denv) as d:
        (inbox / "a.txt").write_bytes(b"1")
        d.wait_log(ENQUEUED_LINE)
        (inbox / "a.txt").write_bytes(b"2")
        d.wait_log(ENQUEUED_LINE, count=2)
    assert len(jobs(denv.queue_path)) == 2


CRASH_POINTS = ("_write_intent", "_place", "_enqueue", "_finish")


# A kept file is not moved before its enqueue: keep has no _place step to crash in.
@pytest.mark.parametrize(
    ("after", "point"),
    [
        (after, point)
        for after in ("move", "delete", "keep")
        for point in CRASH_POINTS
        if (after, point) != ("keep", "_place")
    ],
)
def test_a_crash_at_any_step_gives_one_job_with_the_key_s_id(
    queue: Queue, folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, after: str, point: str
) -> None:
    inbox, done = folders
    (inbox / "a.mkv").write_bytes(b"movie")
    options = {
        "after": after,
        "payload": "content",
        "move_to": str(done) if after == "move" else None,
        "unique": "name",
    }
    key_id = unique_job_id(queue.queue_id, f"inbox:{inbox}/a.mkv")
    original: Callable[..., object] = getattr(Folder, point)

    def crashing(self: Folder, *args: object) -> object:
        original(self, *args)
        raise Crash

    monkeypatch.setattr(Folder, point, crashing)
    with pytest.raises(Crash):
        take(folder_for(inbox, queue, **options), "a.mkv")
    monkeypatch.setattr(Folder, point, original)
    if point != "_finish" or after != "keep":
        # What was written down before the enqueue: the key's id and the key.
        records = [n for n in os.listdir(inbox / STATE_DIR) if n.endswith(".intent")]
        if records:
            assert records == [f"{key_id}.intent"]
            record = json.loads((inbox / STATE_DIR / records[0]).read_bytes())
            assert record["unique"] == f"inbox:{inbox}/a.mkv"

    restarted = folder_for(inbox, queue, **options)
    for intent in restarted.pending_intents():
        assert isinstance(intent, Intent) and intent.job_id == key_id
        assert restarted.resolve(intent).outcome in (ENQUEUED, DONE_BEFORE)
    found = drain_jobs(queue)
    assert [(j, body) for j, body, _ in found] == [(key_id, b"movie")]
    # The same name dropped again after the restart is the key's duplicate.
    if after != "keep":
        (inbox / "a.mkv").write_bytes(b"movie")
    st, _ = restarted.look("a.mkv")
    assert st is not None
    if restarted.already_kept(st) is None:
        result = restarted.take("a.mkv", st)
        assert (result.outcome, result.job_id) == (REFUSED, key_id)
    assert (inbox / "a.mkv").exists()
    assert [n for n in os.listdir(inbox / STATE_DIR) if not n.endswith(".kept")] == []


def test_a_producer_taking_the_key_between_the_look_and_the_enqueue_gets_the_file_refused_and_put_back(
    queue: Queue, folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox, done = folders
    (inbox / "a.mkv").write_bytes(b"movie")
    folder = folder_for(inbox, queue, after="move", move_to=str(done), unique="name")
    key = unique_key(folder.config, "a.mkv", 0, 0)
    assert key == f"inbox:{inbox}/a.mkv"
    original = Folder._enqueue

    def racing(self: Folder, *args: object) -> None:
        queue.enqueue(b"from steadq put --unique", unique=key)
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Folder, "_enqueue", racing)
    result = take(folder, "a.mkv")
    assert result.outcome == REFUSED and result.job_id == unique_job_id(queue.queue_id, key)
    assert "it was left in place" in result.reason
    assert (inbox / "a.mkv").read_bytes() == b"movie" and not (done / "a.mkv").exists()
    assert [body for _, body, _ in drain_jobs(queue)] == [b"from steadq put --unique"]
    assert os.listdir(inbox / STATE_DIR) == []


def test_a_record_with_a_key_that_is_not_text_is_refused() -> None:
    job_id = "0" * 32
    base = {"job_id": job_id, "name": "a", "ino": 1, "size": 1, "mtime_ns": 1, "dest": None}
    assert Intent.from_json(json.dumps(base).encode(), f"{job_id}.intent").unique is None
    for bad in (7, "k" * 1025, "a\0b"):
        with pytest.raises(ValueError, match="unique key"):
            Intent.from_json(json.dumps({**base, "unique": bad}).encode(), f"{job_id}.intent")
