"""Every fixed fact of the SteadQ/1 format, in one place.

Other modules import these names rather than repeating literals, so that a
reader can check the whole format against ``shared/spec/`` from this file.
Nothing here does I/O.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, replace

# --- Domain-separation strings (records.md): each ends with one NUL byte. ---
DOMAIN_FORMAT = b"SteadQ-1-format\0"
DOMAIN_ENVELOPE = b"SteadQ-1-envelope\0"
DOMAIN_RECEIPT = b"SteadQ-1-receipt\0"
DOMAIN_WATERMARK = b"SteadQ-1-wall-watermark\0"
DOMAIN_NAME = b"SteadQ-1-name\0"
DOMAIN_SHARD = b"SteadQ-1-shard\0"
DOMAIN_SCAN = b"SteadQ-1-scan\0"
DOMAIN_JITTER = b"SteadQ-1-jitter\0"

# --- Record magics and sizes. ---
FORMAT_MAGIC = b"SDQFMT1\0"
JOB_MAGIC = b"SDQJOB1\0"
RECEIPT_MAGIC = b"SDQRCPT\0"
WATERMARK_MAGIC = b"SDQWMR1\0"

FORMAT_MAJOR = 1
FORMAT_MINOR = 1  # written everywhere; never checked on read except compact receipts

FORMAT_SIZE = 160
HEADER_SIZE = 128
COMPACT_RECEIPT_SIZE = 128
WATERMARK_SIZE = 64

DIGEST_SHA256 = 1
NAME_TAG_BITS = 64
NAME_TAG_BYTES = 8
ID_BYTES = 16

# --- Limits. ---
MAX_PAYLOAD_LENGTH = (1 << 40) - 1
MAX_EXTENSION_LENGTH = 65_536
MAX_CONTENT_TYPE = 255
MAX_METADATA_ENTRIES = 256
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 4096
MAX_PRODUCER_ID = 255
MAX_TRACE_CONTEXT = 1024
MAX_CBOR_MAP_DECLARED = 2048
MAX_SHARDS = 4096
U16_MAX = (1 << 16) - 1
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
I63_MAX = (1 << 63) - 1
# A job's maximum_attempts (u32 >= 1, spec README job fields): a job allowed no attempt could never be leased.
MIN_MAXIMUM_ATTEMPTS = 1
MAX_MAXIMUM_ATTEMPTS = U32_MAX

NS_PER_SECOND = 1_000_000_000
MIN_LEASE_NS = 1 * NS_PER_SECOND
MAX_LEASE_NS = 7 * 24 * 3600 * NS_PER_SECOND
MIN_TERMINAL_WIDTH_NS = 60 * NS_PER_SECOND
MAX_TERMINAL_WIDTH_NS = 86_400 * NS_PER_SECOND

# --- FORMAT defaults (layout.md). ---
DEFAULT_SHARDS = 64
DEFAULT_LEASE_WIDTH_NS = 10 * NS_PER_SECOND
DEFAULT_DELAYED_WIDTH_NS = 10 * NS_PER_SECOND
DEFAULT_TERMINAL_WIDTH_NS = 3600 * NS_PER_SECOND

# --- Per-handle defaults (clocks.md), not stored on disk. ---
DEFAULT_RECEIPT_RETENTION_NS = 7 * 24 * 3600 * NS_PER_SECOND
DEFAULT_TEMP_TTL_NS = 24 * 3600 * NS_PER_SECOND
# How far recovery trusts a wall watermark that is ahead of this host's
# CLOCK_REALTIME (fs/clock.py): promotion, retention and reap-to-dead go by
# at most local time + this, so one process with a clock set ahead cannot
# delete or deliver anything early.
DEFAULT_MAX_CLOCK_SKEW_NS = 5 * 60 * NS_PER_SECOND
# Claim scans read a ready shard this many bytes of directory entries at a
# time (claim.py): a few hundred names, whatever the depth of the queue.
CLAIM_SCAN_CHUNK_BYTES = 32 * 1024
# A job file's envelope is read with one pread of up to this many bytes
# (verify.py): header, extension and a small payload in one system call.
ENVELOPE_READ_BYTES = 4096
MAX_RETENTION_PROBE_BUCKETS = 4096  # ceil(retention / terminal width) + 2 must not exceed this
# Queue.enqueue_many holds at most this many unlinked job files open at once
# (publish.py): one group of fsyncs, then its links; a longer input is
# published group by group, so a huge iterable cannot exhaust descriptors.
ENQUEUE_MANY_GROUP = 256

# --- The tree (layout.md). ---
FORMAT_FILE = "FORMAT"
INITIALIZING_FILE = ".initializing"
CONTROL_DIR = "control"
READY_DIR = "ready"
LEASED_DIR = "leased"  # legacy layout: never written, still reaped
DELAYED_DIR = "delayed"
RECEIPTS_DIR = "receipts"
DEAD_DIR = "dead"
QUARANTINE_DIR = "quarantine"
TMP_DIR = "tmp"
# Order in which init creates them (layout.md, init step 9).
STATE_DIRS = (CONTROL_DIR, TMP_DIR, READY_DIR, LEASED_DIR, DELAYED_DIR, RECEIPTS_DIR, DEAD_DIR, QUARANTINE_DIR)

MAINTENANCE_LOCK = "maintenance.lock"
WATERMARK_LOCK = "wall-watermark.lock"
RECOVERY_LOCK = "recovery.lock"
WATERMARK_FILE = "wall-watermark"
RECOVERY_CURSOR_FILE = "recovery-cursor.json"
CONTROL_LOCKS = (MAINTENANCE_LOCK, WATERMARK_LOCK, RECOVERY_LOCK)

WATERMARK_INIT_TMP_PREFIX = ".wm.tmp."
WATERMARK_ADVANCE_TMP_PREFIX = ".wm.adv."
FORMAT_TMP_PREFIX = ".format.tmp."
COMPACT_TMP_PREFIX = ".compact-"

JOB_EXT = ".sqj"
RECEIPT_EXT = ".rct"
TEMP_EXT = ".tmp"
QUARANTINE_EXT = ".raw"

DIR_MODE = 0o700
FILE_MODE = 0o600
FORMAT_MODE = 0o400
PARENT_DIR_MODE = 0o755  # parents `init` creates above the queue root, like mkdir -p


@dataclass(frozen=True)
class Modes:
    """Permission bits for what the library creates inside one queue.

    A queue whose root is setgid and group-writable (what ``init --shared``
    makes) is *shared*: producers and daemons in that group must be able to
    write into every directory and read every file, so group bits are set on
    everything the library creates. Otherwise the reference's owner-only modes
    are used (subject to the umask, like the reference): a root the group may
    merely read is how a umask-022 ``mkdir`` leaves any directory, not a
    decision to share. The mode of the root is the only switch, so every
    process agrees without configuration, and the reference reads either kind.
    """

    dir: int
    file: int
    format: int
    # Shared queues set the modes explicitly after creating anything: they must
    # not depend on the umask of whichever member happened to create an entry.
    enforce: bool = False
    # (uid, gid) that everything this process creates is given to, or None.
    # Set when root works in a queue another user owns (a root `steadq put`
    # into the daemon's queue): a root-owned 0600 job would be a job the
    # queue's owner can never lease, so root hands each new entry to the owner.
    owner: tuple[int, int] | None = None


PRIVATE_MODES = Modes(DIR_MODE, FILE_MODE, FORMAT_MODE)
SHARED_MODES = Modes(0o2770, 0o660, 0o440, enforce=True)
SHARED_ROOT_MODE = 0o2770  # setgid: everything created inside keeps the queue's group


_SHARED_ROOT_BITS = 0o2020  # S_ISGID | S_IWGRP: both, or the queue is private


def modes_for_root(st_mode: int) -> Modes:
    return SHARED_MODES if st_mode & _SHARED_ROOT_BITS == _SHARED_ROOT_BITS else PRIVATE_MODES


def modes_for_process(root: os.stat_result, euid: int) -> Modes:
    """The modes a process with effective uid ``euid`` creates entries with in the queue whose root is ``root``.

    Root working in a queue another user owns gives every new entry to the
    root directory's owner and group (:attr:`Modes.owner`), so that the queue
    stays one user's (or one group's) tree whoever produced into it."""
    modes = modes_for_root(root.st_mode)
    if euid == 0 and root.st_uid != 0:
        return replace(modes, owner=(root.st_uid, root.st_gid))
    return modes


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# This process's time-namespace clock offsets (Linux >= 5.6; absent means none).
TIMENS_OFFSETS_PATH = "/proc/self/timens_offsets"


class State(enum.StrEnum):
    """A job object's state; the value is the word used in tag contexts and CLI output."""

    READY = "ready"
    LEASED = "leased"
    DELAYED = "delayed"
    DEAD = "dead"
    RECEIPT = "receipt"


