"""What an operator sets on a queue as a whole, whichever store holds it: the pause record and unique keys.

Why one home: both backends store the same pause record (a file in a
filesystem queue's ``control/``, an object beside a bucket queue's prefix)
and derive a unique job's id the same way, and every reader of the record
must treat it as hostile (a group member wrote it): bounded size, strict
shape, text escaped where it is shown. Neither format knows of either; the
reference implementations never read the record, and a unique job's id is
an ordinary 16-byte job id to them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import socket
from dataclasses import dataclass

from steadqd.errors import InvalidInput
from steadqd.text import printable

__all__ = [
    "PAUSED_BUCKET_LOOK",
    "PAUSE_RECHECK",
    "PAUSE_RECORD_MAX",
    "PauseState",
    "REASON_MAX",
    "UNIQUE_KEY_MAX",
    "decode_pause",
    "encode_pause",
    "new_pause",
    "unique_job_id",
]

PAUSE_RECORD_MAX = 4096  # bytes: a record longer than this is not read (a reader never allocates more)
REASON_MAX = 1000  # characters of --reason
BY_MAX = 256
UNIQUE_KEY_MAX = 1024  # bytes of a unique key (UTF-8)
_UNIQUE_DOMAIN = b"steadq unique job id v1\0"
# s; within one run of claims, the pause is read again before a claim this long after its last read
# (a filesystem read is one open; a bucket's is one GET, so not before every claim of a long run).
PAUSE_RECHECK = 0.5
# s; a consumer of a paused bucket queue reads the pause again this often: a bucket sends no event when
# another host resumes (a filesystem's consumers hear it through inotify on control/).
PAUSED_BUCKET_LOOK = 2.0


@dataclass(frozen=True)
class PauseState:
    """A queue's pause: why, since when (wall ns, 0 if unknown) and who.

    ``problem`` is set when a record is present but cannot be read as one:
    the queue is still paused (the name's presence is the pause; the
    content only annotates it), and ``problem`` says what was wrong.
    """

    reason: str
    since_ns: int
    by: str
    problem: str | None = None

    def summary(self) -> str:
        """One line for a terminal or a log: every field escaped (``printable``), since in UTC."""
        import time

        parts = ["paused"]
        if self.since_ns:
            parts.append("since " + time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(self.since_ns / 1e9)))
        if self.by:
            parts.append(f"by {printable(self.by)}")
        text = " ".join(parts)
        if self.reason:
            text += f": {printable(self.reason)}"
        if self.problem:
            text += f" (pause record unreadable: {printable(self.problem)})"
        return text


def _who() -> str:
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return f"{user}@{socket.gethostname()}"[:BY_MAX]


def new_pause(reason: str, now_ns: int) -> PauseState:
    """The record ``pause`` writes; InvalidInput for a reason too long to keep."""
    if len(reason) > REASON_MAX:
        raise InvalidInput(f"--reason is {len(reason)} characters; give at most {REASON_MAX}")
    return PauseState(reason, now_ns, _who())


def encode_pause(state: PauseState) -> bytes:
    data = json.dumps({"reason": state.reason, "since": state.since_ns, "by": state.by}, ensure_ascii=True)
    return (data + "\n").encode()


def decode_pause(raw: bytes) -> PauseState:
    """The pause a record says; never raises: a malformed record still pauses, with ``problem`` set."""
    if len(raw) > PAUSE_RECORD_MAX:
        return PauseState("", 0, "", f"longer than {PAUSE_RECORD_MAX} bytes")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return PauseState("", 0, "", f"not JSON: {e}")
    if not isinstance(doc, dict) or set(doc) != {"reason", "since", "by"}:
        return PauseState("", 0, "", "not an object of reason, since and by")
    reason, since, by = doc["reason"], doc["since"], doc["by"]
    if not isinstance(reason, str) or not isinstance(by, str) or type(since) is not int or since < 0:
        return PauseState("", 0, "", "a field has the wrong type")
    return PauseState(reason[:REASON_MAX], since, by[:BY_MAX])


def unique_job_id(queue_id: str, key: str) -> str:
    """The job id of the job enqueued with unique ``key`` in the queue ``queue_id`` (32 hex).

    A hash, so that every producer of the key, on any host, names the same
    job, and the store's own no-replace create (a bucket's put-if-absent of
    the job record) decides which producer made it. SHA-256 output is as
    uniform as the random ids both formats draw, so shard placement is as
    even; it is not secret, and need not be: a producer who may enqueue may
    also enqueue the key itself.
    """
    raw = key.encode("utf-8", "surrogateescape")
    if not raw:
        raise InvalidInput("--unique needs a key: give a non-empty string")
    if len(raw) > UNIQUE_KEY_MAX:
        raise InvalidInput(f"the unique key is {len(raw)} bytes; give at most {UNIQUE_KEY_MAX}")
    return hashlib.sha256(_UNIQUE_DOMAIN + bytes.fromhex(queue_id) + b"\0" + raw).digest()[:16].hex()
