"""``--fs ext4|xfs|btrfs``: measure on a fresh journaled filesystem built on a loop device.

Why: the host disk of the benchmark machine may not be what users run. Ours is
ext4 *without a journal*, where every inode allocation scans the inodes freed
in the last minutes (``recently_deleted()``), so creating one file costs
hundreds of µs of system CPU when other tenants delete many files. steadqd's
users run ext4 with a journal, XFS or btrfs. A loop device whose sparse image
lives on the disk being measured keeps the disk (its fsync latency) and swaps
only the filesystem.

The setup is undone in ``finally`` blocks nested in setup order (unmount with
retries, ``losetup -d``, delete image and mount point), so an exception,
Ctrl-C or SIGTERM (``common.signals_unwind``) at any step undoes exactly what
was done: the machine is shared and a leaked loop device or mount outlives the
run. Teardown itself ignores further signals.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .common import log

FS_CHOICES = ("host", "ext4", "xfs", "btrfs")
GIB = 1 << 30
IMAGE_GIB = 8  # sparse: costs only the blocks written; the full profile peaks near 1 GiB
IMAGE_GIB_FULL_SCALE = 16  # 1,000,000 small files: ~4 GiB of blocks plus metadata
# Default mkfs options (ext4 keeps its journal). Two ext4 exceptions:
# - lazy_itable_init=0: mke2fs zeroes the inode tables itself (fast, with BLKZEROOUT on a
#   loop device) instead of leaving it to ext4lazyinit, which otherwise writes ~128 MiB in
#   the background during the first seconds of the run. Same on-disk result.
# - --full-scale raises the inode count: the default (one per 16 KiB) is too few.
MKFS: dict[str, list[str]] = {
    "ext4": ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0"],
    "xfs": ["mkfs.xfs", "-q", "-f"],
    "btrfs": ["mkfs.btrfs", "-q", "-f"],
}
EXT4_FULL_SCALE_EXTRA = ["-i", "4096"]
# Loop direct I/O: the image's pages are not cached a second time in the host page
# cache, and writes reach the disk without a second writeback pass. The choice and the
# measurement behind it are in README.md.
DEFAULT_DIRECT_IO = "on"
_TIMEOUT = 120  # seconds for any one helper command: a hung mkfs must not hang the run


class LoopDiskError(RuntimeError):
    """The loop filesystem cannot be set up here (not root, tool missing, kernel refuses)."""


@dataclass
class LoopSetup:
    """What was built, recorded in results.json so a reader can rebuild it."""

    fs: str
    image: str
    size_bytes: int
    mkfs: list[str]
    direct_io_requested: str
    device: str = ""
    mountpoint: str = ""
    mount_options: str = "defaults"

    def to_json(self) -> dict[str, Any]:
        return {
            "fs": self.fs,
            "image": self.image,
            "image_size_bytes": self.size_bytes,
            "mkfs": " ".join(self.mkfs),
            "losetup": f"losetup --find --show --direct-io={self.direct_io_requested}",
            "device": self.device,
            "mountpoint": self.mountpoint,
            "mount_options": self.mount_options,
        }


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT, check=False)


def image_size(full_scale: bool) -> int:
    return (IMAGE_GIB_FULL_SCALE if full_scale else IMAGE_GIB) * GIB


def mkfs_command(fs: str, full_scale: bool) -> list[str]:
    return [*MKFS[fs], *(EXT4_FULL_SCALE_EXTRA if fs == "ext4" and full_scale else [])]


def check_can_build(fs: str) -> None:
    """Raise LoopDiskError with the reason if this machine cannot build ``fs`` on a loop device."""
    if fs not in MKFS:
        raise LoopDiskError(f"unknown filesystem {fs!r}; choose one of {', '.join(FS_CHOICES)}")
    if os.geteuid() != 0:
        raise LoopDiskError(
            f"--fs {fs} needs root (losetup, mkfs, mount); euid is {os.geteuid()}. "
            "Run as root, or use --fs host to measure the scratch directory's own filesystem."
        )
    for tool in (MKFS[fs][0], "losetup", "mount", "umount"):
        if shutil.which(tool) is None:
            raise LoopDiskError(f"--fs {fs} needs {tool}, which is not installed")
    if not os.path.exists("/dev/loop-control"):
        raise LoopDiskError("loop devices are unavailable here (/dev/loop-control is missing)")


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path`` (from /proc/self/mountinfo, octal escapes decoded).

    The caller deletes its scratch tree only when this is empty: ``shutil.rmtree`` crosses
    mount points, so a mount that failed to go away must keep its parent alive.
    """
    path = os.path.realpath(path).rstrip("/") + "/"
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if (mnt.rstrip("/") + "/").startswith(path):
                out.append(mnt)
    return out


