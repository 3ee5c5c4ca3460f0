"""One wrong clock must not delete data or deliver jobs early (issue 15, point 4).

The attack as it was run: with ``dead_retention: 1h, receipt_retention: 1h``,
``echo x | faketime -f +2h steadq put $Q`` raised the wall watermark two hours
past the host's clock, and the next recovery pass promoted 1 h-delayed jobs,
deleted dead letters that had died seconds earlier and expired receipts. The
producer's clock is moved here by replacing the CLOCK_REALTIME reading the
library makes (``linux.realtime_ns``) for that producer only; the recovery
pass that follows reads the real clock, as the daemon's would.

The watermark keeps its meaning (clocks.md: it may move ahead, and stamps
taken from it stay as they are); only recovery's destructive, wall-sensitive
decisions are bounded by ``max_clock_skew`` from the local clock.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.constants import DEFAULT_MAX_CLOCK_SKEW_NS, NS_PER_SECOND
from steadqd.daemon.config import parse_config
from steadqd.daemon.journal import Log
from steadqd.daemon.service import Loop
from steadqd.daemon.sweeper import SweeperRole
from steadqd.errors import ConfigError, InvalidInput
from steadqd.fs import linux
from steadqd.fs.clock import trusted_wall
from steadqd.fs.names import parse_bucket_dir, terminal_bucket
from steadqd.fs.recovery import RecoveryReport, run_recovery

HOUR = 3600
SEC = NS_PER_SECOND
RETENTIONS = {"receipt_retention": HOUR, "dead_retention": HOUR}


def files_under(root: str, top: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(os.path.join(root, top)) for f in fs
    )


def enqueue_with_clock_ahead(root: str, seconds: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``faketime -f +<seconds>s steadq put``: one producer whose CLOCK_REALTIME is ahead."""
    real = linux.realtime_ns
    with monkeypatch.context() as m:
        m.setattr(linux, "realtime_ns", lambda: real() + seconds * SEC)
        with Queue.open(root) as producer:
            producer.enqueue(b"x")


