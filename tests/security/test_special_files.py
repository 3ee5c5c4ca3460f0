"""FIFOs, sockets and directories where steadqd expects a regular file (issue 15, point 1).

Threat (docs/security.md, "Special files"): a member of a shared queue's group
can replace any file of the tree with something that is not a regular file.
``mkfifo control/wall-watermark`` used to make every ``open()`` of it wait for
a writer forever: the daemon ran no job and ignored SIGTERM, every enqueue and
``steadq put`` hung, and so did ``Queue.open`` for a FIFO at FORMAT,
``maintenance.lock`` or ``recovery-cursor.json``. Every fixed name must now be
opened without blocking and refused, naming the path, when it is not a regular
file; a special file wearing a job's name is quarantined once, not reported as
an error on every scan.

A hang must fail the test, not hang the suite: every call that used to block
runs in a child process with a deadline (``subprocess.run(timeout=...)`` kills
it), and reports what happened as one JSON line.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from steadqd import Queue
from steadqd.cli.common import read_user_file
from steadqd.constants import QuarantineReason
from steadqd.daemon.config import load_config
from steadqd.errors import ConfigError
from steadqd.fs import names
from steadqd.fs.recovery.driver import run_recovery
from tests.cli.helpers import STEADQ
from tests.integration.test_shared_queue import QUEUE_GID, as_user

DEADLINE_S = 60  # generous on a loaded 2-core machine: only a hang gets anywhere near it
PROJECT = Path(__file__).resolve().parents[2]
KINDS = ("fifo", "directory", "socket")
KIND_WORDS = {"fifo": "a FIFO", "directory": "a directory", "socket": "a socket"}
DAEMON_UID = (54331, QUEUE_GID)  # a daemon user in the queue's group, not root


def plant(path: Path, kind: str) -> None:
    """Replace ``path`` (if it exists) by a special file, as a group member would (mv away, mkfifo)."""
    if path.exists() or path.is_symlink():
        path.rename(path.with_name(path.name + ".moved-away"))
    if kind == "fifo":
        os.mkfifo(path, 0o660)
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_bytes(b"x")  # non-empty: rmdir cannot remove it either
    elif kind == "socket":
        # A job's name is ~92 bytes: bind where the path fits sun_path, then move it in.
        short = Path(tempfile.mkdtemp(dir=path.parent if len(str(path.parent)) < 80 else "/tmp")) / "s"
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(str(short))
        finally:
            s.close()
        short.rename(path)
        short.parent.rmdir()
    else:
        raise AssertionError(kind)


def in_child(code: str, *args: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter with a deadline; it prints one JSON object last."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            cwd=PROJECT,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the call blocked for {DEADLINE_S} s instead of failing (stderr: {e.stderr!r})")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    assert STEADQ is not None, "the venv's steadq script is missing (pip install -e .)"
    try:
        return subprocess.run([STEADQ, *argv], capture_output=True, text=True, timeout=DEADLINE_S, input="x\n")
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"steadq {' '.join(argv)} blocked for {DEADLINE_S} s instead of failing (stderr: {e.stderr!r})")


@pytest.fixture
def qpath(tmp_path: Path) -> Path:
    """A queue with one job, and a recovery cursor on disk (a pass wrote it)."""
    path = tmp_path / "q"
    with Queue.init(str(path), shards=2) as q:
        q.enqueue(b"a job")
        q.recover()
    assert (path / "control" / "recovery-cursor.json").is_file()
    return path


# --------------------------------------------------------------------------- fixed names, fresh handles

OPEN_AND_USE = """
    import json, sys
    from steadqd import Queue
    from steadqd.errors import SteadQError
    try:
        with Queue.open(sys.argv[1]) as q:
            q.enqueue(b"another job")
        print(json.dumps({"outcome": "ok"}))
    except SteadQError as e:
        print(json.dumps({"outcome": type(e).__name__, "kind": e.kind.label, "message": e.message}))
