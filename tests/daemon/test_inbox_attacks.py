"""Attacks on a watch folder by a member of its group, against the daemon running as root.

The folder is ``2770`` (or ``3770``) root:group, as docs/operations.md sets it up, so any member
of the group can create, rename and remove entries in it: here a real other uid in that group,
forked with ``as_user``. Each test reproduces what issue 30 saw and checks that the daemon now
refuses it and that the files outside the folder are untouched.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from steadqd.daemon.inbox.intent import STATE_DIR
from tests.daemon.conftest import Daemon, Env
from tests.daemon.test_inbox import jobs, running, write_config
from tests.integration.test_shared_queue import QUEUE_GID, as_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a member of the folder's group")

MEMBER = (54324, 54324)
JOB_ID = "0123456789abcdef0123456789abcdef"
SECRET = b"root-only secret\n"


@pytest.fixture
def place() -> Iterator[dict[str, Path]]:
    """A group-writable folder, a root-owned 0755 directory beside it (think /etc/profile.d) with a
    0600 secret and a 0644 file in it, and a move_to folder of the daemon.

    Not under pytest's tmp_path: every pytest session sets /tmp/pytest-of-root back to 0700,
    and the member must reach the folder whatever other sessions run meanwhile.
    """
    top = Path(tempfile.mkdtemp(prefix="steadq-inbox-attack-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        yield _place(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _place(tmp_path: Path) -> dict[str, Path]:
    inbox, rootdir, done = tmp_path / "inbox", tmp_path / "rootdir", tmp_path / "done"
    for d in (inbox, rootdir, done):
        d.mkdir()
    os.chown(inbox, 0, QUEUE_GID)
    os.chmod(inbox, 0o2770)
    os.chmod(rootdir, 0o755)
    (rootdir / "secret").write_bytes(SECRET)
    os.chmod(rootdir / "secret", 0o600)
    (rootdir / "victim").write_bytes(b"root's file\n")
    os.chmod(rootdir / "victim", 0o644)
    return {"inbox": inbox, "rootdir": rootdir, "done": done}


def record(path: str, dest: str | None, job_id: str = JOB_ID) -> dict[str, object]:
    st = os.stat(path)
    return {
        "job_id": job_id,
        "name": path,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "dest": dest,
    }


def plant(inbox: Path, make: Callable[[], dict[str, object]], *, rename_away: bool) -> None:
    """As the member: take the daemon's state directory away (or be first) and plant an intent."""

    def attack() -> None:
        try:
            steps()
        except PermissionError as e:  # not a refusal the test expects: show it
            raise AssertionError(f"the member could not plant: {e}") from e

    def steps() -> None:
        if rename_away:
            os.rename(inbox / STATE_DIR, inbox / "old-state")
        os.mkdir(inbox / STATE_DIR, 0o700)
        rec = make()
        (inbox / STATE_DIR / f"{rec['job_id']}.intent").write_bytes(json.dumps(rec).encode())

    assert as_user(MEMBER, attack) == "ok"


def first_run(denv: Env) -> None:
    """One clean run, so the state directory is the daemon's before the member strikes."""
    with running(denv):
        pass


def refused_at_start(denv: Env, inbox: Path) -> str:
    d = Daemon(denv, "inbox")
    try:
        assert d.wait() == 78, d.log()
    finally:
        d.stop()
    log = d.log()
    assert f"cannot start: watch folder state {inbox}/{STATE_DIR} is owned by uid {MEMBER[0]}" in log, log
    assert "chmod +t" in log and "not trusted" in log, log
    return log


@pytest.mark.parametrize("rename_away", [False, True], ids=["planted-first", "renamed-away"])
def test_a_planted_intent_cannot_make_a_root_only_file_a_job(
    denv: Env, place: dict[str, Path], rename_away: bool
) -> None:
    inbox, secret = place["inbox"], place["rootdir"] / "secret"
    write_config(denv, {"path": str(inbox), "settle": "0.1s", "payload": "content", "after": "delete"})
    if rename_away:
        first_run(denv)
    plant(inbox, lambda: record(str(secret), f"{JOB_ID}.file"), rename_away=rename_away)
    refused_at_start(denv, inbox)
    assert all(body != SECRET for _, body, _ in jobs(denv.queue_path))
    assert secret.read_bytes() == SECRET and os.stat(secret).st_uid == 0


