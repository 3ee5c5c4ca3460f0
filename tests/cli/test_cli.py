"""The ``steadq`` command line against cli.md: outputs, exit codes, files, tree effects.

Every case runs the installed console script (see helpers.py) and checks
stdout, stderr and the exit status; tree effects are judged by the
independent walker in tests/invariants.py, never by the CLI itself.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from steadqd import Lease, Queue
from steadqd.cli.common import temp_sibling, write_atomic
from steadqd.cli.main import main
from steadqd.constants import State
from steadqd.fs import linux
from steadqd.fs.json_records import LeasedLocation, ReadyLocation, TransitionTicket
from steadqd.fs.records import JobHeader
from tests.invariants import check_tree

from .helpers import steadq

HEX32 = re.compile(r"[0-9a-f]{32}")
HANDLE_FIELDS = [
    "queue_root", "queue_id", "job_id", "generation", "attempt", "maximum_attempts", "token", "boot_id",
    "expires_boottime_ns", "expires_wall_ns", "expected_dev", "expected_inode", "exact_source_path",
    "envelope_digest", "content_type", "payload_length", "payload_digest",
]  # fmt: skip


def put(q: str, payload: bytes = b"payload", *args: str) -> str:
    r = steadq("put", q, *args, stdin=payload)
    assert r.code == 0, r.err
    return r.out_lines[0].removeprefix("job_id: ")


def lease(q: str, handle: Path, *args: str) -> str:
    r = steadq("lease", q, "--handle-file", handle, *args)
    assert r.code == 0, r.err
    return r.out_lines[0].removeprefix("job_id: ")


def files_in(d: Path) -> list[str]:
    return sorted(os.listdir(d))


# --------------------------------------------------------------------------- general


def test_help_usage_errors_and_unknown_commands() -> None:
    r = steadq("--help")
    assert r.code == 0 and "put" in r.out and "admin" in r.out
    r = steadq("put", "--help")
    assert r.code == 0 and "--meta" in r.out and "example:" in r.out
    for argv in (("frobnicate",), (), ("put",), ("init", "/x", "--shards", "zero"), ("put", "/x", "--shard", "4")):
        r = steadq(*argv)
        assert r.code == 1, (argv, r)
        assert len(r.err_lines) == 1 and r.out == "", (argv, r.err)


def test_temp_sibling_replaces_the_extension_like_rust() -> None:
    assert temp_sibling("/d/h.json", "ab") == "/d/h.tmp.ab"
    assert temp_sibling("h", "ab") == "h.tmp.ab"
    assert temp_sibling("/d/.h", "ab") == "/d/.h.tmp.ab"
    assert temp_sibling("a.b.json", "ab") == "a.b.tmp.ab"


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "h.json"
    target.write_text("old")
    write_atomic(str(target), "new")
    assert target.read_text() == "new"
    assert files_in(tmp_path) == ["h.json"]
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(OSError):
        write_atomic(str(tmp_path / "missing" / "h.json"), "x")
    assert files_in(tmp_path) == ["h.json"]


# --------------------------------------------------------------------------- init


def test_init_success_and_failures(tmp_path: Path) -> None:
    q = tmp_path / "new" / "q"
    r = steadq("init", q, "--shards", "8", "--terminal-bucket-width-ns", "600000000000", "--parents")
    assert r.code == 0 and r.out == r.err_lines[1].removeprefix("queue_id: ") + "\n"
    assert r.err_lines[0] == f"initialized queue at {q}"
    assert HEX32.fullmatch(r.err_lines[1].removeprefix("queue_id: "))
    assert r.err_lines[2] == "shards: 8"
    ts = check_tree(q)
    assert ts.fmt.shard_count == 8 and ts.fmt.terminal_width_ns == 600_000_000_000
    assert ts.fmt.queue_id.hex() == r.err_lines[1].removeprefix("queue_id: ")

    r = steadq("init", q)
    assert r.code == 1 and r.err_lines == ["init failed: queue is already initialized (FORMAT exists)"]
    r = steadq("init", tmp_path / "bad", "--terminal-bucket-width-ns", "5")
    assert r.code == 1 and r.err.startswith("init failed: ")
    assert not (tmp_path / "bad" / "FORMAT").exists()


def test_init_on_tmpfs_is_unsupported() -> None:
    d = Path("/dev/shm") / f"steadq-cli-{os.getpid()}"
    try:
        r = steadq("init", d)
        assert r.code == 64, r
        assert r.err.startswith("init failed: ") and "tmpfs" in r.err
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- put


def test_put_from_file_and_stdin(qpath: str, tmp_path: Path) -> None:
    f = tmp_path / "payload.bin"
    f.write_bytes(b"\x00\x01binary" * 1000)
    r = steadq("put", qpath, f, "--content-type", "application/x-test", "--max-attempts", "5", "--producer-id", "me")
    assert r.code == 0 and r.err == ""
    job_id = r.out_lines[0].removeprefix("job_id: ")
    path = r.out_lines[1].removeprefix("path: ")
    assert HEX32.fullmatch(job_id) and path.startswith("ready/") and path.endswith(".sqj")
    assert os.path.isfile(os.path.join(qpath, path))
    job2 = put(qpath, b"from stdin", "-", "--meta", "user=ann", "--meta", "build.id=42")
    ts = check_tree(qpath)
    assert ts.ready == {job_id, job2}
    with Queue.open(qpath) as q:
        got = {}
        while (le := q.lease()) is not None:
            got[le.job_id] = (le.payload(), le.content_type, le.max_attempts, le.metadata, le.producer_id)
    assert got[job_id] == (f.read_bytes(), "application/x-test", 5, {}, "me")
    assert got[job2] == (b"from stdin", "application/octet-stream", 3, {"user": "ann", "build.id": "42"}, None)


def test_put_delayed_by_human_duration_and_not_before(qpath: str) -> None:
    with Queue.open(qpath) as q:
        floor = q.wall_floor_ns()
    r = steadq("put", qpath, "--delay", "2h", stdin=b"x")
    assert r.code == 0, r.err
    assert r.out_lines[1].startswith("path: delayed/")
    job = r.out_lines[0].removeprefix("job_id: ")
    not_before = check_tree(qpath).get(job).name.not_before
    assert floor + 7200 * 10**9 <= not_before <= floor + 7300 * 10**9
    far = floor + 10**15
    r = steadq("put", qpath, "--not-before", str(far), stdin=b"x")
    assert r.code == 0 and r.out_lines[1].startswith("path: delayed/")
    assert check_tree(qpath).get(r.out_lines[0].removeprefix("job_id: ")).name.not_before == far
    r = steadq("put", qpath, "--not-before", "1", stdin=b"x")  # in the past: ready
    assert r.code == 0 and r.out_lines[1].startswith("path: ready/")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--delay", "5x"), "'5x'"),
        (("--delay=-3s",), "'-3s'"),
        (("--meta", "User=x"), "'User'"),
        (("--meta", "novalue"), "'novalue'"),
        (("--meta", "k=v", "--meta", "bad key=v"), "'bad key'"),
        (("--delay", "1s", "--not-before", "5"), "--not-before"),
        (("--max-attempts", "-1"), "max attempts"),
    ],
)
def test_put_bad_input_is_one_line_exit_1_and_writes_nothing(qpath: str, args: tuple[str, ...], needle: str) -> None:
    before = check_tree(qpath).paths()
    r = steadq("put", qpath, *args, stdin=b"x")
    assert r.code == 1 and r.out == ""
    assert len(r.err_lines) == 1 and needle in r.err, r.err
    assert check_tree(qpath, allow_temps=False).paths() == before


def test_put_errors_map_to_spec_exit_codes(qpath: str, tmp_path: Path) -> None:
    r = steadq("put", qpath, tmp_path / "missing.bin")
    assert (r.code, r.err_lines) == (6, [f"cannot read {tmp_path / 'missing.bin'}: No such file or directory"])
    r = steadq("put", tmp_path / "nowhere", stdin=b"x")
    assert r.code == 6 and "does not exist" in r.err and len(r.err_lines) == 1
    (tmp_path / "plain").mkdir()
    r = steadq("put", tmp_path / "plain", stdin=b"x")
    assert r.code == 3 and "not a queue" in r.err and len(r.err_lines) == 1
    r = steadq("put", qpath, "--content-type", "a" * 300, stdin=b"x")  # library validation: NotCommitted(InvalidInput)
    assert r.code == 1 and r.err.startswith("not committed: ")
    assert check_tree(qpath).all_ids == frozenset()


def test_put_outcome_unknown_prints_job_and_path(qpath: str, capsys: pytest.CaptureFixture[str]) -> None:
    import io
    import sys

    # Walk the fsyncs until one after the link fails: earlier ones (file
    # fsync, a watermark advance) give NotCommitted and publish nothing.
    for nth in range(1, 8):
        capsys.readouterr()
        old = sys.stdin
        sys.stdin = io.TextIOWrapper(io.BytesIO(b"payload"))
        try:
            with linux.inject(nth=nth, errno=errno.EIO, op="fsync", after=True):
                code = main(["put", qpath])
        finally:
            sys.stdin = old
        if code == 2:
            break
        assert code != 0
    err_lines = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err_lines[0].startswith("outcome unknown: ")
    assert HEX32.fullmatch(err_lines[1].removeprefix("job_id: "))
    assert err_lines[2].startswith("path: ready/")


# --------------------------------------------------------------------------- lease / ack / retry / bury


def test_lease_writes_the_handle_file_exactly(qpath: str, tmp_path: Path) -> None:
    job = put(qpath, b"abc")
    handle = tmp_path / "h.json"
    r = steadq("lease", qpath, "--handle-file", handle, "--duration-seconds", "60")
    assert r.code == 0
    assert r.out_lines == [f"job_id: {job}", "generation: 1", "attempt: 1/3"]
    doc = json.loads(handle.read_text())
    assert list(doc) == HANDLE_FIELDS
    assert handle.read_text() == json.dumps(doc, indent=2)  # 2-space pretty JSON, field order as cli.md
    assert doc["queue_root"] == qpath and doc["job_id"] == job and doc["payload_length"] == 3
    assert doc["expected_dev"] and doc["expected_inode"]
    st = os.stat(os.path.join(qpath, doc["exact_source_path"]))
    assert (st.st_dev, st.st_ino) == (doc["expected_dev"], doc["expected_inode"])
    assert files_in(tmp_path) == ["h.json", os.path.basename(qpath)]  # no temp left behind
    # interop: the library reads it and settles the lease
    le, qid = Lease.from_handle(handle.read_text())
    with Queue.open(qpath) as q:
        assert qid == q.queue_id
        assert q.ack(le).value == "acked"
    assert check_tree(qpath).receipts == {job}


def test_library_handle_is_accepted_by_the_cli(qpath: str, tmp_path: Path) -> None:
    job = put(qpath)
    with Queue.open(qpath) as q:
        le = q.lease()
        (tmp_path / "lib.json").write_text(le.to_handle(qpath))
    r = steadq("ack", qpath, "--handle-file", tmp_path / "lib.json")
    assert (r.code, r.err_lines, r.out) == (0, ["acked"], "")
    r = steadq("ack", qpath, "--handle-file", tmp_path / "lib.json")
    assert (r.code, r.err_lines) == (0, ["already acked (idempotent success)"])
    assert check_tree(qpath).receipts == {job}


def test_lease_errors(qpath: str, tmp_path: Path) -> None:
    r = steadq("lease", qpath)
    assert (r.code, r.err_lines, r.out) == (1, ["no jobs available"], "")
    for bad in ("0", "604801", "abc"):
        r = steadq("lease", qpath, "--duration-seconds", bad)
        assert r.code == 1 and len(r.err_lines) == 1, (bad, r.err)
    put(qpath)
    r = steadq("lease", qpath, "--handle-file", tmp_path / "nodir" / "h.json")
    assert r.code == 6 and r.err.startswith("failed to write handle file ") and r.out == ""
    r = steadq("lease", tmp_path / "nowhere")
    assert r.code == 6 and "does not exist" in r.err


def test_lease_outcome_unknown_writes_the_ticket(
    qpath: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = put(qpath)
    ticket = tmp_path / "t.json"
    for nth in range(1, 8):  # the first fsync after the claim rename (a watermark advance may come first)
        capsys.readouterr()
        with linux.inject(nth=nth, errno=errno.EIO, op="fsync", after=True):
            code = main(["lease", qpath, "--ticket-out", str(ticket), "--handle-file", str(tmp_path / "h.json")])
        if code == 2:
            break
        assert not ticket.exists()
    assert code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "outcome unknown"
    assert f"job_id: {job}" in lines and f"ticket written to: {ticket}" in lines
    t = TransitionTicket.from_json(ticket.read_text())
    assert t.operation == "claim" and t.job_id.hex() == job
    assert not (tmp_path / "h.json").exists()
    r = steadq("resolve", qpath, "--result-file", ticket)
    assert r.code == 0 and r.err.startswith("destination observed: ready/")


def test_ack_retry_bury_handle_errors(qpath: str, tmp_path: Path) -> None:
    put(qpath)
    h = tmp_path / "h.json"
    lease(qpath, h)
    doc = json.loads(h.read_text())
    for cmd in ("ack", "retry", "bury"):
        r = steadq(cmd, qpath, "--handle-file", tmp_path / "missing.json")
        assert r.code == 6 and r.err.startswith("cannot read handle file ") and len(r.err_lines) == 1
        (tmp_path / "garbage.json").write_text("{not json")
        r = steadq(cmd, qpath, "--handle-file", tmp_path / "garbage.json")
        assert r.code == 1 and r.err.startswith("invalid handle file ")
        other = dict(doc, queue_id="0" * 32)
        (tmp_path / "other.json").write_text(json.dumps(other))
        r = steadq(cmd, qpath, "--handle-file", tmp_path / "other.json")
        assert r.code == 1 and "belongs to queue" in r.err
        (tmp_path / "noqid.json").write_text(json.dumps({k: v for k, v in doc.items() if k != "queue_id"}))
        r = steadq(cmd, qpath, "--handle-file", tmp_path / "noqid.json")
        assert r.code == 1 and "no queue_id" in r.err
        r = steadq(cmd)
        assert r.code == 1
    r = steadq("ack", qpath)  # --handle-file is required
    assert r.code == 1 and "--handle-file" in r.err
    # the lease is untouched by all of that
    assert check_tree(qpath).leased == {doc["job_id"]}
    r = steadq("retry", qpath, "--handle-file", h)
    assert (r.code, r.err_lines) == (0, ["retried"])
    for cmd in ("ack", "retry", "bury"):
        r = steadq(cmd, qpath, "--handle-file", h)
        assert (r.code, r.err_lines) == (1, ["lease lost"]), cmd


def test_retry_later_and_exhausted_retry(qpath: str, tmp_path: Path) -> None:
    job = put(qpath)
    h = tmp_path / "h.json"
    lease(qpath, h)
    r = steadq("retry", qpath, "--handle-file", h, "--after-seconds", "3600")
    assert (r.code, r.err_lines) == (0, ["retried"])
    ts = check_tree(qpath)
    assert ts.delayed == {job} and ts.get(job).attempt == 1
    job1 = put(qpath, b"x", "--max-attempts", "1")
    lease(qpath, h)
    r = steadq("retry", qpath, "--handle-file", h)
    assert (r.code, r.err_lines) == (0, ["retried"])
    ts = check_tree(qpath)
    assert ts.dead == {job1} and ts.get(job1).name.reason == 4  # attempts exhausted


@pytest.mark.parametrize(("given", "stored"), [("3", 3), ("4", 4), ("7", 0), ("65535", 0)])
def test_bury_honours_only_reasons_0_to_4(qpath: str, tmp_path: Path, given: str, stored: int) -> None:
    job = put(qpath)
    lease(qpath, tmp_path / "h.json")
    r = steadq("bury", qpath, "--handle-file", tmp_path / "h.json", "--reason", given)
    assert (r.code, r.err_lines) == (0, ["buried"])
    assert check_tree(qpath).get(job).name.reason == stored


def test_bury_reason_out_of_u16_is_invalid(qpath: str, tmp_path: Path) -> None:
    r = steadq("bury", qpath, "--handle-file", tmp_path / "h.json", "--reason", "65536")
    assert r.code == 1 and "reason" in r.err


def test_shell_lifecycle_checks_the_tree_after_each_step(tmp_path: Path) -> None:
    """init, put, lease, ack; put, lease, retry, lease again, bury; admin dead-list, admin requeue."""
    q = tmp_path / "life"
    h = tmp_path / "h.json"
    assert steadq("init", q, "--shards", "4").code == 0
    assert check_tree(q).all_ids == frozenset()

    a = put(str(q), b"first")
    assert check_tree(q).ready == {a}
    assert lease(str(q), h) == a
    ts = check_tree(q)
    assert ts.leased == {a} and (ts.get(a).generation, ts.get(a).attempt) == (1, 1)
    assert steadq("ack", q, "--handle-file", h).err_lines == ["acked"]
    ts = check_tree(q)
    assert ts.receipts == {a} and ts.ready == ts.leased == frozenset()

    b = put(str(q), b"second")
    assert check_tree(q).ready == {b}
    assert lease(str(q), h) == b
    assert check_tree(q).leased == {b}
    assert steadq("retry", q, "--handle-file", h).err_lines == ["retried"]
    ts = check_tree(q)
    assert ts.ready == {b} and (ts.get(b).generation, ts.get(b).attempt) == (2, 1)
    r = steadq("lease", q, "--handle-file", h)
    assert r.out_lines == [f"job_id: {b}", "generation: 3", "attempt: 2/3"]
    assert check_tree(q).leased == {b}
    assert steadq("bury", q, "--handle-file", h).err_lines == ["buried"]
    ts = check_tree(q)
    assert ts.dead == {b} and ts.get(b).name.reason == 0 and ts.receipts == {a}

    r = steadq("admin", "dead-list", q)
    assert r.code == 0
    (line,) = r.out_lines
    name, rel = line.split(" ")
    assert name.startswith(b) and rel == ts.get(b).path and rel.endswith("/" + name)
    r = steadq("admin", "requeue", q, b)
    assert r.code == 0 and r.out_lines[0] == f"job_id: {b}" and r.out_lines[1].startswith("path: ready/")
    ts = check_tree(q)
    assert ts.ready == {b} and ts.dead == frozenset() and ts.get(b).attempt == 0
    assert lease(str(q), h) == b  # claimable again
    assert steadq("ack", q, "--handle-file", h).code == 0
    assert check_tree(q).receipts == {a, b}


# --------------------------------------------------------------------------- stats / ls / watch


def test_stats_text_json_prometheus(qpath: str) -> None:
    put(qpath)
    r = steadq("stats", qpath)
    assert r.code == 0
    assert r.out_lines[:4] == ["dead: 0", "delayed: 0", "leased: 0", "quarantine: 0"]
    assert re.fullmatch(r"ready: 1 \(oldest \d+s\)", r.out_lines[4]) and r.out_lines[5:] == [
        "receipts: 0",
        "running: 0",
    ]
    j = steadq("stats", qpath, "--json")
    doc = json.loads(j.out)
    assert list(doc) == ["dead", "delayed", "leased", "quarantine", "ready", "receipts", "running"]
    assert doc["ready"]["objects"] == 1 and doc["dead"] == {"objects": 0, "oldest_age_seconds": None}
    assert j.out == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    anywhere = json.loads(steadq("--json", "stats", qpath).out)  # --json accepted anywhere
    assert {k: v["objects"] for k, v in anywhere.items()} == {k: v["objects"] for k, v in doc.items()}
    p = steadq("stats", qpath, "--prometheus", "--json")  # --prometheus wins
    lines = p.out_lines
    assert lines[:2] == ["# TYPE steadq_dead_objects gauge", "steadq_dead_objects 0"]
    assert "steadq_ready_objects 1" in lines
    assert "# TYPE steadq_ready_oldest_age_seconds gauge" in lines
    assert not any(x.startswith("steadq_dead_oldest") for x in lines)
    r = steadq("stats", os.path.dirname(qpath) + "/nowhere")
    assert r.code == 6 and len(r.err_lines) == 1


def test_ls_lists_states_attempts_and_deadlines(qpath: str, tmp_path: Path) -> None:
    # Lease the job while it is the only ready one: the scan order is random.
    leased_job = put(qpath)
    assert lease(qpath, tmp_path / "h.json") == leased_job
    ready = put(qpath)
    delayed = put(qpath, b"d", "--delay", "1d")
    r = steadq("ls", qpath)
    assert r.code == 0 and r.out_lines[0].split() == ["STATE", "JOB_ID", "ATTEMPT", "AGE", "DEADLINE"]
    rows = {line.split()[1]: line.split() for line in r.out_lines[1:]}
    assert set(rows) == {ready, delayed, leased_job}
    # just under a day away; within half a second of the put it rounds to 1d
    assert rows[delayed][0] == "delayed" and re.search(r"\(due in (23h|1d\))", " ".join(rows[delayed]))
    assert rows[leased_job][0] == "running" and rows[leased_job][2] == "1/3"
    docs = json.loads(steadq("ls", qpath, "delayed", "--json").out)
    assert [d["job_id"] for d in docs] == [delayed]
    assert set(docs[0]) == {
        "state",
        "job_id",
        "generation",
        "attempt",
        "max_attempts",
        "age_seconds",
        "deadline_ns",
        "path",
    }
    assert docs[0]["deadline_ns"] == check_tree(qpath).get(delayed).name.not_before
    assert json.loads(steadq("ls", qpath, "dead", "--json").out) == []
    r = steadq("ls", qpath, "bogus")
    assert r.code == 1 and "bogus" in r.err
    r = steadq("ls", str(tmp_path / "nowhere"))
    assert r.code == 6 and "does not exist" in r.err


def test_watch_without_a_terminal_prints_plain_frames(qpath: str) -> None:
    put(qpath)
    r = steadq("watch", qpath, "--count", "2", "--interval", "0.1")
    assert r.code == 0 and "\x1b[" not in r.out
    assert r.out.count(f"steadq watch {qpath}") == 2
    assert re.search(r"^ready\s+1\s", r.out, re.M)
    assert "throughput:" in r.out


# --------------------------------------------------------------------------- fsck / quarantine admin / inspect


def _corrupt_payload(qpath: str, job: str) -> str:
    rel = check_tree(qpath).get(job).path
    full = os.path.join(qpath, rel)
    data = bytearray(Path(full).read_bytes())
    data[-1] ^= 0xFF
    Path(full).write_bytes(bytes(data))
    return rel


def test_fsck_finds_repairs_and_quarantine_admin(qpath: str, tmp_path: Path) -> None:
    good = put(qpath, b"good")
    bad = put(qpath, b"bad payload")
    r = steadq("fsck", qpath)
    assert (r.code, r.out, r.err_lines) == (0, "", ["objects: 2, structurally verified: 2, payload verified: 0"])
    rel = _corrupt_payload(qpath, bad)
    assert steadq("fsck", qpath).code == 0  # structural only: the payload is not hashed
    r = steadq("fsck", qpath, "--deep")
    assert r.code == 3 and r.out_lines[0].startswith(f"ERROR {rel}: ")
    j = json.loads(steadq("fsck", qpath, "--deep", "--json").out)
    assert j["findings"][0]["severity"] == "ERROR" and j["findings"][0]["path"] == rel
    r = steadq("fsck", qpath, "--deep", "--repair")
    assert r.code == 3 and "quarantined: 1" in r.err_lines  # an ERROR was found, even if repaired
    assert steadq("fsck", qpath, "--deep").code == 0
    assert check_tree(qpath).ready == {good}

    r = steadq("admin", "quarantine-list", qpath)
    (line,) = r.out_lines
    qid, reason, qrel = line.split(" ")
    assert HEX32.fullmatch(qid) and reason == "reason=0x0002" and qrel.startswith("quarantine/q" + qid)
    assert json.loads(steadq("admin", "quarantine-list", qpath, "--json").out)[0]["quarantine_id"] == qid
    r = steadq("admin", "quarantine-inspect", qpath, qid)
    size = os.path.getsize(os.path.join(qpath, qrel))
    assert r.out_lines == [f"quarantine_id={qid} reason=0x0002 path={qrel} size={size}"]
    assert (steadq("admin", "quarantine-inspect", qpath, "xyz").code, "invalid quarantine_id") == (
        1,
        "invalid quarantine_id",
    )
    assert steadq("admin", "quarantine-inspect", qpath, "0" * 32).err_lines == ["not found"]
    r = steadq("admin", "quarantine-export", qpath, qid, tmp_path / "evidence.raw")
    assert (r.code, r.err_lines) == (0, [f"exported {size} bytes"])
    assert (tmp_path / "evidence.raw").read_bytes() == Path(qpath, qrel).read_bytes()
    assert steadq("admin", "quarantine-export", qpath, "0" * 32, tmp_path / "x").code == 1
    assert steadq("admin", "quarantine-remove", qpath, qid).err_lines == ["removed"]
    r = steadq("admin", "quarantine-remove", qpath, qid)
    assert (r.code, r.err_lines) == (1, ["not found"])
    assert steadq("admin", "quarantine-list", qpath).out == ""


def test_inspect(qpath: str, tmp_path: Path) -> None:
    job = put(qpath)
    lease(qpath, tmp_path / "h.json")
    steadq("ack", qpath, "--handle-file", tmp_path / "h.json")
    r = steadq("inspect", qpath, job)
    assert r.code == 0
    (line,) = r.out_lines
    assert line == f"receipt gen=2 attempt=1/3 {check_tree(qpath).get(job).path}"
    docs = json.loads(steadq("inspect", qpath, job, "--json").out)
    assert docs[0]["state"] == "receipt" and docs[0]["generation"] == 2
    r = steadq("inspect", qpath, "0" * 32)
    assert (r.code, r.err_lines, r.out) == (1, ["not found"], "")
    for bad in ("XYZ", job.upper(), job[:5], job + "0"):
        r = steadq("inspect", qpath, bad)
        assert r.code == 1 and r.err.startswith("invalid job_id: expected 32 lowercase hex chars, or a unique prefix")
    assert steadq("inspect", qpath, job[:-1]).out_lines == [line]  # a prefix names the job (issue 33 #5)


# --------------------------------------------------------------------------- verify / format-dump


def test_verify_and_format_dump(qpath: str, tmp_path: Path) -> None:
    job = put(qpath, b"hello world")
    src = Path(qpath, check_tree(qpath).get(job).path)
    f = tmp_path / "job.sqj"
    shutil.copy(src, f)
    h = JobHeader.decode(f.read_bytes()[:128])
    head = [f"job_id: {job}", "payload_length: 11", "maximum_attempts: 3"]
    r = steadq("verify", f)
    assert (r.code, r.out, r.err_lines) == (0, "", [*head, "envelope_digest: verified", "valid"])
    r = steadq("verify", f, "--deep")
    assert r.err_lines == [*head, "envelope_digest: verified", "payload_digest: verified", "valid"]
    r = steadq("format-dump", f)
    assert r.code == 0 and r.out_lines == [
        "type: job", f"job_id: {job}", "payload_length: 11", f"extension_header_length: {h.extension_length}",
        "maximum_attempts: 3", f"payload_digest: {h.payload_digest.hex()}", f"envelope_digest: {h.envelope_digest.hex()}",
    ]  # fmt: skip
    assert json.loads(steadq("format-dump", f, "--json").out)["job_id"] == job

    data = f.read_bytes()
    payload_flip = data[:-1] + bytes([data[-1] ^ 1])
    f.write_bytes(payload_flip)
    assert steadq("verify", f).code == 0  # payload not hashed without --deep
    r = steadq("verify", f, "--deep")
    assert (r.code, r.err_lines[-1]) == (3, "CORRUPT: payload digest mismatch")
    f.write_bytes(data[:130] + bytes([data[130] ^ 1]) + data[131:])  # inside the extension
    r = steadq("verify", f)
    assert (r.code, r.err_lines[-1]) == (3, "CORRUPT: envelope digest mismatch")
    f.write_bytes(data[:-2])
    r = steadq("verify", f)
    assert (r.code, r.err_lines[-1]) == (3, f"CORRUPT: expected {len(data)} bytes, got {len(data) - 2}")
    f.write_bytes(data[:8] + b"\xff" * 120)
    r = steadq("verify", f)
    assert r.code == 3 and r.err_lines[0].startswith("CORRUPT: ")
    r = steadq("format-dump", f)
    assert r.code == 1 and r.err.startswith("parse error: ")

    fmt = Path(qpath, "FORMAT")
    r = steadq("verify", fmt)
    ts = check_tree(qpath)
    assert r.err_lines == [f"queue_id: {ts.fmt.queue_id.hex()}", "shard_count: 4", "valid"]
    r = steadq("format-dump", fmt)
    assert r.out_lines[:3] == ["type: format", f"queue_id: {ts.fmt.queue_id.hex()}", "shard_count: 4"]
    assert r.out_lines[3:] == [
        "lease_bucket_width_ns: 10000000000", "delayed_bucket_width_ns: 10000000000",
        "terminal_bucket_width_ns: 3600000000000", "max_payload_length: 1099511627775",
    ]  # fmt: skip
    other = tmp_path / "other.txt"
    other.write_text("just text")
    assert (steadq("verify", other).code, steadq("verify", other).err_lines) == (1, ["unknown format"])
    assert steadq("format-dump", other).err_lines == ["unrecognized format"]
    r = steadq("verify", tmp_path / "missing")
    assert r.code == 6 and len(r.err_lines) == 1


# --------------------------------------------------------------------------- doctor / recover / compact


def test_doctor(qpath: str, tmp_path: Path) -> None:
    r = steadq("doctor", qpath)
    assert r.code == 0, r.err
    assert r.err_lines[0] == f"steadq doctor {qpath}"
    names = [line.strip().split(":")[0] for line in r.err_lines[1:]]
    assert names == [
        "boot_id", "clock_boottime", "clock_realtime", "getrandom", "filesystem", "job_access",
        "publication_mode", "rename_noreplace", "dir_fsync", "job_spawn", "claim_path",
    ]  # fmt: skip
    assert "  filesystem: ext4 (magic 0xef53)" in r.err_lines and "  rename_noreplace: supported" in r.err_lines
    doc = json.loads(steadq("doctor", qpath, "--json").out)
    assert list(doc) == sorted(names) and all(v["ok"] for v in doc.values())
    assert os.listdir(Path(qpath, "tmp")) == []  # probes cleaned up
    from steadqd.daemon.worker.run import fastspawn

    assert f"  job_spawn: {fastspawn.path()}" in r.err_lines  # the spawn path this installation's worker uses
    from steadqd.fs.compiled import bridge

    assert f"  claim_path: {bridge.path()}" in r.err_lines  # the claim path a lease takes here
    r = steadq("doctor", tmp_path / "nowhere")
    assert r.code == 0 and len(r.err_lines) == 7  # the path-free checks, the spawn and the claim path
    shm = Path("/dev/shm") / f"steadq-doctor-{os.getpid()}"
    shm.mkdir()
    try:
        r = steadq("doctor", shm)
        assert r.code == 6 and any(x.startswith("  filesystem: tmpfs") and x.endswith(" [FAIL]") for x in r.err_lines)
    finally:
        shm.rmdir()


def test_recover_and_compact_receipts(qpath: str, tmp_path: Path) -> None:
    r = steadq("recover", qpath, "--budget-ops", "50", "--budget-ms", "1000")
    assert r.code == 0 and re.fullmatch(
        r"reaped:0 promoted:0 temp_deleted:0 dead:0 ops:\d+( \(budget exhausted\))?", r.err_lines[0]
    )
    r = steadq("admin", "compact-receipts", qpath)
    assert (r.code, r.err_lines) == (0, ["compacted: 0 expired: 0"])
    assert steadq("recover", tmp_path / "nowhere").code == 6
    assert steadq("admin", "compact-receipts", tmp_path / "nowhere").code == 6


# --------------------------------------------------------------------------- resolve


def _claim_ticket(qpath: str, job: str) -> TransitionTicket:
    """A claim ticket for the ready object of ``job`` (as an indeterminate lease would produce)."""
    rel = check_tree(qpath).get(job).path
    h = JobHeader.decode(Path(qpath, rel).read_bytes()[:128])
    with Queue.open(qpath) as q:
        qid, boot = bytes.fromhex(q.queue_id), q.boot_id
    return TransitionTicket(
        queue_id=qid, operation="claim", phase="linearized", job_id=bytes.fromhex(job), generation=0, attempt=0,
        maximum_attempts=3, lease_token=os.urandom(16), envelope_digest=h.envelope_digest,
        payload_length=h.payload_length, source=ReadyLocation(),
        destination=LeasedLocation(boot, linux.boottime_ns() + 60 * 10**9, linux.realtime_ns() + 60 * 10**9),
    )  # fmt: skip


def test_resolve_outcomes_and_errors(qpath: str, tmp_path: Path) -> None:
    job = put(qpath)
    t = _claim_ticket(qpath, job)
    tf = tmp_path / "t.json"
    tf.write_text(t.to_json())
    with Queue.open(qpath) as q:
        src, dst = q.ticket_paths(t)
    r = steadq("resolve", qpath, "--result-file", tf)
    assert (r.code, r.err_lines) == (0, [f"source observed: {src}"])
    r = steadq("resolve", qpath, "--result-file", tf, "--stabilize")
    assert (r.code, r.err_lines) == (0, [f"source observed: {src}"])

    Path(qpath, dst).write_bytes(Path(qpath, src).read_bytes())  # a valid copy at the destination too
    os.chmod(Path(qpath, dst), 0o600)
    r = steadq("resolve", qpath, "--result-file", tf)
    assert (r.code, r.err_lines) == (3, ["both source and destination observed (corruption)"])
    Path(qpath, dst).write_bytes(b"garbage" * 40)
    r = steadq("resolve", qpath, "--result-file", tf)
    assert (r.code, r.err_lines) == (3, ["conflicting object at expected path"])
    os.unlink(Path(qpath, dst))
    os.unlink(Path(qpath, src))
    r = steadq("resolve", qpath, "--result-file", tf)
    assert (r.code, r.err_lines) == (1, ["neither source nor destination observed"])

    r = steadq("resolve", qpath, "--result-file", tmp_path / "missing.json")
    assert r.code == 1 and r.err.startswith("cannot read ticket ")
    (tmp_path / "bad.json").write_text('{"schema": "nope"}')
    r = steadq("resolve", qpath, "--result-file", tmp_path / "bad.json")
    assert r.code == 1 and r.err.startswith("invalid transition ticket: ")
    r = steadq("resolve", tmp_path / "nowhere", "--result-file", tf)
    assert r.code == 6  # open failure is 6 for resolve
    other = tmp_path / "other"
    Queue.init(str(other), shards=4).close()
    r = steadq("resolve", other, "--result-file", tf)
    assert r.code == 1 and len(r.err_lines) == 1


# --------------------------------------------------------------------------- work / bench


def test_work_once_acks_and_streams_the_payload(qpath: str, tmp_path: Path) -> None:
    payload = os.urandom(300_000)  # several 64 KiB chunks
    job = put(qpath, payload)
    out = tmp_path / "out.bin"
    r = steadq("work", qpath, "--once", "--", "sh", "-c", f'cat > {out}; echo "$STEADQ_JOB_ID" > {out}.id')
    assert r.code == 0, r.err
    assert out.read_bytes() == payload and Path(f"{out}.id").read_text().strip() == job
    assert check_tree(qpath).receipts == {job}
    r = steadq("work", qpath, "--once", "--", "true")
    assert r.code == 0  # empty queue


def test_work_failures_requeue(qpath: str, tmp_path: Path) -> None:
    job = put(qpath)
    r = steadq("work", qpath, "--once", "--", "sh", "-c", "exit 5")
    assert r.code == 5
    ts = check_tree(qpath)
    assert ts.ready == {job} and ts.get(job).attempt == 1
    r = steadq("work", qpath, "--once", "--", str(tmp_path / "no-such-program"))
    assert r.code == 127 and "cannot run" in r.err
    assert check_tree(qpath).ready == {job}
    r = steadq("work", qpath, "--once", "--", "sh", "-c", "kill -9 $$")
    assert r.code == 1  # a signal counts as 1; that was the last attempt: buried
    assert check_tree(qpath).dead == {job}
    r = steadq("work", qpath, "--once")
    assert r.code == 1 and "missing COMMAND" in r.err
    r = steadq("put", qpath, "--", "cat")
    assert r.code == 1


def test_work_corrupt_payload_is_quarantined(qpath: str) -> None:
    job = put(qpath, b"will be corrupted")
    _corrupt_payload(qpath, job)
    r = steadq("work", qpath, "--once", "--", "cat")
    assert r.code == 3 and "quarantined" in r.err
    ts = check_tree(qpath)
    assert ts.all_ids == frozenset() and len(ts.quarantine) == 1


def test_lease_of_a_corrupt_only_job_exits_3(qpath: str, tmp_path: Path) -> None:
    bad = put(qpath, b"corrupt me")
    _corrupt_payload(qpath, bad)
    r = steadq("lease", qpath, "--handle-file", tmp_path / "h.json")
    assert r.code == 3 and r.err.startswith("lease failed: corrupt object ") and r.out == ""
    assert not (tmp_path / "h.json").exists()
    good = put(qpath, b"fine")
    bad2 = put(qpath, b"corrupt me too")
    _corrupt_payload(qpath, bad2)
    for _ in range(2):  # whichever the scan meets first, the good job is leased in the end
        r = steadq("lease", qpath)
        if r.code == 0:
            break
    assert r.out_lines[0] == f"job_id: {good}"
    r = steadq("lease", qpath)  # whatever is left is corrupt (3) or already isolated (1)
    assert r.code in (1, 3) and r.out == ""
    assert len(check_tree(qpath).quarantine) == 2


def test_bench(qpath: str) -> None:
    r = steadq("bench", qpath, "--duration-seconds", "0.5", "--payload-size", "16")
    assert r.code == 0
    assert r.err_lines[0] == "bench: 1 producers, 1 consumers, 0.5s, 16B payload"  # the reference's line
    counts = {}
    for line, key in zip(r.err_lines[1:4], ("enqueued", "leased", "acked"), strict=True):
        m = re.fullmatch(rf"{key}: (\d+) \(\d+/s\)", line)
        assert m, line
        counts[key] = int(m.group(1))
    assert counts["acked"] == counts["leased"] <= counts["enqueued"]
    ts = check_tree(qpath)
    assert len(ts.receipts) == counts["acked"] and len(ts.ready) == counts["enqueued"] - counts["acked"]


# --------------------------------------------------------------------------- admin (dead letters)


def test_admin_dead_commands(qpath: str, tmp_path: Path) -> None:
    assert steadq("admin", "dead-list", qpath).out == ""
    r = steadq("admin", "dead-list", tmp_path / "nowhere")
    assert r.code == 0 and r.out == ""  # missing dead/ -> 0
    job = put(qpath, b"dead payload")
    lease(qpath, tmp_path / "h.json")
    steadq("bury", qpath, "--handle-file", tmp_path / "h.json", "--reason", "3")
    rel = check_tree(qpath).get(job).path
    r = steadq("admin", "dead-inspect", qpath, job)
    assert r.out_lines == [f"gen=2 attempt=1/3 {rel}"]
    assert steadq("admin", "dead-inspect", qpath, "0" * 32).code == 0  # 0 even if none
    assert steadq("admin", "dead-inspect", qpath, "nope").code == 1
    assert steadq("admin", "dead-inspect", tmp_path / "nowhere", job).code == 6
    docs = json.loads(steadq("admin", "dead-list", qpath, "--json").out)
    assert docs[0]["job_id"] == job and docs[0]["reason"] == 3 and docs[0]["path"] == rel
    r = steadq("admin", "dead-export", qpath, job, tmp_path / "dead.sqj")
    size = os.path.getsize(os.path.join(qpath, rel))
    assert (r.code, r.err_lines) == (0, [f"exported {size} bytes"])
    assert steadq("verify", tmp_path / "dead.sqj", "--deep").code == 0
    assert steadq("admin", "dead-export", qpath, "0" * 32, tmp_path / "x").err_lines == ["not found"]
    assert steadq("admin", "requeue", qpath, "0" * 32).code == 1
    assert steadq("admin", "dead-remove", qpath, job).err_lines == ["removed"]
    r = steadq("admin", "dead-remove", qpath, job)
    assert (r.code, r.err_lines) == (1, ["not found"])
    assert check_tree(qpath).all_ids == frozenset()
    assert steadq("admin", "dead-remove", tmp_path / "nowhere", job).code == 6


# --------------------------------------------------------------------------- bulk put (no terminal)


def test_bulk_put_from_directory_without_tty(qpath: str, tmp_path: Path) -> None:
    d = tmp_path / "payloads"
    d.mkdir()
    for i in range(300):
        (d / f"p{i:04d}").write_bytes(b"%d" % i)
    (d / "subdir").mkdir()  # not a regular file: skipped
    os.symlink(d / "p0000", d / "link")  # symlinks are not followed
    r = steadq("put", qpath, "--dir", d, "--meta", "batch=7", "--print-ids")
    assert r.code == 0, r.err
    assert len(r.err_lines) == 1 and re.match(r"enqueued 300 jobs \(\d+ bytes\) from files of ", r.err)
    assert "\r" not in r.err
    ids = [line.split()[0] for line in r.out_lines]
    assert len(set(ids)) == 300 and {line.split()[1] for line in r.out_lines} == {f"p{i:04d}" for i in range(300)}
    assert check_tree(qpath).ready == set(ids)


def test_bulk_put_jsonl_validates_first(qpath: str, tmp_path: Path) -> None:
    good = b'{"a": 1}\n\n["x", 2]\n"str"\n'
    r = steadq("put", qpath, "--jsonl", "-", stdin=good)
    assert r.code == 0 and r.err.startswith("enqueued 3 jobs")
    with Queue.open(qpath) as q:
        seen = set()
        while (le := q.lease()) is not None:
            seen.add((le.payload(), le.content_type))
    assert seen == {
        (b'{"a": 1}', "application/json"),
        (b'["x", 2]', "application/json"),
        (b'"str"', "application/json"),
    }
    before = check_tree(qpath).paths()
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"ok": true}\n{broken\n')
    r = steadq("put", qpath, "--jsonl", bad)
    assert r.code == 1 and r.err_lines[0].startswith(f"{bad}:2: invalid JSON")
    assert check_tree(qpath).paths() == before  # nothing half-written
    r = steadq("put", qpath, "--jsonl", tmp_path / "missing.jsonl")
    assert r.code == 6
    r = steadq("put", qpath, "--dir", tmp_path / "missing")
    assert r.code == 6 and r.err.startswith("cannot read directory")
    r = steadq("put", qpath, "--dir", tmp_path, "--jsonl", bad)
    assert r.code == 1


# --------------------------------------------------------------------------- completion


def test_completion_scripts() -> None:
    r = steadq("completion", "bash")
    assert r.code == 0 and "complete -F _steadq steadq" in r.out
    for word in ("dead-list", "quarantine-remove", "--handle-file", "--delay"):
        assert word in r.out
    if shutil.which("bash"):
        import subprocess

        assert subprocess.run(["bash", "-n"], input=r.out.encode(), check=False).returncode == 0
        # drive the function: complete "steadq ad" and "steadq admin dead-l"
        script = r.out + '\nCOMP_WORDS=(steadq ad); COMP_CWORD=1; _steadq; echo "${COMPREPLY[@]}"\n'
        script += 'COMP_WORDS=(steadq admin dead-l); COMP_CWORD=2; _steadq; echo "${COMPREPLY[@]}"\n'
        script += 'COMP_WORDS=(steadq lease /q --hand); COMP_CWORD=3; _steadq; echo "${COMPREPLY[@]}"\n'
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
        assert out == ["admin", "dead-list", "--handle-file"]
    z = steadq("completion", "zsh")
    assert z.code == 0 and z.out.startswith("#compdef steadq") and "compdef _steadq steadq" in z.out
    assert steadq("completion", "fish").code == 0  # tests/cli/test_completion.py drives all three shells


def test_state_enum_matches_ls_words() -> None:
    """ls filters by the State words; keep them in sync with the library."""
    assert {s.value for s in State} == {"ready", "leased", "delayed", "dead", "receipt"}


def test_init_shared_makes_a_group_queue(tmp_path: Path) -> None:
    import stat as _stat

    path = str(tmp_path / "shared")
    r = steadq("init", path, "--shards", "2", "--shared")
    assert r.code == 0 and "shared: group members may produce and consume" in r.err
    assert _stat.S_IMODE(os.stat(path).st_mode) == 0o2770
    assert steadq("put", path, stdin=b"x").code == 0
    for dirpath, dirs, files in os.walk(path):
        for n in dirs + files:
            assert os.lstat(os.path.join(dirpath, n)).st_mode & 0o040, f"{dirpath}/{n} not group-readable"