"""

FIXED_AT_OPEN = ("FORMAT", "control/maintenance.lock", "control/wall-watermark", "control/wall-watermark.lock",
                 "control/recovery-cursor.json")  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rel", FIXED_AT_OPEN)
def test_queue_open_refuses_a_special_file_at_a_fixed_name(qpath: Path, rel: str, kind: str) -> None:
    plant(qpath / rel, kind)
    got = in_child(OPEN_AND_USE, str(qpath))
    cursor = rel.endswith("recovery-cursor.json")  # its own type, whose message names the fix (fsck --repair)
    assert got["outcome"] == ("BadRecoveryCursor" if cursor else "QueueCorrupt"), got
    assert got["kind"] == "queue_corrupt", got
    assert rel in str(got["message"]) and KIND_WORDS[kind] in str(got["message"]), got


# --------------------------------------------------------------------------- fixed names, live handles

SWAP_UNDER_A_LIVE_HANDLE = """
    import json, os, socket, sys
    from steadqd import Queue
    from steadqd.errors import SteadQError
    from steadqd.fs import watermark
    from tests.security.test_special_files import plant
    from pathlib import Path

    watermark._CACHE_NS = 0  # re-read the record on every mutation, as after a second has passed
    path, rel, kind, action = sys.argv[1:]
    # A 1 ms delayed bucket: every enqueue below advances the watermark, taking its lock.
    with Queue.open(path) as q:
        q.enqueue(b"before the swap")
        plant(Path(path, rel), kind)
        try:
            if action == "enqueue":
                q.enqueue(b"after the swap")
                print(json.dumps({"outcome": "ok"}))
            else:
                r = q.recover()
                print(json.dumps({"outcome": "report", "errors": r.errors}))
        except SteadQError as e:
            print(json.dumps({"outcome": type(e).__name__, "kind": e.kind.label, "message": e.message}))
