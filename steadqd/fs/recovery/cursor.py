"""Where a pass starts: ``control/recovery-cursor.json`` and this process's memory.

The cursor is read and validated at the start of each pass (an invalid
cursor stops the pass, as in the reference) and a *reference-written* phase
position is honoured. We write the phase the next pass starts with and, for
the phases whose trees only grow with the backlog (``PERSISTED``: temp
cleanup, compaction, retention), that phase's position, in the shape
records.md defines: a one-shot ``steadq recover`` then continues where the
previous process stopped instead of rescanning a million receipts it has
already compacted (the restart made such runs spend their whole budget
re-verifying the same prefix and report ``ops:0``). Reaping and promotion
positions are not written: what they name has moved away when it succeeded,
so a restart costs little, and colocated leases have no cursor shape at all.

Every position is also kept **in-process** (per queue id), including the
ones that cannot be written (colocated leases, dead-letter retention); a
later pass of this process resumes after that entry when the cursor still
names its phase. That matters for liveness: without it, a pass with a tiny
budget whose first entry keeps failing (a collision, an unlinkable file)
would retry that entry forever. The file is rewritten only when its bytes
change, so an idle queue costs no fsyncs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading

from steadqd.constants import CONTROL_DIR, RECOVERY_CURSOR_FILE, TEMP_EXT
from steadqd.errors import BadRecoveryCursor, QueueCorrupt
from steadqd.fs import linux
from steadqd.fs.json_records import cursor_json, validate_cursor
from steadqd.fs.layout import OpenOptions, check_cursor, open_queue_root
from steadqd.fs.recovery.objects import write_temp
from steadqd.fs.recovery.state import PHASES, Key, Pass
from steadqd.fs.tree import is_single_regular

_CURSOR_TMP_PREFIX = ".recovery-cursor."

# Fine-grained resume positions of budget-limited passes, per (queue id,
# step): (phase, last fully processed entry key). The steps are the cyclic
# phases ("cycle") and the due phases a pass runs first ("due", driver.py).
_resume_lock = threading.Lock()
_resume: dict[tuple[bytes, str], tuple[str, Key]] = {}

Positions = dict[str, Key | None]

# Phases whose position is written to the file (see the module docstring);
# their positions are (bucket or boot, shard, entry), the shape records.md gives them.
PERSISTED = ("cleanup_temp", "compact_receipts", "delete_receipts")
_PERSISTED_DEPTH = 3


def read_cursor(p: Pass) -> tuple[str, Positions] | None:
    """(start phase, positions) or None when the cursor is invalid (error recorded)."""
    qid = p.ctx.queue_id
    try:
        fd, st = linux.open_regular(
            p.control, RECOVERY_CURSOR_FILE, os.O_RDONLY, label=f"control/{RECOVERY_CURSOR_FILE}"
        )
    except linux.NotRegularFile as e:
        p.error("recovery_cursor", str(e))
        return None
    except OSError as e:
        if e.errno == errno.ENOENT:
            return _with_memory(qid, PHASES[0], {})
        p.error("recovery_cursor", f"cannot open control/{RECOVERY_CURSOR_FILE}: {e.strerror}")
        return None
    try:
        if not is_single_regular(st):
            raise QueueCorrupt("recovery cursor is not a singly linked regular file")
        doc = validate_cursor(linux.pread(fd, 16_385, 0), qid)
    except QueueCorrupt as e:
        p.error("recovery_cursor", e.message)
        return None
    except OSError as e:
        p.error("recovery_cursor", f"cannot read control/{RECOVERY_CURSOR_FILE}: {e.strerror}")
        return None
    finally:
        linux.close(fd)
    cur = doc["cursor"]
    positions: Positions = {}
    for phase in PHASES:
        pos = cur[phase]
        if pos is None:
            continue
        if phase == "reap_leases":  # legacy tree: (boot, bucket, shard, entry)
            positions[phase] = (b"a", pos["first"], pos["second"], pos["third"], pos["resume_after"])
        else:
            positions[phase] = (pos["first"], pos["second"], pos["resume_after"])
    return _with_memory(qid, cur["phase"], positions)


def _with_memory(queue_id: bytes, start: str, positions: Positions) -> tuple[str, Positions]:
    """Add this process's own resume position when the cursor still names its phase."""
    mem = recall(queue_id, "cycle")
    if mem is not None and mem[0] == start and positions.get(start) is None:
        positions[start] = mem[1]
    return start, positions


