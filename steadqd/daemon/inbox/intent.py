"""The watch folder's state directory and the records in it (what ``files`` writes down).

``.steadq-inbox/`` in the folder holds one record per file being taken
(``<job id>.intent``) or kept (``<job id>.kept``); ``files`` says what each
step of a file does with them. Here is only what a record is, and what one
read back must be before anything is done with it: the directory is verified
to be the daemon's, but a name from a record is used as a path, so each is
checked to be one entry of the folder.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass

from steadqd.queue_control import UNIQUE_KEY_MAX
from steadqd.text import printable

__all__ = ["STATE_DIR", "BadRecord", "Intent", "Unreadable", "one_entry", "shown"]

STATE_DIR = ".steadq-inbox"
# What the entries of the state directory end with: an unfinished intent, a kept file's record,
# a taken file waiting to be deleted, and the names records are set aside under.
INTENT, KEPT, FILE, UNRESOLVED, INVALID, TMP = ".intent", ".kept", ".file", ".unresolved", ".invalid", ".tmp"
_JOB_ID = re.compile(r"[0-9a-f]{32}")


def shown(name: str) -> str:
    """A file name as a log line may carry it: undecodable bytes as \\x escapes, controls escaped."""
    return printable(os.fsencode(name).decode("utf-8", "backslashreplace"))


def one_entry(value: object) -> bool:
    """Whether ``value`` names one entry of a directory and nothing beyond it.

    Every name a record holds is used with the folder's (or move_to's, or the
    state directory's) descriptor: an absolute path or one with a ``/`` would
    ignore or leave that directory, and ``..`` would name its parent.
    """
    return isinstance(value, str) and value not in ("", ".", "..") and "/" not in value and "\0" not in value


def _seen(value: object) -> str:
    return shown(value) if isinstance(value, str) else printable(repr(value))


class BadRecord(ValueError):
    """A record that parses but names something the daemon must not act on."""


@dataclass(frozen=True)
class Intent:
    """What step 1 writes down: enough to find the file again and to finish its job."""

    job_id: str
    name: str
    ino: int
    size: int
    mtime_ns: int
    # Where the file is put before the enqueue: a name in move_to ("move"), the
    # state directory's <job id>.file ("delete"), None where it stays ("keep").
    dest: str | None
    # ``inbox.unique``'s key (files.unique_key) when the file was taken with one: the job id is then
    # the key's (steadqd.queue_control.unique_job_id), and the enqueue, also after a crash, uses the key.
    unique: str | None = None

    @property
    def kind(self) -> str:
        """The ``after:`` it was taken with (the config may have changed since)."""
        if self.dest is None:
            return "keep"
        return "delete" if self.dest == self.job_id + FILE else "move"

    def to_json(self) -> bytes:
        # ensure_ascii keeps an undecodable name's surrogate escapes as \udcXX
        d = asdict(self)
        if self.unique is None:
            del d["unique"]  # a record without a key reads as before (and to an older daemon)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, entry: str) -> Intent:
        """The record in state directory entry ``entry``; BadRecord for anything but what
        :meth:`Folder.take` writes (a ValueError of json: a record cut short).

        Checked even though the state directory is verified to be the daemon's: a name
        from a record is used as a path, and one that is not a single entry of the folder
        (absolute, ``..``, ``a/b``) would make the daemon read, move or unlink files
        elsewhere with its privileges.
        """
        d = json.loads(raw)
        if not isinstance(d, dict) or set(d) - {"unique"} != set(cls.__dataclass_fields__) - {"unique"}:
            raise BadRecord("is not an intent record")
        unique = d.get("unique")
        if unique is not None and (
            not isinstance(unique, str)
            or "\0" in unique
            or len(unique.encode("utf-8", "surrogateescape")) > UNIQUE_KEY_MAX
        ):
            raise BadRecord(f"has unique key {_seen(unique)}, not a key of at most {UNIQUE_KEY_MAX} bytes")
        job_id, name, dest = d["job_id"], d["name"], d["dest"]
        if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
            raise BadRecord(f"has job id {_seen(job_id)}, not 32 lowercase hex digits")
        if entry.rsplit(".", 1)[0] != job_id:
            raise BadRecord(f"has job id {job_id}, not the one its name says")
        if not one_entry(name) or name.startswith("."):
            raise BadRecord(f"names {_seen(name)}, not one visible entry of the folder")
        if dest is not None and (not one_entry(dest) or (dest.startswith(".") and dest != job_id + FILE)):
            raise BadRecord(f"puts the file at {_seen(dest)}, not one entry of move_to or the state directory")
        for key in ("ino", "size", "mtime_ns"):
            if type(d[key]) is not int or d[key] < 0:
                raise BadRecord(f"has {key} {_seen(d[key])}, not a number")
        return cls(**d)


@dataclass(frozen=True)
class Unreadable:
    """A state directory entry that is not a record to act on: cut short while written, or bad."""

    entry: str
    why: str
    cut_short: bool
