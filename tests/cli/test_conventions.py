"""One command line (issue 17, points 4 and 5): versions, global options, help with defaults,
human durations with the reference's flags as aliases, init's and lease's output, and the exit
code table.

Why the installed console scripts: these are conventions a shell script sees (argv, the two
streams, the status). Exit codes 2, 4 and 5 cannot be provoked from outside as root, so those
rows call the entry point in-process with an injected fault or a dropped uid.
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from steadqd.cli.main import build_parser, main
from steadqd.fs import linux
from tests.cli.helpers import steadq
from tests.invariants import check_tree


def put(qpath: str, payload: bytes = b"x") -> None:
    assert steadq("put", qpath, stdin=payload).code == 0


# --------------------------------------------------------------------------- --version, --json


def test_version_names_the_job_spawn_path() -> None:
    from importlib.metadata import version

    from steadqd.daemon.worker.run import fastspawn
    from steadqd.fs.compiled import bridge

    r = steadq("--version")
    assert (r.code, r.out) == (
        0,
        f"steadq {version('steadqd')}\njob spawn: {fastspawn.path()}\nclaim: {bridge.path()}\n",
    )
    r = steadq("--version", env={"STEADQ_SPAWN": "popen"})
    assert r.out.splitlines()[1] == "job spawn: Popen and steadq-exec (two execs per job): STEADQ_SPAWN=popen is set"


def test_version_names_the_claim_path() -> None:
    """Which claim path runs: the C claim core where built, pure Python with the switch (issue 35)."""
    from steadqd.fs.compiled import bridge

    r = steadq("--version", env={bridge.SWITCH: "1"})
    assert r.out.splitlines()[2] == f"claim: pure Python: {bridge.SWITCH}=1 is set"
    if bridge.lib is not None:
        r = steadq("--version", env={bridge.SWITCH: ""})
        assert r.out.splitlines()[2].startswith("claim: C claim core (")


def test_json_is_accepted_before_and_after_the_subcommand(qpath: str) -> None:
    put(qpath)
    before, after = steadq("--json", "stats", qpath), steadq("stats", qpath, "--json")
    assert before.code == after.code == 0
    assert json.loads(before.out)["ready"]["objects"] == json.loads(after.out)["ready"]["objects"] == 1


def _options(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:  # noqa: SLF001 - argparse has no public introspection
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sp in action.choices.items():
                found += _options(sp, f"{prefix} {name}")
        elif not isinstance(action, argparse._HelpAction):  # noqa: SLF001
            found.append((prefix, action))
    return found


def test_every_option_and_argument_has_help_text() -> None:
    missing = [f"{cmd}: {a.option_strings or a.dest}" for cmd, a in _options(build_parser(), "steadq") if not a.help]
    assert missing == []


def test_help_shows_defaults_durations_as_durations() -> None:
    r = steadq("lease", "--help")
    assert r.code == 0
    text = " ".join(r.out.split())
    assert "--duration DURATION, --duration-seconds DURATION" in text
    assert "(default: 30s)" in text
    assert "(default: None)" not in text and "(default: False)" not in text
    text = " ".join(steadq("init", "--help").out.split())
    assert "(default: 64)" in text and "--parents" in text


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize("flags", [("--duration", "2m"), ("--duration-seconds", "120"), ("--duration=1m60s",)])
def test_lease_duration_human_or_reference_seconds(tmp_path: Path, flags: tuple[str, ...]) -> None:
    q = tmp_path / "q"
    assert steadq("init", q, "--shards", "1").code == 0
    put(str(q))
    handle = tmp_path / "h.json"
    r = steadq("lease", q, "--handle-file", handle, *flags)
    assert r.code == 0, r.err
    doc = json.loads(handle.read_text())
    assert 100 < (doc["expires_wall_ns"] - os.stat(handle).st_mtime_ns) / 1e9 <= 121


@pytest.mark.parametrize("bad", ["0", "0s", "8d", "604801", "soon", "5x"])
def test_lease_duration_out_of_range_or_malformed_is_one_line_exit_1(qpath: str, bad: str) -> None:
    for flag in ("--duration", "--duration-seconds"):
        r = steadq("lease", qpath, flag, bad)
        assert (r.code, r.out) == (1, ""), (flag, bad, r)
        assert len(r.err_lines) == 1 and bad in r.err, r.err


def test_retry_after_human_or_reference_seconds(qpath: str, tmp_path: Path) -> None:
    for flags in (("--after", "1h"), ("--after-seconds", "3600")):
        put(qpath)
        h = tmp_path / "h.json"
        assert steadq("lease", qpath, "--handle-file", h).code == 0
        r = steadq("retry", qpath, "--handle-file", h, *flags)
        assert (r.code, r.err) == (0, "retried\n"), flags
    ts = check_tree(qpath)
    assert len(ts.delayed) == 2 and not ts.ready
    deadlines = {obj.name.not_before for j in ts.delayed if (obj := ts.get(j)) is not None}
    wall = time.time_ns()
    assert all(d is not None and 3500e9 < d - wall <= 3601e9 for d in deadlines), deadlines


def test_work_lease_human_or_reference_seconds(qpath: str) -> None:
    for flags in (("--lease", "90s"), ("--lease-seconds", "90")):
        put(qpath)
        r = steadq("work", qpath, "--once", *flags, "--", "cat")
        assert r.code == 0, (flags, r.err)
    r = steadq("work", qpath, "--once", "--lease", "1ms", "--", "cat")
    assert r.code == 1 and "lease duration" in r.err


# --------------------------------------------------------------------------- init and lease output


def test_init_prints_the_queue_id_on_stdout_and_the_reference_lines_on_stderr(tmp_path: Path) -> None:
    q = tmp_path / "q"
    r = steadq("init", q, "--shards", "2")
    assert r.code == 0
    queue_id = r.out.strip()
    assert r.out == f"{queue_id}\n" and len(queue_id) == 32
    assert r.err_lines == [f"initialized queue at {q}", f"queue_id: {queue_id}", "shards: 2"]
    assert check_tree(str(q)).fmt.queue_id.hex() == queue_id


def test_init_refuses_missing_parents_unless_asked(tmp_path: Path) -> None:
    q = tmp_path / "typo" / "deeper" / "q"
    r = steadq("init", q)
    assert (r.code, r.out) == (6, "")
    assert r.err_lines == [f"init failed: parent directory {q.parent} does not exist (create it, or give --parents)"]
    assert not (tmp_path / "typo").exists()
    r = steadq("init", q, "--parents")
    assert r.code == 0 and check_tree(str(q)).fmt.shard_count == 64


def test_lease_without_handle_file_says_what_it_consumed_and_where(qpath: str) -> None:
    put(qpath)
    r = steadq("lease", qpath, "--duration", "5m")
    assert r.code == 0
    assert r.out_lines[1:] == ["generation: 1", "attempt: 1/3"]  # stdout stays the reference's
    job = r.out_lines[0].removeprefix("job_id: ")
    leased = check_tree(qpath).get(job)
    assert leased is not None
    assert r.err_lines == [
        "note: no --handle-file, so nothing can ack, retry or bury this lease; it used attempt 1 of 3",
        f"note: the lease is {os.path.join(qpath, leased.path)}; the job is leasable again when it expires "
        f"in 5m (steadq inspect {qpath} {job})",
    ]


def test_lease_with_handle_file_prints_no_note(qpath: str, tmp_path: Path) -> None:
    put(qpath)
    r = steadq("lease", qpath, "--handle-file", tmp_path / "h.json")
    assert r.code == 0 and r.err == ""


# --------------------------------------------------------------------------- the exit code table


def _in_process(argv: list[str], stdin: bytes = b"") -> int:
    old = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        return main(argv)
    finally:
        sys.stdin = old


def _code_0(tmp: Path, q: str) -> int:
    return steadq("put", q, stdin=b"x").code


def _code_1_empty(tmp: Path, q: str) -> int:
    return steadq("lease", q).code


def _code_1_usage(tmp: Path, q: str) -> int:
    return steadq("put", q, "--max-attempts", "lots").code


def _code_2_outcome_unknown(tmp: Path, q: str) -> int:
    for nth in range(1, 8):  # the first fsync after the link that fails
        with linux.inject(nth=nth, errno=errno.EIO, op="fsync", after=True):
            code = _in_process(["put", q], b"x")
        if code == 2:
            return 2
    return code


def _code_3_not_a_queue(tmp: Path, q: str) -> int:
    (tmp / "plain").mkdir()
    return steadq("stats", tmp / "plain").code


def _code_4_disk_full(tmp: Path, q: str) -> int:
    with linux.inject(nth=1, errno=errno.ENOSPC, op="fsync"):
        return _in_process(["put", q], b"x")


def _code_5_permission(tmp: Path, q: str) -> int:
    from tests.cli.test_permission_exit import run_as_nobody

    if os.geteuid() != 0:
        pytest.skip("needs root to switch users")
    secret = tmp / "secret"
    secret.write_bytes(b"x")
    secret.chmod(0o600)
    os.chmod(tmp, 0o755)
    os.chmod(q, 0o777)
    return run_as_nobody(["put", q, str(secret)])[0]


def _code_6_missing_queue(tmp: Path, q: str) -> int:
    return steadq("stats", tmp / "nowhere").code


def _code_6_missing_input(tmp: Path, q: str) -> int:
    return steadq("put", q, tmp / "missing.bin").code


def _code_64_tmpfs(tmp: Path, q: str) -> int:
    d = Path("/dev/shm") / f"steadq-conventions-{os.getpid()}"
    try:
        return steadq("init", d).code
    finally:
        shutil.rmtree(d, ignore_errors=True)


EXIT_TABLE: dict[str, tuple[int, Callable[[Path, str], int]]] = {
    "success": (0, _code_0),
    "no job available": (1, _code_1_empty),
    "usage error (the reference's parser says 2)": (1, _code_1_usage),
    "outcome unknown": (2, _code_2_outcome_unknown),
    "not a queue (QueueCorrupt)": (3, _code_3_not_a_queue),
    "disk full (ResourceExhausted)": (4, _code_4_disk_full),
    "permission denied on an input file": (5, _code_5_permission),
    "missing queue path (the reference's NotFound I/O error)": (6, _code_6_missing_queue),
    "missing input file": (6, _code_6_missing_input),
    "unsupported filesystem": (64, _code_64_tmpfs),
}


@pytest.mark.parametrize("case", list(EXIT_TABLE))
def test_exit_code_table(case: str, tmp_path: Path, qpath: str, capsys: pytest.CaptureFixture[str]) -> None:
    expected, provoke = EXIT_TABLE[case]
    assert provoke(tmp_path, qpath) == expected


def test_the_documented_table_is_the_tested_one() -> None:
    """docs/cli.md's exit status table lists exactly the codes this table provokes (plus work's and signals')."""
    doc = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    section = doc.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(line.split("|")[1]) for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()}
    assert {code for code, _ in EXIT_TABLE.values()} | {127, 130, 143} == rows
