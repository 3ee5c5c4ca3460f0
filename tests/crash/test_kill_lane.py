"""Crash lab lane 3: SIGKILL of producers, ``steadqd run`` and job commands on ext4, XFS and btrfs.

Why: lane 1 checks computed crash states of the protocol; this lane checks the
deployed processes on the real filesystems, where a killed process leaves
exactly what the kernel has (open O_TMPFILEs vanish, renames are atomic,
leases of a dead worker must expire and be reaped). Every committed enqueue
must end as exactly one receipt or dead entry, nothing partial or duplicated,
fsck clean, no temps, and the queue must still work; and every job's final
state must be the one its script (what its command does at each attempt),
the exit policy and the kills allow: a run killed by a signal never acked,
a buried job dead with the bury reason, attempts exhausted only at the last
attempt. The rig and the gates
live in :mod:`tests.lab.killrig`; ``python -m tests.lab.killrig kill``
runs the long version (docs/crash-lab.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.lab.killrig import (
    DAEMON_ENV,
    EXIT_POLICY,
    JOB_SHELL,
    SCRIPTS,
    Run,
    Script,
    judge,
    kill_lane,
    make_payload,
    rig,
    script_of,
    step,
)
from tests.lab.lanereport import emit

SEED = int(os.environ.get("STEADQ_CRASH_SEED", "8"))


@pytest.mark.parametrize("fs", ["ext4", "xfs", "btrfs"])
def test_sigkill_lane(fs: str, request: pytest.FixtureRequest) -> None:
    """2 producers x 60 jobs, concurrency 4, 10 random SIGKILLs, then settle and check the gates."""
    rep = kill_lane(fs, jobs=60, rounds=10, seed=SEED)
    emit(request, "lane 3", rep.line())
    assert sum(rep.kills.values()) == 10
    assert rep.committed + rep.inflight_lost + rep.inflight_kept == 120  # every serial begun exactly once
    assert rep.receipts + rep.dead == rep.committed + rep.inflight_kept
    assert rep.buried and rep.exhausted and rep.self_killed, "a scripted outcome never occurred: it was not checked"


def test_gates_catch_a_lost_and_a_duplicated_job() -> None:
    """The gates can fail: a receipt removed after settling is reported lost; a second
    enqueue of a serial (what a producer retrying an in-flight enqueue would do) is a duplicate."""
    from steadqd import Queue
    from tests.lab.killrig import make_payload

    with rig("ext4", producers=2, concurrency=2, seed=SEED) as r:
        r.run("5", rounds=0)
        r.settle()
        r.check()  # clean so far
        with Queue.open(r.root) as q:
            q.enqueue(make_payload(0), metadata={"serial": 0})
            lease = q.lease()
            assert lease is not None
            q.bury(lease)  # a dead entry keeps its payload, so the walker reads serial 0 twice
        with pytest.raises(AssertionError, match="enqueued twice"):
            r.check()
        for dirpath, _, files in os.walk(os.path.join(r.root, "receipts")):
            for n in files:
                os.unlink(os.path.join(dirpath, n))
        with pytest.raises(AssertionError, match="committed enqueues lost"):
            r.check()


def test_job_command_follows_its_script(tmp_path: Path) -> None:
    """The job command takes the step its payload's script gives its attempt, logs it, and acts on it."""
    log = tmp_path / "jobs.log"
    command = JOB_SHELL.format(log=log, pause="0", daemon=DAEMON_ENV)
    for serial in range(len(SCRIPTS)):
        script = script_of(serial)
        for attempt in (1, 2, 3):
            env = {"STEADQ_JOB_ID": f"j{serial}", "STEADQ_META_SERIAL": str(serial), "STEADQ_ATTEMPT": str(attempt)}
            env[DAEMON_ENV] = "7"
            p = subprocess.run(["/bin/sh", "-c", command], input=make_payload(serial), env=env, check=False)
            did = step(script, attempt)
            assert p.returncode == {"K": -signal.SIGKILL, "T": -signal.SIGTERM}.get(
                did, int(did) if did.isdigit() else 0
            )
            assert log.read_text().splitlines()[-2:] == [
                f"S j{serial} {serial} {attempt} 7",
                f"E j{serial} {attempt} {did}",
            ]


