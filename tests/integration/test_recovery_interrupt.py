"""Recovery is safe to interrupt after any syscall (recovery.md, issue 3).

One queue state exercises every recovery phase at once: expired, exhausted,
previous-boot and legacy leases (plus an unparseable legacy name), a running
lease, due / not-yet-due / corrupt delayed jobs, temp files of both boots, a
stale compaction temp, a full receipt to compact and receipts past retention.

An uninterrupted pass on a copy of that state gives the reference outcome and
the syscall trace (N positions). Then, for every position i, a fresh copy is
recovered with the i-th syscall failing with EIO (before it runs; and, for
the syscalls with side effects, also *after* it succeeded, the "it happened
but we never learned it" case). The faulted pass must not raise; after it,
passes with no fault run until one changes nothing, and the final tree must
equal the reference: the same objects (state, job id, generation, attempt,
compactness, path), the same quarantined bytes per reason, the same temps,
directories and control files, and no job lost or duplicated
(``check_tree``).

Determinism: the wall floor is pinned by a watermark published a day ahead
(so every wall decision — which delayed buckets are due, the dead bucket,
receipt retention — is fixed while the test runs), boottime is passed as
``now_boottime``, and every copy keeps the queue id so names still
authenticate. Quarantine ids are random, so quarantine is compared by
(reason, bytes).
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:  # make ``tests.*`` importable however pytest was started
    sys.path.insert(0, _REPO)

from steadqd import Queue  # noqa: E402
from steadqd.constants import QuarantineReason  # noqa: E402
from steadqd.fs import linux, names  # noqa: E402
from steadqd.fs.recovery import RecoveryReport, run_recovery  # noqa: E402
from tests.integration.test_recovery import (  # noqa: E402
    OTHER_BOOT,
    SEC,
    _ack_one,
    _move_receipt_to_bucket,
    advance_watermark_to,
    craft_lease,
    flip_byte,
    only_object,
)
from tests.invariants import check_tree  # noqa: E402

SHARDS = 4
DAY = 86_400 * SEC
RETENTION_S = 60  # receipts of a bucket that ended over a minute before the floor expire
TEMP_TTL_S = 5
# Large enough never to cut the pass short: the fault, not the budget, interrupts it.
BUDGET = {"budget_ops": 100_000, "budget_ms": 3_600_000}
MAX_PASSES = 6  # convergence passes after the faulted one; more means recovery does not converge
# Syscalls with a side effect: failing them *after* they succeeded is a different case
# from failing them before. Read-only calls (stat, listdir, read, clock, ...) behave the
# same either way, so after=True runs only these.
# Failures that are deliberately not errors: the watermark re-stat is retried by the
# reader, and a cursor that cannot be pre-read is simply rewritten. Every other
# injected failure must leave a trace in the report.
SILENT_OK = frozenset({("stat", "wall-watermark"), ("open", "recovery-cursor.json")})
SIDE_EFFECT_OPS = frozenset(
    {
        "open",
        "openat2",
        "mkdir",
        "write",
        "pwrite",
        "fsync",
        "rename_noreplace",
        "rename",
        "link",
        "unlink",
        "rmdir",
        "lock",
    }
)


@dataclass(frozen=True)
class Scenario:
    """The pristine initial tree (never recovered) and the clocks every pass uses."""

    root: str
    now_boottime: int
    jobs: dict[str, str]  # role -> job id (32 hex)
    expired_receipt_bucket: int  # terminal bucket past retention: removed with its shard dirs


@dataclass(frozen=True)
class Outcome:
    """Everything about a final tree that recovery decides, independent of random ids."""

    objects: tuple[tuple[str, str, int, int, bool, str], ...]  # (state, job, generation, attempt, compact, path)
    quarantine: tuple[tuple[int, bytes], ...]  # (reason, raw bytes), sorted
    temps: tuple[str, ...]
    directories: tuple[str, ...]
    control: tuple[str, ...]
    cursor: bytes

    def differences(self, other: Outcome) -> list[str]:
        out = []
        for f in ("objects", "quarantine", "temps", "directories", "control", "cursor"):
            mine, theirs = getattr(self, f), getattr(other, f)
            if mine != theirs:
                if isinstance(mine, tuple):
                    extra = sorted(set(mine) - set(theirs), key=repr)
                    missing = sorted(set(theirs) - set(mine), key=repr)
                    out.append(f"{f}: extra {extra!r} missing {missing!r} (counts {len(mine)} vs {len(theirs)})")
                else:
                    out.append(f"{f}: {mine!r} != {theirs!r}")
        return out


def open_queue(root: str) -> Queue:
    """Every handle of the test uses the same per-handle options (retention, temp TTL),
    and trusts the watermark the scenario pins a day ahead of the clock."""
    return Queue.open(root, receipt_retention=RETENTION_S, temp_ttl=TEMP_TTL_S, max_clock_skew=2 * DAY / SEC)


def one_pass(q: Queue, now_boottime: int) -> RecoveryReport:
    """One pass with a fixed boottime, inside an operation as the public facade does."""
    with q._ctx.tree.operation():
        return run_recovery(q._ctx, now_boottime=now_boottime, **BUDGET)


def build_scenario(root: str) -> Scenario:
    """Create the initial tree; see the module docstring for what it holds."""
    jobs: dict[str, str] = {}
    with Queue.init(root, shards=SHARDS) as q:
        width = q.format.delayed_width_ns
        # Delayed jobs due once the floor jumps ahead (enqueued before it does).
        due, due_rel = q.enqueue_detailed(b"due delayed", delay=1)
        bad, bad_rel = q.enqueue_detailed(b"corrupt delayed", delay=1)
        assert due_rel.startswith("delayed/") and bad_rel.startswith("delayed/")
        flip_byte(root, bad_rel, 60)  # envelope digest mismatch: quarantined 0x0001 once due
        jobs.update(due=due, corrupt_delayed=bad)
    # Pin the wall floor a day ahead: it stays exactly this value during the test.
    advance_watermark_to(root, (linux.realtime_ns() + DAY) // width + 1)
    with open_queue(root) as q:
        fmt = q.format
        floor = q.wall_floor_ns()
        assert floor % width == 0 and floor > linux.realtime_ns() + DAY // 2
        jobs["expired"] = q.enqueue(b"expired lease")
        expired = q.lease(duration=1)
        jobs["exhausted"] = q.enqueue(b"exhausted lease", max_attempts=1)
        exhausted = q.lease(duration=1)
        jobs["running"] = q.enqueue(b"running lease")
        running = q.lease(duration=3600)
        assert expired and exhausted and running
        assert (expired.job_id, exhausted.job_id, running.job_id) == (
            jobs["expired"],
            jobs["exhausted"],
            jobs["running"],
        )
        # Receipts: one recent (compacted), two in a bucket past retention (deleted).
        now_b = names.terminal_bucket(floor, fmt.terminal_width_ns)
        jobs["receipt_recent"], _ = _ack_one(q, b"recent receipt " * 50)
        for role in ("receipt_old_1", "receipt_old_2"):
            jobs[role], _ = _ack_one(q, b"old receipt")
            _move_receipt_to_bucket(q, only_object(root, jobs[role]), now_b - 2)
        recent_rel = only_object(root, jobs["receipt_recent"])
        stale = Path(root, os.path.dirname(recent_rel), names.make_compact_temp_name(os.urandom(16)))
        stale.write_bytes(b"half a compact record")
        jobs["prev_boot"], _, _ = craft_lease(q, boot=OTHER_BOOT, deadline=1)
        jobs["legacy"], legacy_rel, _ = craft_lease(q, boot=OTHER_BOOT, deadline=1, legacy=True)
        Path(root, os.path.dirname(legacy_rel), "not-a-lease.sqj").write_bytes(b"garbage")  # quarantined 0x0003
        jobs["future"] = q.enqueue(b"not yet due", not_before_ns=floor + 30 * DAY)
        jobs["ready"] = q.enqueue(b"plain ready job")
        now_bt = linux.boottime_ns() + 60 * SEC
        assert expired.boottime_deadline_ns < now_bt < running.boottime_deadline_ns
        me, other = q.boot_id, names.boot_dashed(OTHER_BOOT)
        temps = {
            f"tmp/{other}/0000/{names.make_temp_name(now_bt, os.urandom(16))}": b"other boot",
            f"tmp/{me}/0001/{names.make_temp_name(now_bt - 10 * SEC, os.urandom(16))}": b"old",
            f"tmp/{me}/0001/{names.make_temp_name(now_bt - 1 * SEC, os.urandom(16))}": b"young",
        }
        for rel, data in temps.items():
            os.makedirs(Path(root, rel).parent, exist_ok=True)
            Path(root, rel).write_bytes(data)
        q.sync()
    return Scenario(root, now_bt, jobs, now_b - 2)


def outcome(root: str) -> Outcome:
    """Check every invariant (no job lost or duplicated) and summarise the tree."""
    ts = check_tree(root, allow_temps=True, allow_quarantine=True)
    objects = tuple(
        sorted((o.state.value, o.job_id, o.generation, o.attempt, o.compact, o.path) for o in ts.objects.values())
    )
    quarantine = tuple(sorted((reason, Path(root, "quarantine", n).read_bytes()) for n, reason in ts.quarantine))
    dirs = []
    for dirpath, dirnames, _ in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirs.extend(os.path.normpath(os.path.join(rel, d)) for d in dirnames)
    cursor_path = Path(root, "control", "recovery-cursor.json")
    return Outcome(
        objects=objects,
        quarantine=quarantine,
        temps=tuple(sorted(ts.temps)),
        directories=tuple(sorted(dirs)),
        control=tuple(sorted(os.listdir(os.path.join(root, "control")))),
        cursor=cursor_path.read_bytes() if cursor_path.exists() else b"",
    )


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def fresh_copy(scn: Scenario, dest: str) -> None:
    if os.path.exists(dest):
        shutil.rmtree(dest)
    shutil.copytree(scn.root, dest, symlinks=True)
    age_delayed_dirs(dest)


def age_delayed_dirs(root: str) -> None:
    """Let "a while" pass for the delayed directories.

    Empty delayed buckets are removed only once quiet for a minute by the local
    clock (recovery/buckets.py): every copy starts with the same old times, so
    whether a bucket goes never depends on how long the test has run, and the
    passes after a fault run "later", when a bucket the faulted pass touched
    is quiet again.
    """
    old = time.time_ns() - 2 * 3600 * SEC
    for dirpath, _, _ in os.walk(os.path.join(root, "delayed")):
        os.utime(dirpath, ns=(old, old))


def converge(root: str, now_bt: int) -> tuple[int, RecoveryReport]:
    """Clean passes until one changes nothing; (passes run, last report)."""
    for n in range(1, MAX_PASSES + 1):
        age_delayed_dirs(root)
        with open_queue(root) as q:
            report = one_pass(q, now_bt)
        if report.changed == 0:
            return n, report
    return MAX_PASSES + 1, report


# --------------------------------------------------------------------------- fixtures


@dataclass(frozen=True)
class Reference:
    scenario: Scenario
    outcome: Outcome
    ops: tuple[str, ...]  # the op of every syscall of the uninterrupted pass, in order
    names: tuple[str, ...]  # the file name each call was about ("" if none), in the same order


@pytest.fixture(scope="module")
def reference(ram_ext4_base: Path) -> Iterator[Reference]:
    # ~500 copies, passes and removals of a 1,700-directory tree: on a RAM-backed ext4 their
    # fsyncs and journal commits cost no disk I/O (3.6 s instead of 10 s per 40 positions).
    base = Path(tempfile.mkdtemp(prefix="recovery-interrupt-", dir=ram_ext4_base))
    try:
        yield _reference(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _reference(base: Path) -> Reference:
    scn = build_scenario(str(base / "initial"))
    work = str(base / "reference")
    fresh_copy(scn, work)
    with open_queue(work) as q, linux.trace() as events:
        report = one_pass(q, scn.now_boottime)
    assert report.errors == [], report.errors
    assert not report.budget_exhausted
    passes, last = converge(work, scn.now_boottime)
    # One uninterrupted pass does everything, but for the buckets it emptied itself: those are
    # removed by the next pass once quiet.
    assert passes <= 2 and last.errors == [], (passes, last)
    names = tuple(next((d for d in e.detail if isinstance(d, str)), "") for e in events)
    return Reference(scn, outcome(work), tuple(e.op for e in events), names)


@pytest.fixture
def work_root(fast_tmp_path: Path) -> str:
    return str(fast_tmp_path / "work")


# --------------------------------------------------------------------------- tests


def test_reference_pass_exercises_every_phase(reference: Reference) -> None:
    """The uninterrupted outcome is the intended one, so matching it means something."""
    jobs = reference.scenario.jobs
    got = {job: (state, gen, attempt, compact) for state, job, gen, attempt, compact, _ in reference.outcome.objects}
    # Generations start at 0; every transition adds one, attempts count claims.
    for role in ("expired", "prev_boot", "legacy"):  # back to ready, attempt kept
        assert got[jobs[role]][:3] == ("ready", 2, 1), role
    assert got[jobs["exhausted"]][:3] == ("dead", 2, 1)
    assert got[jobs["running"]][:3] == ("leased", 1, 1)
    assert got[jobs["due"]][:3] == ("ready", 1, 0)
    assert got[jobs["future"]][:3] == ("delayed", 0, 0)
    assert got[jobs["ready"]][:3] == ("ready", 0, 0)
    assert got[jobs["receipt_recent"]] == ("receipt", 2, 1, True)
    for gone in ("corrupt_delayed", "receipt_old_1", "receipt_old_2"):
        assert jobs[gone] not in got, gone
    reasons = sorted(r for r, _ in reference.outcome.quarantine)
    assert reasons == [QuarantineReason.ENVELOPE_CORRUPT, QuarantineReason.FILENAME_PARSE_FAILED]
    assert len(reference.outcome.temps) == 1 and reference.outcome.temps[0].startswith("tmp/")  # the young one
    old = f"receipts/{reference.scenario.expired_receipt_bucket:016x}"
    assert not [d for d in reference.outcome.directories if d.startswith(old)]
    assert os.path.isdir(os.path.join(reference.scenario.root, old))  # it was there before the pass
    n = len(reference.ops)
    assert n > 100 and {"rename_noreplace", "rename", "unlink", "rmdir", "fsync"} <= set(reference.ops)


def _run_with_fault(reference: Reference, dest: str, nth: int, after: bool) -> list[str]:
    """Recover a fresh copy with syscall ``nth`` failing, converge, compare; the problems found."""
    scn = reference.scenario
    fresh_copy(scn, dest)
    problems: list[str] = []
    before = open_fds()
    q = open_queue(dest)
    try:
        with linux.inject(nth=nth, errno=errno.EIO, after=after) as fault:
            try:
                report = one_pass(q, scn.now_boottime)
            except Exception as e:  # recovery records errors; it must never raise for I/O
                problems.append(f"faulted pass raised {type(e).__name__}: {e}")
                report = None
    finally:
        q.close()
    op, name = reference.ops[nth - 1], reference.names[nth - 1]
    if not fault.fired and not after:
        problems.append(f"fault never fired (saw {fault.calls_seen} calls)")
    if report is not None and fault.fired and report.errors == [] and op != "close" and (op, name) not in SILENT_OK:
        # A close failure changes nothing worth reporting; anything else unnoticed is a swallowed error.
        problems.append("fault fired but the pass recorded no error")
    leaked = open_fds() - before
    for fd in leaked:
        os.close(fd)  # also drops a leaked OFD lock, which would block every later pass
    if leaked and not (op == "close" and not after):  # a close failed before running cannot release its fd
        problems.append(f"{len(leaked)} descriptor(s) leaked")
    passes, last = converge(dest, scn.now_boottime)
    if passes > MAX_PASSES:
        problems.append(f"did not converge in {MAX_PASSES} passes; last errors {last.errors}")
    elif last.errors:
        problems.append(f"converged pass still records errors {last.errors}")
    try:
        problems.extend(outcome(dest).differences(reference.outcome))
    except AssertionError as e:  # check_tree: a job lost, duplicated or corrupt
        problems.append(str(e))
    return [f"position {nth} ({op} {name}, after={after}): {p}" for p in problems]


def _positions(reference: Reference, after: bool) -> Iterator[int]:
    for i, op in enumerate(reference.ops, start=1):
        if not after or op in SIDE_EFFECT_OPS:
            yield i


@pytest.mark.parametrize("after", [False, True], ids=["fail-before", "fail-after"])
def test_interrupted_pass_converges_to_the_uninterrupted_outcome(
    reference: Reference, work_root: str, after: bool
) -> None:
    failures: list[str] = []
    count = 0
    for nth in _positions(reference, after):
        count += 1
        failures.extend(_run_with_fault(reference, work_root, nth, after))
    assert count > 0
    assert failures == [], f"{len(failures)} problem(s) over {count} positions:\n" + "\n".join(failures)
