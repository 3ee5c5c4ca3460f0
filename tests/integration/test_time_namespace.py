"""A process in a time namespace may not take or judge boottime leases (issue 15, point 5).

The attack as it was run: ``unshare -Ur --time --boottime 86400 steadq recover
$Q`` (no privilege needed) reaped a live, renewed 5 s lease 3 s after it was
claimed, because that process's CLOCK_BOOTTIME reads a day ahead of the boot's;
conversely a worker in such a namespace wrote leases the host's sweeper could
not judge. Lease names hold boottime deadlines of the boot (clocks.md), so a
process whose ``/proc/self/timens_offsets`` shows a boottime offset is refused
claim, renew and the recovery phases that compare boottimes (reap, temps).

Most tests point the detector at a fixture file (``clock.TIMENS_OFFSETS_PATH``);
the last ones run the CLI in a real time namespace with ``unshare``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from steadqd import ErrorKind, NotCommitted, Queue
from steadqd.constants import NS_PER_SECOND
from steadqd.fs import clock, linux, names
from steadqd.fs.clock import TimeOffsets, boottime_problem, parse_time_offsets
from steadqd.fs.recovery import run_recovery
from tests.cli.helpers import STEADQ
from tests.prereq import required

SEC = NS_PER_SECOND
HOST = "monotonic           0         0\nboottime            0         0\n"
SHIFTED = "monotonic           0         0\nboottime        86400         0\n"


@pytest.fixture
def offsets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Make every handle opened afterwards read its time-namespace offsets from ``text``."""
    path = tmp_path / "timens_offsets"

    def use(text: str) -> None:
        path.write_text(text)
        monkeypatch.setattr(clock, "TIMENS_OFFSETS_PATH", str(path))

    return use


def files_under(root: str, top: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(os.path.join(root, top)) for f in fs
    )


# --------------------------------------------------------------------------- the detector


def test_offsets_are_parsed_from_the_kernel_format() -> None:
    assert parse_time_offsets(HOST) == TimeOffsets(0, 0)
    assert parse_time_offsets(SHIFTED) == TimeOffsets(0, 86_400 * SEC)
    assert parse_time_offsets("monotonic -5 250000000\nboottime 3 1\n") == TimeOffsets(
        -5 * SEC + 250_000_000, 3 * SEC + 1
    )
    assert parse_time_offsets("7 2 0\n") == TimeOffsets(0, 2 * SEC)  # a clock id, as written to the file


@pytest.mark.parametrize(
    "text",
    ["boottime 1\n", "realtime 1 0\n", "boottime 1 1000000000\n", "boottime x 0\n", "boottime 1 0\nboottime 2 0\n"],
)
def test_a_malformed_offsets_file_names_its_line(text: str) -> None:
    with pytest.raises(ValueError, match="line"):
        parse_time_offsets(text)


def test_only_a_boottime_offset_is_a_problem(tmp_path: Path) -> None:
    f = tmp_path / "offsets"
    f.write_text(HOST)
    assert boottime_problem(str(f)) is None
    f.write_text("monotonic 600 0\nboottime 0 0\n")  # CLOCK_MONOTONIC is never stored
    assert boottime_problem(str(f)) is None
    f.write_text(SHIFTED)
    problem = boottime_problem(str(f))
    assert problem is not None and "+86400 s" in problem and "time namespace" in problem, problem
    f.write_text("garbage\n")
    unknown = boottime_problem(str(f))
    assert unknown is not None and "cannot tell" in unknown, unknown
    assert boottime_problem(str(tmp_path / "absent")) is None  # a kernel without time namespaces


def test_this_test_process_is_not_in_a_time_namespace() -> None:
    """The real file is read and parsed (the other tests depend on a zero offset here)."""
    assert boottime_problem() is None


# --------------------------------------------------------------------------- claim, renew, recovery


def test_claim_is_refused_and_nothing_moves(queue: Queue, queue_path: str, offsets_file: Callable[[str], None]) -> None:
    job = queue.enqueue(b"x")
    before = files_under(queue_path, "ready")
    offsets_file(SHIFTED)
    with Queue.open(queue_path) as shifted:
        with pytest.raises(NotCommitted) as info:
            shifted.lease(duration=30)
        assert info.value.kind is ErrorKind.INVALID_INPUT
        assert "lease refused" in str(info.value) and "time namespace" in str(info.value), info.value
        assert shifted.poisoned is None
        other = shifted.enqueue(b"producing is fine")  # no boottime is written or judged
    assert set(before) <= set(files_under(queue_path, "ready"))
    # The host's handle, opened before, still works. Two jobs are ready in shards the scan visits in its own
    # order, so both are leased and the pair is compared, not the first.
    leases = [queue.lease(duration=30), queue.lease(duration=30)]
    assert {lease.job_id for lease in leases if lease is not None} == {job, other}


