"""An operator's mistakes, met from the shell: each gets one line naming what is wrong, the
documented exit status, no traceback, and nothing done behind the operator's back.

Found by an audit of the failure paths (argument order, closed standard streams, a planted
symlink); the cases that were already right are covered where their command is tested.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.constants import MAX_MAXIMUM_ATTEMPTS, MIN_MAXIMUM_ATTEMPTS
from steadqd.s3 import keys
from steadqd.s3.backend import BucketBackend
from steadqd.s3.layout import DEFAULT_FORMAT, init_layout
from steadqd.s3.records import encode_record
from steadqd.s3.store.memory import ManualClock, MemoryStore
from steadqd.s3.verify import read_record
from tests.invariants import check_tree
from tests.procs import alive

from .helpers import STEADQ, payload_dir, steadq


def run_with_closed(fd: int, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """The console script with standard descriptor ``fd`` closed, as ``<&-``, ``>&-`` or ``2>&-`` leave it."""
    assert STEADQ is not None
    return subprocess.run(
        [STEADQ, *args],
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        preexec_fn=lambda: os.close(fd),
        timeout=60,
    )


# --------------------------------------------------------------------------- argument order


def test_options_may_follow_the_positionals_as_cli_md_says(qpath: str, tmp_path: Path) -> None:
    payload = tmp_path / "p.txt"
    payload.write_bytes(b"x")
    r = steadq("put", qpath, "--content-type", "text/plain", "-", stdin=b"from stdin")
    assert r.code == 0, r.err
    r = steadq("put", qpath, "--delay", "5m", payload)
    assert r.code == 0, r.err
    tree = check_tree(qpath)
    assert len(tree.ready) == 1 and len(tree.delayed) == 1


def test_an_unknown_option_is_named_with_its_subcommand(qpath: str) -> None:
    r = steadq("ls", qpath, "--bogus")
    assert r.code == 1
    assert r.err_lines == ["steadq ls: unrecognized arguments: --bogus (see 'steadq ls --help')"]
    r = steadq("admin", "dead-list", qpath, "--bogus")
    assert r.code == 1
    assert r.err_lines == [
        "steadq admin dead-list: unrecognized arguments: --bogus (see 'steadq admin dead-list --help')"
    ]


# --------------------------------------------------------------------------- a queue this steadq cannot read


def test_a_queue_of_a_newer_format_says_which_version_to_use(qpath: str) -> None:
    fmt = Path(qpath) / "FORMAT"
    data = bytearray(fmt.read_bytes())
    data[8:10] = (2).to_bytes(2, "big")  # the major version (records.md)
    os.chmod(fmt, 0o600)
    fmt.write_bytes(bytes(data))
    r = steadq("ls", qpath)
    assert r.code == 64
    assert r.err_lines == [
        f"cannot open queue {qpath}: FORMAT: unsupported format major version 2 (another steadq version made "
        "this queue: open it with that version, or upgrade this one)"
    ]


# --------------------------------------------------------------------------- closed standard streams


def test_put_with_stdin_closed_says_so_and_enqueues_nothing(qpath: str) -> None:
    for argv in (("put", qpath), ("put", "--jsonl", "-", qpath)):
        p = run_with_closed(0, *argv)
        assert p.returncode == 6, p.stderr
        assert p.stderr.decode().splitlines() == [
            "cannot read the payload from stdin: stdin is closed (give a FILE, or redirect stdin from one)"
        ]
    assert not check_tree(qpath).ready


def test_stdout_closed_is_refused_before_anything_is_done(qpath: str) -> None:
    """A put whose job id cannot be printed must not enqueue: the script would retry it."""
    p = run_with_closed(1, "put", qpath, stdin=b"payload")
    assert p.returncode == 1
    assert p.stderr.decode().splitlines() == [
        "steadq: stdout is closed: nothing was done (redirect it, e.g. >/dev/null, instead of closing it)"
    ]
    assert not check_tree(qpath).ready


def test_stderr_closed_leaves_stdout_clean_and_the_exit_status_speaks(qpath: str) -> None:
    p = run_with_closed(2, "--json", "ls", qpath, "nonsense")
    assert p.returncode == 1 and p.stdout == b""
    p = run_with_closed(2, "--json", "ls", qpath)
    assert p.returncode == 0 and json.loads(p.stdout) == []


# --------------------------------------------------------------------------- signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_work_stopped_by_a_signal_stops_its_command_and_retries_the_job(
    qpath: str, tmp_path: Path, sig: signal.Signals
) -> None:
    """Not an orphaned command running on under a lease that nobody will settle for an hour."""
    job = steadq("put", qpath, stdin=b"x").out_lines[0].split()[1]
    pidfile = tmp_path / "command.pid"
    assert STEADQ is not None
    work = subprocess.Popen(
        [STEADQ, "work", qpath, "--lease", "1h", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        for _ in range(300):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        command = int(pidfile.read_text())
        work.send_signal(sig)
        _, stderr = work.communicate(timeout=60)
    finally:
        if work.poll() is None:
            work.kill()
    assert work.returncode == 128 + sig, stderr
    assert not alive(command)
    assert stderr.decode().splitlines() == [
        f"work: interrupted by {sig.name}: job {job}: its command was stopped; the job is now ready (attempt 1 of 3 used)"
    ]
    (listed,) = json.loads(steadq("--json", "ls", qpath).out)
    assert (listed["job_id"], listed["state"], listed["attempt"]) == (job, "ready", 1)


# --------------------------------------------------------------------------- a planted symlink


@pytest.mark.parametrize("link", ["dead", "dead/0000000000000001", "dead/0000000000000001/0000"])
def test_dead_list_does_not_follow_a_symlinked_dead_directory(qpath: str, tmp_path: Path, link: str) -> None:
    """A symlinked dead/, bucket or shard once listed the names of whatever directory it pointed at."""
    outside = tmp_path / "outside"
    (outside / "0000000000000001" / "0000").mkdir(parents=True)
    for d in (outside, outside / "0000000000000001", outside / "0000000000000001" / "0000"):
        (d / "secret-name").write_bytes(b"")
    planted = Path(qpath) / link
    planted.parent.mkdir(parents=True, exist_ok=True)
    if planted.is_dir():
        os.rmdir(planted)
    planted.symlink_to(outside / os.path.relpath(link, "dead"))
    r = steadq("admin", "dead-list", qpath)
    assert "secret-name" not in r.out
    assert r.code == 3, r.err
    assert f"{link} is a symlink" in r.err


def _stray_body(q: BucketBackend, store: MemoryStore, real: str, stray: str, kind: str) -> bytes:
    """Junk, or the job's record re-encoded for the stray key (its key tag verifies there)."""
    if kind == "junk":
        return b"not a record"
    qid = q.layout.queue_id
    record = read_record(
        store.snapshot()[real],
        qid,
        real.removeprefix("farm/"),
        required_feature_bits=DEFAULT_FORMAT.required_feature_bits,
    )
    return encode_record(record, qid, keys.key_tag(qid, stray.removeprefix("farm/")))