@pytest.mark.parametrize("rename_away", [False, True], ids=["planted-first", "renamed-away"])
def test_a_planted_intent_cannot_move_and_unlink_a_root_file(
    denv: Env, place: dict[str, Path], rename_away: bool
) -> None:
    inbox, victim = place["inbox"], place["rootdir"] / "victim"
    write_config(denv, {"path": str(inbox), "settle": "0.1s", "payload": "content", "after": "delete"})
    if rename_away:
        first_run(denv)
    plant(inbox, lambda: record(str(victim), f"{JOB_ID}.file"), rename_away=rename_away)
    refused_at_start(denv, inbox)
    assert victim.read_bytes() == b"root's file\n"
    assert jobs(denv.queue_path) == []


@pytest.mark.parametrize("rename_away", [False, True], ids=["planted-first", "renamed-away"])
def test_a_planted_intent_cannot_move_the_members_script_into_a_root_directory(
    denv: Env, place: dict[str, Path], rename_away: bool
) -> None:
    inbox, rootdir, done = place["inbox"], place["rootdir"], place["done"]
    write_config(
        denv, {"path": str(inbox), "pattern": "*.mkv", "settle": "0.1s", "after": "move", "move_to": str(done)}
    )
    if rename_away:
        first_run(denv)

    def make() -> dict[str, object]:
        script = inbox / "evil.sh"  # not matched by the pattern: only the record would act on it
        script.write_bytes(b"#!/bin/sh\necho owned\n")
        rec = record(str(script), str(rootdir / "evil.sh"))
        rec["name"] = "evil.sh"
        return rec

    plant(inbox, make, rename_away=rename_away)
    refused_at_start(denv, inbox)
    assert sorted(os.listdir(rootdir)) == ["secret", "victim"]
    assert (inbox / "evil.sh").exists() and jobs(denv.queue_path) == []


def test_a_member_cannot_lose_the_ledger_of_kept_files(denv: Env, place: dict[str, Path]) -> None:
    """``after: keep`` remembers kept files in the state directory: renamed away, every kept file
    would become a job again. The daemon refuses a folder where a member could do that, and with
    the sticky bit the rename itself is refused by the kernel."""
    inbox = place["inbox"]
    write_config(denv, {"path": str(inbox), "settle": "0.1s", "payload": "content", "after": "keep"})
    (inbox / "a.dat").write_bytes(b"kept")
    d = Daemon(denv, "inbox")
    try:
        assert d.wait() == 78, d.log()
    finally:
        d.stop()
    assert f"{inbox} is writable by its group without the sticky bit" in d.log() and "chmod +t" in d.log()
    assert jobs(denv.queue_path) == []

    os.chmod(inbox, 0o3770)
    with running(denv) as d:
        d.wait_log(r"a\.dat enqueued as job")
    assert len(jobs(denv.queue_path)) == 1

    def rename_away() -> None:
        with pytest.raises(PermissionError) as refused:
            os.rename(inbox / STATE_DIR, inbox / "old-state")
        assert refused.value.errno == errno.EPERM  # the sticky bit: not the member's entry

    assert as_user(MEMBER, rename_away) == "ok"
    with running(denv) as d:
        (inbox / "b.dat").write_bytes(b"new")
        d.wait_log(r"b\.dat enqueued as job")
    assert [body for _, body, _ in jobs(denv.queue_path)] == [b"new"]  # a.dat was not taken again


def test_a_record_naming_anything_but_one_entry_of_the_folder_is_refused_and_set_aside(
    denv: Env, place: dict[str, Path]
) -> None:
    """Records in the daemon's own (verified) directory are still checked: a name or dest that is
    not one plain entry of the folder is never acted on."""
    inbox, rootdir, done = place["inbox"], place["rootdir"], place["done"]
    os.chmod(inbox, 0o3770)
    write_config(
        denv, {"path": str(inbox), "pattern": "*.mkv", "settle": "0.1s", "after": "move", "move_to": str(done)}
    )
    first_run(denv)
    (inbox / "x.mkv").write_bytes(b"x")
    os.chmod(inbox / "x.mkv", 0o640)
    bad = {
        "1" * 32: record(str(rootdir / "victim"), "victim"),
        "2" * 32: {**record(str(inbox / "x.mkv"), "../rootdir/x.mkv"), "name": "x.mkv"},
        "3" * 32: {**record(str(inbox / "x.mkv"), str(rootdir / "x.mkv")), "name": "x.mkv"},
        "4" * 32: {**record(str(inbox / "x.mkv"), "x.mkv"), "name": ".."},
        "5" * 32: {**record(str(inbox / "x.mkv"), "a\0b"), "name": "x.mkv"},
        "6" * 32: {**record(str(inbox / "x.mkv"), ""), "name": "x.mkv"},
        "7" * 32: {**record(str(inbox / "x.mkv"), "x.mkv"), "name": STATE_DIR},
        "8" * 32: {**record(str(inbox / "x.mkv"), "x.mkv"), "name": "x.mkv", "job_id": "ABC"},
    }
    for job_id, rec in bad.items():
        if rec["job_id"] != "ABC":
            rec["job_id"] = job_id
        (inbox / STATE_DIR / f"{job_id}.intent").write_bytes(json.dumps(rec).encode())
    with running(denv) as d:
        d.wait_log(r"refused and set aside", count=len(bad))
        d.wait_log(r"x\.mkv enqueued as job")  # the file itself is taken the normal way, once
    log = d.log()
    assert "a\\x00b" in log  # escaped, never raw
    assert sorted(os.listdir(rootdir)) == ["secret", "victim"]
    assert (rootdir / "victim").read_bytes() == b"root's file\n"
    assert os.listdir(done) == ["x.mkv"] and len(jobs(denv.queue_path)) == 1
    left = sorted(os.listdir(inbox / STATE_DIR))
    assert left == sorted(f"{j}.intent.invalid" for j in bad), left


