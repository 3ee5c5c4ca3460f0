"""Job progress: what a running job reports through ``$STEADQ_PROGRESS``, and where other processes read it.

The job's side
    The worker makes an empty file ``progress`` in the job's own directory
    (the one of its payload copy, daemon/worker/payload.py) and names it in
    ``STEADQ_PROGRESS``. The job writes lines ``<percent 0-100> [text]``; the
    latest complete line counts (overwrite or append, both work).

The worker's side: the file is the job's, hence hostile
    It is read at most once per :data:`READ_EVERY` per job, by descriptor:
    ``openat`` of the job's directory (held open, so renaming the directory
    does not redirect it) with ``O_NOFOLLOW|O_NONBLOCK`` (a symlink is refused,
    a FIFO never blocks), then ``fstat``: only a regular file with one link,
    owned by the job's user, of at most :data:`MAX_FILE` bytes is read, and
    only its last :data:`TAIL` bytes. Anything else is refused (and said
    once). The text is kept as data and escaped wherever it is shown.

Where it is published
    For processes on this host (``steadq show``, ``ls``, ``watch``): one small
    JSON file per running job, ``<base>/<queue id>/<job id>``, where ``<base>``
    is ``$STEADQ_PROGRESS_DIR``, else ``/run/steadq/progress`` (the package's
    tmpfiles.d), else ``$XDG_RUNTIME_DIR/steadq/progress``. Only the daemon
    writes there: by descriptor, a new file renamed over the old one, removed
    when the job ends. A job running on another host (a bucket queue's other
    workers) is not shown.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from collections.abc import Collection, Mapping
from typing import Any

from steadqd.constants import runtime_dirs

__all__ = [
    "MAX_FILE",
    "PROGRESS_DIR_ENV",
    "READ_EVERY",
    "TAIL",
    "Publisher",
    "Refused",
    "bases",
    "lookup",
    "parse",
    "published",
    "read_file",
    "shown",
]

PROGRESS_DIR_ENV = "STEADQ_PROGRESS_DIR"
READ_EVERY = 1.0  # s; the most often a job's file is read
MAX_FILE = 1 << 20  # bytes; a larger progress file is refused (rewrite it rather than append forever)
TAIL = 4096  # bytes read from the end of the file
MAX_TEXT = 200  # characters of text kept
_LINE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)%?(?:\s+(.*))?")
_JOB = re.compile(r"[0-9a-f]{32}")
_QUEUE = re.compile(r"[0-9a-f]{1,64}")


class Refused(Exception):
    """The progress file is not one the worker reads (a link, a FIFO, too large, not the job's)."""


def bases() -> list[str]:
    """The base directories of published progress, in the order the worker tries them."""
    return runtime_dirs("progress", PROGRESS_DIR_ENV)


def parse(data: bytes) -> tuple[float, str] | None:
    """The latest complete line that reads as progress, or None."""
    for raw in reversed(data.split(b"\n")[:-1] if b"\n" in data else []):
        m = _LINE.fullmatch(raw.decode("utf-8", "replace").rstrip("\r"))
        if m is None:
            continue
        percent = float(m.group(1))
        if 0.0 <= percent <= 100.0:
            return percent, (m.group(2) or "")[:MAX_TEXT]
    return None


def read_file(dir_fd: int, name: str, owners: Collection[int]) -> tuple[float, str] | None:
    """Read a job's progress file by descriptor; raises :class:`Refused` for anything but a small regular file."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Refused("a symbolic link" if e.errno == 40 else (e.strerror or str(e))) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("not a regular file")
        if st.st_nlink != 1:
            raise Refused("a hard link to another file")
        if st.st_uid not in owners:
            raise Refused(f"owned by uid {st.st_uid}, not by the job's user")
        if st.st_size > MAX_FILE:
            raise Refused(f"{st.st_size} bytes, more than {MAX_FILE} (rewrite it instead of appending forever)")
        return parse(os.pread(fd, TAIL, max(0, st.st_size - TAIL)))
    finally:
        os.close(fd)


def _open_dir(name: str, dir_fd: int | None = None) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


class Publisher:
    """The daemon's side: one queue's directory of progress files, written by descriptor only."""

    def __init__(self, dir_fd: int, path: str) -> None:
        self._fd = dir_fd
        self.path = path

    @classmethod
    def open(cls, queue_id: str) -> tuple[Publisher | None, str | None]:
        """The queue's directory under the first usable base (made if missing), or (None, why none)."""
        why: list[str] = []
        for base in bases():
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(base, 0o755)
                base_fd = _open_dir(base)
                try:
                    if os.fstat(base_fd).st_uid not in (0, os.geteuid()):
                        raise PermissionError(f"{base} is not root's or this daemon's")
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(queue_id, 0o755, dir_fd=base_fd)
                    fd = _open_dir(queue_id, base_fd)
                finally:
                    os.close(base_fd)
                if os.fstat(fd).st_uid != os.geteuid():
                    os.close(fd)
                    raise PermissionError(f"{base}/{queue_id} is not this daemon's")
                return cls(fd, os.path.join(base, queue_id)), None
            except OSError as e:
                why.append(f"{base}: {e.strerror or e}")
        return None, "; ".join(why)

    def publish(self, job_id: str, percent: float, text: str) -> None:
        """Replace the job's file at once (a reader sees the old value or the new, never half)."""
        tmp = f".{job_id}.{os.getpid()}.tmp"
        doc = json.dumps({"percent": percent, "text": text, "updated_ns": time.time_ns()})
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=self._fd)
        try:
            os.write(fd, doc.encode())
        finally:
            os.close(fd)
        os.rename(tmp, job_id, src_dir_fd=self._fd, dst_dir_fd=self._fd)

    def remove(self, job_id: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(job_id, dir_fd=self._fd)

    def close(self) -> None:
        os.close(self._fd)


def lookup(queue_id: str, job_id: str) -> dict[str, Any] | None:
    """The published progress of a job running on this host, or None (read-only; never raises)."""
    if not _JOB.fullmatch(job_id) or not _QUEUE.fullmatch(queue_id):
        return None
    for base in bases():
        try:
            fd = os.open(os.path.join(base, queue_id, job_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            doc = json.loads(os.read(fd, 4096))
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
        if isinstance(doc, dict) and isinstance(doc.get("percent"), int | float) and isinstance(doc.get("text"), str):
            return {"percent": doc["percent"], "text": doc["text"], "updated_ns": doc.get("updated_ns")}
    return None


def published(queue_id: str, limit: int = 20) -> list[tuple[str, dict[str, Any]]]:
    """Up to ``limit`` running jobs of the queue with published progress on this host, by job id."""
    if not _QUEUE.fullmatch(queue_id):
        return []
    names: set[str] = set()
    for base in bases():
        with contextlib.suppress(OSError):
            names.update(n for n in os.listdir(os.path.join(base, queue_id)) if _JOB.fullmatch(n))
    found = []
    for name in sorted(names):
        p = lookup(queue_id, name)
        if p is not None:
            found.append((name, p))
        if len(found) >= limit:
            break
    return found


def shown(p: Mapping[str, Any]) -> str:
    """``42% text`` (the caller escapes it: the text is the job's)."""
    pct = p["percent"]
    number = f"{pct:g}"
    return f"{number}% {p['text']}".rstrip()
