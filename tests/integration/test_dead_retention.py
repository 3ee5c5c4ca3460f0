"""Optional dead-letter retention (open-questions A7; issue 3).

The reference keeps dead jobs forever ("Dead jobs have no retention",
recovery.md phase 5). We keep that as the default and offer an opt-in
``dead_retention`` that runs inside ``delete_receipts`` with the receipt
rules: a bucket is due once ``B × w + w + retention ≤ wall floor``; only dead
jobs that parse, authenticate for their directory and pass structural
validation are unlinked, after a re-stat proves the path still names the
verified inode; everything else is kept and reported; emptied directories
are removed.

Determinism: buckets are aged by publishing a watermark far ahead of the
clock (the wall floor of a fresh handle is then exactly ``watermark bucket ×
delayed width``), never by sleeping. The host clock this process reads moves
with it, to a minute before the watermark: recovery trusts a watermark only
``max_clock_skew`` ahead of the local clock (issue 15, point 4). Every test here checks the tree itself,
so a pass that deleted the wrong thing or nothing at all fails.
"""

from __future__ import annotations

import errno
import io
import math
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:  # make ``tests.*`` importable however pytest was started
    sys.path.insert(0, _REPO)

from steadqd import Queue  # noqa: E402
from steadqd.daemon.config import parse_config  # noqa: E402
from steadqd.daemon.journal import Log  # noqa: E402
from steadqd.daemon.service import Loop  # noqa: E402
from steadqd.daemon.sweeper import SweeperRole  # noqa: E402
from steadqd.errors import InvalidInput  # noqa: E402
from steadqd.fs import linux  # noqa: E402
from steadqd.fs.json_records import reset_cursor_json, validate_cursor  # noqa: E402
from steadqd.fs.recovery import RecoveryReport, objects, run_recovery  # noqa: E402
from tests.integration.test_recovery import (  # noqa: E402
    SEC,
    _ack_one,
    advance_watermark_to,
    cursor_bytes,
    files_under,
    flip_byte,
    no_errors,
    only_object,
    recover,
)
from tests.invariants import check_tree  # noqa: E402

SHARDS = 4
DAY = 86_400 * SEC
HOUR_S = 3600
_REAL_CLOCK = linux.realtime_ns
_clock_ahead_ns = 0  # how far age_by moved this process's CLOCK_REALTIME


@pytest.fixture(autouse=True)
def _host_clock() -> Iterator[None]:
    """Its own MonkeyPatch: a test's ``monkeypatch.undo()`` must not stop the clock."""
    global _clock_ahead_ns
    _clock_ahead_ns = 0
    with pytest.MonkeyPatch.context() as m:
        m.setattr(linux, "realtime_ns", lambda: _REAL_CLOCK() + _clock_ahead_ns)
        yield


# The root queue_path and queue (tests/conftest.py), under this module's short names.
@pytest.fixture
def qpath(queue_path: str) -> str:
    return queue_path


@pytest.fixture
def q(queue: Queue) -> Queue:
    return queue


def bury_one(queue: Queue, payload: bytes) -> tuple[str, str]:
    """Enqueue, lease and bury one job; (job id, relative dead path)."""
    job = queue.enqueue(payload)
    lease = queue.lease()
    assert lease is not None and lease.job_id == job
    queue.bury(lease, reason=1)
    rel = only_object(queue.path, job)
    assert rel.startswith("dead/"), rel
    return job, rel


def age_by(root: str, ahead_ns: int, delayed_width_ns: int) -> int:
    """Publish a watermark ``ahead_ns`` past the clock; returns the exact wall
    floor a fresh handle will use (the watermark bucket start)."""
    global _clock_ahead_ns
    bucket = (linux.realtime_ns() + ahead_ns) // delayed_width_ns
    advance_watermark_to(root, bucket)
    # Time passed on the host too; a minute short, so the floor is still the watermark's.
    _clock_ahead_ns = bucket * delayed_width_ns - 60 * SEC - _REAL_CLOCK()
    return bucket * delayed_width_ns