def _judge(state: str, attempt: int, reason: int | None, script: Script, runs: dict[int, Run], **kw: Any) -> str | None:
    return judge(state, attempt, reason, script, runs, kw.get("killed", set()), kw.get("daemon_kills", 0))


BURY, EXHAUSTED = EXIT_POLICY["bury_reason"], 4


def test_judge_accepts_what_the_protocol_allows() -> None:
    """Each final state that a script, the exit policy and the kills make possible passes."""
    ok, killed_once = (("0",), 6), (("K", "0"), 6)
    assert _judge("receipt", 1, None, ok, {1: Run(1, True, "0")}) is None
    assert _judge("receipt", 2, None, killed_once, {1: Run(1, True, "K"), 2: Run(1, True, "0")}) is None
    assert _judge("receipt", 2, None, (("75", "0"), 6), {1: Run(1, True, "75"), 2: Run(1, True, "0")}) is None
    assert _judge("dead", 1, BURY, (("100",), 6), {1: Run(1, True, "100")}) is None
    assert _judge("dead", 2, EXHAUSTED, (("75",), 2), {1: Run(1, True, "75"), 2: Run(1, True, "75")}) is None
    # the rig killed attempt 1 after its "E 0" line: a retry, then success
    assert _judge("receipt", 2, None, ok, {1: Run(1, True, "0", killed=True), 2: Run(2, True, "0")}) is None
    # daemon 1 died after attempt 1 exited 0 and before it acked: the lease expired, attempt 2 acked
    assert _judge("receipt", 2, None, ok, {1: Run(1, True, "0"), 2: Run(2, True, "0")}, killed={1}) is None
    # the same with one attempt: dead, attempts exhausted, though the command succeeded
    assert _judge("dead", 1, EXHAUSTED, (("0",), 1), {1: Run(1, True, "0")}, killed={1}, daemon_kills=1) is None
    # a claim whose daemon died before the command started
    assert _judge("receipt", 2, None, ok, {2: Run(2, True, "0")}, daemon_kills=1) is None
    # daemon 1 was SIGKILLed mid-run and its guard killed the command: no "E" line, unsettled, attempt 2 acked
    assert _judge("receipt", 2, None, ok, {1: Run(1, True), 2: Run(2, True, "0")}, killed={1}) is None


def test_judge_rejects_what_it_does_not() -> None:
    """The audit's mutation (a run killed by a signal is acked) and its relatives are reported."""
    killed_once = (("K", "0"), 6)
    assert "could only end as retry" in str(_judge("receipt", 1, None, killed_once, {1: Run(1, True, "K")}))
    rig_killed = {1: Run(1, True, None, killed=True)}
    assert "could only end as retry" in str(_judge("receipt", 1, None, (("0",), 6), rig_killed))
    assert "no run" in str(_judge("receipt", 1, None, (("0",), 6), {}, daemon_kills=1))
    assert "yet attempt 2 followed" in str(
        _judge("receipt", 2, None, (("0",), 6), {1: Run(1, True, "0"), 2: Run(1, True, "0")})
    )
    assert "could only end as bury" in str(_judge("dead", 1, EXHAUSTED, (("100",), 6), {1: Run(1, True, "100")}))
    assert "could only end as retry" in str(_judge("dead", 1, BURY, (("75", "0"), 6), {1: Run(1, True, "75")}))
    assert "never ran, and no daemon was killed" in str(
        _judge("dead", 2, EXHAUSTED, (("75",), 2), {2: Run(1, True, "75")})
    )
    assert "never ended, and the rig did not kill it" in str(
        _judge("dead", 2, EXHAUSTED, (("75",), 2), {1: Run(1, True), 2: Run(1, True, "75")})
    )
    # a run that died with its daemon settled nothing: it cannot be the acking one
    assert _judge("receipt", 1, None, (("0",), 6), {1: Run(1, True)}, killed={1}) is not None
    assert "its script says" in str(_judge("receipt", 1, None, (("75", "0"), 6), {1: Run(1, True, "0")}))
    assert "ran (or was killed) after" in str(
        _judge("dead", 1, BURY, (("100",), 6), {1: Run(1, True, "100"), 2: Run(1, True, "100")})
    )
    # exhausted before the last attempt
    assert "could only end as" in str(_judge("dead", 1, EXHAUSTED, (("75",), 2), {1: Run(1, True, "75")}))