"""


@pytest.fixture
def fast_watermark_q(tmp_path: Path) -> Path:
    path = tmp_path / "wq"
    with Queue.init(str(path), shards=2, delayed_width_ns=1_000_000) as q:
        q.recover()
    return path


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rel", ["control/wall-watermark", "control/wall-watermark.lock"])
def test_enqueue_refuses_a_watermark_file_swapped_under_a_live_handle(
    fast_watermark_q: Path, rel: str, kind: str
) -> None:
    got = in_child(SWAP_UNDER_A_LIVE_HANDLE, str(fast_watermark_q), rel, kind, "enqueue")
    if rel.endswith(".lock") and kind == "fifo":
        # A FIFO opens at once without blocking and takes an OFD lock like a file, so
        # the advance cannot hang; Queue.open refuses it (test above). Either is fine.
        assert got["outcome"] in ("ok", "NotCommitted"), got
        return
    assert got["outcome"] == "NotCommitted" and got["kind"] == "queue_corrupt", got
    assert rel in str(got["message"]) and KIND_WORDS[kind] in str(got["message"]), got


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rel", ["control/recovery-cursor.json", "control/recovery.lock"])
def test_recovery_reports_a_special_control_file_and_returns(fast_watermark_q: Path, rel: str, kind: str) -> None:
    got = in_child(SWAP_UNDER_A_LIVE_HANDLE, str(fast_watermark_q), rel, kind, "recover")
    assert got["outcome"] == "report", got
    messages = [message for _code, message in got["errors"]]
    assert any(rel in m and KIND_WORDS[kind] in m for m in messages), got


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    ("rel", "argv"),
    [
        ("control/wall-watermark", ("put",)),
        ("control/recovery-cursor.json", ("put",)),
        ("control/recovery-cursor.json", ("stats",)),
        ("control/recovery-cursor.json", ("fsck",)),
        ("control/maintenance.lock", ("recover",)),
        ("FORMAT", ("stats",)),
    ],
)
def test_steadq_refuses_a_fifo_at_a_fixed_name_with_exit_3(qpath: Path, rel: str, argv: tuple[str, ...]) -> None:
    plant(qpath / rel, "fifo")
    done = run_cli(*argv, str(qpath))
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert rel in done.stderr and "a FIFO" in done.stderr, done.stderr


# --------------------------------------------------------------------------- daemon configuration files


def test_load_config_refuses_a_fifo_instead_of_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "jobs.yaml", 0o660)
    got = in_child(
        """
        import json, sys
        from steadqd.daemon.config import load_config
        from steadqd.errors import ConfigError
        try:
            load_config("jobs", sys.argv[1])
            print(json.dumps({"outcome": "ok"}))
        except ConfigError as e:
            print(json.dumps({"outcome": "ConfigError", "message": e.message}))
        """,
        str(tmp_path),
    )
    assert got["outcome"] == "ConfigError", got
    assert str(tmp_path / "jobs.yaml") in str(got["message"]) and "not a regular file" in str(got["message"]), got


def test_check_config_refuses_a_fifo_with_exit_78(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "jobs.yaml", 0o660)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "steadqd.daemon.main", "--config-dir", str(tmp_path), "check-config", "jobs"],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            cwd=PROJECT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("steadqd check-config blocked on a FIFO")
    assert done.returncode == 78, (done.returncode, done.stdout, done.stderr)
    assert "jobs.yaml" in done.stdout + done.stderr


@pytest.mark.parametrize("kind", ["directory", "socket"])
def test_load_config_names_what_is_there(tmp_path: Path, kind: str) -> None:
    plant(tmp_path / "jobs.yaml", kind)
    with pytest.raises(ConfigError, match="not a regular file") as info:
        load_config("jobs", str(tmp_path))
    assert str(tmp_path / "jobs.yaml") in info.value.message


def test_load_config_follows_a_symlink_to_a_regular_file(tmp_path: Path) -> None:
    """Configuration management often links configs into place: that must keep working."""
    (tmp_path / "real.yaml").write_text(f"queue: {tmp_path / 'q'}\nworker:\n  command: [/bin/true]\n")
    (tmp_path / "jobs.yaml").symlink_to(tmp_path / "real.yaml")
    assert load_config("jobs", str(tmp_path)).queue == str(tmp_path / "q")


# --------------------------------------------------------------------------- files the user names to steadq


def test_read_user_file_refuses_a_fifo_instead_of_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "handle.json", 0o600)
    got = in_child(
        """
        import json, sys
        from steadqd.cli.common import read_user_file, os_exit_code, error_text
        try:
            read_user_file(sys.argv[1])
            print(json.dumps({"outcome": "ok"}))
        except OSError as e:
            print(json.dumps({"outcome": "OSError", "code": os_exit_code(e), "text": error_text(e)}))
        """,
        str(tmp_path / "handle.json"),
    )
    assert got == {"outcome": "OSError", "code": 1, "text": f"{tmp_path / 'handle.json'}: not a regular file"}


@pytest.mark.parametrize("kind", ["directory", "socket"])
def test_read_user_file_says_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    plant(tmp_path / "ticket.json", kind)
    with pytest.raises(OSError, match="not a regular file") as info:
        read_user_file(str(tmp_path / "ticket.json"))
    assert info.value.errno == errno.EINVAL and info.value.filename == str(tmp_path / "ticket.json")


def test_read_user_file_reads_a_file_or_a_link_to_one(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_bytes(b"x" * 10)
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert read_user_file(str(tmp_path / "link.json"), limit=4) == b"xxxx"
    with pytest.raises(FileNotFoundError):
        read_user_file(str(tmp_path / "missing.json"))


# --------------------------------------------------------------------------- special files wearing a job's name


def _special_ready_job(q: Queue, qpath: Path, kind: str) -> str:
    """A FIFO/directory/socket at an authentic ready job's name; returns its path in the tree."""
    _job, rel = q.enqueue_detailed(b"to be replaced")
    (qpath / rel).unlink()
    plant(qpath / rel, kind)
    return rel


