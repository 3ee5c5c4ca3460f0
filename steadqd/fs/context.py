"""Per-handle state shared by the transition modules.

A :class:`Context` is what one open queue handle knows: the FORMAT, the boot,
the directory cache and barrier policy (:class:`~steadqd.fs.tree.Tree`), the wall
floor, and whether an indeterminate failure has poisoned it. It holds no copy
of the queue's contents: every operation reads the tree.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from steadqd.constants import (
    CONTROL_DIR,
    DEFAULT_MAX_CLOCK_SKEW_NS,
    QUARANTINE_DIR,
    READY_DIR,
    ZFS_MAGIC,
    Modes,
    modes_for_process,
)
from steadqd.errors import ErrorKind, MaintenanceBusy, NotCommitted, QueuePoisoned, SteadQError, kind_for_errno
from steadqd.fs import clock, linux
from steadqd.fs.compiled import bridge
from steadqd.fs.layout import OpenOptions
from steadqd.fs.names import boot_raw, shard_dir
from steadqd.fs.owner import give_to_owner
from steadqd.fs.records import FormatRecord
from steadqd.fs.tree import Tree
from steadqd.fs.watermark import WallFloor


@dataclass
class ShardCandidates:
    """Ready-looking names left from this handle's last chunk of one ready shard.

    The claim scan reads a shard a chunk at a time from the cached directory
    fd's offset and keeps the chunk's untried names here for the next lease
    call. They are hints only: each is opened and verified as usual, and one
    that vanished (claimed elsewhere) simply fails to open.
    """

    names: deque[str] = field(default_factory=deque)
    at_end: bool = False  # the last scan read to the end and found nothing: rewind first


@dataclass
class Context:
    path: str
    root_fd: int
    fmt: FormatRecord
    boot_id: str
    options: OpenOptions
    fs_magic: int
    # How far recovery trusts a wall watermark ahead of CLOCK_REALTIME (fs/clock.py).
    max_clock_skew_ns: int = DEFAULT_MAX_CLOCK_SKEW_NS
    modes: Modes = field(init=False)
    tree: Tree = field(init=False)
    control_fd: int = field(init=False)
    wall: WallFloor = field(init=False)
    boot_raw: bytes = field(init=False)
    nonce: bytes = field(init=False)
    # Why this process may not write or judge boottime deadlines (a time namespace), or None.
    boottime_problem: str | None = field(init=False)
    # "ready/<S>" for every shard S, formatted once: the claim scan looks each one up per lease.
    ready_rels: tuple[str, ...] = field(init=False)
    scan_round: int = 0
    last_enqueued_shard: int | None = None
    # The shard the last claim came from while this handle still holds candidates of it, and how
    # many claims in a row came from it (the claim scan's stay: claim._Scan.stay).
    claim_stay: int | None = None
    claim_streak: int = 0
    claim_candidates: dict[int, ShardCandidates] = field(default_factory=dict)
    # "direct", "proc" (O_TMPFILE + linkat forms) or "named" (temp + rename).
    publication: str = "direct"
    poisoned: str | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    # The C claim core for this queue (bridge), or None: claims in pure Python. Decided at open.
    c_core: Any = field(init=False)

    def __post_init__(self) -> None:
        self.modes = modes_for_process(linux.fstat(self.root_fd), os.geteuid())
        self.tree = Tree(self.root_fd, self.fmt.shard_count, deferred=self.options.deferred, modes=self.modes)
        # The wall floor keeps its own descriptor: a cached one can be evicted
        # (and its number reused) while the handle lives.
        self.control_fd = linux.open_dir(self.root_fd, CONTROL_DIR)
        self.wall = WallFloor(self.control_fd, self.fmt.delayed_width_ns, modes=self.modes)
        self.boot_raw = boot_raw(self.boot_id)
        self.ready_rels = tuple(f"{READY_DIR}/{shard_dir(s)}" for s in range(self.fmt.shard_count))
        self.nonce = linux.getrandom(16)
        self.boottime_problem = clock.boottime_problem()
        if self.fs_magic == ZFS_MAGIC:
            self.publication = "named"
        fmt = self.fmt
        self.c_core = bridge.core_for(fmt.queue_id, fmt.shard_count, fmt.lease_width_ns, fmt.max_payload_length)

    @property
    def queue_id(self) -> bytes:
        return self.fmt.queue_id

    def close(self) -> None:
        # Refuse mutations from now on: the descriptor numbers this context
        # holds get reused by later opens (possibly of another queue).
        self.poison("handle closed")
        self.tree.close()
        linux.close(self.control_fd)

    def check_usable(self) -> None:
        """Refuse mutations after an indeterminate failure (errors.md)."""
        if self.poisoned is not None:
            raise QueuePoisoned(f"queue handle is poisoned after: {self.poisoned}")

    def poison(self, why: str) -> None:
        self.poisoned = self.poisoned or why

    def wall_floor(self) -> int:
        """The wall floor for a mutation; a failure other than lock
        contention poisons the handle (clocks.md)."""
        try:
            return self.wall.for_mutation()
        except MaintenanceBusy:
            raise
        except (SteadQError, OSError) as e:
            self.poison(f"wall floor unavailable: {e}")
            raise

    def shard_candidates(self, shard: int) -> ShardCandidates:
        """This handle's claim-scan candidates for ``shard`` (created empty)."""
        with self.lock:
            cand = self.claim_candidates.get(shard)
            if cand is None:
                cand = self.claim_candidates[shard] = ShardCandidates()
            return cand

    def ready_dir(self, shard: int) -> int:
        """The ready shard directory, recreated if someone deleted it."""
        return self.tree.ensure_dir(self.ready_rels[shard])

    def drained_ready_dirs(self, shards: Iterable[int]) -> list[int | None]:
        """For each of ``shards``, its cached fd if this handle's last scan of it read to its end and kept no names, else None.

        Such a shard is rewound before it is read again, so one read tells
        whether it is still empty: the claim scan probes these together
        (linux.first_listing) instead of doing each one's per-shard work.
        """
        cands, rels = self.claim_candidates, self.ready_rels
        wanted = [rels[s] if (c := cands.get(s)) is not None and c.at_end and not c.names else None for s in shards]
        if not any(wanted):  # most leases that find work: no lock taken
            return [None] * len(wanted)
        return self.tree.cached_fds(wanted)

    def quarantine_dir(self) -> int:
        return self.tree.ensure_dir(QUARANTINE_DIR)

    def new_file_mode(self, fd: int) -> None:
        """Give a file this handle just created the queue's owner (root in another
        user's queue) and the queue's file mode (shared queues)."""
        if self.modes.owner is not None:
            give_to_owner(fd, self.modes.owner)
        if self.modes.enforce:
            linux.fchmod(fd, self.modes.file)

    def random(self, n: int = 16) -> bytes:
        return linux.getrandom(n)


def not_committed(e: OSError, what: str, *, job_id: str | None = None) -> NotCommitted:
    """An errno before linearization: nothing happened."""
    kind = kind_for_errno(e.errno) if e.errno else ErrorKind.IO_FAILURE
    if e.errno in (errno.EACCES, errno.EPERM):
        kind = ErrorKind.IO_FAILURE  # the reference surfaces EACCES as IoFailure
    return NotCommitted(f"{what}: {os.strerror(e.errno) if e.errno else e}", kind, job_id=job_id)