# Tag-context first component per state: receipts use the plural directory name.
TAG_STATE_WORD = {
    State.READY: "ready",
    State.LEASED: "leased",
    State.DELAYED: "delayed",
    State.DEAD: "dead",
    State.RECEIPT: "receipts",
}


class QuarantineReason(enum.IntEnum):
    """Quarantine reason registry (reference/reasons.md)."""

    ENVELOPE_CORRUPT = 0x0001
    PAYLOAD_CORRUPT = 0x0002
    FILENAME_PARSE_FAILED = 0x0003
    FILENAME_TAG_FAILED = 0x0004
    FILENAME_HEADER_MISMATCH = 0x0005
    UNSUPPORTED_REQUIRED_FEATURE = 0x0006
    DUPLICATE_STATE_CONFLICT = 0x0007
    NON_REGULAR_FILE = 0x0008
    UNEXPECTED_HARD_LINK = 0x0009
    CROSS_DEVICE_OBJECT = 0x000A
    IMPOSSIBLE_STATE_TRANSITION = 0x000B


class DeadReason(enum.IntEnum):
    """Dead-letter reason registry; 0x0100-0x7fff application, 0x8000-0xffff private."""

    UNSPECIFIED = 0x0000
    CONSUMER_REJECTED = 0x0001
    UNSUPPORTED_CONTENT_TYPE = 0x0002
    ADMINISTRATIVE_BURY = 0x0003
    ATTEMPTS_EXHAUSTED = 0x0004
    # Private use (0x8000-0xffff): this implementation's own. `steadq cancel` dead-letters a job with it, so
    # an operator's cancel is told apart from a consumer's bury in `show`, `ls dead`, `admin requeue --reason`.
    CANCELLED = 0x8000