def _quarantined(qpath: Path) -> list[int]:
    """The reason codes in quarantine/, read from the names: ``list_quarantine`` descends into
    a quarantined directory instead of listing it."""
    out = []
    for entry in sorted(os.listdir(qpath / "quarantine")):
        parsed = names.parse_quarantine_name(entry)
        assert parsed is not None, entry
        out.append(parsed[1])
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_claim_quarantines_a_special_file_with_a_ready_name_once(tmp_path: Path, kind: str) -> None:
    qpath = tmp_path / "q"
    with Queue.init(str(qpath), shards=1) as q:
        rel = _special_ready_job(q, qpath, kind)
        assert q.lease() is None
        assert q.last_scan is not None and not q.last_scan.errors, q.last_scan
        assert [p for p, _r, _q in q.last_scan.quarantined] == [rel]
        assert _quarantined(qpath) == [QuarantineReason.NON_REGULAR_FILE]
        assert not (qpath / rel).exists() and not (qpath / rel).is_symlink()
        real = q.enqueue(b"a real job")
        lease = q.lease()
        assert lease is not None and lease.job_id == real
        q.ack(lease)
        assert q.lease() is None
        assert not q.last_scan.errors and not q.last_scan.quarantined


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_recovery_quarantines_a_special_file_with_a_delayed_name(tmp_path: Path, kind: str) -> None:
    qpath = tmp_path / "q"
    with Queue.init(str(qpath), shards=1) as q:
        job, data_rel = q.enqueue_detailed(b"template")
        (qpath / data_rel).unlink()
        jid = bytes.fromhex(job)
        jn = names.delayed_name(jid, 1, 0, 3, not_before=10**9)
        bucket = names.delayed_bucket(10**9, q.format.delayed_width_ns)
        fname = names.make_filename(
            q.format.queue_id, jn, shard=0, bucket=bucket, lease_width_ns=q.format.lease_width_ns
        )
        rel = f"delayed/{names.bucket_dir(bucket)}/0000/{fname}"
        (qpath / rel).parent.mkdir(parents=True)
        plant(qpath / rel, kind)
        r = q.recover()
        assert not r.errors, r.errors
        assert [p for p, _r, _q in r.quarantined_objects] == [rel]
        assert _quarantined(qpath) == [QuarantineReason.ENVELOPE_CORRUPT]  # recovery.md, phase 2


@pytest.mark.parametrize("kind", KINDS)
def test_recovery_quarantines_a_special_file_with_a_lease_name(tmp_path: Path, kind: str) -> None:
    qpath = tmp_path / "q"
    with Queue.init(str(qpath), shards=1) as q:
        q.enqueue(b"leased, then replaced")
        lease = q.lease(duration=1)
        assert lease is not None
        (qpath / lease.path).unlink()
        plant(qpath / lease.path, kind)
        r = run_recovery(q._ctx, budget_ops=1000, budget_ms=10_000, now_boottime=2**62)
        assert not r.errors, r.errors
        assert [p for p, _r, _q in r.quarantined_objects] == [lease.path]


# --------------------------------------------------------------------------- a directory the daemon may not move


@pytest.fixture
def shared_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root to plant a directory as one user and scan as another")
    d = tmp_path_factory.mktemp("shared")
    parent = str(d)
    while parent != "/":  # pytest's base dirs are 0700
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
        parent = os.path.dirname(parent)
    return d


@pytest.mark.parametrize("mode", [0o700, 0o755])
def test_an_unmovable_directory_in_ready_is_reported_once_then_ignored(shared_base: Path, mode: int) -> None:
    """A group member's ``mkdir -m 700 ready/0000/<job>.sqj``: the daemon can neither read it
    (EACCES) nor move it out of ready/ (renaming a directory to another parent needs
    write access to it, for its ``..``). Today's answer was the same error on every
    scan, forever; now the first scan of a process says so and later ones step over it."""
    qpath = shared_base / "q"
    qpath.mkdir()
    os.chown(qpath, 0, QUEUE_GID)
    with Queue.init(str(qpath), shards=1, shared=True) as q:
        rel = _special_ready_job(q, qpath, "directory")
    os.chmod(qpath / rel, mode)  # owned by root, the "other member": not writable by the daemon

    def scan_twice() -> None:
        with Queue.open(str(qpath)) as q:
            first: list[str] = []
            try:
                assert q.lease() is None
            except Exception as e:  # noqa: BLE001 - the first scan may fail, naming the entry
                first.append(str(e))
            first += q.last_scan.errors if q.last_scan is not None else []
            assert any(rel in m and "a directory" in m for m in first), first
            real = q.enqueue(b"a real job")
            lease = q.lease()
            assert lease is not None and lease.job_id == real
            q.ack(lease)
            assert q.lease() is None, "an empty queue answers empty, without an error"
            assert q.last_scan is not None and not q.last_scan.errors, q.last_scan

    assert as_user(DAEMON_UID, scan_twice) == "ok"
    assert (qpath / rel).is_dir(), "nothing the daemon may not touch was touched"


