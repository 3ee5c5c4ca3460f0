"""What the phases do to one object: validate it, move it, quarantine it,
lock a receipt.

Recovery never poisons the handle and never raises for on-disk problems:
each action here records its failure in the report, as an error code that
names the phase's action and its outcome, and returns so that the pass goes
on with the next entry.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator

from steadqd.constants import QuarantineReason, State
from steadqd.errors import CorruptObject, QueueCorrupt, SteadQError
from steadqd.fs import linux
from steadqd.fs.names import JobName, authenticate, delayed_bucket, lease_bucket, shard_of
from steadqd.fs.quarantine import quarantine, quarantine_special
from steadqd.fs.receipt import ReceiptInfo, verify_receipt
from steadqd.fs.recovery.state import Pass
from steadqd.fs.tree import Collision, Indeterminate, MoveError, MoveFailed, SourceMissing, Witness
from steadqd.fs.verify import Envelope, check_name_matches, check_object_stat, read_envelope


def quarantine_object(p: Pass, dir_fd: int, rel: str, name: str, reason: int) -> None:
    p.op()
    kind = ""
    try:
        st = linux.stat_at(dir_fd, name)
        with p.ctx.tree.operation():  # pins the cached quarantine/ fd
            if stat.S_ISREG(st.st_mode):
                qname: str | None = quarantine(p.ctx, dir_fd, name, reason)
            else:
                kind = f", {linux.file_kind(st.st_mode)}"
                qname = quarantine_special(p.ctx, dir_fd, name, reason, st)
    except (SourceMissing, FileNotFoundError):
        return  # someone else moved it: nothing left to isolate
    except (MoveError, Indeterminate, SteadQError, OSError) as e:
        p.error("quarantine_failed", f"{rel}/{name} (reason 0x{reason:04x}{kind}): {e}")
        return
    if qname is None:
        return  # a special file this process could not move: reported by an earlier pass
    p.report.quarantined += 1
    p.report.quarantined_objects.append((f"{rel}/{name}", int(reason), qname))


def move(p: Pass, kind: str, src_fd: int, src_rel: str, name: str, dst_rel: str, dst_name: str) -> bool:
    """Unwitnessed move into ``dst_rel`` (created durably if missing) with
    its outcome recorded as ``<kind>_<outcome>``."""
    tree = p.ctx.tree
    where = f"{src_rel}/{name} -> {dst_rel}/{dst_name}"
    with tree.operation():  # the cached destination fd stays open until the barriers are done
        try:
            dst_fd = tree.ensure_dir(dst_rel)
        except OSError as e:
            p.error(f"{kind}_not_committed", f"cannot open {dst_rel}: {e.strerror}")
            return False
        return rename(p, kind, where, src_fd, name, dst_fd, dst_name)


def rename(p: Pass, kind: str, where: str, src_fd: int, name: str, dst_fd: int, dst_name: str) -> bool:
    p.op()
    try:
        p.ctx.tree.move_unwitnessed(src_fd, name, dst_fd, dst_name)
        return True
    except Collision:
        p.error(f"{kind}_collision", f"{where}: destination exists")
    except SourceMissing:
        p.error(f"{kind}_source_missing", f"{where}: source is gone")
    except MoveFailed as e:
        p.error(f"{kind}_not_committed", f"{where}: {e}")
    except Indeterminate as e:
        p.error(f"{kind}_outcome_unknown", f"{where}: {e}")
    return False


def validate(
    p: Pass,
    dir_fd: int,
    name: str,
    job: JobName,
    *,
    shard: int,
    bucket: int | None = None,
    path_boot: bytes | None = None,
) -> Envelope:
    """``validate_active_object``: everything but the payload hash.

    Raises CorruptObject/QueueCorrupt for corruption, OSError for I/O
    (FileNotFoundError when the object is simply gone).
    """
    fmt = p.fmt
    st = linux.stat_at(dir_fd, name)
    check_object_stat(st)
    try:
        fd = linux.open_at(dir_fd, name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CorruptObject("is a symlink", QuarantineReason.NON_REGULAR_FILE) from e
        raise
    try:
        fst = linux.fstat(fd)
        if not Witness.of(st).matches(fst):
            raise OSError(errno.EAGAIN, "replaced while being validated")
        env = read_envelope(fd, fmt.max_payload_length, fst)
    finally:
        linux.close(fd)
    if not authenticate(fmt.queue_id, job, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns):
        raise CorruptObject("name tag does not authenticate", QuarantineReason.FILENAME_TAG_FAILED)
    if job.state is State.LEASED and bucket is not None:
        assert job.boottime_deadline is not None
        if lease_bucket(job.boottime_deadline, fmt.lease_width_ns) != bucket:
            raise CorruptObject("legacy lease is in the wrong bucket directory", QuarantineReason.FILENAME_TAG_FAILED)
        if job.boot_id != path_boot:
            raise CorruptObject("legacy lease is in another boot's directory", QuarantineReason.FILENAME_TAG_FAILED)
    if job.state is State.DELAYED:
        assert job.not_before is not None
        if delayed_bucket(job.not_before, fmt.delayed_width_ns) != bucket:
            raise CorruptObject("delayed job is in the wrong bucket directory", QuarantineReason.FILENAME_TAG_FAILED)
    check_name_matches(env.header, job)
    if shard_of(fmt.queue_id, job.job_id, fmt.shard_count) != shard:
        raise CorruptObject("is in the wrong shard directory", QuarantineReason.FILENAME_TAG_FAILED)
    return env


def valid(
    p: Pass,
    dir_fd: int,
    rel: str,
    name: str,
    job: JobName,
    code: str,
    *,
    shard: int,
    bucket: int | None = None,
    path_boot: bytes | None = None,
) -> bool:
    """True if the object passes ``validate``; a corrupt one is quarantined
    (0x0001), an I/O failure recorded as ``code``, a vanished one ignored."""
    try:
        validate(p, dir_fd, name, job, shard=shard, bucket=bucket, path_boot=path_boot)
    except FileNotFoundError:
        return False
    except (CorruptObject, QueueCorrupt):
        quarantine_object(p, dir_fd, rel, name, QuarantineReason.ENVELOPE_CORRUPT)
        return False
    except (OSError, SteadQError) as e:
        p.error(code, f"{rel}/{name}: {e}")
        return False
    return True


@contextlib.contextmanager
def locked_receipt(p: Pass, dir_fd: int, rel: str, name: str, code: str) -> Iterator[int | None]:
    """The receipt opened O_RDWR with an exclusive OFD lock; None when it
    is gone or busy (another maintainer has it: skip silently)."""
    try:
        fd = linux.open_at(dir_fd, name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno != errno.ENOENT:
            p.error(code, f"cannot open {rel}/{name}: {e.strerror}")
        yield None
        return
    try:
        try:
            locked = linux.ofd_lock(fd, exclusive=True)
        except OSError as e:
            p.error(code, f"cannot lock {rel}/{name}: {e.strerror}")
            locked = False
        yield fd if locked else None
    finally:
        with contextlib.suppress(OSError):
            linux.close(fd)


def verified_receipt(
    p: Pass, fd: int, rel: str, name: str, bucket: int, shard: int, code: str, note: str = ""
) -> ReceiptInfo | None:
    """The receipt open on ``fd`` (from :func:`locked_receipt`), verified for its directory; None when
    it does not verify (reported as ``<code>_invalid``, ``note`` after the reason) or cannot be read
    (``<code>_failed``)."""
    try:
        return verify_receipt(p.fmt, fd, name, bucket, shard)
    except SteadQError as e:
        p.error(f"{code}_invalid", f"{rel}/{name}: {e}{note}")
    except OSError as e:
        p.error(f"{code}_failed", f"{rel}/{name}: {e.strerror}")
    return None


def write_temp(
    p: Pass,
    dir_fd: int,
    dir_rel: str,
    temp_name: Callable[[bytes], str],
    data: bytes,
    report: tuple[str, str],
    *,
    unlink_failed_create: bool = False,
) -> str | None:
    """``data`` in a new file, durable under a fresh temp name (``temp_name`` of 16 random bytes) in
    ``dir_fd`` (``dir_rel``), for the caller to rename over its target; returns the temp name.

    None on failure, reported as ``report`` = (error code, what was being done), the temp unlinked
    once it exists. ``unlink_failed_create``: a create that failed may still have made the file, so
    unlink the name (unless it was taken before: EEXIST) — for a directory nothing sweeps.
    """
    code, what = report
    try:
        tmp = temp_name(p.ctx.random(16))
    except OSError as e:
        p.error(code, f"{what}: getrandom: {e.strerror}")
        return None
    try:
        fd = linux.open_at(dir_fd, tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, p.ctx.modes.file)
    except OSError as e:
        p.error(code, f"cannot create {dir_rel}/{tmp}: {e.strerror}")
        if unlink_failed_create and e.errno != errno.EEXIST:
            with contextlib.suppress(OSError):
                linux.unlink_at(dir_fd, tmp)
        return None
    try:
        try:
            p.ctx.new_file_mode(fd)
            linux.write_all(fd, data)
            linux.fsync(fd)
        finally:
            linux.close(fd)
    except OSError as e:
        p.error(code, f"{what}: {e.strerror}")
        with contextlib.suppress(OSError):
            linux.unlink_at(dir_fd, tmp)
        return None
    return tmp