# The daemon without root's power to read any file, and in the folder's group, as the `steadq` user
# is (the interpreter of this test run lives under /root, so a real other uid could not start it).
NOT_ROOT = ("setpriv", f"--groups={QUEUE_GID}", "--bounding-set=-dac_override,-dac_read_search", "--")


def test_a_file_the_daemon_cannot_read_is_refused_and_the_folder_goes_on(denv: Env, place: dict[str, Path]) -> None:
    inbox = place["inbox"]
    os.chmod(inbox, 0o3770)
    write_config(denv, {"path": str(inbox), "settle": "0.1s", "payload": "content", "after": "delete"})

    def upload(name: str, body: bytes, umask: int) -> Callable[[], None]:
        def go() -> None:
            os.umask(umask)
            (inbox / name).write_bytes(body)

        return go

    assert as_user(MEMBER, upload("private.dat", b"mine", 0o077)) == "ok"  # 0600, the member's
    for run in range(2):  # and again after a restart: nothing piles up
        d = Daemon(denv, "inbox", wrapper=NOT_ROOT)
        try:
            d.wait_log(r"private\.dat refused: it cannot be read by the daemon's user")
            assert as_user(MEMBER, upload(f"open{run}.dat", b"open%d" % run, 0o007)) == "ok"
            d.wait_log(rf"open{run}\.dat enqueued as job")
            assert "stopped" not in d.log()
        finally:
            d.stop()
        assert d.log().count("private.dat refused") == 1
        assert os.listdir(inbox / STATE_DIR) == []
    assert sorted(body for _, body, _ in jobs(denv.queue_path)) == [b"open0", b"open1"]
    assert (inbox / "private.dat").read_bytes() == b"mine"


def test_payload_path_is_never_a_path_a_member_can_redirect(denv: Env, place: dict[str, Path]) -> None:
    """A job given a path in a folder the member may write reads whatever the member puts there
    after intake (a symbolic link to a root-only file): such a folder is refused for
    ``payload: path``; a ``move_to`` only the daemon writes is where the job's path points."""
    inbox, done, secret = place["inbox"], place["done"], place["rootdir"] / "secret"
    os.chmod(inbox, 0o3770)
    os.chown(done, 0, QUEUE_GID)
    os.chmod(done, 0o2770)  # the members' share, where they pick up what was taken
    config = {"path": str(inbox), "pattern": "*.mkv", "settle": "0.1s", "payload": "path", "after": "move"}
    write_config(denv, {**config, "move_to": str(done)})
    d = Daemon(denv, "inbox")
    try:
        assert d.wait() == 78, d.log()
    finally:
        d.stop()
    assert f"payload: path would hand jobs paths in {done}, which is writable by its group" in d.log()
    write_config(denv, {"path": str(inbox), "settle": "0.1s", "payload": "path", "after": "keep"})
    d = Daemon(denv, "inbox")
    try:
        assert d.wait() == 78, d.log()
    finally:
        d.stop()
    assert f"payload: path would hand jobs paths in {inbox}, which is writable by its group" in d.log()

    os.chmod(done, 0o2750)  # readable by the group, written by the daemon only
    write_config(denv, {**config, "move_to": str(done)})
    assert as_user(MEMBER, lambda: (inbox / "x.mkv").write_bytes(b"the member's movie")) == "ok"
    with running(denv) as d:
        d.wait_log(r"x\.mkv enqueued as job")

    def redirect() -> None:
        with pytest.raises(PermissionError):
            os.unlink(done / "x.mkv")
        with pytest.raises(PermissionError):
            os.symlink(secret, done / "y.mkv")

    assert as_user(MEMBER, redirect) == "ok"
    [(_, path, _)] = jobs(denv.queue_path)
    assert Path(os.fsdecode(path)).read_bytes() == b"the member's movie"  # what the job's `cp` would copy
