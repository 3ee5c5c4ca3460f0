"""Pausing a filesystem queue: the record ``control/paused``, and the lock unique enqueues take.

The pause record
    ``control/paused`` holds one JSON record (steadqd.queue_control). It is
    written like the watermark (a temp in ``control/``, fsync, rename over,
    fsync ``control/``), so a reader sees a whole record or none and the
    pause survives a power cut; ``resume`` unlinks it and fsyncs
    ``control/``. SteadQ/1 readers, the reference included, never open
    names in ``control/`` they do not know (layout.md lists its files;
    fsck skips the directory), so a paused queue is still a valid queue.

    Anyone who may write ``control/`` (the owner; a shared queue's group)
    may pause: that is an operator's action. Every reader still treats the
    record as hostile: opened ``O_NOFOLLOW | O_NONBLOCK``, refused unless a
    regular file, read to at most ``PAUSE_RECORD_MAX`` bytes. A name that
    is present but not a readable record still pauses (with its problem
    said): the name is the pause, the content only annotates it, so a
    broken record never lets workers claim that the operator stopped.

    Workers learn of a pause or a resume through inotify on ``control/``
    (steadqd.fs.ready_watch), and read the record before every claim.

The unique lock
    ``control/unique.lock`` (created on first use, the queue's file mode)
    is held with ``flock`` while a unique enqueue looks for its job and
    publishes it, so producers of this host never both find it absent.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator

from steadqd.constants import CONTROL_DIR
from steadqd.fs import linux
from steadqd.fs.context import Context, not_committed
from steadqd.queue_control import PAUSE_RECORD_MAX, PauseState, decode_pause, encode_pause

__all__ = ["PAUSE_FILE", "UNIQUE_LOCK", "clear_pause", "read_pause", "unique_lock", "write_pause"]

PAUSE_FILE = "paused"
UNIQUE_LOCK = "unique.lock"
_PAUSE_TMP_PREFIX = ".paused.tmp."


def read_pause(control_fd: int) -> PauseState | None:
    """The queue's pause, or None if it is not paused. Never follows a link, never blocks on a FIFO."""
    try:
        fd, _ = linux.open_regular(control_fd, PAUSE_FILE, os.O_RDONLY | os.O_CLOEXEC, label=f"{CONTROL_DIR}/paused")
    except FileNotFoundError:
        return None
    except linux.NotRegularFile as e:
        return PauseState("", 0, "", str(e))
    except OSError as e:
        return PauseState("", 0, "", f"cannot open it: {e.strerror}")
    try:
        raw = os.read(fd, PAUSE_RECORD_MAX + 1)
    except OSError as e:
        return PauseState("", 0, "", f"cannot read it: {e.strerror}")
    finally:
        os.close(fd)
    return decode_pause(raw)


def write_pause(ctx: Context, state: PauseState) -> None:
    """Replace ``control/paused`` with ``state``, durably (NotCommitted if it could not be)."""
    control = ctx.control_fd
    name = _PAUSE_TMP_PREFIX + ctx.random().hex()
    try:
        fd = linux.open_at(control, name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, ctx.modes.file)
        try:
            try:
                ctx.new_file_mode(fd)
                linux.write_all(fd, encode_pause(state))
                linux.fsync(fd)
            finally:
                linux.close(fd)
            linux.rename_replace(control, name, control, PAUSE_FILE)
        except BaseException:
            with contextlib.suppress(OSError):
                linux.unlink_at(control, name)
            raise
        linux.fsync(control)
    except OSError as e:
        raise not_committed(e, f"write {CONTROL_DIR}/{PAUSE_FILE}") from e


def clear_pause(ctx: Context) -> bool:
    """Remove the pause, durably; False if the queue was not paused."""
    try:
        linux.unlink_at(ctx.control_fd, PAUSE_FILE)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise not_committed(e, f"remove {CONTROL_DIR}/{PAUSE_FILE}") from e
    try:
        linux.fsync(ctx.control_fd)
    except OSError as e:
        raise not_committed(e, f"fsync {CONTROL_DIR}/ after removing {PAUSE_FILE}") from e
    return True


@contextlib.contextmanager
def unique_lock(ctx: Context) -> Iterator[None]:
    """Hold ``control/unique.lock`` exclusively (flock, waiting for it) for the block.

    flock is per host: producers on other hosts of a network filesystem are
    not serialised, which is one reason SteadQ/1 queues are local only.
    """
    try:
        fd = linux.open_at(
            ctx.control_fd, UNIQUE_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, ctx.modes.file
        )
    except OSError as e:
        raise not_committed(e, f"open {CONTROL_DIR}/{UNIQUE_LOCK}") from e
    try:
        with contextlib.suppress(OSError):
            ctx.new_file_mode(fd)  # a lock another member created is theirs to chmod; it already has the mode
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                break
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise not_committed(e, f"lock {CONTROL_DIR}/{UNIQUE_LOCK}") from e
        yield
    finally:
        os.close(fd)