def test_renew_is_refused_and_the_lease_stays(
    queue: Queue, queue_path: str, offsets_file: Callable[[str], None]
) -> None:
    queue.enqueue(b"x")
    lease = queue.lease(duration=30)
    assert lease is not None
    offsets_file(SHIFTED)
    with Queue.open(queue_path) as shifted:
        with pytest.raises(NotCommitted, match="renew refused.*time namespace"):
            shifted.renew(lease, 30)
    assert os.path.exists(os.path.join(queue_path, lease.path))
    queue.renew(lease, 30)


def test_recovery_judges_no_lease_and_no_temp(
    queue: Queue, queue_path: str, offsets_file: Callable[[str], None]
) -> None:
    queue.enqueue(b"x")
    lease = queue.lease(duration=5)
    assert lease is not None
    temp = Path(queue_path, "tmp", queue.boot_id, "0000", names.make_temp_name(linux.boottime_ns(), os.urandom(16)))
    temp.parent.mkdir(parents=True, exist_ok=True)
    temp.write_bytes(b"being written")
    offsets_file(SHIFTED)
    with Queue.open(queue_path, temp_ttl=60) as shifted:
        a_day_on = linux.boottime_ns() + 86_400 * SEC  # what this process's clock would read
        report = run_recovery(shifted._ctx, budget_ops=10_000, budget_ms=60_000, now_boottime=a_day_on)
    assert [code for code, _ in report.errors] == ["time_namespace"], report.errors
    assert "recovery refused" in report.errors[0][1]
    assert (report.leases_reaped, report.temp_files_deleted, report.operations_attempted) == (0, 0, 0)
    assert os.path.exists(os.path.join(queue_path, lease.path)) and temp.exists()


def test_a_promote_only_pass_still_runs(queue: Queue, queue_path: str, offsets_file: Callable[[str], None]) -> None:
    """Promotion is a wall-clock decision: the promoter may run in a time namespace."""
    queue.enqueue(b"later", delay=1)
    offsets_file(SHIFTED)
    with Queue.open(queue_path) as shifted:
        floor = shifted.wall_floor_ns()
        with pytest.MonkeyPatch.context() as m:
            m.setattr(linux, "realtime_ns", lambda: floor + 30 * SEC)
            report = shifted.recover(budget_ops=10_000, budget_ms=60_000, phases=("promote_delayed",))
    assert report.ok and report.delayed_promoted == 1, report


# --------------------------------------------------------------------------- a real time namespace


def _unshare_time() -> list[str]:
    """The ``unshare`` prefix of the reproduction, or a skip (a failure in CI) naming why."""
    tool = shutil.which("unshare")
    why = "unshare(1) is not installed"
    if tool is not None:
        argv = [tool, "-Ur", "--time", "--boottime", "86400"]
        probe = subprocess.run([*argv, "cat", "/proc/self/timens_offsets"], capture_output=True, text=True)
        if probe.returncode == 0 and parse_time_offsets(probe.stdout).boottime_ns == 86_400 * SEC:
            return argv
        why = f"unshare --time is not permitted here: {probe.stderr.strip() or probe.returncode}"
    if required():
        pytest.fail(why)
    pytest.skip(why)


def test_steadq_recover_in_a_time_namespace_reaps_no_live_lease(queue: Queue, queue_path: str) -> None:
    queue.enqueue(b"x")
    lease = queue.lease(duration=30)
    assert lease is not None
    assert STEADQ is not None
    p = subprocess.run([*_unshare_time(), STEADQ, "recover", queue_path], capture_output=True, text=True, timeout=60)
    assert p.returncode == 6, (p.returncode, p.stdout, p.stderr)
    assert "time namespace" in p.stdout + p.stderr, (p.stdout, p.stderr)
    assert os.path.exists(os.path.join(queue_path, lease.path)), "the live lease was reaped"
    queue.renew(lease, 30)


def test_steadq_lease_in_a_time_namespace_is_refused(queue: Queue, queue_path: str) -> None:
    queue.enqueue(b"x")
    assert STEADQ is not None
    p = subprocess.run(
        [*_unshare_time(), STEADQ, "lease", queue_path, "--duration-seconds", "30"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == ErrorKind.INVALID_INPUT.exit_code, (p.returncode, p.stdout, p.stderr)
    assert "time namespace" in p.stderr, p.stderr
    assert files_under(queue_path, "ready") and queue.lease(duration=30) is not None
