"""Deliberately broken protocols, to prove each crash lane can fail.

Each function returns a context manager factory for a workload's ``mutate``
argument: the bug is in place only while the recorded run executes. Lanes 1
and 2 run the same bugs, so their detection power can be compared.
"""

from __future__ import annotations

import contextlib
import os
import stat
import types
from collections.abc import Iterator
from typing import Any

from steadqd.fs import linux, publish, tree


@contextlib.contextmanager
def _swapped(owner: Any, attr: str, value: Any) -> Iterator[None]:
    orig = getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        setattr(owner, attr, orig)


def _publish_linux(**overrides: object) -> contextlib.AbstractContextManager[None]:
    """The Linux layer *as seen by publish.py only*, with some calls replaced."""
    proxy = types.SimpleNamespace(**{k: getattr(linux, k) for k in dir(linux) if not k.startswith("__")})
    for k, v in overrides.items():
        setattr(proxy, k, v)
    return _swapped(publish, "linux", proxy)


def job_file_never_fsynced() -> contextlib.AbstractContextManager[None]:
    return _publish_linux(fsync=lambda fd: None)  # publish.py's only fsync is the job file's


def link_before_fsync() -> contextlib.AbstractContextManager[None]:
    """The reference's claim (content durable before it has a name), broken."""

    def link_then_fsync(fd: int, dirfd: int, name: str, *, prefer_proc: bool = False) -> str:
        form = linux.link_tmpfile(fd, dirfd, name, prefer_proc=prefer_proc)
        linux.fsync(fd)
        return form

    return _publish_linux(fsync=lambda fd: None, link_tmpfile=link_then_fsync)


def settle_without_source_barrier() -> contextlib.AbstractContextManager[None]:
    """An ack that returns before the source directory is durable."""

    def dst_only(self: tree.Tree, src_fd: int, dst_fd: int, *, always_both: bool, force: bool) -> None:
        self.barrier(dst_fd, force=force)

    return _swapped(tree.Tree, "_barrier_pair", dst_only)


def dirs_without_parent_barrier() -> contextlib.AbstractContextManager[None]:
    """ensure_dir creating directories without fsyncing their parent."""

    def no_barrier(self: tree.Tree, parent_rel: str, parent_fd: int, names: list[str]) -> None:
        for name in names:
            linux.mkdir_at(parent_fd, name, self.modes.dir)

    return _swapped(tree.Tree, "_mkdirs_durably", no_barrier)


def lying_file_fsync() -> contextlib.AbstractContextManager[None]:
    """fsync(2) of a regular file returns success without reaching the file system.

    steadqd.fs.linux still issues (and lane 1's recorder still sees) every fsync;
    only the kernel never gets it: a stand-in for a wrapper, library or
    hypervisor that drops barriers.
    """
    real = os.fsync

    def fsync(fd: int) -> None:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            real(fd)

    return _swapped(os, "fsync", fsync)
