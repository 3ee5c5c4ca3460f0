"""Phase 1, reap leases (recovery.md): expired leases go back to ``ready/``,
or to ``dead/`` once their attempts are used up.

Two trees hold leases: the legacy ``leased/<BOOT>/<B>/<S>/`` (1a) and the
current layout's colocated leases in ``ready/<S>/`` (1b). Position keys are
``(b"a", boot, bucket, shard, entry)`` for the legacy tree and
``(b"b", shard, entry)`` for colocated leases, so 1a sorts before 1b.

Colocated leases that fail authentication or structural validation are
quarantined (0x0004 for a tag/shard-placement failure, 0x0001 otherwise)
instead of being skipped forever as the reference does (open-questions B12);
legacy leases are quarantined exactly as specified.
"""

from __future__ import annotations

import contextlib

from steadqd.constants import LEASED_DIR, READY_DIR, DeadReason, QuarantineReason, State
from steadqd.errors import SteadQError
from steadqd.fs import linux
from steadqd.fs.names import (
    JobName,
    authenticate,
    dead_name,
    format_name,
    leased_name,
    make_filename,
    next_generation,
    parse_bucket_dir,
    ready_name,
    shard_dir,
    shard_of,
    state_dir,
    terminal_bucket,
)
from steadqd.fs.recovery.objects import move, quarantine_object, rename, valid
from steadqd.fs.recovery.state import Key, Pass
from steadqd.fs.recovery.walk import NOT_BOOT, NOT_BUCKET, Level, entries, leaf_job, parse_boot, shard_level, walk

# Leased names have one fixed length (names.md); measured on one rather than restated.
_LEASED_NAME_LENGTH = len(
    format_name(
        leased_name(bytes(16), 0, 0, 1, boot_id=bytes(16), boottime_deadline=0, wall_deadline=0, lease_token=bytes(16)),
        bytes(8),
    ).encode("ascii")
)


def reap_leases(p: Pass) -> None:
    _reap_legacy(p)
    _reap_colocated(p)


def _reap_legacy(p: Pass) -> None:
    me = p.ctx.boot_raw
    now_bucket = p.bt_now // p.fmt.lease_width_ns
    levels = (
        Level(parse_boot, NOT_BOOT),
        # A current-boot bucket after now holds only running leases.
        Level(parse_bucket_dir, NOT_BUCKET, lambda v: not (v[0] == me and v[1] > now_bucket)),
        shard_level(p),
    )
    for (boot, bucket, shard), fd, rel, raw in walk(p, LEASED_DIR, levels, (b"a",)):
        _legacy_entry(p, fd, rel, raw, boot, boot == me, bucket, shard)


def _legacy_entry(
    p: Pass, dir_fd: int, rel: str, raw: bytes, boot: bytes, current: bool, bucket: int, shard: int
) -> None:
    leaf = leaf_job(p, raw, rel, State.LEASED)
    if leaf is None:
        return
    name, job = leaf
    if job is None:
        quarantine_object(p, dir_fd, rel, name, QuarantineReason.FILENAME_PARSE_FAILED)
        return
    assert job.boottime_deadline is not None
    if current and job.boottime_deadline > p.bt_now:
        return
    if valid(p, dir_fd, rel, name, job, "reap_validate", shard=shard, bucket=bucket, path_boot=boot):
        _reap(p, dir_fd, rel, name, job, shard, same_dir=False)


def _reap_colocated(p: Pass) -> None:
    for shard in range(p.fmt.shard_count):
        sname = shard_dir(shard)
        skey: Key = (b"b", sname.encode("ascii"))
        if p.done_before(skey):
            continue
        p.check_budget()
        rel = f"{READY_DIR}/{sname}"
        try:
            # Uncached: a pass may visit thousands of shards.
            dir_fd = p.ctx.tree.open_transient(rel)
        except OSError as e:
            p.error("directory", f"cannot open {rel}: {e.strerror}")
            continue
        try:
            _colocated_shard(p, dir_fd, rel, skey, shard)
        finally:
            with contextlib.suppress(OSError):
                linux.close(dir_fd)


def _colocated_shard(p: Pass, dir_fd: int, rel: str, skey: Key, shard: int) -> None:
    fmt = p.fmt
    # Every pass scans these shards first, and most of their entries are
    # ready jobs: only names of a lease's length cost a budget check or a parse.
    for raw in entries(p, dir_fd, rel, skey, keep=lambda raw: len(raw) == _LEASED_NAME_LENGTH):
        leaf = leaf_job(p, raw, rel, State.LEASED)
        if leaf is None:
            continue
        name, job = leaf
        if job is None:
            continue  # fsck's business
        if not authenticate(fmt.queue_id, job, shard=shard, lease_width_ns=fmt.lease_width_ns) or (
            shard_of(fmt.queue_id, job.job_id, fmt.shard_count) != shard
        ):
            # No holder can own a name that does not authenticate here.
            quarantine_object(p, dir_fd, rel, name, QuarantineReason.FILENAME_TAG_FAILED)
            continue
        assert job.boottime_deadline is not None
        if job.boot_id == p.ctx.boot_raw and job.boottime_deadline > p.bt_now:
            continue  # a running lease
        if valid(p, dir_fd, rel, name, job, "reap_validate", shard=shard):
            _reap(p, dir_fd, rel, name, job, shard, same_dir=True)


def _reap(p: Pass, src_fd: int, src_rel: str, name: str, job: JobName, shard: int, *, same_dir: bool) -> None:
    """An expired lease goes back to ready/<S> (same attempt), or to dead
    with reason 0x0004 when its attempts are used up."""
    try:
        generation = next_generation(job.generation)
    except SteadQError as e:
        p.error("reap_state_exhausted", f"{src_rel}/{name}: {e}")
        return
    if job.attempt >= job.max_attempts:
        _reap_to_dead(p, src_fd, src_rel, name, job, generation, shard)
        return
    fmt = p.fmt
    target = ready_name(job.job_id, generation, job.attempt, job.max_attempts)
    target_file = make_filename(fmt.queue_id, target, shard=shard, lease_width_ns=fmt.lease_width_ns)
    if same_dir:
        # Colocated lease: rename within ready/<S> (the directory is fsynced twice).
        where = f"{src_rel}/{name} -> {target_file}"
        if rename(p, "reap_to_ready", where, src_fd, name, src_fd, target_file):
            p.report.leases_reaped += 1
            p.report.reaped_jobs.append(job.job_id.hex())
        return
    dst_rel = state_dir(State.READY, shard)
    if move(p, "reap_to_ready", src_fd, src_rel, name, dst_rel, target_file):
        p.report.leases_reaped += 1
        p.report.reaped_jobs.append(job.job_id.hex())


def _reap_to_dead(p: Pass, src_fd: int, src_rel: str, name: str, job: JobName, generation: int, shard: int) -> None:
    if p.wall is None:
        p.error("reap_to_dead_no_wall_floor", f"{src_rel}/{name}: exhausted lease left in place")
        return
    fmt = p.fmt
    tb = terminal_bucket(p.wall, fmt.terminal_width_ns)
    target = dead_name(job.job_id, generation, job.attempt, job.max_attempts, reason=DeadReason.ATTEMPTS_EXHAUSTED)
    target_file = make_filename(fmt.queue_id, target, shard=shard, bucket=tb, lease_width_ns=fmt.lease_width_ns)
    dst_rel = state_dir(State.DEAD, shard, tb)
    if move(p, "reap_to_dead", src_fd, src_rel, name, dst_rel, target_file):
        p.report.leases_to_dead += 1
        p.report.reaped_jobs.append(job.job_id.hex())
