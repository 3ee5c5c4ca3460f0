"""Real filesystems for tests: loop-device ext4/xfs/btrfs, and overlayfs mounts.

Why: SteadQ/1's guarantees depend on the filesystem (statfs magic detection,
O_TMPFILE + linkat publication, renameat2(RENAME_NOREPLACE)), and /tmp here is
ext4 only. These helpers build a small sparse image, attach it to a loop
device, format and mount it, and *always* tear everything down again (unmount,
detach, delete) in ``finally`` -- also on test failure or KeyboardInterrupt --
because several engineers share this machine and a leaked loop device or
mount outlives the test run.

Environments that cannot do this (not root, no mkfs tool, no loop devices,
kernel without the filesystem) make the test *skip* with the reason instead of
failing: that is a property of the machine, not of steadqd.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

# mkfs command line and the smallest image (MB) each tool accepts.
_MKFS: dict[str, tuple[list[str], int]] = {
    "ext4": (["mkfs.ext4", "-q", "-F"], 16),
    "xfs": (["mkfs.xfs", "-q", "-f"], 300),
    "btrfs": (["mkfs.btrfs", "-q", "-f"], 114),
}
DEFAULT_SIZE_MB: dict[str, int] = {"ext4": 32, "xfs": 300, "btrfs": 128}
# statfs f_type of each filesystem, as steadqd.constants.SUPPORTED_FILESYSTEMS spells it.
FS_MAGIC: dict[str, int] = {"ext4": 0xEF53, "xfs": 0x58465342, "btrfs": 0x9123683E}

_TIMEOUT = 60  # seconds for any one helper command; a hung mkfs must not hang the suite


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT, check=False)


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"{what} needs root (euid {os.geteuid()})")


def _kernel_has(fstype: str) -> bool:
    """True if /proc/filesystems lists it; a module may still autoload, so only a hint."""
    try:
        with open("/proc/filesystems") as f:
            return any(line.split()[-1] == fstype for line in f if line.strip())
    except OSError:
        return True


def _umount(mountpoint: str) -> None:
    """Unmount, retrying briefly if busy (a just-closed fd), lazily as the last resort."""
    for _ in range(20):
        if _run(["umount", mountpoint]).returncode == 0:
            return
        if not os.path.ismount(mountpoint):
            return
        time.sleep(0.1)
    _run(["umount", "-l", mountpoint])


@contextlib.contextmanager
def _mounted(fstype: str, device: str, prefix: str, *options: str, skip_unsupported: bool = False) -> Iterator[str]:
    """``device`` mounted on a new directory under /tmp named ``prefix``...; unmounted and removed on the way out.

    A failed mount raises, or with ``skip_unsupported`` skips the test where the kernel has no ``fstype``.
    """
    mountpoint = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        mounted = _run(["mount", "-t", fstype, *options, device, mountpoint])
        if mounted.returncode != 0:
            if skip_unsupported and not _kernel_has(fstype):
                pytest.skip(f"kernel cannot mount {fstype}: {mounted.stderr.strip()}")
            raise RuntimeError(f"mount -t {fstype} {device} failed: {mounted.stderr.strip()}")
        try:
            yield mountpoint
        finally:
            _umount(mountpoint)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(mountpoint)


@contextlib.contextmanager
def loop_filesystem(fstype: str, size_mb: int | None = None) -> Iterator[str]:
    """Yield the mount point of a fresh ``fstype`` filesystem on a loop device.

    The image is a sparse file under /tmp, so even the 300 MB xfs minimum
    costs only the blocks mkfs and the test write. Teardown (unmount,
    ``losetup -d``, delete image and mount point) runs in ``finally`` blocks
    nested in setup order, so an interruption at any step undoes exactly
    what was done.
    """
    if fstype not in _MKFS:
        raise ValueError(f"unsupported test filesystem {fstype!r}; choose one of {sorted(_MKFS)}")
    mkfs, minimum = _MKFS[fstype]
    size = DEFAULT_SIZE_MB[fstype] if size_mb is None else size_mb
    if size < minimum:
        raise ValueError(f"{fstype} needs at least {minimum} MB, asked for {size}")
    _require_root(f"a loop-device {fstype} filesystem")
    for tool in (mkfs[0], "losetup", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    if not os.path.exists("/dev/loop-control"):
        pytest.skip("loop devices are unavailable (/dev/loop-control missing)")

    fd, image = tempfile.mkstemp(prefix=f"steadq-{fstype}-", suffix=".img", dir="/tmp")
    try:
        os.ftruncate(fd, size * 1024 * 1024)  # sparse
        os.close(fd)
        fd = -1
        attach = _run(["losetup", "--find", "--show", image])
        if attach.returncode != 0 or not attach.stdout.strip():
            pytest.skip(f"loop devices are unavailable: losetup: {attach.stderr.strip()}")
        device = attach.stdout.strip()
        try:
            made = _run([*mkfs, device])
            if made.returncode != 0:
                raise RuntimeError(f"{' '.join(mkfs)} {device} failed: {made.stderr.strip()}")
            with _mounted(fstype, device, f"steadq-{fstype}-mnt-", skip_unsupported=True) as mountpoint:
                yield mountpoint
        finally:
            _run(["losetup", "-d", device])
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(image)


@contextlib.contextmanager
def overlay_mount() -> Iterator[tuple[str, str]]:
    """Yield ``(merged, lower)`` of an overlayfs whose lower/upper/work dirs live under /tmp.

    Anything placed in ``lower`` before opening it through ``merged`` is
    visible there, which lets a test open an existing queue via overlayfs.
    """
    _require_root("an overlayfs mount")
    if shutil.which("mount") is None:
        pytest.skip("mount is not installed")
    base = tempfile.mkdtemp(prefix="steadq-overlay-", dir="/tmp")
    try:
        lower, upper, work, merged = (os.path.join(base, n) for n in ("lower", "upper", "work", "merged"))
        for d in (lower, upper, work, merged):
            os.mkdir(d)
        opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
        mounted = _run(["mount", "-t", "overlay", "overlay", "-o", opts, merged])
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount overlayfs: {mounted.stderr.strip()}")
        try:
            yield merged, lower
        finally:
            _umount(merged)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def loop_fs() -> Iterator[Callable[..., str]]:
    """Fixture factory: ``mnt = loop_fs("xfs")``; everything is torn down after the test."""
    with contextlib.ExitStack() as stack:

        def make(fstype: str, size_mb: int | None = None) -> str:
            return stack.enter_context(loop_filesystem(fstype, size_mb))

        yield make


# A RAM-backed ext4 for tests whose time goes to fsync and rmdir journal commits, not to what they check.
_RAM_PREFIX = "steadq-ramext4-"
_RAM_SIZE_MB = 4096  # sparse: tmpfs holds only the blocks written
_RAM_INODES = 400_000  # the 100k-job stats test needs ~110k


def reap_stale_ram_ext4() -> list[str]:
    """Unmount and detach RAM filesystems of test runs that died without their teardown (SIGKILL, timeout).

    The image is unlinked once attached, so detaching the loop device is what frees its memory.
    """
    reaped = []
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[:2] for line in f]
    for source, mountpoint in mounts:
        name = os.path.basename(mountpoint)
        if not name.startswith(_RAM_PREFIX):
            continue
        pid = int(name[len(_RAM_PREFIX) :].split("-")[0])
        if os.path.exists(f"/proc/{pid}"):
            continue
        _umount(mountpoint)
        _run(["losetup", "-d", source])
        with contextlib.suppress(OSError):
            os.rmdir(mountpoint)
        reaped.append(mountpoint)
    return reaped


@contextlib.contextmanager
def ram_ext4() -> Iterator[str | None]:
    """Yield the mount point of an ext4 on a loop device over a /dev/shm image, or None if unavailable.

    Still ext4 (statfs magic, O_TMPFILE, RENAME_NOREPLACE behave as on /tmp), but an fsync reaches no
    disk. None (not root, no loop devices) lets the caller fall back to tmp_path: what a test checks
    never depends on which one it got, only its run time does. The mount point's name carries this
    process's pid so that :func:`reap_stale_ram_ext4` can clean up after a run that was killed.
    """
    if os.geteuid() != 0 or not os.path.exists("/dev/loop-control") or not os.path.isdir("/dev/shm"):
        yield None
        return
    if any(shutil.which(tool) is None for tool in ("mkfs.ext4", "losetup", "mount", "umount")):
        yield None
        return
    reap_stale_ram_ext4()
    fd, image = tempfile.mkstemp(prefix=f"{_RAM_PREFIX}{os.getpid()}-", suffix=".img", dir="/dev/shm")
    try:
        os.ftruncate(fd, _RAM_SIZE_MB * 1024 * 1024)
        attach = _run(["losetup", "--find", "--show", image])
    finally:
        os.close(fd)
        os.unlink(image)  # the loop device keeps it open: its memory goes when the device is detached
    device = attach.stdout.strip()
    if attach.returncode != 0 or not device:
        yield None
        return
    try:
        made = _run(["mkfs.ext4", "-q", "-F", "-N", str(_RAM_INODES), "-E", "nodiscard", device])
        if made.returncode != 0:
            raise RuntimeError(f"mkfs.ext4 {device} failed: {made.stderr.strip()}")
        # noinit_itable: no background zeroing of inode tables into RAM.
        with _mounted("ext4", device, f"{_RAM_PREFIX}{os.getpid()}-", "-o", "noinit_itable") as mountpoint:
            yield mountpoint
    finally:
        _run(["losetup", "-d", device])
