"""fs/boot_id.py: the kernel's boot id, read through the syscall layer and checked canonical."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadqd.fs import linux
from steadqd.fs.boot_id import read_boot_id
from steadqd.fs.names import boot_dashed, boot_raw


def test_read_boot_id_real() -> None:
    boot = read_boot_id()
    assert len(boot) == 36 and boot == boot.strip().lower()
    assert boot_dashed(boot_raw(boot)) == boot


def test_read_boot_id_goes_through_the_syscall_layer(tmp_path: Path) -> None:
    p = tmp_path / "boot_id"
    p.write_bytes(b"790db382-418e-46e5-89bb-f2b67b377639\n")
    with linux.trace() as events:
        read_boot_id(str(p))
    assert [e.op for e in events] == ["open", "read", "close"]


def test_read_boot_id_strips_whitespace(tmp_path: Path) -> None:
    p = tmp_path / "boot_id"
    p.write_bytes(b"  790db382-418e-46e5-89bb-f2b67b377639\n")
    assert read_boot_id(str(p)) == "790db382-418e-46e5-89bb-f2b67b377639"


@pytest.mark.parametrize(
    "content",
    [
        b"790DB382-418E-46E5-89BB-F2B67B377639\n",
        b"790db382418e46e589bbf2b67b377639\n",
        b"790db382-418e-46e5-89bb-f2b67b37763\n",
        b"790db382-418e-46e5-89bb-f2b67b3776390\n",
        b"790db382-418e-46e5-89bb-f2b67b37763g\n",
        b"790db382-418e-46e5-89bb-f2b67b377639 x\n",
        b"\xff\n",
        b"",
    ],
)
def test_read_boot_id_rejects(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "boot_id"
    p.write_bytes(content)
    with pytest.raises(ValueError, match="boot id"):
        read_boot_id(str(p))
