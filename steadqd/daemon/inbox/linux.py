"""The one Linux call the watch folder needs and Python's ``os`` lacks: renameat2.

The daemon may not import ``steadqd.fs`` (its syscall layer belongs to the
filesystem backend, and the watch folder is a producer above the backend
contract), so this is a ctypes call of its own, as in ``guard.py``. inotify
is the ``inotify_simple`` dependency's (see ``watch``).
"""

from __future__ import annotations

import ctypes
import errno
import os

_libc = ctypes.CDLL(None, use_errno=True)

_RENAME_NOREPLACE = 1


def rename_noreplace(src_dir: int, src: str, dst_dir: int, dst: str) -> None:
    """Move ``src`` to ``dst`` unless ``dst`` exists (FileExistsError), in one step where the
    filesystem can; else by link and unlink, which refuses an existing ``dst`` just the same."""
    result = _libc.renameat2(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), _RENAME_NOREPLACE)
    if result == 0:
        return
    e = ctypes.get_errno()
    if e not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        raise OSError(e, os.strerror(e), src, None, dst)
    os.link(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)
    os.unlink(src, dir_fd=src_dir)