def tree_snapshot(root: str, top: str) -> list[tuple[str, int, bool]]:
    """(relative path, inode, is directory) of everything below ``root/top``."""
    out = []
    for dirpath, dirs, files in os.walk(os.path.join(root, top)):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            out.append((os.path.relpath(p, root), os.lstat(p).st_ino, n in dirs))
    return sorted(out)


def bucket_of(rel: str) -> str:
    return "/".join(rel.split("/")[:2])  # dead/<B>


# --------------------------------------------------------------------------- default: keep forever


def test_without_dead_retention_nothing_in_dead_is_ever_deleted(q: Queue, qpath: str) -> None:
    dead = [bury_one(q, f"dead {i}".encode()) for i in range(3)]
    # A corrupt dead job as well: without retention recovery does not even look at dead/.
    flip_byte(qpath, dead[0][1], 5)
    before = tree_snapshot(qpath, "dead")
    # Ten years later, every dead bucket is ancient.
    age_by(qpath, 3650 * DAY, q.format.delayed_width_ns)
    for kwargs in ({}, {"dead_retention": None}):
        with Queue.open(qpath, **kwargs) as q2:  # type: ignore[arg-type]
            assert q2._ctx.options.dead_retention_ns is None
            report = recover(q2)
            no_errors(report)
            assert report.wall_floor_available
            assert report.dead_deleted == 0
            assert tree_snapshot(qpath, "dead") == before


# --------------------------------------------------------------------------- retention


def test_old_dead_buckets_are_emptied_and_removed_young_ones_kept(q: Queue, qpath: str) -> None:
    old = [bury_one(q, f"old {i}".encode()) for i in range(3)]
    old_buckets = {bucket_of(rel) for _, rel in old}
    assert len(old_buckets) == 1  # buried within one terminal bucket (1 h) of each other
    old_bucket = old_buckets.pop()
    old_dirs = len(os.listdir(os.path.join(qpath, old_bucket)))
    age_by(qpath, 10 * DAY, q.format.delayed_width_ns)
    with Queue.open(qpath, dead_retention=1 * 86400) as q2:
        young = [bury_one(q2, f"young {i}".encode()) for i in range(2)]
        young_bucket = bucket_of(young[0][1])
        assert young_bucket != old_bucket
        report = recover(q2)
        no_errors(report)
        assert report.dead_deleted == 3
        assert report.directories_removed == old_dirs + 1  # every shard directory, then the bucket
        assert not os.path.exists(os.path.join(qpath, old_bucket))
        for job, rel in young:
            assert only_object(qpath, job) == rel
        state = check_tree(qpath)
        assert state.dead == frozenset(j for j, _ in young)
        assert not state.all_ids & {j for j, _ in old}
        again = recover(q2)  # idempotent: nothing more to do
        no_errors(again)
        assert (again.dead_deleted, again.directories_removed) == (0, 0)


def test_bucket_boundary_is_exact(q: Queue, qpath: str) -> None:
    """Due iff ``B × w + w + retention ≤ wall``: one second more retention keeps it."""
    job, rel = bury_one(q, b"boundary")
    width = q.format.terminal_width_ns
    bucket = int(rel.split("/")[1], 16)
    wall = age_by(qpath, 3 * DAY, q.format.delayed_width_ns)
    exact_s = (wall - (bucket * width + width)) // SEC
    assert (bucket * width + width) + exact_s * SEC == wall  # all multiples of 10 s
    with Queue.open(qpath, dead_retention=exact_s + 1) as q2:
        kept = recover(q2)
        no_errors(kept)
        assert kept.dead_deleted == 0 and only_object(qpath, job) == rel
    with Queue.open(qpath, dead_retention=exact_s) as q3:
        gone = recover(q3)
        no_errors(gone)
        assert gone.dead_deleted == 1
        assert not os.path.exists(os.path.join(qpath, bucket_of(rel)))


def test_no_wall_floor_means_no_dead_deletion(q: Queue, qpath: str) -> None:
    job, rel = bury_one(q, b"no floor")
    age_by(qpath, 10 * DAY, q.format.delayed_width_ns)
    wm = Path(qpath, "control", "wall-watermark")
    good = wm.read_bytes()
    wm.write_bytes(b"\0" * 64)  # the floor can no longer be authenticated
    try:
        with Queue.open(qpath, dead_retention=HOUR_S) as q2:
            report = recover(q2)
    finally:
        wm.write_bytes(good)
    assert not report.wall_floor_available
    assert [c for c, _ in report.errors] == ["wall_floor"], report.errors
    assert report.dead_deleted == 0
    assert only_object(qpath, job) == rel