# The outcomes below are part of what every backend promises (its callers
# branch on them), so they live here rather than beside one implementation.


class AckResult(enum.Enum):
    """What an acknowledgement found: it settled the job now, or a receipt says it already was."""

    ACKED = "acked"
    ALREADY_ACKED = "already_acked"


class CancelResult(enum.Enum):
    """What a cancel found: it dead-lettered the job now, or the job had already settled (nothing changed)."""

    CANCELLED = "cancelled"
    # A bucket job someone holds (or not claimable yet): its holder buries it at its next renewal (s3/cancel.py).
    REQUESTED = "requested"
    ALREADY_ACKED = "already_acked"
    ALREADY_DEAD = "already_dead"


@dataclass(frozen=True)
class Cancellation:
    """The outcome of one cancel, as the operator is told it.

    ``was`` is the state the job was found in by the move that decided the
    outcome: ``ready``, ``delayed`` or ``leased`` (running) when it was
    cancelled now; ``receipt`` or ``dead`` when it had already settled.
    ``reason`` is the dead reason of an already dead job (a second cancel
    says ``cancelled``).
    """

    result: CancelResult
    was: str
    reason: int | None = None


class Resolution(enum.Enum):
    """What resolving an indeterminate transition concluded (errors.md combination table)."""

    SOURCE_OBSERVED = "source_observed"
    SOURCE_STABILIZED = "source_stabilized"
    DESTINATION_OBSERVED = "destination_observed"
    DESTINATION_STABILIZED = "destination_stabilized"
    NEITHER_OBSERVED = "neither_observed"
    BOTH_OBSERVED = "both_observed"
    CONFLICTING_OBJECT = "conflicting_object"
    RESOLUTION_FAILED = "resolution_failed"


# statfs f_type magics (layout.md), compared as unsigned 32-bit values.
SUPPORTED_FILESYSTEMS = {
    0xEF53: "ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0xF00D: "f2fs",
    0xF2F52010: "f2fs",
    0x2FC12FC1: "zfs",
}
ZFS_MAGIC = 0x2FC12FC1  # forces named-temp publication
REFUSED_FILESYSTEMS = {
    0x01021994: "tmpfs",
    0x6969: "nfs",
    0x65735546: "fuse",
    0x794C7630: "overlayfs",
}

# The retry backoff when nobody configured one: the daemon's `retry:` defaults and the
# Python worker API's (steadqd.tasks) are this one policy.
DEFAULT_BACKOFF_BASE_S = 1.0
DEFAULT_BACKOFF_MAX_S = 300.0


def runtime_dirs(kind: str, override_env: str) -> list[str]:
    """Where this host's processes meet for ``kind`` (doorbells, published progress), in the order they try them.

    One rule for every such place: ``$<override_env>`` alone when set; else
    ``/run/steadq/<kind>`` (made by the package's tmpfiles.d for the units and the
    group), then ``$XDG_RUNTIME_DIR/steadq/<kind>`` for a user's own processes.
    """
    override = os.environ.get(override_env)
    if override:
        return [override]
    found = [f"/run/steadq/{kind}"]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        found.append(os.path.join(runtime, "steadq", kind))
    return found
