"""The watch folder's per-file protocol in process (steadqd/daemon/inbox/files.py).

A crash can stop the protocol between any two of its steps; every test here
stops it at one of them (an exception no handler catches, as SIGKILL would),
starts over with a new ``Folder`` on the same directories, and checks that the
file became exactly one job, with the id written in its intent. The SIGKILL
test of the real daemon is in test_inbox_kill.py.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.backend import new_job_id
from steadqd.daemon.config import InboxConfig
from steadqd.daemon.inbox.files import DONE_BEFORE, ENQUEUED, LATER, REFUSED, Folder
from steadqd.daemon.inbox.intent import STATE_DIR, Intent, Unreadable
from steadqd.errors import ErrorKind, InvalidInput, NotCommitted


class Crash(BaseException):
    """Stands for SIGKILL: nothing in the protocol catches it."""


def drain_jobs(q: Queue) -> list[tuple[str, bytes, dict]]:
    """(job id, payload, metadata) of every ready job; leases them all."""
    out = []
    while (lease := q.lease(duration=60)) is not None:
        out.append((lease.job_id, q.read_payload(lease), dict(lease.metadata)))
    return out


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    inbox, done = tmp_path / "inbox", tmp_path / "done"
    inbox.mkdir()
    done.mkdir()
    return inbox, done


def folder_for(inbox: Path, q: Queue, retention: float = 3600.0, **config: object) -> Folder:
    return Folder(InboxConfig(path=str(inbox), settle=0.0, **config), q, retention)  # type: ignore[arg-type]


def take(folder: Folder, name: str):
    st, why = folder.look(name)
    assert st is not None, why
    return folder.take(name, st)


def test_a_chosen_job_id_is_the_published_id_and_is_found_by_inspect(queue: Queue) -> None:
    job_id = new_job_id()
    assert queue.enqueue(b"x", job_id=job_id) == job_id
    assert [o.state.value for o in queue.inspect(job_id)] == ["ready"]


def test_a_malformed_chosen_job_id_is_refused_naming_it(queue: Queue) -> None:
    with pytest.raises(InvalidInput, match="'ABC'.*32 lowercase hex"):
        queue.enqueue(b"x", job_id="ABC")
    assert drain_jobs(queue) == []


@pytest.mark.parametrize(
    ("after", "payload"), [("move", "path"), ("move", "content"), ("delete", "content"), ("keep", "path")]
)
def test_a_file_becomes_one_job_and_then_is_kept_moved_or_deleted(
    queue: Queue, dirs: tuple[Path, Path], after: str, payload: str
) -> None:
    inbox, done = dirs
    (inbox / "a.mkv").write_bytes(b"movie")
    folder = folder_for(inbox, queue, after=after, payload=payload, move_to=str(done) if after == "move" else None)
    result = take(folder, "a.mkv")
    assert result.outcome == ENQUEUED
    [(job_id, body, meta)] = drain_jobs(queue)
    assert job_id == result.job_id
    assert meta["inbox_file"] == "a.mkv"
    where = {"move": done / "a.mkv", "keep": inbox / "a.mkv"}.get(after)
    assert body == (b"movie" if payload == "content" else os.fsencode(str(where)))
    assert (inbox / "a.mkv").exists() == (after == "keep")
    assert (done / "a.mkv").exists() == (after == "move")
    left = sorted(os.listdir(inbox / STATE_DIR))
    assert left == ([f"{job_id}.kept"] if after == "keep" else [])


def test_a_kept_file_is_known_on_the_next_start_and_a_rewritten_one_is_new(
    queue: Queue, dirs: tuple[Path, Path]
) -> None:
    inbox, _ = dirs
    (inbox / "a.mkv").write_bytes(b"one")
    assert take(folder_for(inbox, queue), "a.mkv").outcome == ENQUEUED
    again = folder_for(inbox, queue)
    assert again.pending_intents() == []
    st, _ = again.look("a.mkv")
    assert st is not None and again.already_kept(st) is not None
    os.utime(inbox / "a.mkv", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    st, _ = again.look("a.mkv")
    assert st is not None and again.already_kept(st) is None
    assert take(again, "a.mkv").outcome == ENQUEUED
    assert len(drain_jobs(queue)) == 2
    assert len(os.listdir(inbox / STATE_DIR)) == 1  # the older record was replaced


CRASH_POINTS = ("_write_intent", "_place", "_enqueue", "_finish")


@pytest.mark.parametrize(
    ("after", "point"),
    # A kept file is not moved before its enqueue: it has no _place step.
    [(a, p) for a in ("move", "delete", "keep") for p in CRASH_POINTS if (a, p) != ("keep", "_place")],
)
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_at_any_step_still_gives_exactly_one_job(
    queue: Queue, dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, after: str, point: str, when: str
) -> None:
    inbox, done = dirs
    (inbox / "a.mkv").write_bytes(b"movie")
    options = {"after": after, "payload": "content", "move_to": str(done) if after == "move" else None}
    original: Callable[..., object] = getattr(Folder, point)

    def crashing(self: Folder, *args: object) -> object:
        if when == "before":
            raise Crash
        original(self, *args)
        raise Crash

    monkeypatch.setattr(Folder, point, crashing)
    with pytest.raises(Crash):
        take(folder_for(inbox, queue, **options), "a.mkv")
    monkeypatch.setattr(Folder, point, original)

    restarted = folder_for(inbox, queue, **options)
    for intent in restarted.pending_intents():
        assert isinstance(intent, Intent)
        assert restarted.resolve(intent).outcome in (ENQUEUED, DONE_BEFORE)
    # What a restart's scan then finds in the folder is taken as usual.
    if (inbox / "a.mkv").exists():
        st, _ = restarted.look("a.mkv")
        assert st is not None
        if restarted.already_kept(st) is None:
            assert restarted.take("a.mkv", st).outcome == ENQUEUED
    jobs = drain_jobs(queue)
    assert [body for _, body, _ in jobs] == [b"movie"]
    assert (inbox / "a.mkv").exists() == (after == "keep")
    assert (done / "a.mkv").exists() == (after == "move")
    assert [n for n in os.listdir(inbox / STATE_DIR) if not n.endswith(".kept")] == []


def test_an_intent_older_than_the_retention_is_not_enqueued_again(queue: Queue, dirs: tuple[Path, Path]) -> None:
    inbox, done = dirs
    (inbox / "a.mkv").write_bytes(b"movie")
    folder = folder_for(inbox, queue, retention=60.0, after="move", move_to=str(done))
    st, _ = folder.look("a.mkv")
    assert st is not None
    intent = Intent(new_job_id(), "a.mkv", st.st_ino, st.st_size, st.st_mtime_ns, "a.mkv")
    folder._write_intent(intent)
    old = time.time() - 120
    os.utime(inbox / STATE_DIR / f"{intent.job_id}.intent", (old, old))
    result = folder.resolve(intent)
    assert result.outcome == REFUSED
    assert "put the file back" in result.reason and f"{intent.job_id}.unresolved" in result.reason
    assert drain_jobs(queue) == []
    assert (inbox / "a.mkv").exists()  # never deleted on this path
    assert os.listdir(inbox / STATE_DIR) == [f"{intent.job_id}.unresolved"]


def test_an_intent_cut_short_is_reported_by_name(queue: Queue, dirs: tuple[Path, Path]) -> None:
    inbox, _ = dirs
    folder = folder_for(inbox, queue)
    (inbox / STATE_DIR / f"{new_job_id()}.intent").write_bytes(b'{"job_id": "')
    [entry] = folder.pending_intents()
    assert isinstance(entry, Unreadable) and entry.cut_short and entry.entry.endswith(".intent")


def _link_from_outside(p: Path) -> None:
    outside = p.parent.parent / "outside"
    outside.write_bytes(b"x")
    os.link(outside, p)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: os.symlink("/etc/passwd", p), "symbolic link"),
        (lambda p: os.mkfifo(p), "FIFO"),
        (lambda p: os.mkdir(p), "directory"),
        (_link_from_outside, "hard links"),
    ],
)
def test_what_is_not_a_regular_file_of_the_folder_is_refused(
    queue: Queue, dirs: tuple[Path, Path], make: Callable[[Path], object], reason: str
) -> None:
    inbox, _ = dirs
    make(inbox / "x.mkv")
    st, why = folder_for(inbox, queue).look("x.mkv")
    assert st is None and reason in why
    assert drain_jobs(queue) == []


def test_move_to_on_another_filesystem_is_refused_at_start(queue: Queue, dirs: tuple[Path, Path]) -> None:
    inbox, _ = dirs
    with pytest.raises(InvalidInput, match="another filesystem.*same filesystem"):
        folder_for(inbox, queue, after="move", move_to="/dev/shm")


def test_a_missing_folder_is_named(queue: Queue, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=f"inbox.path {tmp_path}/nope does not exist"):
        folder_for(tmp_path / "nope", queue)


def test_a_file_larger_than_the_queue_allows_is_refused_and_left_where_it_was(
    make_queue: Callable[..., Queue], dirs: tuple[Path, Path]
) -> None:
    q = make_queue(max_payload_length=10)
    inbox, done = dirs
    (inbox / "big.mkv").write_bytes(b"x" * 11)
    result = take(folder_for(inbox, q, payload="content", after="move", move_to=str(done)), "big.mkv")
    assert result.outcome == REFUSED
    assert "exceeds the queue maximum of 10" in result.reason
    assert (inbox / "big.mkv").read_bytes() == b"x" * 11 and os.listdir(done) == []
    assert os.listdir(inbox / STATE_DIR) == [] and drain_jobs(q) == []


def test_a_queue_that_cannot_take_the_job_now_leaves_the_file_to_be_tried_again(
    queue: Queue, dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox, done = dirs
    (inbox / "a.mkv").write_bytes(b"movie")
    folder = folder_for(inbox, queue, after="move", move_to=str(done))

    def full(*_args: object, **_kw: object) -> str:
        raise NotCommitted("enqueue: no space left on device", ErrorKind.RESOURCE_EXHAUSTED)

    monkeypatch.setattr(queue, "enqueue", full)
    result = take(folder, "a.mkv")
    assert result.outcome == LATER and "no space left" in result.reason
    assert (inbox / "a.mkv").exists() and os.listdir(done) == [] and os.listdir(inbox / STATE_DIR) == []
    monkeypatch.undo()
    assert take(folder, "a.mkv").outcome == ENQUEUED
    assert len(drain_jobs(queue)) == 1


def test_a_name_that_is_not_utf8_survives_a_crash_and_reaches_the_job_as_bytes(
    queue: Queue, dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox, done = dirs
    raw = b"caf\xe9.mkv"  # Latin-1, as an old Samba share may write it
    with open(os.path.join(os.fsencode(inbox), raw), "wb") as f:
        f.write(b"movie")
    name = os.fsdecode(raw)
    original = Folder._enqueue

    def crash(self: Folder, *args: object) -> None:
        raise Crash

    monkeypatch.setattr(Folder, "_enqueue", crash)
    with pytest.raises(Crash):
        take(folder_for(inbox, queue, after="move", move_to=str(done)), name)
    monkeypatch.setattr(Folder, "_enqueue", original)
    restarted = folder_for(inbox, queue, after="move", move_to=str(done))
    [intent] = restarted.pending_intents()
    assert isinstance(intent, Intent) and intent.name == name
    assert restarted.resolve(intent).outcome == ENQUEUED
    [(_, payload, meta)] = drain_jobs(queue)
    assert payload == os.fsencode(str(done)) + b"/" + raw and meta["inbox_file"] == raw


def test_an_intent_never_renamed_into_place_is_removed_at_start(queue: Queue, dirs: tuple[Path, Path]) -> None:
    """Intents are written under a temporary name and renamed whole: one a SIGKILL left is nothing."""
    inbox, _ = dirs
    folder_for(inbox, queue).close()
    (inbox / STATE_DIR / f".{new_job_id()}.intent.tmp").write_bytes(b'{"job_id": "')
    folder = folder_for(inbox, queue)
    assert folder.pending_intents() == []
    assert os.listdir(inbox / STATE_DIR) == []


@pytest.mark.parametrize("stem", ["a" * 246, "é" * 123, "a" * 251], ids=["ascii", "utf8", "longest"])
def test_a_long_name_already_in_move_to_is_shortened_keeping_its_extension(
    queue: Queue, dirs: tuple[Path, Path], stem: str
) -> None:
    """With the job id's 8 digits in front, a name of 247+ bytes would be longer than a name may
    be (ENAMETOOLONG) and was tried again every 5 s forever: it is shortened instead."""
    inbox, done = dirs
    name = stem + ".mkv"
    (inbox / name).write_bytes(b"new")
    (done / name).write_bytes(b"older")
    folder = folder_for(inbox, queue, after="move", payload="path", move_to=str(done))
    result = take(folder, name)
    assert result.outcome == ENQUEUED, result
    [moved] = [n for n in os.listdir(done) if n != name]
    assert moved.startswith(f"{result.job_id[:8]}-") and moved.endswith(".mkv")
    assert len(os.fsencode(moved)) <= 255 and moved.encode("utf-8")  # whole characters only
    assert (done / moved).read_bytes() == b"new" and (done / name).read_bytes() == b"older"
    [(_, body, _)] = drain_jobs(queue)
    assert body == os.fsencode(str(done / moved))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to bind-mount")
def test_a_file_mounted_over_a_name_of_the_folder_is_refused(queue: Queue, dirs: tuple[Path, Path]) -> None:
    """A bind mount of a file from another filesystem is not a file of the folder."""
    inbox, _ = dirs
    target = inbox / "x.mkv"
    target.write_bytes(b"placeholder")
    with tempfile.NamedTemporaryFile(dir="/dev/shm") as other:
        subprocess.run(["mount", "--bind", other.name, str(target)], check=True, timeout=30)
        try:
            st, why = folder_for(inbox, queue).look("x.mkv")
        finally:
            subprocess.run(["umount", str(target)], check=True, timeout=30)
    assert st is None and "another filesystem" in why


def test_a_state_directory_that_is_a_symbolic_link_is_refused(queue: Queue, dirs: tuple[Path, Path]) -> None:
    """Even to a directory of the daemon's own (0700): its records would belong to another folder."""
    inbox, _ = dirs
    elsewhere = inbox.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, inbox / STATE_DIR)
    with pytest.raises(InvalidInput, match=f"{STATE_DIR} must be a directory of the daemon"):
        folder_for(inbox, queue)