# --------------------------------------------------------------------------- what is never deleted


def test_unverifiable_dead_objects_are_kept_and_reported(q: Queue, qpath: str) -> None:
    corrupt_job, corrupt_rel = bury_one(q, b"corrupt header")
    mislaid_job, mislaid_rel = bury_one(q, b"wrong shard")
    linked_job, linked_rel = bury_one(q, b"hard linked")
    good_job, good_rel = bury_one(q, b"fine")
    bucket_dir = bucket_of(good_rel)
    flip_byte(qpath, corrupt_rel, 5)  # header byte: the envelope digest fails
    # A genuine dead job moved into another shard directory: its tag no longer authenticates.
    shard = int(mislaid_rel.split("/")[2], 16)
    other_dir = f"{bucket_dir}/{(shard + 1) % SHARDS:04x}"
    os.makedirs(os.path.join(qpath, other_dir), exist_ok=True)
    moved_rel = f"{other_dir}/{os.path.basename(mislaid_rel)}"
    os.rename(os.path.join(qpath, mislaid_rel), os.path.join(qpath, moved_rel))
    os.link(os.path.join(qpath, linked_rel), os.path.join(qpath, "linked-copy"))
    # A .sqj file whose name is not a dead name, and a stray non-job file.
    not_dead_rel = f"{other_dir}/not-a-dead-name.sqj"
    Path(qpath, not_dead_rel).write_bytes(b"x")
    stray_rel = f"{os.path.dirname(good_rel)}/notes.txt"
    Path(qpath, stray_rel).write_bytes(b"operator notes")
    age_by(qpath, 10 * DAY, q.format.delayed_width_ns)
    with Queue.open(qpath, dead_retention=HOUR_S) as q2:
        report = recover(q2)
    codes = sorted(c for c, _ in report.errors)
    assert codes == ["dead_delete_invalid", "dead_delete_invalid", "dead_delete_invalid", "dead_parse"], report.errors
    messages = " ".join(m for _, m in report.errors)
    for rel in (corrupt_rel, moved_rel, linked_rel, not_dead_rel):
        assert rel in messages
        assert os.path.exists(os.path.join(qpath, rel)), rel
    assert os.path.exists(os.path.join(qpath, stray_rel))  # not ours to judge: silently kept
    assert report.dead_deleted == 1
    assert not os.path.exists(os.path.join(qpath, good_rel))
    # Directories holding kept files stay, and so does their bucket.
    for rel in (corrupt_rel, moved_rel, linked_rel, stray_rel):
        assert os.path.isdir(os.path.join(qpath, os.path.dirname(rel)))
    left = set(os.listdir(os.path.join(qpath, bucket_dir)))
    assert left == {rel.split("/")[2] for rel in (corrupt_rel, moved_rel, linked_rel, stray_rel)}