def recall(queue_id: bytes, step: str) -> tuple[str, Key] | None:
    """Where this process's last pass left ``step`` (forgotten once asked)."""
    with _resume_lock:
        return _resume.pop((queue_id, step), None)


def remember(queue_id: bytes, step: str, position: tuple[str, Key] | None) -> None:
    """Keep (or forget) where this process's next pass resumes ``step``."""
    with _resume_lock:
        if position is not None:
            _resume[(queue_id, step)] = position
        else:
            _resume.pop((queue_id, step), None)


def write_cursor(p: Pass, phase: str, position: Key | None = None) -> None:
    """Persist ``phase`` and, where it has a written shape, its position
    (skipped when the bytes are already there)."""
    data = cursor_json(p.ctx.queue_id, phase, persisted_position(phase, position))
    if _holds(p.control, data) or _replace(p, data):
        p.report.next_phase = phase


def persisted_position(phase: str, position: Key | None) -> Key | None:
    """The part of a position the file keeps: None for the phases it does not
    keep and for positions of another shape (the dead letters retention walks
    after the receipts)."""
    if phase not in PERSISTED or position is None or len(position) != _PERSISTED_DEPTH:
        return None
    return position


def _holds(control: int, data: bytes) -> bool:
    try:
        fd, st = linux.open_regular(control, RECOVERY_CURSOR_FILE, os.O_RDONLY)
        try:
            return is_single_regular(st) and linux.pread(fd, len(data) + 1, 0) == data
        finally:
            linux.close(fd)
    except (OSError, linux.NotRegularFile):
        return False  # missing, unreadable or not a file: write it


def _replace(p: Pass, data: bytes) -> bool:
    """Temp file, fsync, rename over the cursor, fsync ``control/``; False (error recorded) on failure."""
    control = p.control
    tmp = write_temp(
        p,
        control,
        "control",
        lambda rand16: _CURSOR_TMP_PREFIX + rand16.hex() + TEMP_EXT,
        data,
        ("recovery_cursor", "cannot persist the recovery cursor"),
        unlink_failed_create=True,  # the temp is unlinked on failure; nothing ever sweeps control/ (layout.md)
    )
    if tmp is None:
        return False
    renamed = False
    try:
        linux.rename_replace(control, tmp, control, RECOVERY_CURSOR_FILE)
        renamed = True
        linux.fsync(control)
    except OSError as e:
        p.error("recovery_cursor", f"cannot persist the recovery cursor: {e.strerror}")
        return False
    finally:
        if not renamed:
            with contextlib.suppress(OSError):
                linux.unlink_at(control, tmp)
    return True


def remove_bad_cursor(path: str) -> str | None:
    """Remove ``control/recovery-cursor.json`` if the open would refuse it: what was wrong, or None.

    ``steadq fsck --repair``'s way out of a cursor that stops every open
    (:class:`BadRecoveryCursor`). The queue is opened as usual but for the
    cursor check, so everything else about it must be sound. The entry goes by
    ``unlinkat`` without following it: a symlink's target and a hard link's
    other name stay as they are, a FIFO is never opened for writing. A
    directory there is refused (its contents are not ours to delete).
    """
    # The caller's open refused only the cursor, so the filesystem passed its check already.
    opened = open_queue_root(path, OpenOptions(allow_unsupported_fs=True, check_cursor=False))
    try:
        control = linux.open_dir(opened.root_fd, CONTROL_DIR)
        try:
            try:
                check_cursor(control, opened.format.queue_id)
            except BadRecoveryCursor as e:
                what = e.__cause__.message if isinstance(e.__cause__, QueueCorrupt) else e.message
                try:
                    linux.unlink_at(control, RECOVERY_CURSOR_FILE)
                except IsADirectoryError:
                    raise QueueCorrupt(
                        f"{CONTROL_DIR}/{RECOVERY_CURSOR_FILE} is a directory: move it out of the queue by hand"
                    ) from None
                linux.fsync(control)
                return what
            return None
        finally:
            linux.close(control)
    finally:
        linux.close(opened.maintenance_fd)
        linux.close(opened.root_fd)
