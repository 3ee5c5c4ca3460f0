"""Which boot is this? The kernel's boot id, read once per open.

A lease's boottime deadline means something only in the boot that wrote it,
so every leased name carries the boot id (clocks.md). This module reads it
from ``/proc`` through the syscall layer (the syscall hook sees the open, the
read and the close); its two spellings, dashed in paths and raw in names,
are the format's and live in :mod:`steadqd.fs.names` (``boot_raw``,
``boot_dashed``).
"""

from __future__ import annotations

import os

from steadqd.errors import InvalidInput
from steadqd.fs import linux
from steadqd.fs.names import boot_raw

__all__ = ["read_boot_id"]


def read_boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> str:
    """The current boot id, whitespace stripped; ValueError unless canonical lowercase 8-4-4-4-12 hex."""
    fd = linux.open_at(linux.AT_FDCWD, path, os.O_RDONLY)
    try:
        raw = linux.pread(fd, 4096, 0)
    finally:
        linux.close(fd)
    try:
        text = raw.strip().decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"boot id in {path} is not ASCII: {raw!r}") from None
    try:
        boot_raw(text)
    except InvalidInput:
        raise ValueError(f"boot id {text!r} is not canonical lowercase 8-4-4-4-12 hex") from None
    return text