def test_dead_job_swapped_between_verify_and_unlink_is_kept(
    q: Queue, qpath: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, rel = bury_one(q, b"swap me")
    path = os.path.join(qpath, rel)
    original_ino = os.stat(path).st_ino
    age_by(qpath, 10 * DAY, q.format.delayed_width_ns)
    real = objects.read_envelope
    swapped: list[int] = []

    def read_then_swap(fd: int, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        env = real(fd, *args, **kwargs)  # type: ignore[arg-type]
        if not swapped:
            # Same bytes, new inode, renamed over the verified name: whatever is
            # there now was never verified and must survive.
            tmp = path + ".swap"
            Path(tmp).write_bytes(Path(path).read_bytes())
            os.rename(tmp, path)
            swapped.append(os.stat(path).st_ino)
        return env

    with Queue.open(qpath, dead_retention=HOUR_S) as q2:
        monkeypatch.setattr(objects, "read_envelope", read_then_swap)
        report = recover(q2)
        monkeypatch.undo()
        assert swapped and swapped[0] != original_ino
        assert [c for c, _ in report.errors] == ["dead_delete_failed"], report.errors
        assert "replaced while being verified" in report.errors[0][1]
        assert report.dead_deleted == 0
        assert os.stat(path).st_ino == swapped[0]
        # The next pass verifies the new inode and may delete it.
        later = recover(q2)
        no_errors(later)
        assert later.dead_deleted == 1 and not os.path.exists(path)


# --------------------------------------------------------------------------- budget and cursor


def test_one_op_at_a_time_resumes_through_receipts_then_dead(q: Queue, qpath: str) -> None:
    """The dead sub-walk lives in delete_receipts; its positions sort after the
    receipt walk's, so a budget-limited pass resumes without skipping either."""
    acked = [_ack_one(q, f"acked {i}".encode())[0] for i in range(2)]
    dead = [bury_one(q, f"dead {i}".encode())[0] for i in range(3)]
    age_by(qpath, 30 * DAY, q.format.delayed_width_ns)  # past the default 7-day receipt retention too
    qid = q.format.queue_id
    totals = RecoveryReport()
    passes = 0
    with Queue.open(qpath, dead_retention=HOUR_S) as q2:
        while True:
            passes += 1
            assert passes < 200, "recovery made no progress"
            r = run_recovery(q2._ctx, budget_ops=1, budget_ms=60_000)
            assert r.operations_attempted <= 1
            no_errors(r)
            totals.receipts_deleted += r.receipts_deleted
            totals.dead_deleted += r.dead_deleted
            totals.receipts_compacted += r.receipts_compacted
            validate_cursor(cursor_bytes(qpath), qid)  # never a phase the reference does not know
            if not r.budget_exhausted:
                break
    assert (totals.receipts_deleted, totals.dead_deleted) == (2, 3)
    assert files_under(qpath, "dead") == [] and files_under(qpath, "receipts") == []
    assert os.listdir(os.path.join(qpath, "dead")) == [] and os.listdir(os.path.join(qpath, "receipts")) == []
    state = check_tree(qpath)
    assert not state.all_ids & set(acked + dead)
    assert cursor_bytes(qpath) == reset_cursor_json(qid, "reap_leases")


# --------------------------------------------------------------------------- options and config


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, True, "1d", 2.0**64])
def test_invalid_dead_retention_is_refused_at_open(q: Queue, qpath: str, bad: object) -> None:
    with pytest.raises(InvalidInput):
        Queue.open(qpath, dead_retention=bad)  # type: ignore[arg-type]


def test_open_option_reaches_the_handle(q: Queue, qpath: str) -> None:
    with Queue.open(qpath, dead_retention=1.5) as q2:
        assert q2._ctx.options.dead_retention_ns == 1_500_000_000
    assert q._ctx.options.dead_retention_ns is None


def test_sweeper_key_round_trips_and_the_sweeper_deletes_and_logs(q: Queue, qpath: str) -> None:
    base = f"queue: {qpath}\nsweeper:\n  interval: 1h\n"
    parse = lambda text: parse_config(text, path="t.yaml", name="t")  # noqa: E731
    assert parse(base).sweeper.dead_retention is None
    assert parse(base + "  dead_retention: null\n").sweeper.dead_retention is None
    settings = parse(base + "  dead_retention: 30d\n")
    assert settings.sweeper.dead_retention == 30 * 86400.0

    job, rel = bury_one(q, b"for the sweeper")
    age_by(qpath, 40 * DAY, q.format.delayed_width_ns)
    out = io.StringIO()
    loop = Loop()
    role = SweeperRole(settings, Log("sweeper", "t", journal=False, stream=out))
    try:
        role.start(loop)
        first = role.queue
        assert first is not None and first._ctx.options.dead_retention_ns == 30 * DAY
        loop.run_once(0.5)  # the start pass
        assert role.last_report is not None and role.last_report.dead_deleted == 1, role.last_report
        assert not os.path.exists(os.path.join(qpath, rel))
        log = out.getvalue()
        assert "dead letters deleted 1" in log and "DEAD_DELETED=1" in log, log
        # Same settings: same handle. A changed retention reopens with it.
        role.reload(parse(base + "  dead_retention: 30d\n"))
        assert role.queue is first
        role.reload(parse(base + "  dead_retention: null\n"))
        assert role.queue is not None and role.queue is not first
        assert role.queue._ctx.options.dead_retention_ns is None
    finally:
        role.close()
        loop.close()


