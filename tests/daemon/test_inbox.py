"""Watch folders as the daemon runs them: `steadqd inbox|run|worker QUEUE` as real subprocesses.

What arrives in the folder comes from this test process through the kernel
(writes, renames, links), so inotify sees exactly what a NAS upload would
produce. Every wait is a deadline on a fact (a log line, a job, a file).
The protocol's crash points are in test_inbox_ledger.py, SIGKILLs in
test_inbox_kill.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from steadqd import Queue
from tests.daemon.conftest import Daemon, Env, wait_for

QUICK_SETTLE = "0.3s"


def write_config(env: Env, inbox: dict[str, Any], worker: dict[str, Any] | None = None) -> None:
    doc: dict[str, Any] = {"queue": env.queue_path, "inbox": inbox}
    if worker is not None:
        doc["worker"] = worker
    path = env.config_dir / f"{env.name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def jobs(queue_path: str) -> list[tuple[str, bytes, dict[str, Any]]]:
    """(id, payload, metadata) of every ready job, leased for a minute (the test's view)."""
    out = []
    with Queue.open(queue_path) as q:
        while (lease := q.lease(duration=60)) is not None:
            out.append((lease.job_id, q.read_payload(lease), dict(lease.metadata)))
    return out


def ready_count(queue_path: str) -> int:
    with Queue.open(queue_path) as q:
        return int(q.stats()["ready"].objects)


@contextlib.contextmanager
def running(env: Env, role: str = "inbox") -> Iterator[Daemon]:
    d = Daemon(env, role)
    try:
        d.wait_log(rf"^<5>{role}\[{env.name}\]: started")
        yield d
    finally:
        d.stop()


@pytest.fixture
def tmp_path(fast_tmp_path: Path) -> Path:
    """The session's RAM-backed ext4 (tests/conftest.py): the daemon's fsyncs for the 10,000-file burst
    reach no disk (60 s instead of 112 s); inotify and the queue see the same ext4 as on /tmp."""
    return fast_tmp_path


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    inbox, done = tmp_path / "inbox", tmp_path / "done"
    inbox.mkdir()
    done.mkdir()
    return inbox, done


def test_files_there_at_start_written_or_moved_in_become_one_job_each(denv: Env, folders: tuple[Path, Path]) -> None:
    inbox, done = folders
    write_config(
        denv, {"path": str(inbox), "pattern": "*.mkv", "settle": QUICK_SETTLE, "after": "move", "move_to": str(done)}
    )
    (inbox / "before.mkv").write_bytes(b"1")
    (inbox / "notes.txt").write_bytes(b"not matched")
    staging = denv.tmp / "staging.mkv"
    with running(denv) as d:
        (inbox / "written.mkv").write_bytes(b"2")
        staging.write_bytes(b"3")
        os.rename(staging, inbox / "moved.mkv")
        lines = d.wait_log(r"^<5>inbox\[testq\]: watch folder: (\S+) enqueued as job ([0-9a-f]{32})", count=3)
    found = jobs(denv.queue_path)
    assert sorted(m.group(1) for m in lines) == ["before.mkv", "moved.mkv", "written.mkv"]
    assert {m.group(2) for m in lines} == {j for j, _, _ in found}
    assert sorted(p for _, p, _ in found) == sorted(
        os.fsencode(str(done / n)) for n in ("before.mkv", "moved.mkv", "written.mkv")
    )
    assert sorted(os.listdir(done)) == ["before.mkv", "moved.mkv", "written.mkv"]
    assert sorted(os.listdir(inbox)) == [".steadq-inbox", "notes.txt"]
    assert "STEADQ_JOB_ID=" in lines[0].string and "STEADQ_INBOX_FILE=" in lines[0].string


def test_a_file_written_in_pieces_becomes_a_job_only_once_complete(denv: Env, folders: tuple[Path, Path]) -> None:
    inbox, _ = folders
    write_config(denv, {"path": str(inbox), "settle": "3s", "payload": "content", "after": "delete"})
    pieces = [bytes([65 + i]) * 1000 for i in range(8)]
    with running(denv) as d:
        with open(inbox / "upload.bin", "wb") as f:  # open, never closed yet: not a candidate at all
            for piece in pieces[:4]:
                f.write(piece)
                f.flush()
                time.sleep(0.1)
            assert ready_count(denv.queue_path) == 0
        for piece in pieces[4:]:  # closed and reopened: each write starts the settle time again
            with open(inbox / "upload.bin", "ab") as f:
                f.write(piece)
            time.sleep(0.2)
        d.wait_log(r"upload.bin enqueued as job")
    [(_, payload, meta)] = jobs(denv.queue_path)
    assert payload == b"".join(pieces)
    assert meta["inbox_file"] == "upload.bin"
    assert os.listdir(inbox / ".steadq-inbox") == [] and not (inbox / "upload.bin").exists()


def test_a_file_renamed_in_half_written_is_taken_complete(denv: Env, folders: tuple[Path, Path]) -> None:
    inbox, _ = folders
    write_config(denv, {"path": str(inbox), "settle": "3s", "payload": "content", "after": "delete"})
    with running(denv) as d:
        with open(inbox / ".part", "wb") as f:  # hidden: never taken under this name
            f.write(b"a" * 5000)
            f.flush()
            os.rename(inbox / ".part", inbox / "video.mkv")  # moved in while still being written
            for _ in range(5):
                time.sleep(0.2)
                f.write(b"b" * 5000)
                f.flush()
        d.wait_log(r"video.mkv enqueued as job")
    [(_, payload, _)] = jobs(denv.queue_path)
    assert payload == b"a" * 5000 + b"b" * 25000


def test_links_fifos_folders_hard_links_are_refused_once_and_names_are_escaped(
    denv: Env, folders: tuple[Path, Path]
) -> None:
    inbox, _ = folders
    write_config(denv, {"path": str(inbox), "settle": QUICK_SETTLE})
    secret = denv.tmp / "secret"
    secret.write_bytes(b"outside")
    os.symlink(secret, inbox / "at-start-link")
    with running(denv) as d:
        os.symlink(secret, inbox / "link")
        os.mkfifo(inbox / "fifo")
        os.mkdir(inbox / "folder")
        os.link(secret, inbox / "hardlink")
        (inbox / "new\nline\x1b[31m").write_bytes(b"ok")
        d.wait_log(r"refused", count=5)
        d.wait_log(r"enqueued as job")
        d.signal(signal.SIGHUP)  # a reload is not a reason to refuse them again
        d.wait_log(r"reloaded configuration")
        log = d.log()
    for name, why in [
        ("at-start-link", "symbolic link"),
        ("link", "symbolic link"),
        ("fifo", "FIFO"),
        ("folder", "directory"),
        ("hardlink", "hard links"),
    ]:
        assert (
            log.count(f"watch folder: {name} refused: it is") + log.count(f"watch folder: {name} refused: it has") == 1
        ), (
            name,
            log,
        )
        assert why in log
    assert "new\\nline\\x1b[31m enqueued as job" in log
    [(_, payload, meta)] = jobs(denv.queue_path)
    assert payload == os.fsencode(str(inbox / "new\nline\x1b[31m")) and meta["inbox_file"] == "new\nline\x1b[31m"
    assert secret.read_bytes() == b"outside"


def test_run_takes_the_files_and_runs_their_jobs_and_a_producer_only_worker_just_watches(
    denv: Env, folders: tuple[Path, Path]
) -> None:
    inbox, done = folders
    inbox_cfg = {"path": str(inbox), "settle": QUICK_SETTLE, "after": "move", "move_to": str(done)}
    worker = {"command": ["/bin/sh", "-c", f'cat > "{denv.results}/$STEADQ_JOB_ID.path"'], "lease": "10s"}
    write_config(denv, inbox_cfg, worker)
    with running(denv, "run") as d:
        (inbox / "a.mkv").write_bytes(b"x")
        [m] = d.wait_log(r"a.mkv enqueued as job ([0-9a-f]{32})")
        out = denv.results / f"{m.group(1)}.path"
        wait_for(lambda: out.exists() and out.read_bytes(), what="the job to run")
        assert out.read_bytes() == os.fsencode(str(done / "a.mkv"))
    write_config(denv, inbox_cfg)  # no worker: section
    with running(denv, "worker") as d:
        (inbox / "b.mkv").write_bytes(b"y")
        d.wait_log(r"b.mkv enqueued as job")
        assert "roles=inbox" in d.log().replace("STEADQ_ROLES", "roles")
    assert len(jobs(denv.queue_path)) == 1


def test_sigterm_stops_the_watch_cleanly(denv: Env, folders: tuple[Path, Path]) -> None:
    inbox, _ = folders
    write_config(denv, {"path": str(inbox), "settle": QUICK_SETTLE})
    d = Daemon(denv, "inbox")
    try:
        d.wait_log(r"started")
        d.signal(signal.SIGTERM)
        assert d.wait() == 0
        d.wait_log(r"stopped")
    finally:
        d.stop()


def test_a_missing_folder_is_a_configuration_error_naming_it(denv: Env, tmp_path: Path) -> None:
    write_config(denv, {"path": str(tmp_path / "absent")})
    d = Daemon(denv, "inbox")
    try:
        assert d.wait() == 78
        assert f"inbox.path {tmp_path}/absent does not exist" in d.log()
    finally:
        d.stop()


@contextlib.contextmanager
def tmpfs(where: Path) -> Iterator[Path]:
    """A small tmpfs at ``where`` (root only), always unmounted again."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for the watch folder needs root")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], check=True, timeout=30)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False, timeout=30)


def test_a_folder_on_another_filesystem_than_the_queue(denv: Env, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "tmpfs") as mnt:
        inbox, done = mnt / "inbox", mnt / "done"
        inbox.mkdir()
        done.mkdir()
        assert os.stat(inbox).st_dev != os.stat(denv.queue_path).st_dev
        write_config(
            denv,
            {"path": str(inbox), "settle": QUICK_SETTLE, "payload": "content", "after": "move", "move_to": str(done)},
        )
        (inbox / "early.mkv").write_bytes(b"early")
        with running(denv) as d:
            (inbox / "late.mkv").write_bytes(b"late")
            d.wait_log(r"enqueued as job", count=2)
        assert sorted(p for _, p, _ in jobs(denv.queue_path)) == [b"early", b"late"]
        assert sorted(os.listdir(done)) == ["early.mkv", "late.mkv"]


def test_move_to_on_another_filesystem_is_refused_at_start(
    denv: Env, tmp_path: Path, folders: tuple[Path, Path]
) -> None:
    inbox, _ = folders
    with tmpfs(tmp_path / "tmpfs") as mnt:
        write_config(denv, {"path": str(inbox), "after": "move", "move_to": str(mnt)})
        d = Daemon(denv, "inbox")
        try:
            assert d.wait() == 78
            assert "is on another filesystem" in d.log()
        finally:
            d.stop()


BURST = 10_000


@pytest.mark.slow
def test_a_burst_of_ten_thousand_files_gives_ten_thousand_jobs(denv: Env, folders: tuple[Path, Path]) -> None:
    inbox, _ = folders
    write_config(denv, {"path": str(inbox), "settle": "0.2s", "payload": "content", "after": "delete"})
    with running(denv) as d:
        for i in range(BURST):
            (inbox / f"f{i:05}.dat").write_bytes(b"%d" % i)
        wait_for(lambda: ready_count(denv.queue_path) >= BURST, 600, "every file to become a job", every=1.0)
        wait_for(lambda: os.listdir(inbox) == [".steadq-inbox"], 60, "the folder to be empty")
        assert "refused" not in d.log()
    assert ready_count(denv.queue_path) == BURST
    assert os.listdir(inbox / ".steadq-inbox") == []
    payloads = sorted(int(p) for _, p, _ in jobs(denv.queue_path))
    assert payloads == list(range(BURST))


def test_a_file_still_open_for_writing_is_not_taken_however_long_it_is_idle(
    denv: Env, folders: tuple[Path, Path]
) -> None:
    """The kernel tells the file's owner (or root) whether anyone has a file open for writing."""
    if os.geteuid() != 0:
        pytest.skip("asking the kernel about another process's open file needs root or the file's owner")
    inbox, _ = folders
    write_config(denv, {"path": str(inbox), "settle": QUICK_SETTLE, "payload": "content", "after": "delete"})
    with running(denv) as d:
        (inbox / "slow.bin").write_bytes(b"first half ")  # closed after writing: a candidate
        with open(inbox / "slow.bin", "ab") as f:  # ... reopened at once by a stalled uploader
            d.wait_log(r"slow.bin is still open for writing")
            time.sleep(1.0)  # idle for more than three settle times: still not taken
            assert ready_count(denv.queue_path) == 0
            f.write(b"second half")
        d.wait_log(r"slow.bin enqueued as job")
    [(_, payload, _)] = jobs(denv.queue_path)
    assert payload == b"first half second half"


def test_a_flood_of_refusals_names_the_first_few_and_counts_the_rest(denv: Env, folders: tuple[Path, Path]) -> None:
    """Thousands of directories dropped in must not flood the journal (journald's rate limit would
    then hide real errors): the first ones are named, the rest counted in a summary line."""
    inbox, _ = folders
    write_config(denv, {"path": str(inbox), "settle": "0.1s", "payload": "content", "after": "delete"})
    for i in range(2000):
        (inbox / f"d{i:04}").mkdir()
    with running(denv) as d:
        (inbox / "last.dat").write_bytes(b"x")  # armed after every directory: taken after their refusals
        d.wait_log(r"last\.dat enqueued as job")
        d.signal(signal.SIGTERM)
        d.wait()
    log = d.log()
    assert log.count("refused: it is a directory") == 10, log
    assert "further refusals are counted" in log
    assert "1990 more files refused without a line each (2000 in all)" in log, log
