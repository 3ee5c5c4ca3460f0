"""Per-job payload copies: a private read-only file per job, removed when the job ends or its worker is gone.

Each job's verified payload is copied to ``<tmp>/steadqd-<pidns>-<pid>-<job>-XXXX/payload``
before its command starts (the command reads it on stdin or from STEADQ_PAYLOAD_FILE), and
the directory is removed when the job is settled. A worker that is SIGKILLed cannot remove
its copies, and payloads may be sensitive, so a starting worker removes the directories
whose creating process is gone. The pid namespace in the name matters: in a /tmp shared
between pid namespaces a process number means nothing, so only directories made in this
worker's own namespace are judged. (Under the systemd units /tmp is private to the service
and vanishes with it; this is for ``steadqd run`` in containers and shells.)

The claim step (claim.py) makes and fills a copy; the run step starts the command on it;
the settle step (settle.py) removes it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

__all__ = ["make", "make_progress", "remove", "remove_stale", "temp_dir", "write_copy"]

_NAME = re.compile(r"steadqd-(\d+)-(\d+)-[0-9a-f]{12}-")


@functools.cache
def _pid_namespace() -> int:
    """This process's pid namespace (fixed for its life: steadqd never calls setns)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists in this pid namespace (``kill(pid, 0)``);
    a process of another user counts as alive: its directory is not ours to judge."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The part of every copy's directory name that names this process, and the random source of their tails:
# made at the first copy, again in a forked child (its pid differs). tempfile.mkdtemp cost ~45 Python
# calls and a getpid a job for the same (it draws its 8 characters one call each; here 8 hex digits, one).
_made: tuple[str, random.Random] | None = None


def _forget_made() -> None:
    global _made
    _made = None


os.register_at_fork(after_in_child=_forget_made)


# temp_dir's last answer: (tempfile's directory as set, its absolute form).
_temp_dir_memo: tuple[str, str] = ("", "")


def temp_dir() -> str:
    """The directory payload copies are made in, absolute: ``tempfile.gettempdir()`` (TMPDIR, else /tmp, ...),
    as ``mkdtemp`` makes a path of it. The one place that asks; preflight and remove_stale ask here too.

    Cheap enough for every job: ``tempfile.tempdir`` (documented: gettempdir sets it and returns it once set)
    is read, not gettempdir called (its _gettempdir, fsdecode, fspath and isinstance were five calls a job);
    unset (the first copy, or a test that resets it) or bytes: gettempdir is called. Its ``abspath`` is
    remembered for the directory last seen."""
    global _temp_dir_memo
    tmp = tempfile.tempdir
    if type(tmp) is not str:
        tmp = tempfile.gettempdir()
    seen, absolute = _temp_dir_memo
    if tmp != seen:
        absolute = os.path.abspath(tmp)
        _temp_dir_memo = (tmp, absolute)
    return absolute


def _in_dir(directory: str, name: str) -> str:
    """``os.path.join(directory, name)`` for a relative ``name`` (every path of a copy is one), in one
    frame: join's own calls (fspath, _get_sep, isinstance, startswith, endswith) were six a job."""
    return f"{directory}/{name}" if directory and directory[-1] != "/" else directory + name


def make(job_id: str) -> str:
    """A fresh private directory (0700) for one job's payload copy: ``<tmp>/steadqd-<pidns>-<pid>-<job>-XXXXXXXX``.

    Like ``tempfile.mkdtemp``: a random tail (32 bits from a generator seeded from ``os.urandom``), ``mkdir``
    0700, which fails on any name that exists (a symlink included), and another tail then.
    """
    for path in _candidate_paths(job_id):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, "no usable temporary directory name found")


def _candidate_paths(job_id: str) -> Iterator[str]:
    """The names :func:`make` and :func:`make_with_files` try in turn (``TMP_MAX`` of them, as ``mkdtemp``)."""
    global _made
    if _made is None:
        _made = (f"steadqd-{_pid_namespace()}-{os.getpid()}-", random.Random())
    prefix, rng = _made
    base = _in_dir(temp_dir(), f"{prefix}{job_id[:12]}-")
    for _ in range(tempfile.TMP_MAX):
        yield f"{base}{rng.getrandbits(32):08x}"


# make, make_progress and write_copy's open in one compiled call (run/spawn.c's steadq_make_copy), set with
# use_compiled: the claiming thread drops the GIL once for the three instead of four times.
_compiled_make: Callable[[str], int] | None = None


def make_with_files(job_id: str) -> tuple[str, str, int] | None:
    """:func:`make`, :func:`make_progress` (no owner, no traverse) and the payload file's creation in one
    compiled call: (directory, progress path, the payload's descriptor for :func:`fill_copy`); None where
    there is no compiled maker (the three steps in Python then). Same names, modes and retries as they."""
    maker = _compiled_make
    if maker is None:
        return None
    for path in _candidate_paths(job_id):
        fd = maker(path)
        if fd >= 0:
            return path, _in_dir(path, "progress"), fd
        if -fd != errno.EEXIST:
            raise OSError(-fd, os.strerror(-fd), path)
    raise FileExistsError(errno.EEXIST, "no usable temporary directory name found")