def test_recover_api_counts_dead_deleted_as_a_change(q: Queue, qpath: str) -> None:
    bury_one(q, b"counted")
    age_by(qpath, 10 * DAY, q.format.delayed_width_ns)
    with Queue.open(qpath, dead_retention=HOUR_S) as q2:
        report = q2.recover(budget_ops=10_000, budget_ms=60_000)
    no_errors(report)
    assert report.dead_deleted == 1 and report.changed == 1 + report.directories_removed


# --------------------------------------------------------------------------- interruption


# Syscalls with an effect on disk or on held state (failing them after they ran is its own case).
_SIDE_EFFECTS = frozenset(
    {"open", "openat2", "close", "mkdir", "write", "pwrite", "fsync", "rename", "rename_noreplace", "link", "unlink",
     "rmdir", "lock", "fchmod", "tmpfile"}
)  # fmt: skip


def _dead_tree(root: str) -> list[str]:
    """Every path below dead/ (files and directories): what deletion may change."""
    return sorted(p for p, _, _ in tree_snapshot(root, "dead"))


def test_interrupted_dead_deletion_converges_to_the_uninterrupted_outcome(tmp_path: Path) -> None:
    """Safe to interrupt after any syscall: for every syscall of a dead-retention
    pass, failing it (before it runs, and after it ran) and then running clean
    passes ends in exactly the tree of an uninterrupted pass; nothing young
    or unverifiable is ever deleted on the way."""
    base = str(tmp_path / "base")
    with Queue.init(base, shards=SHARDS) as q:
        old = [bury_one(q, f"old {i}".encode()) for i in range(2)]
        corrupt_job, corrupt_rel = bury_one(q, b"corrupt")
        flip_byte(base, corrupt_rel, 5)
        age_by(base, 10 * DAY, q.format.delayed_width_ns)
    with Queue.open(base, dead_retention=HOUR_S) as q:
        young_job, young_rel = bury_one(q, b"young")
    must_stay = [corrupt_rel, young_rel]

    def pass_on(root: str) -> RecoveryReport:
        with Queue.open(root, dead_retention=HOUR_S) as qq:
            return run_recovery(qq._ctx, budget_ops=100_000, budget_ms=3_600_000, phases=("delete_receipts",))

    reference_root = str(tmp_path / "reference")
    shutil.copytree(base, reference_root, symlinks=True)
    with Queue.open(reference_root, dead_retention=HOUR_S) as qq, linux.trace() as events:
        ref = run_recovery(qq._ctx, budget_ops=100_000, budget_ms=3_600_000, phases=("delete_receipts",))
    assert ref.dead_deleted == 2 and [c for c, _ in ref.errors] == ["dead_delete_invalid"]
    reference = _dead_tree(reference_root)
    assert all(rel in reference for rel in must_stay) and not any(rel in reference for _, rel in old)
    n = len(events)
    assert 20 < n < 400, n
    for nth in range(1, n + 1):
        # "It happened but we never learned it" differs from "it failed" only for calls with an effect.
        for after in (False, True) if events[nth - 1].op in _SIDE_EFFECTS else (False,):
            root = str(tmp_path / f"c{nth}{'a' if after else 'b'}")
            shutil.copytree(base, root, symlinks=True)
            with Queue.open(root, dead_retention=HOUR_S) as qq, linux.inject(nth=nth, errno=errno.EIO, after=after):
                run_recovery(qq._ctx, budget_ops=100_000, budget_ms=3_600_000, phases=("delete_receipts",))
            for rel in must_stay:
                assert os.path.exists(os.path.join(root, rel)), (nth, after, rel)
            for _ in range(4):
                if pass_on(root).changed == 0:
                    break
            else:
                pytest.fail(f"fault {nth} (after={after}): recovery does not converge")
            assert _dead_tree(root) == reference, (nth, after, events[nth - 1])
            shutil.rmtree(root)
