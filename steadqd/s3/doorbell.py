"""The doorbell: a producer on this host wakes the idle workers of a bucket queue at once.

Why one exists: a bucket sends no events, so an idle worker learns of a new
job by polling (``steadqd.s3.watch``), seconds late. A producer on the same
host can do better for free: after its enqueue it sends one empty datagram
to every worker of the queue that is waiting here, and they look at once.

How: each waiting process binds a datagram unix socket in the queue's
directory, ``<base>/<queue id>/<pid>.<random>.sock``, where ``<base>`` is
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
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat

__all__ = ["DOORBELL_DIR_ENV", "Doorbell", "RUN_DIR", "bases", "ring"]

DOORBELL_DIR_ENV = "STEADQ_DOORBELL_DIR"
RUN_DIR = "/run/steadq/doorbell"
_SUFFIX = ".sock"
_MAX_RUNG = 64  # sockets one ring reaches: bounds the cost of an enqueue on a crowded host
_STALE = (errno.ECONNREFUSED, errno.ENOENT)  # a socket whose process is gone


def bases() -> list[str]:
    """The base directories, in the order a listener tries them (a ringer rings in all)."""
    override = os.environ.get(DOORBELL_DIR_ENV)
    if override:
        return [override]
    found = [RUN_DIR]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        found.append(os.path.join(runtime, "steadq", "doorbell"))
    return found


def _queue_dir(base: str, queue_id: str) -> str:
    return os.path.join(base, queue_id)


def ring(queue_id: str) -> int:
    """Ring every waiting worker of the queue on this host; returns how many sockets took the ring."""
    rung = 0
    sender: socket.socket | None = None
    try:
        for base in bases():
            directory = _queue_dir(base, queue_id)
            try:
                names = [n for n in os.listdir(directory) if n.endswith(_SUFFIX)]
            except OSError:
                continue  # no directory: nobody waits there
            for name in names[:_MAX_RUNG]:
                if sender is None:
                    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                path = os.path.join(directory, name)
                try:
                    sender.sendto(b"\x01", socket.MSG_DONTWAIT, path)
                    rung += 1
                except BlockingIOError:
                    rung += 1  # its buffer is full: it has been rung already
                except OSError as e:
                    if e.errno in _STALE:
                        with contextlib.suppress(OSError):
                            os.unlink(path)  # nobody listens: a live listener never refuses
    except OSError:
        pass  # a socket could not even be made: the next poll finds the job
    finally:
        if sender is not None:
            sender.close()
    return rung


class Doorbell:
    """One waiting process's socket; readable (``fileno()``) once it has been rung."""

    def __init__(self, sock: socket.socket, path: str) -> None:
        self._sock = sock
        self.path = path

    @classmethod
    def bind(cls, queue_id: str) -> tuple[Doorbell | None, str | None]:
        """A bound doorbell, or (None, why none could be bound: the watch then only polls)."""
        why: list[str] = []
        for base in bases():
            try:
                return cls._bind_in(_queue_dir(base, queue_id)), None
            except OSError as e:
                why.append(f"{base}: {e.strerror or e}")
        return None, "no doorbell (" + "; ".join(why) + "); idle polling only"

    @classmethod
    def _bind_in(cls, directory: str) -> Doorbell:
        base = os.path.dirname(directory)
        info = os.stat(base)  # the base must exist: a listener never creates /run/steadq itself
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", base)
        # The queue's directory gets the base's sharing: the group may ring if it may enter the base.
        shared = bool(info.st_mode & stat.S_IXGRP)
        mode = 0o2770 if shared else 0o700
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, mode)
            os.chmod(directory, mode)  # mkdir's mode is cut by the umask
        _remove_stale(directory)
        path = os.path.join(directory, f"{os.getpid()}.{os.urandom(4).hex()}{_SUFFIX}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            sock.bind(path)
            os.chmod(path, 0o660 if shared else 0o600)
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return cls(sock, path)

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
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self._sock.close()


def _remove_stale(directory: str) -> None:
    """Sockets of processes that died without closing them: removed so that rings are not wasted on them."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(_SUFFIX)]
    except OSError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        for name in names:
            path = os.path.join(directory, name)
            try:
                probe.connect(path)
            except OSError as e:
                if e.errno == errno.ECONNREFUSED:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
    finally:
        probe.close()
