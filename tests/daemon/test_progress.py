"""Progress (issue 32 #4): a job writes ``<percent> [text]`` lines to ``$STEADQ_PROGRESS``; the worker
reads the file at a modest rate, refuses anything but a small regular file of the job's own without
blocking, and publishes the latest value where ``steadq show`` / ``ls`` (another process) read it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from steadqd import Queue, progress
from tests.daemon.conftest import Env, payload_copies_removed, traversable, wait_for
from tests.integration.test_shared_queue import PRODUCER, as_user
from tests.invariants import live_tree

STEADQ = os.path.join(os.path.dirname(sys.executable), "steadq")

# Writes progress, then waits (bounded) for the test's go-file.
JOB = r"""
set -e
{setup}
i=0
while [ ! -e "{go}/$STEADQ_JOB_ID" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
"""


def _config(denv: Env, setup: str, concurrency: int = 1) -> Path:
    go = denv.tmp / "go"
    go.mkdir(exist_ok=True)
    denv.write_config(command=["/bin/sh", "-c", JOB.format(setup=setup, go=go)], concurrency=concurrency)
    return go


def _cli(denv: Env, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STEADQ_PROGRESS_DIR": str(denv.tmp / "progress")}
    return subprocess.run([STEADQ, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def pdir(denv: Env) -> dict[str, str]:
    (denv.tmp / "progress").mkdir()
    return {"STEADQ_PROGRESS_DIR": str(denv.tmp / "progress")}


def test_progress_is_shown_by_show_and_ls_while_the_job_runs(denv: Env, daemons, pdir) -> None:
    go = _config(denv, r'printf "10 starting\n42 half \033[31mred\n" >> "$STEADQ_PROGRESS"')
    d = daemons(denv, extra_env=pdir)
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(b"")
    d.ready()

    def shown() -> str | None:
        r = _cli(denv, "show", "--no-journal", denv.queue_path, job)
        return r.stdout if "42%" in r.stdout else None

    text = wait_for(shown, what="progress in steadq show")
    assert "  progress:      42% half \\x1b[31mred" in text, text  # the latest line, escaped
    doc = json.loads(_cli(denv, "show", "--no-journal", "--json", denv.queue_path, job).stdout)
    assert doc["progress"]["percent"] == 42 and doc["progress"]["text"] == "half \x1b[31mred"
    assert doc["state"] == "leased"  # the existing fields are unchanged
    ls = _cli(denv, "ls", denv.queue_path).stdout
    assert "42% half \\x1b[31mred" in ls, ls
    (listed,) = json.loads(_cli(denv, "ls", "--json", denv.queue_path).stdout)
    assert listed["progress"]["percent"] == 42
    watch = _cli(denv, "watch", "--count", "1", denv.queue_path).stdout
    assert f"  {job[:8]}  42% half \\x1b[31mred" in watch, watch
    (go / job).touch()
    wait_for(lambda: job in live_tree(denv.queue_path).receipts, what="the job acked")
    wait_for(lambda: not any((denv.tmp / "progress").rglob(job)), what="its progress removed")
    assert "progress:" not in _cli(denv, "show", "--no-journal", denv.queue_path, job).stdout


@pytest.mark.parametrize("kind", ["fifo", "symlink", "huge", "hardlink"])
def test_a_hostile_progress_file_is_refused_without_blocking(denv: Env, daemons, pdir, kind: str) -> None:
    secret = denv.tmp / "secret"
    secret.write_text("99 the daemon's secret\n")
    setup = {
        "fifo": 'rm -f "$STEADQ_PROGRESS"; mkfifo "$STEADQ_PROGRESS"',
        "symlink": f'rm -f "$STEADQ_PROGRESS"; ln -s {secret} "$STEADQ_PROGRESS"',
        "huge": 'truncate -s 2G "$STEADQ_PROGRESS"; printf "77 at the end\\n" >> "$STEADQ_PROGRESS"',
        "hardlink": f'rm -f "$STEADQ_PROGRESS"; ln {secret} "$STEADQ_PROGRESS"',
    }[kind]
    go = _config(denv, setup, concurrency=2)
    d = daemons(denv, extra_env=pdir)
    with Queue.open(denv.queue_path) as q:
        bad = q.enqueue(b"")
    d.ready()
    d.wait_log(rf"progress file of job {bad[:8]} refused: ")
    # the worker is not blocked: a second job runs and reports progress meanwhile
    _config(denv, 'echo "5 fine" > "$STEADQ_PROGRESS"', concurrency=2)
    d.signal(1)  # SIGHUP: the next job runs the new command
    d.wait_log("worker configuration reloaded")
    with Queue.open(denv.queue_path) as q:
        good = q.enqueue(b"")
    wait_for(
        lambda: "5% fine" in _cli(denv, "show", "--no-journal", denv.queue_path, good).stdout, what="good's progress"
    )
    out = _cli(denv, "show", "--no-journal", denv.queue_path, bad).stdout
    assert "progress:" not in out and "secret" not in out and "77%" not in out, (out, d.log())
    assert d.log().count(f"progress file of job {bad[:8]} refused") == 1  # said once, not every second
    (go / bad).touch()
    (go / good).touch()
    wait_for(lambda: {bad, good} <= live_tree(denv.queue_path).receipts, what="both jobs acked")


# The job, run as worker.user and owning its directory (input: file), moves the directory away once the
# test says so and puts a symlink to a decoy directory of its own in its place, then writes its real
# progress in the moved directory. On exit it puts things back, so the worker's cleanup finds them.
SWAP = r"""
printf '10 before\n' > "$STEADQ_PROGRESS"
d=$(dirname "$STEADQ_PROGRESS")
trap 'rm -f "$d"; mv "$d.moved" "$d"; rm -rf "$d.decoy"' EXIT
i=0
while [ ! -e "{go}/swap-$STEADQ_JOB_ID" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
mv "$d" "$d.moved"
mkdir "$d.decoy"
printf '99 decoy\n' > "$d.decoy/progress"
ln -s "$d.decoy" "$d"
printf '50 after\n' > "$d.moved/progress"
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the job as another user")
def test_a_job_that_swaps_its_directory_for_a_symlink_is_still_read_through_the_held_descriptor(
    denv: Env, daemons, pdir
) -> None:
    """The worker opened the job's directory once (``O_DIRECTORY|O_NOFOLLOW``) when the job started and
    reads ``progress`` relative to that descriptor: after the job (``user: nobody``, ``input: file``, so
    the directory is its own) renames the directory and puts a symlink to a decoy in its place, the
    worker still reads the moved directory's file, never the decoy's."""
    traversable(denv.tmp)
    os.chmod(denv.jobtmp, 0o1777)  # like /tmp: the job may create its decoy beside its directory
    go = denv.tmp / "go"
    go.mkdir()
    setup = SWAP.format(go=go)
    denv.write_config(
        command=["/bin/sh", "-c", JOB.format(setup=setup, go=go)], user="nobody", input="file", concurrency=1
    )
    d = daemons(denv, extra_env=pdir)
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(b"")
    d.ready()

    def show() -> str:
        return _cli(denv, "show", "--no-journal", denv.queue_path, job).stdout

    wait_for(lambda: "10% before" in show(), what="the progress before the swap")
    (go / f"swap-{job}").touch()
    after = wait_for(lambda: next((out for out in [show()] if "50%" in out or "99%" in out), None),
                     what="the progress after the swap")  # fmt: skip
    assert "50% after" in after and any(denv.jobtmp.glob("*.decoy")), after
    for _ in range(3):  # a few more reads (one a second): the decoy is never read
        out = show()
        assert "99%" not in out and "decoy" not in out, out
        time.sleep(1.0)
    assert "refused" not in d.log(), d.log()
    (go / job).touch()
    wait_for(lambda: job in live_tree(denv.queue_path).receipts, what="the job acked")
    payload_copies_removed(denv)


QID = "ab" * 16
JOBS = [f"{i:032x}" for i in range(1, 5)]


def _root_only(tmp_path: Path, body: str) -> Path:
    """A file only root may read, which a local user would like the daemon or ``steadq show`` to reveal."""
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    secret = private / "secret"
    secret.write_text(body)
    return secret


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")
def test_a_progress_directory_a_local_user_planted_is_refused_and_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local user pre-creates the queue's progress directory in a base anyone may write (sticky, like
    /tmp), with symlinks under the names the daemon would write (the job's file and its temp name):
    the daemon refuses a queue directory that is not its own, so nothing is written through them. A
    base owned by another user, or a symlink for the base, is refused too."""
    traversable(tmp_path)
    secret = _root_only(tmp_path, "root's data\n")
    base = tmp_path / "progress"
    base.mkdir()
    os.chmod(base, 0o1777)
    tmp_name = f".{JOBS[0]}.{os.getpid()}.tmp"  # Publisher.publish's temp name in this process

    def plant() -> None:
        qdir = base / QID
        qdir.mkdir(mode=0o777)
        for name in (JOBS[0], tmp_name):
            os.symlink(secret, qdir / name)

    assert as_user(PRODUCER, plant) == "ok"
    monkeypatch.setenv(progress.PROGRESS_DIR_ENV, str(base))
    pub, why = progress.Publisher.open(QID)
    assert pub is None and why is not None and f"{base}/{QID} is not this daemon's" in why, why
    assert secret.read_text() == "root's data\n" and (base / QID / JOBS[0]).is_symlink()

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, *PRODUCER)
    monkeypatch.setenv(progress.PROGRESS_DIR_ENV, str(theirs))
    pub, why = progress.Publisher.open(QID)
    assert pub is None and why is not None and "is not root's or this daemon's" in why, why
    assert list(theirs.iterdir()) == []

    (tmp_path / "linked").symlink_to(theirs)
    monkeypatch.setenv(progress.PROGRESS_DIR_ENV, str(tmp_path / "linked"))
    pub, why = progress.Publisher.open(QID)
    assert pub is None and why is not None and str(tmp_path / "linked") in why, why
    assert list(theirs.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")
def test_published_progress_a_local_user_planted_is_neither_followed_nor_blocks_nor_overread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a base a local user controls (their own ``$STEADQ_PROGRESS_DIR`` or ``$XDG_RUNTIME_DIR``), they
    plant a FIFO, a symlink to a root-only progress document and a 2 MiB document under job ids, for
    ``steadq show``/``ls`` run as root to read: nothing blocks, the link is not followed, at most 4 KiB
    is read (so the big one is not a document), and ids that are not hex are never looked up."""
    traversable(tmp_path)
    secret = _root_only(tmp_path, json.dumps({"percent": 99, "text": "root's secret"}))
    base = tmp_path / "theirs"
    base.mkdir()
    os.chown(base, *PRODUCER)
    fifo, link, big, _ = JOBS

    def plant() -> None:
        qdir = base / QID
        qdir.mkdir()
        os.mkfifo(qdir / fifo)
        os.symlink(secret, qdir / link)
        (qdir / big).write_text(json.dumps({"percent": 1, "text": "x" * (2 << 20)}))
        (base / "planted").write_text(json.dumps({"percent": 7, "text": "not a job's"}))  # only as "../planted"

    assert as_user(PRODUCER, plant) == "ok"
    monkeypatch.setenv(progress.PROGRESS_DIR_ENV, str(base))
    found: list[object] = []

    def read() -> None:
        found.extend(progress.lookup(QID, job) for job in (fifo, link, big))
        found.append(progress.lookup(QID, "../planted"))
        found.append(progress.published(QID))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():  # blocked in open(2) on the FIFO: release it so the thread can end, then fail
        os.close(os.open(base / QID / fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(30)
        pytest.fail("reading published progress blocked on a FIFO")
    assert found == [None, None, None, None, []]
