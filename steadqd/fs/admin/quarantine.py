"""Operator tools for ``quarantine/`` (corrupt objects): list, inspect, export and remove (protocol.md
"Administrative operations", cli.md ``admin quarantine …``).

Exports never follow a symlink: quarantine can hold symlinks wearing job
names (claim isolates them), and copying through one would read an arbitrary
file; a planted directory is removed only when empty. Listing reports only
names that parse for the directory they are in.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator

from steadqd.constants import HEADER_SIZE, QUARANTINE_DIR
from steadqd.errors import (
    InvalidInput,
    SteadQError,
)
from steadqd.fs import linux
from steadqd.fs.admin.files import (
    close_quietly,
    fstat_object,
    mutation,
    not_found,
    open_dir,
    open_object,
    raw_chunks,
    stat_entries,
    unlink_durably,
    write_atomically,
)
from steadqd.fs.context import Context
from steadqd.fs.names import (
    parse_job_id,
    parse_quarantine_name,
)
from steadqd.fs.records import JobHeader
from steadqd.view_records import QuarantinedObject, quarantined_by_id

__all__ = [
    "QuarantinedObject",
    "export_quarantine",
    "find_quarantined",
    "inspect_quarantine",
    "list_quarantine",
    "remove_quarantine",
]

_MAX_QUARANTINE_DEPTH = 16  # nested layouts are tolerated, not unbounded recursion


def list_quarantine(ctx: Context) -> Iterator[QuarantinedObject]:
    """Every ``q<id>.x<reason>.raw`` under ``quarantine/``, nested directories included.

    Entries are visited in bytewise order; directories are descended without
    following symlinks, except one that bears a quarantine name: that is a
    planted directory claim isolated whole, and what is inside it is its
    content, not more quarantined objects. Other names are skipped.
    """
    yield from _walk_quarantine(ctx, QUARANTINE_DIR, 0)


def _walk_quarantine(ctx: Context, rel: str, depth: int) -> Iterator[QuarantinedObject]:
    dir_fd = open_dir(ctx.root_fd, rel)
    if dir_fd is None:
        return
    found: list[QuarantinedObject] = []
    subdirs: list[str] = []
    try:
        for raw, st in stat_entries(dir_fd, rel, bytes.isascii):
            text = raw.decode("ascii")
            parsed = parse_quarantine_name(text)
            if parsed is not None:  # a quarantined directory (reason 0x0008) is one object, never walked
                found.append(QuarantinedObject(parsed[0].hex(), parsed[1], f"{rel}/{text}", st.st_size, st.st_mtime_ns))
            elif stat.S_ISDIR(st.st_mode) and depth < _MAX_QUARANTINE_DEPTH:
                subdirs.append(text)
    finally:
        close_quietly(dir_fd)
    # Sorted listing interleaves files and directories bytewise; keep that order.
    by_name = {o.path.rsplit("/", 1)[1]: o for o in found}
    for name in sorted(list(by_name) + subdirs):
        if name in by_name:
            yield by_name[name]
        else:
            yield from _walk_quarantine(ctx, f"{rel}/{name}", depth + 1)


def find_quarantined(ctx: Context, job_id: str) -> QuarantinedObject | None:
    """The first quarantined regular file whose header names ``job_id``, or None.

    Quarantine names carry no job id (the object may be too damaged to have
    one), so each file's header is read: this costs one small read per
    quarantined object, which is why only ``steadq show`` asks, and only for
    a job found nowhere else.
    """
    want = parse_job_id(job_id)
    for obj in list_quarantine(ctx):
        try:
            fd = open_object(ctx, obj.path)
        except SteadQError:
            continue  # a symlink, removed meanwhile, unreadable: it names no job we can tell
        try:
            if not stat.S_ISREG(linux.fstat(fd).st_mode):
                continue
            header = JobHeader.decode(linux.pread(fd, HEADER_SIZE, 0))
        except (SteadQError, OSError):
            continue
        finally:
            close_quietly(fd)
        if header.job_id == want:
            return obj
    return None


def _parse_quarantine_id(quarantine_id: str) -> str:
    if (
        not isinstance(quarantine_id, str)
        or len(quarantine_id) != 32
        or any(c not in "0123456789abcdef" for c in quarantine_id)
    ):
        raise InvalidInput("invalid quarantine_id")
    return quarantine_id


def inspect_quarantine(ctx: Context, quarantine_id: str) -> QuarantinedObject:
    """The quarantined object with this id (32 lowercase hex); NOT_FOUND if none."""
    qid = _parse_quarantine_id(quarantine_id)
    return quarantined_by_id(list_quarantine(ctx), qid, lambda: not_found(f"no quarantined object {qid}"))


def export_quarantine(ctx: Context, quarantine_id: str, out_path: str) -> int:
    """Copy a quarantined object's raw bytes to ``out_path`` (atomically, durably).

    Refuses anything but a regular file: a quarantined symlink is never
    followed and a FIFO is never read.
    """
    obj = inspect_quarantine(ctx, quarantine_id)
    fd = open_object(ctx, obj.path)
    try:
        st = fstat_object(fd, obj.path)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"{obj.path} is not a regular file; inspect it in place")
        return write_atomically(out_path, raw_chunks(fd), obj.path)
    finally:
        close_quietly(fd)


def remove_quarantine(ctx: Context, quarantine_id: str) -> None:
    """Unlink a quarantined object and fsync its directory (the reference skips the fsync)."""
    with mutation(ctx, f"remove quarantined object {quarantine_id}"):
        ctx.check_usable()
        obj = inspect_quarantine(ctx, quarantine_id)
        unlink_durably(ctx, obj.path, f"remove quarantined object {quarantine_id}", directory_ok=True)
