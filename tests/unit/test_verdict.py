"""The exit policy as a table: every way a run can end, under every `worker.exit_status` option.

One row per way a run ends; one column per policy. The policies cover each
option of docs/configuration.md: the three lists at their defaults, lists
that replace them (a status listed twice is a config error, test_config.py),
``other: bury`` against ``other: retry``, and a status of 128 or more
listed explicitly (a shell reports a signal as 128 + N, but to the policy it
is a status like any other). ``worker.timeout`` enters as ``timed_out``.
``bury_reason`` and attempts do not change the verdict; how the worker
applies one (the reason code, reason 4 when no attempts are left) is the
second test, on a real queue.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.daemon.config import ExitPolicy, parse_config
from steadqd.daemon.journal import Log
from steadqd.daemon.worker.policy import Verdict, verdict
from tests.invariants import check_tree

ACK, RETRY, BURY, ABANDON = Verdict.ACK, Verdict.RETRY, Verdict.BURY, Verdict.ABANDON

POLICIES = {
    "default": ExitPolicy(),  # ack [0], retry [75], bury [100], other retry
    "custom": ExitPolicy(
        ack=frozenset({0, 1}),
        retry=frozenset({75, 111, 130}),
        bury=frozenset({100, 101}),
        other="bury",
        bury_reason=300,
    ),
    "lists empty": ExitPolicy(ack=frozenset({0}), retry=frozenset(), bury=frozenset(), other="retry"),
    "bury the rest": ExitPolicy(other="bury"),
}

# (how the run ended, status, timed_out, lease_lost, verdicts under POLICIES in order)
TABLE = [
    ("exit 0", 0, False, False, (ACK, ACK, ACK, ACK)),
    ("exit 1: listed under ack by custom only", 1, False, False, (RETRY, ACK, RETRY, BURY)),
    ("exit 75: the default retry code", 75, False, False, (RETRY, RETRY, RETRY, RETRY)),
    ("exit 111: a custom retry code", 111, False, False, (RETRY, RETRY, RETRY, BURY)),
    ("exit 100: the default bury code", 100, False, False, (BURY, BURY, RETRY, BURY)),
    ("exit 101: a custom bury code", 101, False, False, (RETRY, BURY, RETRY, BURY)),
    ("exit 3: listed nowhere", 3, False, False, (RETRY, BURY, RETRY, BURY)),
    ("exit 128", 128, False, False, (RETRY, BURY, RETRY, BURY)),
    ("exit 130: listed under retry by custom", 130, False, False, (RETRY, RETRY, RETRY, BURY)),
    ("exit 255", 255, False, False, (RETRY, BURY, RETRY, BURY)),
    ("killed by SIGKILL", -9, False, False, (RETRY, BURY, RETRY, BURY)),
    ("killed by SIGTERM", -15, False, False, (RETRY, BURY, RETRY, BURY)),
    ("killed by SIGSEGV", -11, False, False, (RETRY, BURY, RETRY, BURY)),
    ("timed out, then killed by SIGTERM", -15, True, False, (RETRY, RETRY, RETRY, RETRY)),
    ("timed out, then killed by SIGKILL", -9, True, False, (RETRY, RETRY, RETRY, RETRY)),
    ("timed out, exited 0 on SIGTERM", 0, True, False, (RETRY, RETRY, RETRY, RETRY)),
    ("timed out, exited with a bury code", 100, True, False, (RETRY, RETRY, RETRY, RETRY)),
    ("lease lost, exit 0", 0, False, True, (ABANDON, ABANDON, ABANDON, ABANDON)),
    ("lease lost, bury code", 100, False, True, (ABANDON, ABANDON, ABANDON, ABANDON)),
    ("lease lost, killed by a signal", -9, False, True, (ABANDON, ABANDON, ABANDON, ABANDON)),
    ("lease lost and timed out", -15, True, True, (ABANDON, ABANDON, ABANDON, ABANDON)),
]


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize(("case", "status", "timed_out", "lost", "expected"), TABLE, ids=[row[0] for row in TABLE])
def test_verdict_table(case: str, status: int, timed_out: bool, lost: bool, expected: tuple, policy: str) -> None:
    want = expected[list(POLICIES).index(policy)]
    assert verdict(status, timed_out=timed_out, lease_lost=lost, policy=POLICIES[policy]) is want


def test_bury_reason_does_not_change_a_verdict() -> None:
    for status in (0, 3, 75, 100, -9):
        assert {
            verdict(status, timed_out=False, lease_lost=False, policy=ExitPolicy(bury_reason=r)) for r in (0, 1, 300)
        } == {verdict(status, timed_out=False, lease_lost=False, policy=ExitPolicy())}


def test_the_journal_shows_the_verdict_as_a_word() -> None:
    assert [str(v) for v in Verdict] == ["ack", "retry", "bury", "abandoned"]


# --- how the worker applies a verdict --------------------------------------------


@pytest.mark.parametrize(
    ("applied", "max_attempts", "states", "reason"),
    [
        (ACK, 3, {"receipt"}, None),
        (RETRY, 3, {"ready", "delayed"}, None),  # 1 ms of back-off: delayed, or ready if already due
        (RETRY, 1, {"dead"}, 4),  # attempts exhausted: the backend's reason, not bury_reason
        (BURY, 3, {"dead"}, 300),  # bury_reason from the config
        (BURY, 1, {"dead"}, 300),
    ],
)
def test_the_worker_applies_a_verdict(
    tmp_path: Path, applied: Verdict, max_attempts: int, states: set[str], reason: int | None
) -> None:
    from steadqd.daemon.worker.role import WorkerRole

    qpath = str(tmp_path / "q")
    Queue.init(qpath, shards=1).close()
    settings = parse_config(
        f"queue: {qpath}\nworker:\n  command: ['true']\n  exit_status: {{bury_reason: 300}}\n"
        "  retry: {backoff_base: 1ms, backoff_max: 1ms, jitter: false}\n",
        path="t.yaml",
        name="t",
    )
    out = io.StringIO()
    role = WorkerRole(settings, Log("worker", "t", journal=False, stream=out))
    with Queue.open(qpath) as q:
        job = q.enqueue(b"x", max_attempts=max_attempts)
        lease = q.lease()
        assert lease is not None and settings.worker is not None
        role.q = q
        # _apply settles and returns the line that follows `job finished`; the worker logs it
        role._log_follow_up(lease, role._apply(lease, settings.worker, applied))
    found = check_tree(qpath).objects[job]
    assert str(found.state) in states, found
    if reason is not None:
        assert found.name.reason == reason
    dead = "dead" in states
    assert (role.tally.done, role.tally.failed, role.tally.retried) == (
        int(applied is ACK),
        int(dead),
        int(not dead and applied is RETRY),
    )
    if reason == 4:
        assert f"job {job[:8]} buried: no attempts left (1/1, attempts_exhausted)" in out.getvalue()
