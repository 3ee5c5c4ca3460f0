"""``steadq doctor``: can this machine and this filesystem hold a SteadQ/1 queue?

Spec: cli.md ``doctor``. Each check is one probe of what the protocol relies
on: a boot id (leases are per boot), the two clocks, ``getrandom``, and, for a
queue that exists, the filesystem type and the three operations publication
and every transition need (``O_TMPFILE`` + ``linkat``, no-replace rename,
directory fsync), tried for real in the queue's ``tmp/``. Probes never leave
files behind, and a failing probe is a failed check, never an exception: the
point of doctor is to say what is wrong.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from typing import NamedTuple

from steadqd.constants import DELAYED_DIR, READY_DIR, SUPPORTED_FILESYSTEMS, TMP_DIR
from steadqd.fs import linux
from steadqd.fs.boot_id import read_boot_id
from steadqd.fs.layout import filesystem_name
from steadqd.fs.owner import command_name, groups_of, owner_and_mode, readable_by, user_name

__all__ = ["Check", "doctor_checks"]


class Check(NamedTuple):
    """One line of the report. ``value`` is what was found, or the error that made the probe fail;
    the caller words errors (the CLI words every error the same way)."""

    name: str
    ok: bool
    value: str | BaseException


def doctor_checks(path: str) -> list[Check]:
    """cli.md's doctor checks, in its order; the filesystem ones only where the queue (its ``tmp/``) exists."""
    checks: list[Check] = []

    def check(name: str, probe: Callable[[], str]) -> None:
        try:
            checks.append(Check(name, True, probe()))
        except Exception as e:  # noqa: BLE001 - a failed probe is a failed check
            checks.append(Check(name, False, e))

    check("boot_id", read_boot_id)
    check("clock_boottime", lambda: f"{linux.boottime_ns()} ns")
    check("clock_realtime", lambda: f"{linux.realtime_ns()} ns")
    check("getrandom", lambda: "OK" if len(linux.getrandom(16)) == 16 else "short read")
    if not os.path.exists(path):
        return checks
    try:
        magic = linux.statfs_type(path)
        checks.append(
            Check("filesystem", magic in SUPPORTED_FILESYSTEMS, f"{filesystem_name(magic)} (magic 0x{magic:x})")
        )
    except OSError as e:
        checks.append(Check("filesystem", False, e))
    if os.path.isdir(os.path.join(path, READY_DIR)):
        checks.append(_job_access(path))
    tmp = os.path.join(path, TMP_DIR)
    if not os.path.isdir(tmp):
        return checks
    try:
        dfd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        checks.extend(Check(name, False, e) for name in ("publication_mode", "rename_noreplace", "dir_fsync"))
        return checks
    try:
        check("publication_mode", lambda: _probe_publication(dfd))
        try:
            supported = _probe_rename_noreplace(dfd)
            checks.append(Check("rename_noreplace", supported, "supported" if supported else "unsupported"))
        except OSError as e:
            checks.append(Check("rename_noreplace", False, e))
        try:
            os.fsync(dfd)
            checks.append(Check("dir_fsync", True, "supported"))
        except OSError:
            checks.append(Check("dir_fsync", False, "unsupported"))
    finally:
        os.close(dfd)
    return checks


def _job_access(path: str) -> Check:
    """Can the queue's owner (the daemon's user) read every ready and delayed job?

    A job it cannot read is one the worker can never lease: a producer
    outside the queue's group, or root before it gave its jobs to the owner,
    left it. Names are listed and stat'ed only (never opened or followed)."""
    try:
        root = os.stat(path)
    except OSError as e:
        return Check("job_access", False, e)
    gids = groups_of(root.st_uid, root.st_gid)
    owner = user_name(root.st_uid)
    count, bad = 0, []
    for rel in _job_dirs(path):
        try:
            names = os.listdir(os.path.join(path, rel))
        except OSError:
            continue  # not a directory, or gone: fsck's business
        for name in names:
            try:
                st = os.lstat(os.path.join(path, rel, name))
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            count += 1
            if not readable_by(st, root.st_uid, gids):
                bad.append((f"{rel}/{name}", st))
    if not bad:
        return Check("job_access", True, f"{count} ready and delayed jobs, all readable by {owner}")
    first, st = bad[0]
    return Check(
        "job_access",
        False,
        f"{len(bad)} of {count} ready and delayed jobs cannot be read by {owner} (the queue's owner), "
        f"e.g. {first} ({owner_and_mode(st)}); run: chown -R {command_name(root.st_uid)}: {path}, "
        f"and let producers run as {owner} or use a queue made with init --shared",
    )


def _job_dirs(path: str) -> list[str]:
    """``ready/<shard>`` and ``delayed/<bucket>/<shard>`` relative to the queue root."""
    rels: list[str] = []
    for top, depth in ((READY_DIR, 1), (DELAYED_DIR, 2)):
        level = [top]
        for _ in range(depth):
            nxt: list[str] = []
            for rel in level:
                try:
                    nxt.extend(f"{rel}/{n}" for n in sorted(os.listdir(os.path.join(path, rel))))
                except OSError:
                    continue
            level = nxt
        rels.extend(level)
    return rels


def _probe_publication(dfd: int) -> str:
    """How enqueue will publish here: linking an O_TMPFILE (two ways) or a named temp and a rename."""
    try:
        fd = linux.open_tmpfile(dfd)
    except OSError:
        return "named-fallback"
    name = f".pubprobe-{os.urandom(16).hex()}"
    try:
        form = linux.link_tmpfile(fd, dfd, name)
    except (linux.TmpfileLinkUnsupported, OSError):
        return "named-fallback"
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dfd)
    return "direct-at-empty-path" if form == "direct" else "proc-self-fd"


def _probe_rename_noreplace(dfd: int) -> bool:
    """Supported iff the no-replace rename onto an existing file fails with EEXIST."""
    rand = os.urandom(16).hex()
    n1, n2 = f".rnprobe1-{rand}", f".rnprobe2-{rand}"
    for n in (n1, n2):
        os.close(os.open(n, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=dfd))
    try:
        linux.rename_noreplace(dfd, n1, dfd, n2)
        return False
    except OSError as e:
        return e.errno == errno.EEXIST
    finally:
        for n in (n1, n2):
            with contextlib.suppress(OSError):
                os.unlink(n, dir_fd=dfd)