def write_copy(directory: str, copy: Callable[[BinaryIO], object], owner: tuple[int, int] | None = None) -> str:
    """Fill ``<directory>/payload`` through ``copy`` and make it read-only; returns its path.

    ``copy`` is the backend's verified copy: a corrupt payload raises (after
    the backend quarantined it) and never reaches a command. ``owner``
    (uid, gid) hands file and directory to a command that runs as another
    user and opens the file itself; the directory stays unwritable to it.
    """
    # Made 0400 at its creation (the descriptor writes all the same), unless the umask would cut that.
    fd = os.open(
        _in_dir(directory, "payload"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o400
    )
    return fill_copy(directory, fd, copy, owner)


def fill_copy(directory: str, fd: int, copy: Callable[[BinaryIO], object], owner: tuple[int, int] | None = None) -> str:
    """:func:`write_copy` once ``<directory>/payload`` is open as ``fd`` (which this closes); returns its path."""
    path = _in_dir(directory, "payload")
    out: BinaryIO = _Out(fd)  # type: ignore[assignment]  # the write it needs (typing.cast: a call a job)
    try:
        copy(out)
        if _umask() & 0o400:
            os.fchmod(fd, 0o400)
        if owner is not None:
            os.fchown(fd, *owner)
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)  # its error too is the copy's (a file system that reports a failed write at the close)
    if owner is not None:
        os.chown(directory, *owner)
        os.chmod(directory, 0o500)
    return path


class _Out:
    """The copy's file by its descriptor: whole writes, no buffer (the backend writes in large chunks).

    A Python file object would cost an ``fstat``, an ``ioctl`` (isatty) and an ``lseek`` per job besides."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        size = len(view)  # once, not at every test of the loop
        done = 0
        while done < size:
            done += os.write(self._fd, view[done:])
        return done


@functools.cache
def _umask() -> int:
    """The process's umask (``Umask:`` of /proc/self/status: asking umask(2) would set it, racing the other
    threads); steadqd never changes it. Unknown: 0o777, which keeps the explicit ``fchmod``."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o777


def make_progress(directory: str, owner: tuple[int, int] | None = None, *, traverse: bool = False) -> str:
    """An empty ``<directory>/progress`` the job may write (STEADQ_PROGRESS; steadqd/progress.py reads it).

    ``owner`` hands it to a command run as another user; ``traverse`` lets
    that user reach it through a directory it does not own (``input: stdin``:
    its payload copy stays the daemon's, 0400, unreadable to it).
    """
    path = _in_dir(directory, "progress")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)
    if traverse:
        os.chmod(directory, 0o711)
    return path


_OWN_FILES = ("payload", "progress")  # what make_progress and write_copy put in a job's directory


# The same removal in one compiled call (run/spawn.c's steadq_remove_copy: 0, or rmdir's errno), set by the
# worker where the spawn module is built: the settling thread then drops the GIL once for it, not five times.
_compiled_remove: Callable[[str], int] | None = None


def use_compiled(remover: Callable[[str], int] | None, maker: Callable[[str], int] | None = None) -> None:
    """Remove copies through ``remover`` (``fastspawn.remove_copy()``) and make them through ``maker``
    (``fastspawn.make_copy()``: :func:`make_with_files`), or in Python again (None)."""
    global _compiled_remove, _compiled_make
    _compiled_remove = remover
    _compiled_make = maker


def remove(directory: str) -> None:
    """Remove a job's payload directory, read-only as it may be; never raises.

    Its own two files and the directory go in a few calls (the directory made writable first only
    where an unlink was refused: root is never refused); only a directory
    that holds more (a command run as the daemon's user may write there) is
    walked by ``shutil.rmtree``, which costs several times that for every job.
    The directory is opened without following a symlink and its files are
    removed through that descriptor: a command whose user owns the directory
    (``user:`` with ``input: file``) may rename it and leave a symlink in its
    place, and the daemon must then change and remove nothing it points to.
    """
    if not directory:
        return
    compiled = _compiled_remove
    if compiled is not None:  # the same steps in C (run/spawn.c)
        if compiled(directory) != 0:
            shutil.rmtree(directory, ignore_errors=True)
        return
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        fd = -1  # gone, or not a directory: rmdir and rmtree below judge it (rmtree refuses a symlink)
    try:
        opened_up = False
        for name in _OWN_FILES if fd >= 0 else ():
            try:
                os.unlink(name, dir_fd=fd)
            except PermissionError:  # made unwritable (0500: write_copy's owner, or its command): opened up
                opened_up = opened_up or _open_up(fd)
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)
            except OSError:
                pass
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            return
        except OSError:
            if fd >= 0 and not opened_up:
                _open_up(fd)
            shutil.rmtree(directory, ignore_errors=True)
    finally:
        if fd >= 0:
            os.close(fd)


def _open_up(fd: int) -> bool:
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o700)
    return True


def remove_stale(directory: str | None = None) -> list[str]:
    """Remove payload directories of workers in this pid namespace that no longer run."""
    base = directory or temp_dir()
    ns = _pid_namespace()
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        m = _NAME.match(entry.name)
        if m is None or int(m.group(1)) != ns or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(m.group(2))
        if pid == os.getpid() or _alive(pid):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(entry.path)
    return removed
