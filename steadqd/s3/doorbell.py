"""The doorbell: a producer on this host wakes the idle workers of a bucket queue at once.

Why one exists: a bucket sends no events, so an idle worker learns of a new
job by polling (``steadqd.s3.watch``), seconds late. A producer on the same
host can do better for free: after its enqueue it sends one empty datagram
to every worker of the queue that is waiting here, and they look at once.

How: each waiting process binds a datagram unix socket in the queue's
directory (by descriptor, see Security), ``<base>/<queue id>/<pid>.<random>.sock``, where ``<base>`` is
``$STEADQ_DOORBELL_DIR``, else ``/run/steadq/doorbell`` (made by the
package's tmpfiles.d, group ``steadq``, setgid), else
``$XDG_RUNTIME_DIR/steadq/doorbell``. A ringer sends to every socket it finds
in any of those directories that exists.

It is lossy on purpose, and nothing relies on it: a ring that is not heard
(no directory, a full socket buffer, a worker on another host) only means
the job is found at the next poll. Ringing never blocks (``MSG_DONTWAIT``)
and never raises, so it cannot fail or delay an enqueue.

Security: the datagram's bytes are ignored. Whoever may write to a socket
(the directory's group, as the queue's users) can only make a worker look
at the bucket sooner, and a ring costs its sender nothing (no store
credentials, no request), while each look costs the worker a claim pass.
So the watch (``steadqd.s3.watch``) hears one ring at once and coalesces
the rest into at most one look per ``s3.doorbell_interval`` (1 s by default).
The shared directory is one where any member may rename or replace any
entry, so no name in it is trusted: both sides open the base and the queue's
directory with ``O_NOFOLLOW`` and work relative to those descriptors; a
ringer rings only an entry that, opened ``O_PATH|O_NOFOLLOW``, is a socket
owned by root, by itself or by the base's owner (the daemons' user), and
sends through ``/proc/self/fd/<that descriptor>``, so a member's symlink to a
socket elsewhere is never followed. A listener sets its modes by descriptor
(``fchmod`` of the directory it made, ``chmod`` of ``/proc/self/fd/<O_PATH fd>``
of its own socket after checking it), never by a path that can be swapped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from collections.abc import Collection

from steadqd.constants import runtime_dirs

__all__ = ["DOORBELL_DIR_ENV", "Doorbell", "bases", "ring"]

DOORBELL_DIR_ENV = "STEADQ_DOORBELL_DIR"
_SUFFIX = ".sock"
_MAX_RUNG = 64  # sockets one ring reaches: bounds the cost of an enqueue on a crowded host
_STALE = (errno.ECONNREFUSED, errno.ENOENT)  # a socket whose process is gone


def bases() -> list[str]:
    """The base directories, in the order a listener tries them (a ringer rings in all)."""
    return runtime_dirs("doorbell", DOORBELL_DIR_ENV)


def _queue_dir(base: str, queue_id: str) -> str:
    return os.path.join(base, queue_id)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(name: str, dir_fd: int | None = None) -> int:
    """A directory by descriptor, never through a link: every later name is looked up in it."""
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _by_fd(fd: int) -> str:
    """A name for exactly the inode ``fd`` holds: connecting, sending or chmod through it follows no entry."""
    return f"/proc/self/fd/{fd}"


def _socket_entry(dir_fd: int, name: str, owners: Collection[int]) -> int | None:
    """An O_PATH descriptor of ``name`` if it is a socket (not a link) owned by one of ``owners``, else None.

    Why a descriptor: a group member may rename and replace any entry of the
    shared directory at any moment, so a check of the name and a later use of
    the name could see two different files. The descriptor is the checked one."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    info = os.fstat(fd)
    if stat.S_ISSOCK(info.st_mode) and info.st_uid in owners:
        return fd
    os.close(fd)
    return None


def _owners(dir_fd: int) -> set[int]:
    """Whose sockets a ring reaches: root's, our own, and those of the base's owner (the daemons' user)."""
    return {0, os.geteuid(), os.fstat(dir_fd).st_uid}


