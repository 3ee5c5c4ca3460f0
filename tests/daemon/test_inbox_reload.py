"""A watch folder added by a reload, and a watch folder that cannot be watched (issue 33 #2).

`systemctl reload` after adding `inbox:` used to say "reloaded configuration" with
the folder not watched (the worker had no watch role to give it to); the next
restart then failed the whole worker with exit 78 on ".steadq-inbox: Read-only
file system", naming neither the folder nor the fix. A watch folder is an extra:
its problems are reported (journal, status) and the jobs keep running.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from steadqd import Queue
from tests.daemon.conftest import Daemon, Env


def write(env: Env, inbox: dict[str, Any] | None) -> None:
    doc: dict[str, Any] = {
        "queue": env.queue_path,
        "worker": {"command": env.command(), "concurrency": 1, "lease": "10s"},
    }
    if inbox is not None:
        doc["inbox"] = inbox
    path = env.config_dir / f"{env.name}.yaml"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.rename(path)


@contextlib.contextmanager
def worker(env: Env) -> Iterator[Daemon]:
    d = Daemon(env, "worker")
    try:
        d.ready()
        yield d
    finally:
        d.stop()


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` as a hardened unit without ReadWritePaths= for it sees it: a read-only mount."""
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_adding_a_watch_folder_and_reloading_watches_it(denv: Env, tmp_path: Path) -> None:
    folder = tmp_path / "drop"
    folder.mkdir()
    write(denv, None)
    with worker(denv) as d:
        write(denv, {"path": str(folder), "settle": "0.3s", "after": "delete", "payload": "content"})
        d.signal(signal.SIGHUP)
        d.wait_log(r"reloaded configuration")
        (folder / "a.txt").write_bytes(b'{"exit": 0}')
        d.wait_log(r"watch folder: a.txt enqueued as job")
        log = d.log()
    assert f"watching {folder}" in log


@pytest.mark.skipif(not Path("/proc/self/mountinfo").exists(), reason="needs mounts")
def test_a_folder_that_cannot_be_watched_is_reported_and_the_jobs_run(denv: Env, tmp_path: Path) -> None:
    folder = tmp_path / "drop"
    folder.mkdir()
    write(denv, {"path": str(folder), "settle": "0.3s", "after": "delete", "payload": "content"})
    with read_only(folder), worker(denv) as d:
        line = d.wait_log(r"^<3>worker\[testq\]: watch folder .*")[0].group(0)
        with Queue.open(denv.queue_path) as q:
            job = q.enqueue(b'{"exit": 0}')
        denv.result(job, 1)  # the worker runs jobs all the same
        assert d.proc.poll() is None
    # The whole path, the reason and the fix (the unit's writable paths).
    assert f"{folder}/.steadq-inbox" in line and "Read-only file system" in line, line
    assert f"ReadWritePaths={folder}" in line, line


def test_a_folder_that_cannot_be_watched_shows_in_status_and_fails_only_a_watch_alone(
    queue: Queue, queue_path: str, tmp_path: Path
) -> None:
    from steadqd.daemon.config import parse_config
    from steadqd.daemon.inbox.watch import InboxRole
    from steadqd.daemon.journal import Log
    from steadqd.daemon.service import Loop
    from steadqd.errors import InvalidInput

    missing = tmp_path / "missing"
    settings = parse_config(f"queue: {queue_path}\ninbox:\n  path: {missing}\n", path="q.yaml", name="q")
    role = InboxRole(settings, Log("worker", "q", journal=False, stream=io.StringIO()))
    role.start(Loop())
    assert role.status() == f"failed: {missing} not watched (see the journal)"
    missing.mkdir()
    role.reload(settings)  # the same configuration: a reload tries the folder again
    assert role.status() == "0 enqueued, 0 settling, 0 refused"
    role.close()
    alone = InboxRole(settings, Log("inbox", "q", journal=False, stream=io.StringIO()))
    alone.alone = True
    shutil.rmtree(missing)
    with pytest.raises(InvalidInput, match="does not exist"):
        alone.start(Loop())


def test_a_folder_the_daemons_user_cannot_write_names_the_path_and_the_fix(
    queue: Queue, queue_path: str, request: pytest.FixtureRequest
) -> None:
    from steadqd.daemon.config import parse_config
    from steadqd.daemon.inbox.files import Folder
    from steadqd.errors import InvalidInput
    from tests.integration.test_shared_queue import as_user

    folder = Path(tempfile.mkdtemp(prefix="steadq-drop-"))  # below /tmp: the user may reach it
    folder.chmod(0o755)  # root's: the daemon's user may read it, not write it
    request.addfinalizer(lambda: shutil.rmtree(folder))
    config = parse_config(f"queue: {queue_path}\ninbox:\n  path: {folder}\n", path="q.yaml", name="q").inbox
    assert config is not None

    def start() -> None:
        with pytest.raises(InvalidInput) as e:
            Folder(config, queue, 3600.0)
        message = str(e.value)
        assert f"{folder}/.steadq-inbox cannot be created: Permission denied" in message, message
        assert f"chmod g+w,+t {folder}" in message, message

    assert as_user((54325, 54325), start) == "ok"


@pytest.mark.skipif(not Path("/proc/self/mountinfo").exists(), reason="needs mounts")
def test_a_reload_whose_folder_fails_does_not_say_plainly_reloaded(denv: Env, tmp_path: Path) -> None:
    """Never "reloaded configuration" for a change not applied (issue 33 #2): the reload line says what was not."""
    folder = tmp_path / "drop"
    folder.mkdir()
    write(denv, None)
    with read_only(folder), worker(denv) as d:
        write(denv, {"path": str(folder), "settle": "0.3s", "after": "delete", "payload": "content"})
        d.signal(signal.SIGHUP)
        line = d.wait_log(r"^<\d>worker\[testq\]: reloaded configuration.*")[0].group(0)
        d.signal(signal.SIGHUP)  # the same file again: the folder is tried again, and still not watched
        again = d.wait_log(r"^<\d>worker\[testq\]: reloaded configuration.*", count=2)[1].group(0)
        assert d.proc.poll() is None
    for said in (line, again):
        assert said.startswith("<4>"), said  # a warning, not a notice
        assert f"reloaded configuration except inbox: watch folder {folder} not watched" in said, said
        assert "Read-only file system" in said, said
