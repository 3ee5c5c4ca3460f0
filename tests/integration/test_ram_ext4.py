"""The session's RAM-backed ext4 (tests/loopfs.py: ram_ext4) is ext4, and a killed run's copy is reclaimed.

Why: its memory is the shared machine's. A run that dies before its teardown (SIGKILL, a CI
timeout) leaves a mount and a loop device behind; the next run must detach them, or every
killed run would pin up to 4 GiB of RAM until someone noticed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from steadqd.fs import linux
from tests import loopfs

pytestmark = pytest.mark.loopfs

REPO = Path(__file__).resolve().parents[2]
HOLDER = "from tests import loopfs\nimport time\nwith loopfs.ram_ext4() as m:\n    print(m, flush=True)\n    time.sleep(600)\n"


def _mounted(mountpoint: str) -> str | None:
    """The device mounted at ``mountpoint``, or None."""
    with open("/proc/self/mounts") as f:
        return next((line.split()[0] for line in f if line.split()[1] == mountpoint), None)


def test_the_ram_filesystem_is_ext4(ram_ext4_base: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a loop-device filesystem needs root")
    assert os.path.ismount(ram_ext4_base), f"{ram_ext4_base} fell back to pytest's temp directory"
    assert linux.statfs_type(str(ram_ext4_base)) == loopfs.FS_MAGIC["ext4"]
    assert (_mounted(str(ram_ext4_base)) or "").startswith("/dev/loop")


def test_a_killed_runs_ram_filesystem_is_reaped_by_the_next() -> None:
    if os.geteuid() != 0:
        pytest.skip("a loop-device filesystem needs root")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        mountpoint = holder.stdout.readline().strip()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert mountpoint.startswith("/tmp/steadq-ramext4-"), mountpoint
    device = _mounted(mountpoint)
    assert device is not None and device.startswith("/dev/loop"), device
    assert mountpoint in loopfs.reap_stale_ram_ext4()
    assert _mounted(mountpoint) is None and not os.path.exists(mountpoint)
    attached = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    assert not any(line.startswith(device + ":") for line in attached.splitlines()), attached