@pytest.fixture
def attacked(make_queue: object, queue_path: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Three 1 h-delayed jobs, four dead letters and four receipts made just now,
    then a producer two hours ahead (the reproduction of the issue)."""
    q = make_queue()  # type: ignore[operator]
    for i in range(4):
        q.enqueue(b"dead %d" % i)
        lease = q.lease()
        assert lease is not None
        q.bury(lease)
    for i in range(4):
        q.enqueue(b"done %d" % i)
        lease = q.lease()
        assert lease is not None
        q.ack(lease)
    for i in range(3):
        q.enqueue(b"later %d" % i, delay=HOUR)
    q.close()
    enqueue_with_clock_ahead(queue_path, 2 * HOUR, monkeypatch)
    yield queue_path


def recover(root: str, **options: float) -> RecoveryReport:
    with Queue.open(root, **RETENTIONS, **options) as q:  # type: ignore[arg-type]
        return q.recover(budget_ops=100_000, budget_ms=60_000)


def skew_warnings(report: RecoveryReport) -> list[str]:
    return [message for code, message in report.errors if code == "clock_skew"]


def test_a_producer_two_hours_ahead_makes_recovery_delete_and_promote_nothing(attacked: str) -> None:
    delayed, dead = files_under(attacked, "delayed"), files_under(attacked, "dead")
    assert (len(delayed), len(dead)) == (3, 4)
    report = recover(attacked)
    assert (report.delayed_promoted, report.dead_deleted, report.receipts_deleted) == (0, 0, 0), report
    assert files_under(attacked, "delayed") == delayed
    assert files_under(attacked, "dead") == dead
    assert files_under(attacked, "receipts"), "the receipts were expired"
    (warning,) = skew_warnings(report)
    assert re.search(r"is (1h59m|2h) ahead", warning) and "max_clock_skew 5m" in warning, warning
    # Both clocks, readable: the watermark's (two hours on) and this host's.
    floor, local = (
        datetime.strptime(m, "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC).timestamp()
        for m in re.findall(r"(?:wall floor|local clock) ([0-9-]+ [0-9:]+ UTC)", warning)
    )
    assert abs(local - linux.realtime_ns() / SEC) < 60, warning
    assert 2 * HOUR - 60 < floor - local <= 2 * HOUR, warning


def test_the_same_pass_does_it_all_when_the_bound_allows_the_lead(attacked: str) -> None:
    """The control: with a bound above the lead, the attack works as reported,
    so the test above fails if the bound is not applied."""
    report = recover(attacked, max_clock_skew=3 * HOUR)
    assert (report.delayed_promoted, report.dead_deleted, report.receipts_deleted) == (3, 4, 4), report
    assert not skew_warnings(report)


def test_a_lead_within_the_bound_is_trusted_as_the_spec_says(queue: Queue, queue_path: str) -> None:
    """A watermark a minute ahead (a clock stepped back by a minute) still
    promotes by the watermark: rollback protection is unchanged."""
    queue.enqueue(b"soon", delay=30)
    real = linux.realtime_ns
    with pytest.MonkeyPatch.context() as m:
        m.setattr(linux, "realtime_ns", lambda: real() + 60 * SEC)
        with Queue.open(queue_path) as ahead:
            ahead.enqueue(b"x")
    report = recover(queue_path)
    assert report.delayed_promoted == 1 and report.ok, report


def test_reap_to_dead_files_the_letter_by_the_local_clock(
    make_queue: object, queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exhausted lease reaped while the watermark is 30 h ahead goes to the
    dead bucket of the local clock, not of the watermark: its retention then
    runs from when it really died."""
    q = make_queue()  # type: ignore[operator]
    q.enqueue(b"last try", max_attempts=1)
    assert q.lease(duration=1) is not None
    q.close()
    enqueue_with_clock_ahead(queue_path, 30 * HOUR, monkeypatch)
    with Queue.open(queue_path) as r:
        expired = linux.boottime_ns() + HOUR * SEC
        report = run_recovery(r._ctx, budget_ops=100_000, budget_ms=60_000, now_boottime=expired)
        width = r.format.terminal_width_ns
    assert report.leases_to_dead == 1, report
    (dead,) = files_under(queue_path, "dead")
    bucket = parse_bucket_dir(Path(dead).parts[1])
    assert bucket is not None
    assert bucket <= terminal_bucket(linux.realtime_ns() + DEFAULT_MAX_CLOCK_SKEW_NS, width), dead


def test_the_sweeper_logs_a_warning_with_both_clocks(attacked: str) -> None:
    text = f"queue: {attacked}\nsweeper:\n  receipt_retention: 1h\n  dead_retention: 1h\n  max_clock_skew: 10m\n"
    settings = parse_config(text, path="t.yaml", name="t")
    assert settings.sweeper.max_clock_skew == 600.0
    out = io.StringIO()
    loop = Loop()
    role = SweeperRole(settings, Log("sweeper", "t", journal=False, stream=out))
    try:
        role.start(loop)
        loop.run_once(0.5)
    finally:
        role.close()
    report = role.last_report
    assert report is not None and (report.delayed_promoted, report.dead_deleted, report.receipts_deleted) == (0, 0, 0)
    log = out.getvalue()
    assert "clock_skew" in log and "local clock" in log and "max_clock_skew 10m" in log, log


def test_trusted_wall_is_the_floor_within_the_bound_and_local_plus_bound_beyond() -> None:
    local = 1_800_000_000 * SEC
    assert trusted_wall(local + 60 * SEC, local, 300 * SEC) == (local + 60 * SEC, None)
    assert trusted_wall(local + 300 * SEC, local, 300 * SEC) == (local + 300 * SEC, None)
    wall, warning = trusted_wall(local + 2 * HOUR * SEC, local, 300 * SEC)
    assert wall == local + 300 * SEC
    assert warning is not None
    assert "2027-01-15 08:00:00 UTC" in warning and "2027-01-15 10:00:00 UTC" in warning, warning


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "5m", True, 1e300])
def test_queue_open_refuses_a_bad_max_clock_skew(queue: Queue, queue_path: str, bad: object) -> None:
    with pytest.raises(InvalidInput, match="max_clock_skew"):
        Queue.open(queue_path, max_clock_skew=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "message"), [("0s", "between"), ("400d", "between"), ("soon", "invalid duration")])
def test_config_refuses_a_bad_max_clock_skew(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"t.yaml:3: sweeper.max_clock_skew: .*{message}"):
        parse_config(f"queue: /srv/q\nsweeper:\n  max_clock_skew: {value}\n", path="t.yaml", name="t")
