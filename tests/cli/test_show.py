"""``steadq show QUEUE JOB_ID``: one job's whole story, in any state, from the installed script.

The journal part runs a stand-in ``journalctl`` put first on PATH (the tests
never read or start the machine's journal): it prints what ``journalctl -o
json`` would, or fails the way an unreadable journal does.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

from steadqd import Queue

from .helpers import STEADQ, steadq

ESC = "\x1b"


def _run(*args: str, path_dirs: list[Path] | None = None) -> tuple[int, bytes, str]:
    """The script with PATH replaced (only ``path_dirs``), so which journalctl it finds is the test's."""
    assert STEADQ is not None
    env = dict(os.environ, PATH=os.pathsep.join(map(str, path_dirs or [])))
    p = subprocess.run([STEADQ, *args], capture_output=True, env=env, stdin=subprocess.DEVNULL, timeout=60)
    return p.returncode, p.stdout, p.stderr.decode()


def _fake_journalctl(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    script = d / "journalctl"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return d


def _dead_job(qpath: str, payload: bytes, reason: int, **options: object) -> str:
    with Queue.open(qpath) as q:
        job = q.enqueue(payload, **options)  # type: ignore[arg-type]
        lease = q.lease()
        assert lease is not None and lease.job_id == job
        q.bury(lease, reason=reason)
    return job


def test_show_a_ready_job_tells_its_whole_story(qpath: str) -> None:
    with Queue.open(qpath) as q:
        job = q.enqueue(b'{"hello": "world"}\n', content_type="application/json", metadata={"user": "ann"},
                        producer_id="importer-7")  # fmt: skip
    r = steadq("show", qpath, job, "--no-journal")
    assert r.code == 0, r.err
    lines = r.out_lines
    assert lines[0] == f"job {job}: ready"
    for want in ("  generation:    0", "  attempts:      0 used of 3", "  content type:  application/json",
                 "  producer:      importer-7", "  metadata:      user=ann", "  payload:       19 bytes, verified",
                 "payload (text):", '  {"hello": "world"}'):  # fmt: skip
        assert want in lines, (want, r.out)
    assert any(line.startswith("  created:       20") and line.endswith("ago)") for line in lines), r.out
    doc = json.loads(steadq("show", qpath, job, "--json", "--no-journal").out)
    assert doc["state"] == "ready" and doc["job_id"] == job and doc["payload_verified"] is True
    assert doc["metadata"] == {"user": "ann"} and doc["payload_head_text"] == '{"hello": "world"}\n'
    assert doc["content_type"] == "application/json" and doc["producer_id"] == "importer-7"
    assert doc["reason"] is None and [o["state"] for o in doc["objects"]] == ["ready"]


def test_show_a_dead_job_names_its_reason_and_dumps_a_binary_payload(qpath: str) -> None:
    payload = bytes(range(256)) * 40  # 10 KiB, not text
    job = _dead_job(qpath, payload, reason=4)
    r = steadq("show", qpath, job, "--no-journal")
    assert r.code == 0, r.err
    assert r.out_lines[0] == f"job {job}: dead: attempts_exhausted (0x0004)"
    assert "  attempts:      1 used of 3" in r.out_lines
    assert "payload (binary) (first 256 of 10240 bytes; --payload writes all):" in r.out_lines
    assert "  00000000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f  ................" in r.out_lines
    doc = json.loads(steadq("show", qpath, job, "--json", "--no-journal").out)
    assert (doc["reason"], doc["reason_name"]) == (4, "attempts_exhausted")
    assert doc["payload_head_text"] is None and doc["payload_head_bytes"] == 4096
    code, out, err = _run("show", qpath, job, "--payload")
    assert code == 0 and out == payload, err


def test_show_payload_writes_nothing_from_a_corrupt_payload(qpath: str) -> None:
    with Queue.open(qpath) as q:
        job = q.enqueue(b"hello, checksum")
        (obj,) = q.inspect(job)
    path = os.path.join(qpath, obj.path)
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    r = steadq("show", qpath, job, "--no-journal")
    assert r.code == 0, r.err
    assert "  payload:       15 bytes, NOT verified" in r.out_lines
    assert "  problem:       payload digest mismatch" in r.out_lines
    code, out, err = _run("show", qpath, job, "--payload")
    assert code == 3 and out == b"", (code, err)
    assert "payload digest mismatch (nothing was written)" in err


def test_show_escapes_a_hostile_payload_and_metadata(qpath: str) -> None:
    with Queue.open(qpath) as q:
        job = q.enqueue(f"red {ESC}[31m\r\nforged line\u2028".encode(), content_type="text/plain",
                        metadata={"note": f"{ESC}]0;title\x07"})  # fmt: skip
    r = steadq("show", qpath, job, "--no-journal")
    assert r.code == 0, r.err
    assert ESC not in r.out and "\x07" not in r.out and "\u2028" not in r.out
    assert "  red \\x1b[31m\\r" in r.out_lines and "  forged line\\u2028" in r.out_lines, r.out


def test_show_finds_a_quarantined_job_by_its_header(qpath: str) -> None:
    with Queue.open(qpath) as q:
        job = q.enqueue(b"x" * 100, content_type="text/plain")
        (obj,) = q.inspect(job)
        path = os.path.join(qpath, obj.path)
        data = bytearray(Path(path).read_bytes())
        data[-1] ^= 0xFF  # the payload no longer matches its digest
        Path(path).write_bytes(bytes(data))
        assert q.lease() is None  # the claim quarantines it
    r = steadq("show", qpath, job, "--no-journal")
    assert r.code == 0, r.err
    assert r.out_lines[0] == f"job {job}: quarantine: payload_corrupt (0x0002)", r.out
    assert any(line.startswith("  quarantine id: ") for line in r.out_lines)
    assert "  payload:       100 bytes, NOT verified" in r.out_lines


def test_show_an_acknowledged_job_and_a_missing_one(qpath: str) -> None:
    with Queue.open(qpath) as q:
        job = q.enqueue(b"done soon")
        lease = q.lease()
        assert lease is not None
        q.ack(lease)
    r = steadq("show", qpath, job, "--no-journal")
    assert r.code == 0 and r.out_lines[0] == f"job {job}: receipt", r
    assert "  payload:       gone (the job was acknowledged; its receipt is what is left)" in r.out_lines
    code, out, err = _run("show", qpath, job, "--payload")
    assert code == 1 and out == b"" and "holds a payload" in err
    missing = "0" * 32
    r = steadq("show", qpath, missing)
    assert r.code == 1 and r.err_lines == [
        f"show: no object of job {missing} in {qpath} (not in any state, nor in quarantine)"
    ]
    assert steadq("show", qpath, "not-an-id").code == 1


def test_show_prints_the_jobs_journal_lines_escaped(qpath: str, tmp_path: Path) -> None:
    job = _dead_job(qpath, b"boom", reason=1)
    entries = [
        {"__REALTIME_TIMESTAMP": "1796130000000000", "_SYSTEMD_UNIT": "steadq-worker@demo.service",
         "MESSAGE": "job started: attempt 1", "STEADQ_JOB_ID": job},
        {"__REALTIME_TIMESTAMP": "1796130001000000", "_SYSTEMD_UNIT": "steadq-worker@demo.service",
         "MESSAGE": f"fatal: {ESC}[2J disk on fire", "STEADQ_STREAM": "stderr", "STEADQ_JOB_ID": job},
        {"__REALTIME_TIMESTAMP": "1796130002000000", "SYSLOG_IDENTIFIER": "steadqd",
         "MESSAGE": [0x62, 0x61, 0xFF, 0x64], "STEADQ_JOB_ID": job},
    ]  # fmt: skip
    body = f'[ "$*" = "--no-pager -o json -n 1000 STEADQ_JOB_ID={job}" ] || exit 9\n' + "".join(
        f"echo '{json.dumps(e)}'\n" for e in entries
    )
    fake = _fake_journalctl(tmp_path, body)
    code, out, err = _run("show", qpath, job, path_dirs=[fake])
    assert code == 0, err
    text = out.decode()
    assert ESC not in text
    assert f"journal (last 3 entries with STEADQ_JOB_ID={job}):" in text
    assert "  2026-12-01T13:00:00Z steadq-worker@demo.service: job started: attempt 1\n" in text
    assert "  2026-12-01T13:00:01Z steadq-worker@demo.service [stderr]: fatal: \\x1b[2J disk on fire\n" in text
    assert "  2026-12-01T13:00:02Z steadqd: ba\\xffd\n" in text
    code, out, err = _run("show", qpath, job, "--json", path_dirs=[fake])
    doc = json.loads(out)
    assert [e["stream"] for e in doc["journal"]["entries"]] == ["", "stderr", ""]


def test_show_says_plainly_when_the_journal_cannot_be_read(qpath: str, tmp_path: Path) -> None:
    job = _dead_job(qpath, b"boom", reason=1)
    code, out, err = _run("show", qpath, job, path_dirs=[tmp_path / "empty"])
    assert code == 0, err
    assert out.decode().splitlines()[-1] == "journal: not readable here: journalctl is not installed"
    fake = _fake_journalctl(tmp_path, "echo 'Failed to open journal: Permission denied' >&2\nexit 1\n")
    code, out, err = _run("show", qpath, job, path_dirs=[fake])
    assert code == 0, err
    assert out.decode().splitlines()[-1] == "journal: not readable: Failed to open journal: Permission denied"


def test_show_a_leased_and_a_delayed_job_gives_their_deadlines(qpath: str) -> None:
    with Queue.open(qpath) as q:
        delayed = q.enqueue(b"later", delay=3600)
        leased = q.enqueue(b"now")
        lease = q.lease(duration=600)
        assert lease is not None and lease.job_id == leased
        r = steadq("show", qpath, leased, "--no-journal")
        assert r.code == 0 and r.out_lines[0] == f"job {leased}: running", r
        assert "  attempts:      1 used of 3" in r.out_lines
        (until,) = [line for line in r.out_lines if line.startswith("  lease until:   ")]
        assert re.search(r"Z \(in (10m|[5-9]m(\d+s)?)\)$", until), until  # 600 s, less what the commands took
        doc = json.loads(steadq("show", qpath, leased, "--json", "--no-journal").out)
        assert doc["details"]["token"] == lease.token.hex()
    r = steadq("show", qpath, delayed, "--no-journal")
    assert r.code == 0 and r.out_lines[0] == f"job {delayed}: delayed", r
    (nb,) = [line for line in r.out_lines if line.startswith("  not before:    ")]
    assert re.search(r"Z \(in (1h|5\dm(\d+s)?)\)$", nb), nb


def test_show_picks_the_verdict_and_the_stderr_lines_over_a_flood_of_stdout(qpath: str, tmp_path: Path) -> None:
    """Issue 33 #7: the last 20 journal lines were 20 lines of a job's stdout, and its verdict was not among them."""
    job = _dead_job(qpath, b"movie", reason=0x0100)
    unit = {"_SYSTEMD_UNIT": "steadq-worker@demo.service", "STEADQ_JOB_ID": job}
    at = iter(range(1796130000000000, 1796139999999999, 1000000))
    entries = [{**unit, "__REALTIME_TIMESTAMP": str(next(at)), "MESSAGE": f"job {job[:8]} started (attempt 1/3)"}]
    entries += [
        {**unit, "__REALTIME_TIMESTAMP": str(next(at)), "MESSAGE": "ffmpeg: not a video", "STEADQ_STREAM": "stderr"}
    ]
    entries += [
        {**unit, "__REALTIME_TIMESTAMP": str(next(at)), "MESSAGE": f"frame {i}", "STEADQ_STREAM": "stdout"}
        for i in range(60)
    ]
    entries += [{**unit, "__REALTIME_TIMESTAMP": str(next(at)), "MESSAGE": f"job {job[:8]} buried: not a video"}]
    entries += [
        {**unit, "__REALTIME_TIMESTAMP": str(next(at)), "MESSAGE": f"late {i}", "STEADQ_STREAM": "stdout"}
        for i in range(5)
    ]
    body = f'[ "$*" = "--no-pager -o json -n 1000 STEADQ_JOB_ID={job}" ] || exit 9\n' + "".join(
        f"echo '{json.dumps(e)}'\n" for e in entries
    )
    fake = _fake_journalctl(tmp_path, body)
    code, out, err = _run("show", qpath, job, path_dirs=[fake])
    assert code == 0, err
    lines = out.decode().splitlines()
    at_journal = next(i for i, line in enumerate(lines) if line.startswith("journal ("))
    shown = lines[at_journal + 1 :]
    assert lines[at_journal] == (
        f"journal (20 of 68 entries with STEADQ_JOB_ID={job}: the worker's, the job's stderr, its last stdout):"
    ), lines[at_journal]
    messages = [line.split(": ", 1)[1] for line in shown[:-1]]
    assert messages[0] == f"job {job[:8]} started (attempt 1/3)" and messages[1] == "ffmpeg: not a video"
    assert f"job {job[:8]} buried: not a video" in messages and len(messages) == 20
    assert messages[-5:] == [f"late {i}" for i in range(5)]  # the stdout that fits: the last, in time order
    assert shown[-1] == f"  (48 lines of stdout not shown: journalctl STEADQ_JOB_ID={job} has all)"
    doc = json.loads(_run("show", qpath, job, "--json", path_dirs=[fake])[1])
    assert doc["journal"]["omitted"] == 48 and len(doc["journal"]["entries"]) == 20


def test_show_json_tells_the_failure_story_from_the_journal(qpath: str, tmp_path: Path) -> None:
    """Issue 34 #2: a dashboard gets each run's verdict and exit, why the job died, and its stderr tail,
    from the worker's structured fields (escaped like every journal value)."""
    job = _dead_job(qpath, b"boom", reason=1)
    unit = {"_SYSTEMD_UNIT": "steadq-worker@demo.service", "STEADQ_JOB_ID": job, "STEADQ_QUEUE": "demo"}
    entries = [
        {**unit, "MESSAGE": "job started", "STEADQ_ATTEMPT": "1"},
        {**unit, "MESSAGE": "no such file", "STEADQ_STREAM": "stderr"},
        {**unit, "MESSAGE": "job finished: retry (exit 1, 0.2 s, attempt 1/2)", "STEADQ_VERDICT": "retry",
         "STEADQ_EXIT_STATUS": "1", "STEADQ_ATTEMPT": "1", "STEADQ_DURATION_MS": "200", "PRIORITY": "4"},
        {**unit, "MESSAGE": "job retried: delayed", "STEADQ_STATE": "delayed", "STEADQ_ATTEMPT": "1"},
        {**unit, "MESSAGE": f"still {ESC}[31mno such file", "STEADQ_STREAM": "stderr"},
        {**unit, "MESSAGE": "job finished: retry (timed out, signal SIGKILL, 9.0 s, attempt 2/2)",
         "STEADQ_VERDICT": "retry", "STEADQ_SIGNAL": "SIGKILL", "STEADQ_TIMED_OUT": "true", "STEADQ_ATTEMPT": "2",
         "STEADQ_DURATION_MS": "9000", "PRIORITY": "4"},
        {**unit, "MESSAGE": "job buried: no attempts left (2/2, attempts_exhausted)", "STEADQ_REASON": "0x0002",
         "STEADQ_ATTEMPT": "2"},
        # Any local user can log these fields (logger, systemd-cat), not journald's _SYSTEMD_UNIT:
        {**unit, "_SYSTEMD_UNIT": "user@1000.service", "MESSAGE": "job finished: ack", "STEADQ_VERDICT": "ack"},
        {"STEADQ_JOB_ID": job, "MESSAGE": "all is fine", "STEADQ_STREAM": "stderr", "STEADQ_REASON": "0x0000"},
    ]  # fmt: skip
    fake = _fake_journalctl(tmp_path, "".join(f"echo '{json.dumps(e)}'\n" for e in entries))
    code, out, err = _run("show", qpath, job, "--json", path_dirs=[fake])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["journal"]["entries"][2]["fields"]["verdict"] == "retry"
    assert len(doc["journal"]["entries"]) == 9  # all shown, as the plain output shows them
    story = doc["failure"]
    assert story["runs"] == [
        {"attempt": 1, "verdict": "retry", "exit_status": 1, "signal": None, "timed_out": False,
         "duration_ms": 200, "time": "-"},
        {"attempt": 2, "verdict": "retry", "exit_status": None, "signal": "SIGKILL", "timed_out": True,
         "duration_ms": 9000, "time": "-"},
    ]  # fmt: skip
    assert story["outcomes"] == ["job retried: delayed", "job buried: no attempts left (2/2, attempts_exhausted)"]
    assert story["reason"] == "0x0002"
    assert story["stderr_tail"] == ["no such file", "still \\x1b[31mno such file"]


def test_show_json_has_no_failure_story_without_the_journal(qpath: str) -> None:
    job = _dead_job(qpath, b"boom", reason=1)
    doc = json.loads(steadq("show", qpath, job, "--json", "--no-journal").out)
    assert doc["failure"] is None