def _make_unmovable_delayed(q: Queue, qpath: Path) -> str:
    job, data_rel = q.enqueue_detailed(b"template")
    (qpath / data_rel).unlink()
    jn = names.delayed_name(bytes.fromhex(job), 1, 0, 3, not_before=10**9)
    bucket = names.delayed_bucket(10**9, q.format.delayed_width_ns)
    fname = names.make_filename(q.format.queue_id, jn, shard=0, bucket=bucket, lease_width_ns=q.format.lease_width_ns)
    rel = f"delayed/{names.bucket_dir(bucket)}/0000/{fname}"
    (qpath / rel).parent.mkdir(parents=True)
    os.chown((qpath / rel).parent, 0, QUEUE_GID)
    os.chown((qpath / rel).parent.parent, 0, QUEUE_GID)
    os.chmod((qpath / rel).parent, 0o2770)
    os.chmod((qpath / rel).parent.parent, 0o2770)
    plant(qpath / rel, "directory")
    os.chmod(qpath / rel, 0o755)
    return rel


def test_recovery_reports_an_unmovable_special_entry_once_per_process(shared_base: Path) -> None:
    qpath = shared_base / "q"
    qpath.mkdir()
    os.chown(qpath, 0, QUEUE_GID)
    with Queue.init(str(qpath), shards=1, shared=True) as q:
        rel = _make_unmovable_delayed(q, qpath)

    def recover_twice() -> None:
        with Queue.open(str(qpath)) as q:
            first = q.recover(phases=("promote_delayed",))
            assert [c for c, m in first.errors if rel in m] == ["quarantine_failed"], first.errors
            second = q.recover(phases=("promote_delayed",))
            assert not second.errors, second.errors

    assert as_user(DAEMON_UID, recover_twice) == "ok"
    assert (qpath / rel).is_dir()


# --------------------------------------------------------------------------- the helper itself


def test_open_regular_opens_a_regular_file_nonblocking(tmp_path: Path) -> None:
    from steadqd.fs import linux

    (tmp_path / "f").write_bytes(b"content")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd, st = linux.open_regular(dfd, "f", os.O_RDONLY)
        try:
            assert stat.S_ISREG(st.st_mode) and os.pread(fd, 16, 0) == b"content"
            assert os.get_inheritable(fd) is False
        finally:
            os.close(fd)
        (tmp_path / "l").symlink_to(tmp_path / "f")
        with pytest.raises(linux.NotRegularFile, match="a symbolic link"):
            linux.open_regular(dfd, "l", os.O_RDONLY)
        with pytest.raises(FileNotFoundError):
            linux.open_regular(dfd, "missing", os.O_RDONLY)
    finally:
        os.close(dfd)


# --------------------------------------------------------------------------- the running daemon


def test_worker_names_a_fifo_watermark_and_still_stops_on_sigterm(tmp_path: Path) -> None:
    """The attack as it was run: ``mkfifo control/wall-watermark`` under a running worker.

    It used to block in open() at the next claim: no job ran and SIGTERM was never
    handled. Now the claim fails naming the file, and the worker stops when told.
    """
    from tests.daemon.conftest import Daemon, Env, wait_for

    qpath = tmp_path / "q"
    with Queue.init(str(qpath), shards=1) as q:
        _job, rel = q.enqueue_detailed(b"{}")
    parked = tmp_path / "parked.sqj"
    (qpath / rel).rename(parked)  # out of sight until the FIFO is in place
    env = Env(tmp_path, str(qpath))
    env.write_config()
    daemon = Daemon(env)
    try:
        daemon.ready()
        plant(qpath / "control" / "wall-watermark", "fifo")
        time.sleep(1.5)  # past the handle's 1 s watermark cache: the claim must read the file
        parked.rename(qpath / rel)
        wait_for(lambda: "control/wall-watermark is a FIFO" in daemon.log(), DEADLINE_S, "the FIFO named in the log")
        daemon.signal(signal.SIGTERM)
        daemon.wait(DEADLINE_S)
        assert not list(env.results.iterdir()), "no job ran on a queue whose watermark is unreadable"
    finally:
        daemon.stop()