def _umount(mountpoint: str) -> bool:
    """Unmount, retrying while busy (a just-exited child may still hold a file), lazily last.

    Returns True if nothing is mounted there any more.
    """
    for _ in range(50):
        if _run(["umount", mountpoint]).returncode == 0 or not os.path.ismount(mountpoint):
            return True
        time.sleep(0.2)
    log(f"umount {mountpoint} still busy after 10 s; detaching lazily")
    _run(["umount", "-l", mountpoint])
    return not os.path.ismount(mountpoint)


def _attached(image: str) -> list[str]:
    """Loop devices whose backing file is ``image`` (``losetup -j``)."""
    r = _run(["losetup", "--noheadings", "--output", "NAME", "--associated", image])
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def _detach(device: str) -> None:
    """``losetup -d``, retried: the kernel may hold the device for a moment after umount."""
    for _ in range(20):
        r = _run(["losetup", "-d", device])
        if r.returncode == 0:
            return
        time.sleep(0.2)
    log(f"losetup -d {device} failed: {r.stderr.strip()} (the device auto-clears when its last user goes)")


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """Hold off SIGINT/SIGTERM while tearing down: a second Ctrl-C must not leak the device."""
    try:
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def loop_filesystem(
    fs: str,
    base: str,
    *,
    full_scale: bool = False,
    direct_io: str = DEFAULT_DIRECT_IO,
    image_dir: str | None = None,
) -> Iterator[tuple[str, LoopSetup]]:
    """Yield ``(scratch dir, setup)`` on a fresh ``fs`` whose sparse image lives in ``base``.

    ``base`` must be on the disk to measure: the image's blocks, and so every fsync of the
    loop filesystem, land there. ``image_dir`` puts the image elsewhere (``/dev/shm``: the
    same journaled filesystem with fsyncs that cost little, so CPU decides) while the mount
    point stays in ``base``.
    """
    check_can_build(fs)
    setup = LoopSetup(
        fs=fs,
        image=os.path.join(image_dir or base, f"steadqd-bench-{fs}.img"),
        size_bytes=image_size(full_scale),
        mkfs=mkfs_command(fs, full_scale),
        direct_io_requested=direct_io,
    )
    try:
        fd = os.open(setup.image, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as e:
        raise LoopDiskError(f"{setup.image} exists (left by an interrupted run?); remove it or use --dir") from e
    try:
        os.ftruncate(fd, setup.size_bytes)  # sparse
        os.close(fd)
        fd = -1
        try:
            attach = _run(["losetup", "--find", "--show", f"--direct-io={direct_io}", setup.image])
            if attach.returncode != 0 or not attach.stdout.strip():
                raise LoopDiskError(f"losetup --find --show failed: {attach.stderr.strip()}")
            setup.device = attach.stdout.strip()
            made = _run([*setup.mkfs, setup.device])
            if made.returncode != 0:
                raise LoopDiskError(f"{' '.join(setup.mkfs)} {setup.device} failed: {made.stderr.strip()}")
            setup.mountpoint = os.path.join(base, f"mnt-{fs}")
            try:
                os.mkdir(setup.mountpoint)
            except FileExistsError as e:
                raise LoopDiskError(f"{setup.mountpoint} exists (left by an interrupted run?)") from e
            try:
                try:
                    mounted = _run(["mount", "-t", fs, setup.device, setup.mountpoint])
                    if mounted.returncode != 0:
                        raise LoopDiskError(f"mount -t {fs} {setup.device} failed: {mounted.stderr.strip()}")
                    scratch = os.path.join(setup.mountpoint, "bench")
                    os.mkdir(scratch)
                    log(f"{fs} on {setup.device} (image {setup.image}, direct-io={direct_io}) at {scratch}")
                    yield scratch, setup
                finally:
                    with _no_interrupts():
                        _umount(setup.mountpoint)
            finally:
                with _no_interrupts(), contextlib.suppress(OSError):
                    os.rmdir(setup.mountpoint)
        finally:
            # By image, not by the device we were told: an interrupt between the
            # kernel attaching and losetup printing the name must not leak it.
            with _no_interrupts():
                for device in _attached(setup.image):
                    _detach(device)
    finally:
        with _no_interrupts():
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(setup.image)