@pytest.mark.parametrize("kind", ["junk", "tagged"])
def test_a_stray_key_in_another_shard_does_not_list_a_bucket_job_twice(kind: str) -> None:
    """A job key under a shard its id does not map to once made ls show the job twice, and stats count
    a job that ls does not list."""
    store = MemoryStore(clock=ManualClock(step_ns=1000))
    q = BucketBackend(init_layout(store, "farm/", worker_id="w", certify_store=False), url="s3://mem/farm")
    job = q.enqueue(b"hello")
    (real,) = list(store.keys("farm/jobs/"))
    stray = "0001" if "/0000/" in real else "0000"
    store.put_if_absent(f"farm/jobs/{stray}/{job}", _stray_body(q, store, real, f"farm/jobs/{stray}/{job}", kind))
    nobody = next(
        i.hex()
        for i in (n.to_bytes(16, "big") for n in range(1, 1000))
        if keys.shard_of(q.layout.queue_id, i, q.layout.format.shard_count) != int(stray, 16)
    )
    store.put_if_absent(f"farm/jobs/{stray}/{nobody}", b"not a record")
    assert [j.job_id for j in q.list_jobs({"ready"})] == [job]
    assert q.stats()["ready"].objects == 1


def test_bulk_put_whose_print_ids_reader_goes_away_stops_and_says_how_far_it_got(qpath: str, tmp_path: Path) -> None:
    """``put --dir D --print-ids Q | head -1`` once exited 0 in silence after some of D."""
    source = payload_dir(tmp_path, 3000)
    assert STEADQ is not None
    p = subprocess.Popen(
        [STEADQ, "put", "--dir", source, "--print-ids", qpath], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()
    stderr = p.stderr.read().decode()
    assert p.wait(timeout=120) == 6, stderr
    enqueued = len(check_tree(qpath).ready)
    assert 0 < enqueued < 3000
    lines = stderr.splitlines()
    assert len(lines) == 2, stderr
    assert lines[0].startswith("put: stdout was closed while printing the ids: stopped after the jobs counted below")
    assert lines[1].startswith(f"enqueued {enqueued} jobs ")


def test_admin_requeue_whose_reader_goes_away_stops_and_says_how_far_it_got(queue: Queue, queue_path: str) -> None:
    for _ in queue.enqueue_many([b"x"] * 600):
        lease = queue.lease(duration=60)
        assert lease is not None
        queue.bury(lease)
    queue.close()
    assert STEADQ is not None
    p = subprocess.Popen(
        [STEADQ, "admin", "requeue", queue_path, "--all"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()
    stderr = p.stderr.read().decode()
    assert p.wait(timeout=120) == 6, stderr
    requeued = len(check_tree(queue_path).ready)
    assert 0 < requeued < 600
    assert stderr.splitlines() == [
        f"admin requeue: stdout was closed while printing: stopped; requeued: {requeued} of 600 dead jobs "
        f"selected; {600 - requeued} untouched"
    ]


# --------------------------------------------------------------------------- option values


@pytest.mark.parametrize("value", [["--after", "-5s"], ["--after=-5s"], ["--after-seconds", "-5"], ["--after", "-1m"]])
def test_a_negative_retry_delay_is_refused_as_negative_by_its_option(
    qpath: str, tmp_path: Path, value: list[str]
) -> None:
    """Not argparse's "expected one argument": a value that starts with '-' is still the option's value."""
    handle = tmp_path / "h.json"
    r = steadq("retry", qpath, "--handle-file", handle, *value)
    assert r.code == 1, r.err
    [line] = r.err_lines
    assert line.startswith("steadq retry: argument --after/--after-seconds: invalid duration "), line
    assert "negative" in line, line


@pytest.mark.parametrize("extra", [[], ["--dir", "DIR"]])
def test_put_with_no_attempts_allowed_is_bad_input_refused_before_anything_is_written(
    qpath: str, tmp_path: Path, extra: list[str]
) -> None:
    """Not the library's "not committed": the option is wrong, and the message says which values it takes."""
    args = [str(payload_dir(tmp_path, 2)) if a == "DIR" else a for a in extra]
    r = steadq("put", qpath, "--max-attempts", "0", *args, stdin=b"x")
    assert r.code == 1, r.err
    [line] = r.err_lines
    allowed = f"{MIN_MAXIMUM_ATTEMPTS}..{MAX_MAXIMUM_ATTEMPTS}"
    assert line.startswith(f"steadq put: argument --max-attempts: invalid max attempts '0': must be in {allowed}")
    assert "not committed" not in line and r.out == ""
    assert not check_tree(qpath).ready


# --------------------------------------------------------------------------- a read-only filesystem


@pytest.fixture
def read_only_view(qpath: str) -> Iterator[str]:
    """``qpath`` through a read-only bind mount (every write there fails with EROFS); unmounted in ``finally``."""
    if os.geteuid() != 0:
        pytest.skip(f"a read-only bind mount needs root (euid {os.geteuid()})")
    mountpoint = tempfile.mkdtemp(prefix="steadq-ro-", dir="/tmp")
    try:
        subprocess.run(["mount", "--bind", qpath, mountpoint], check=True, capture_output=True, timeout=60)
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", mountpoint], check=True, capture_output=True, timeout=60)
            yield mountpoint
        finally:
            if subprocess.run(["umount", mountpoint], capture_output=True, timeout=60).returncode != 0:
                subprocess.run(["umount", "-l", mountpoint], capture_output=True, timeout=60)
    finally:
        os.rmdir(mountpoint)


def test_lease_on_a_read_only_filesystem_says_its_error_once(qpath: str, read_only_view: str) -> None:
    assert steadq("put", qpath, stdin=b"x").code == 0
    r = steadq("lease", read_only_view)
    assert r.code == 6, r.err
    [line] = r.err_lines
    assert line.startswith("lease failed: ") and line.count("Read-only file system") == 1, line
    assert len(check_tree(qpath).ready) == 1