def ring(queue_id: str) -> int:
    """Ring every waiting worker of the queue on this host; returns how many sockets took the ring.

    Only a socket entry of an expected owner is rung, through a descriptor of
    the entry itself, so a member's symlink (or a socket swapped in after the
    check) never lets a ring reach a socket in a directory the member cannot
    enter."""
    rung = 0
    sender: socket.socket | None = None
    try:
        for base in bases():
            try:
                base_fd = _open_dir(base)
            except OSError:
                continue  # no directory: nobody waits there
            try:
                owners = _owners(base_fd)
                dir_fd = _open_dir(queue_id, base_fd)
            except OSError:
                os.close(base_fd)
                continue
            os.close(base_fd)
            try:
                names = [n for n in os.listdir(dir_fd) if n.endswith(_SUFFIX)]
                for name in names[:_MAX_RUNG]:
                    entry = _socket_entry(dir_fd, name, owners)
                    if entry is None:
                        continue  # a link, not a socket, or a stranger's: never rung
                    try:
                        if sender is None:
                            sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                        sender.sendto(b"\x01", socket.MSG_DONTWAIT, _by_fd(entry))
                        rung += 1
                    except BlockingIOError:
                        rung += 1  # its buffer is full: it has been rung already
                    except OSError as e:
                        if e.errno in _STALE:
                            with contextlib.suppress(OSError):
                                os.unlink(name, dir_fd=dir_fd)  # nobody listens: a live listener never refuses
                    finally:
                        os.close(entry)
            finally:
                os.close(dir_fd)
    except OSError:
        pass  # a socket could not even be made: the next poll finds the job
    finally:
        if sender is not None:
            sender.close()
    return rung


class Doorbell:
    """One waiting process's socket; readable (``fileno()``) once it has been rung."""

    def __init__(self, sock: socket.socket, dir_fd: int, name: str, path: str) -> None:
        self._sock = sock
        self._dir_fd = dir_fd  # the queue's directory, held: close() removes our name from it, not another's
        self._name = name
        self.path = path

    @classmethod
    def bind(cls, queue_id: str) -> tuple[Doorbell | None, str | None]:
        """A bound doorbell, or (None, why none could be bound: the watch then only polls)."""
        why: list[str] = []
        for base in bases():
            try:
                return cls._bind_in(base, queue_id), None
            except OSError as e:
                why.append(f"{base}: {e.strerror or e}")
        return None, "no doorbell (" + "; ".join(why) + "); idle polling only"

    @classmethod
    def _bind_in(cls, base: str, queue_id: str) -> Doorbell:
        """Bind in ``<base>/<queue id>/``, every step by descriptor: nothing a member swaps in is followed."""
        base_fd = _open_dir(base)  # the base must exist: a listener never creates /run/steadq itself
        try:
            # The queue's directory gets the base's sharing: the group may ring if it may enter the base.
            shared = bool(os.fstat(base_fd).st_mode & stat.S_IXGRP)
            owners = _owners(base_fd)
            mode = 0o2770 if shared else 0o700
            try:
                os.mkdir(queue_id, mode, dir_fd=base_fd)
                made = True
            except FileExistsError:
                made = False
            dir_fd = _open_dir(queue_id, base_fd)
        finally:
            os.close(base_fd)
        try:
            if made and os.fstat(dir_fd).st_uid == os.geteuid():
                os.fchmod(dir_fd, mode)  # mkdir's mode is cut by the umask; by descriptor, so never another's
            _remove_stale(dir_fd, owners)
            return cls._bind_socket(dir_fd, os.path.join(base, queue_id), 0o660 if shared else 0o600)
        except BaseException:
            os.close(dir_fd)
            raise

    @classmethod
    def _bind_socket(cls, dir_fd: int, directory: str, mode: int) -> Doorbell:
        name = f"{os.getpid()}.{os.urandom(4).hex()}{_SUFFIX}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            sock.bind(os.path.join(_by_fd(dir_fd), name))
            # bind's mode is cut by the umask. The mode is set on the entry's own inode, checked to be
            # our socket: a member may have replaced the name since bind (with a link to a root file).
            entry = _socket_entry(dir_fd, name, {os.geteuid()})
            if entry is None:
                raise PermissionError(errno.EPERM, f"doorbell socket {name} was replaced right after bind")
            try:
                os.chmod(_by_fd(entry), mode)
            finally:
                os.close(entry)
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            raise
        return cls(sock, dir_fd, name, os.path.join(directory, name))

    def fileno(self) -> int:
        return self._sock.fileno()

    def drain(self) -> int:
        """Read every ring waiting; returns how many there were."""
        count = 0
        while True:
            try:
                self._sock.recv(16)
            except (BlockingIOError, InterruptedError):
                return count
            except OSError:
                return count
            count += 1

    def close(self) -> None:
        if self._dir_fd < 0:
            return
        with contextlib.suppress(OSError):
            os.unlink(self._name, dir_fd=self._dir_fd)
        self._sock.close()
        os.close(self._dir_fd)
        self._dir_fd = -1


def _remove_stale(dir_fd: int, owners: Collection[int]) -> None:
    """Sockets of processes that died without closing them: removed so that rings are not wasted on them."""
    try:
        names = [n for n in os.listdir(dir_fd) if n.endswith(_SUFFIX)]
    except OSError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        for name in names:
            entry = _socket_entry(dir_fd, name, owners)
            if entry is None:
                continue
            try:
                probe.connect(_by_fd(entry))
            except OSError as e:
                if e.errno == errno.ECONNREFUSED:
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=dir_fd)
            finally:
                os.close(entry)
    finally:
        probe.close()
