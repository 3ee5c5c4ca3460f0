"""Recover one materialised crash state and check the gates of issue 8.

The expectations come from the workload's *commit marks*: a call that
returned before the crash point is committed (its effects must survive);
the call in flight at the crash point may or may not have taken effect.
:func:`after_recovery` maps each job's last known state to what recovery may turn it
into (recovery runs with a boottime far in the future, so every lease of the
crashed "boot" counts as expired, every temp as abandoned).

Gates (each failure is one message; an empty list means the state passed):

1. the crash state itself holds every tree invariant except leftover temps
   (``tests.invariants.check_tree``): never two objects for one job, every
   object verifies;
2. the queue opens and recovery, repeated until it changes nothing, reports
   no error;
3. after recovery the tree holds every invariant, temps included, and fsck
   reports no ERROR finding;
4. every job is in a state its history allows (no committed enqueue lost, no
   acknowledged job active again, no terminal job resurrected) and no job
   id appears that the workload never created (phantom);
5. nothing committed was quarantined (by recovery, fsck or a lease scan);
6. draining the queue delivers exactly the ready jobs, each with the
   payload that was enqueued (a corrupt payload is never delivered);
7. the queue works afterwards: a new job is enqueued, leased and acked.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import NamedTuple

from steadqd import Queue
from steadqd.constants import NS_PER_SECOND, State
from steadqd.fs import linux
from steadqd.fs.recovery import run_recovery
from tests.invariants import TreeState, check_tree

JobState = State | None  # None: no object (never enqueued, or gone)


class JobView(NamedTuple):
    """What the workload saw of a job after a call: enough to say what recovery may do."""

    state: State
    attempt: int
    max_attempts: int
    not_before: int | None  # delayed jobs only (wall ns)


def after_recovery(view: JobView | None, wall_now_ns: int) -> frozenset[JobState]:
    """The states recovery may leave a job in, given its last known view.

    Recovery runs with a boottime far ahead, so every lease is expired: it goes
    back to ready with attempts left, to dead without. A delayed job may be
    promoted only once its not-before instant has passed (promotion works on
    whole buckets, so a due job may also still wait). Nothing else moves.
    """
    if view is None:
        return frozenset({None})
    if view.state is State.LEASED:
        return frozenset({State.DEAD if view.attempt >= view.max_attempts else State.READY})
    if view.state is State.DELAYED:
        due = view.not_before is not None and view.not_before <= wall_now_ns
        return frozenset({State.DELAYED, State.READY}) if due else frozenset({State.DELAYED})
    return frozenset({view.state})


# Far enough ahead that every lease deadline and temp TTL of the crashed run has passed.
REBOOT_AHEAD_NS = 400 * 24 * 3600 * NS_PER_SECOND
_MAX_PASSES = 8
_JOB_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Expectation:
    """What a crash state must recover to."""

    allowed: Mapping[str, frozenset[JobState]]  # every job the workload knows of
    committed: Set[str]  # jobs whose enqueue is committed (must never be quarantined)
    payloads: Mapping[str, bytes]

    def key(self) -> tuple[object, ...]:
        """Equal keys mean equal checks (used to deduplicate crash states)."""
        allowed = tuple(sorted((j, tuple(sorted(str(s) for s in a))) for j, a in self.allowed.items()))
        return allowed, tuple(sorted(self.committed))


def _job_of(path: str) -> str | None:
    base = os.path.basename(path)[:32]
    return base if _JOB_ID.fullmatch(base) else None


def check_state(root: str, expect: Expectation) -> list[str]:
    """Run recovery on the tree at ``root`` and return every gate violation."""
    fails: list[str] = []
    try:
        check_tree(root, allow_temps=True)
    except AssertionError as e:
        fails.append(f"crash state violates invariants: {e}")
    try:
        q = Queue.open(root, allow_unsupported_fs=True)
    except Exception as e:
        return fails + [f"Queue.open failed: {type(e).__name__}: {e}"]
    try:
        _after_open(q, root, expect, fails)
    finally:
        q.close()
    return fails


def _after_open(q: Queue, root: str, expect: Expectation, fails: list[str]) -> None:
    quarantined: dict[str, str] = {}  # job -> where it was found
    ctx = q._ctx  # recovery with an injected boottime is not public API
    now = linux.boottime_ns() + REBOOT_AHEAD_NS
    # A pass resumes at the phase the crashed tree's cursor names and runs the
    # phases after it, so one pass that changed nothing may not have reaped:
    # recovered means two passes in a row changed nothing (the second one
    # began at the first phase, as the first ran to the end of the list).
    unchanged = 0
    for n in range(_MAX_PASSES):
        with ctx.tree.operation():
            rep = run_recovery(ctx, budget_ops=1_000_000, budget_ms=600_000, now_boottime=now)
        fails.extend(f"recovery pass {n}: {code}: {msg}" for code, msg in rep.errors)
        for path, reason, _qname in rep.quarantined_objects:
            quarantined[_job_of(path) or path] = f"recovery (reason 0x{reason:04x}) {path}"
        unchanged = 0 if rep.changed else unchanged + 1
        if rep.errors or unchanged == 2:
            break
    else:
        fails.append(f"recovery still changing the tree after {_MAX_PASSES} passes")
    try:
        tree: TreeState | None = check_tree(root, allow_temps=False)
    except AssertionError as e:
        fails.append(f"recovered tree violates invariants: {e}")
        tree = None
    fsck = q.fsck()
    fails.extend(f"fsck ERROR {f.path}: {f.finding_type} ({f.details})" for f in fsck.errors)
    if tree is not None:
        _job_gates({j: o.state for j, o in tree.objects.items()}, expect, fails)

    # Drain: every ready job is delivered once, with its own payload.
    delivered: set[str] = set()
    for _ in range(len(expect.allowed) + 2):
        try:
            lease = q.lease(duration=300.0)
        except Exception as e:  # a gate failure like any other: the findings above still count
            fails.append(f"drain: lease failed: {type(e).__name__}: {e}")
            break
        scan = q.last_scan
        if scan is not None:
            for path, reason, _qname in scan.quarantined:
                quarantined[_job_of(path) or path] = f"lease scan (reason 0x{reason:04x}) {path}"
            fails.extend(f"lease scan error: {e}" for e in scan.errors)
        if lease is None:
            break
        job = lease.job_id
        if job in delivered:
            fails.append(f"job {job} delivered twice while draining")
            break
        delivered.add(job)
        try:
            payload = lease.payload()
            if payload != expect.payloads.get(job):
                fails.append(f"job {job} delivered with a payload that was never enqueued for it")
            q.ack(lease)
        except Exception as e:
            fails.append(f"delivered job {job} cannot be read or acked: {type(e).__name__}: {e}")
            break  # the handle may be poisoned now
    if tree is not None:
        if delivered != set(tree.ready):
            fails.append(
                f"drain delivered {sorted(delivered - tree.ready)} not ready, missed {sorted(tree.ready - delivered)}"
            )
    else:
        # The recovered tree was broken; judge the jobs once the lease scan had its say.
        try:
            drained = check_tree(root, allow_temps=False)
        except AssertionError as e:
            fails.append(f"tree still violates invariants after draining: {e}")
        else:
            states = {j: State.READY if j in delivered else o.state for j, o in drained.objects.items()}
            _job_gates(states, expect, fails)
    for job, where in sorted(quarantined.items()):
        if job in expect.committed:
            fails.append(f"committed job {job} quarantined by {where}")

    # The queue still works, for a fresh handle (a new process after the reboot).
    try:
        with Queue.open(root, allow_unsupported_fs=True) as q2:
            new = q2.enqueue(b"after the crash")
            lease = q2.lease(duration=300.0)
            if lease is None or lease.job_id != new:
                fails.append(f"queue unusable after recovery: enqueued {new}, leased {lease and lease.job_id}")
            else:
                q2.ack(lease)
        if tree is not None:
            check_tree(root, allow_temps=False)
    except Exception as e:
        fails.append(f"queue unusable after recovery: {type(e).__name__}: {e}")


def _job_gates(states: Mapping[str, State], expect: Expectation, fails: list[str]) -> None:
    """Every job in an allowed state; no job the workload never created."""
    for job, state in sorted(states.items()):
        if job not in expect.allowed:
            fails.append(f"phantom job {job} in {state.value}")
    for job, allowed in sorted(expect.allowed.items()):
        got = states.get(job)
        if got not in allowed:
            names = sorted("absent" if s is None else s.value for s in allowed)
            fails.append(f"job {job} is {'absent' if got is None else got.value}; allowed: {names}")


def remove_tree(path: str) -> None:
    """rmtree that copes with 0400 files and 0500 directories (shared-mode trees)."""
    for dirpath, dirs, _files in os.walk(path):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, d), 0o700)
    import shutil

    shutil.rmtree(path)
