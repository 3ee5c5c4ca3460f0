"""Leases: the Lease object, validating its source, and renewal.

A lease is a capability: the exact leased file (its path, which encodes the
generation, deadlines and token, and its inode). Every use first proves the
file is still exactly that (protocol.md "Validating the current lease
source"); if it is gone the lease is lost, if it is something else the
queue is corrupt and the handle refuses further mutations.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from steadqd.constants import (
    ENVELOPE_READ_BYTES,
    HEADER_SIZE,
    LEASED_DIR,
    MAX_LEASE_NS,
    MIN_LEASE_NS,
    NS_PER_SECOND,
    READY_DIR,
    U64_MAX,
    State,
)
from steadqd.errors import (
    ErrorKind,
    InvalidInput,
    LeaseLost,
    NotCommitted,
    OutcomeUnknown,
    QueueCorrupt,
    SteadQError,
    kind_for_errno,
)
from steadqd.fs import linux
from steadqd.fs.clock import refuse_boottime
from steadqd.fs.context import Context, not_committed
from steadqd.fs.json_records import LeasedLocation, Location, TransitionTicket
from steadqd.fs.names import (
    JobName,
    authenticate,
    boot_dashed,
    boot_raw,
    lease_bucket,
    leased_name,
    make_filename,
    next_generation,
    parse_bucket_dir,
    parse_job_id,
    parse_name,
    parse_shard_dir,
    shard_of,
)
from steadqd.fs.records import Extension, FormatRecord, decode_extension
from steadqd.fs.tree import Collision, Indeterminate, MoveFailed, SourceChanged, SourceMissing, Witness
from steadqd.fs.verify import Envelope, forget_verified, read_envelope, verified_head


@dataclass(eq=False)
class Lease:
    """A claimed job. Pass it back to renew/ack/retry/bury on the same queue.

    ``job_id`` is the 32-hex id; ``path`` is the exact relative path of the
    leased file (the handle file's ``exact_source_path``).
    """

    queue_id: bytes
    job_id: str
    generation: int
    attempt: int
    max_attempts: int
    token: bytes
    boot_id: str
    boottime_deadline_ns: int
    wall_deadline_ns: int
    dev: int
    ino: int
    path: str
    envelope_digest: bytes
    payload_length: int
    payload_digest: bytes
    content_type: str
    extension: Extension | None = None
    _reader: Any = field(default=None, repr=False)

    @property
    def metadata(self) -> dict[str, bool | int | str | bytes]:
        if self.extension is None and self._reader is not None:
            self.extension = self._reader.read_extension(self)
        if self.extension is None or not self.extension.metadata:
            return {}
        return dict(self.extension.metadata)

    @property
    def producer_id(self) -> str | None:
        return self.extension.producer_id if self.extension else None

    @property
    def job_id_bytes(self) -> bytes:
        return bytes.fromhex(self.job_id)

    def payload(self) -> bytes:
        """The payload, re-read from the leased file and verified against its digest."""
        if self._reader is None:
            raise InvalidInput("lease is not bound to an open queue")
        return self._reader.read_payload(self)

    def copy_payload_to(self, out: Any) -> int:
        """Stream the payload into a binary file; raises after the copy if corrupt."""
        if self._reader is None:
            raise InvalidInput("lease is not bound to an open queue")
        return self._reader.copy_payload(self, out)

    # -- handle file (cli.md "Lease handle file") ----------------------------

    def to_handle(self, queue_root: str) -> str:
        doc = {
            "queue_root": queue_root,
            "queue_id": self.queue_id.hex(),
            "job_id": self.job_id,
            "generation": self.generation,
            "attempt": self.attempt,
            "maximum_attempts": self.max_attempts,
            "token": self.token.hex(),
            "boot_id": self.boot_id,
            "expires_boottime_ns": self.boottime_deadline_ns,
            "expires_wall_ns": self.wall_deadline_ns,
            "expected_dev": self.dev,
            "expected_inode": self.ino,
            "exact_source_path": self.path,
            "envelope_digest": self.envelope_digest.hex(),
            "content_type": self.content_type,
            "payload_length": self.payload_length,
            "payload_digest": self.payload_digest.hex(),
        }
        return json.dumps(doc, indent=2)

    @classmethod
    def from_handle(cls, text: str) -> tuple[Lease, str | None]:
        """Parse a handle file; returns the lease and its queue_id (hex or None)."""
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:
            # RecursionError: deeply nested arrays in a forged handle file.
            raise InvalidInput(f"handle file is not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise InvalidInput("handle file must hold a JSON object")

        def need(key: str, kind: type) -> Any:
            if key not in doc:
                raise InvalidInput(f"handle file lacks {key!r}")
            v = doc[key]
            if kind is int and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= U64_MAX):
                raise InvalidInput(f"handle file field {key!r} must be an unsigned integer")
            if kind is str and not isinstance(v, str):
                raise InvalidInput(f"handle file field {key!r} must be a string")
            return v

        def hexfield(key: str, nbytes: int) -> bytes:
            v = need(key, str)
            # Character check first: bytes.fromhex skips whitespace, so "00 11…" of the
            # right length would otherwise decode to a shorter token/digest.
            if len(v) != 2 * nbytes or any(c not in "0123456789abcdef" for c in v):
                raise InvalidInput(f"handle file field {key!r} must be {2 * nbytes} lowercase hex digits")
            return bytes.fromhex(v)

        queue_id = doc.get("queue_id")
        if queue_id is not None:
            queue_id_b = hexfield("queue_id", 16)
        job = parse_job_id(need("job_id", str))
        boot = need("boot_id", str)
        boot_raw(boot)  # validates the canonical form
        lease = cls(
            queue_id=queue_id_b if queue_id is not None else b"",
            job_id=job.hex(),
            generation=need("generation", int),
            attempt=need("attempt", int),
            max_attempts=need("maximum_attempts", int),
            token=hexfield("token", 16),
            boot_id=boot,
            boottime_deadline_ns=need("expires_boottime_ns", int),
            wall_deadline_ns=need("expires_wall_ns", int),
            dev=need("expected_dev", int),
            ino=need("expected_inode", int),
            path=need("exact_source_path", str),
            envelope_digest=hexfield("envelope_digest", 32),
            payload_length=need("payload_length", int),
            payload_digest=hexfield("payload_digest", 32),
            content_type=need("content_type", str),
        )
        return lease, queue_id

    def location(self) -> LeasedLocation:
        return LeasedLocation(self.boot_id, self.boottime_deadline_ns, self.wall_deadline_ns)


def lease_duration_ns(seconds: float) -> int:
    """Lease durations are 1 s .. 7 days inclusive (clocks.md)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds != seconds:
        raise InvalidInput(f"lease duration must be a number of seconds, got {seconds!r}")
    # round() of an infinite product (inf, or 1e300 s) would raise OverflowError.
    ns = round(seconds * NS_PER_SECOND) if math.isfinite(seconds * NS_PER_SECOND) else None
    if ns is None or not MIN_LEASE_NS <= ns <= MAX_LEASE_NS:
        raise InvalidInput(f"lease duration {seconds} s is outside 1 s .. 604800 s (7 days)")
    return ns


# lease_duration_ns memoised, for an exact float or int only (hashable; a bool is neither): every
# lease converts its duration, nearly always the same value, and for these the conversion is pure.
# An error is never cached; any other type goes to lease_duration_ns itself.
plain_duration_ns = functools.lru_cache(maxsize=64)(lease_duration_ns)


def make_ticket(
    ctx: Context, lease: Lease, operation: str, phase: str, destination: Location, *, source: Location | None = None
) -> TransitionTicket:
    return TransitionTicket(
        queue_id=ctx.queue_id,
        operation=operation,
        phase=phase,
        job_id=lease.job_id_bytes,
        generation=lease.generation,
        attempt=lease.attempt,
        maximum_attempts=lease.max_attempts,
        lease_token=lease.token,
        envelope_digest=lease.envelope_digest,
        payload_length=lease.payload_length,
        source=source if source is not None else lease.location(),
        destination=destination,
    )


def indeterminate(
    ctx: Context, lease: Lease, operation: str, e: Indeterminate, destination: Location
) -> OutcomeUnknown:
    """Poison the handle and describe where the object may now be."""
    ctx.poison(f"{operation} of {lease.job_id}: {e.cause}")
    ticket = make_ticket(ctx, lease, operation, e.phase, destination)
    return OutcomeUnknown(f"{operation} outcome unknown: {e.cause}", ticket)


class Source:
    """A validated lease source: the open file and where it is.

    A plain slotted class (every payload() and ack makes one); ``witness`` is
    the envelope's, stored rather than a property because each settlement reads it.
    """

    __slots__ = ("dir_fd", "dir_rel", "name", "fd", "envelope", "witness")

    def __init__(self, dir_fd: int, dir_rel: str, name: str, fd: int, envelope: Envelope) -> None:
        self.dir_fd = dir_fd
        self.dir_rel = dir_rel
        self.name = name
        self.fd = fd
        self.envelope = envelope
        self.witness: Witness = envelope.witness

    def __repr__(self) -> str:
        return f"Source(dir_fd={self.dir_fd}, dir_rel={self.dir_rel!r}, name={self.name!r}, fd={self.fd})"

    def close(self) -> None:
        # Read-only fd: a close error cannot undo or redo the move that may
        # just have committed, so it must not replace the real outcome.
        linux.close_quietly(self.fd)


def _corrupt(ctx: Context, poison: bool, why: str) -> QueueCorrupt:
    if poison:
        ctx.poison(why)
    return QueueCorrupt(why)


@dataclass(frozen=True, init=False)
class _PathFacts:
    """What a lease path proves by itself, before any file is opened.

    ``early_error`` / ``late_error`` are the structural and the tag/bucket
    failures, kept apart so validate_source reports them in protocol order
    around the checks that compare the path with the lease and the boot.

    Every claim makes one (remember_own_lease_path). The constructor updates the instance's
    ``__dict__`` in the fields' order, where the generated one would set each field through
    ``object.__setattr__``: ~4,400 instructions fewer a construction (callgrind), and the dict
    stays the class's shared-key one, so a read costs what it did (not so when ``__dict__`` is replaced).
    """

    parts: tuple[str, ...]
    shard: int | None = None
    name: JobName | None = None
    path_boot: str = ""
    early_error: str | None = None
    late_error: str | None = None
    dir_rel: str = ""  # the lease's directory (set with a name): joined once per path, not per use

    def __init__(
        self,
        parts: tuple[str, ...],
        shard: int | None = None,
        name: JobName | None = None,
        path_boot: str = "",
        early_error: str | None = None,
        late_error: str | None = None,
        dir_rel: str = "",
    ) -> None:
        self.__dict__.update({
            "parts": parts, "shard": shard, "name": name, "path_boot": path_boot, "early_error": early_error,
            "late_error": late_error, "dir_rel": dir_rel,
        })  # fmt: skip


_FactsKey = tuple[bytes, int, int, str]
_FACTS: dict[_FactsKey, _PathFacts] = {}
_FACTS_MAX = 1024  # a few hundred live leases per process at most; a full memo just starts over


def _path_facts(queue_id: bytes, shard_count: int, lease_width_ns: int, path: str) -> _PathFacts:
    """Parse and authenticate a lease path: a pure function of these four values.

    It is memoised because every use of a lease (payload(), ack, retry, bury,
    renew) validates the same path again; the filesystem checks that follow
    it in validate_source are never cached.
    """
    key = (queue_id, shard_count, lease_width_ns, path)
    facts = _FACTS.get(key)
    if facts is None:
        facts = _compute_path_facts(*key)
        _remember_facts(key, facts)
    return facts


def _facts_key(fmt: FormatRecord, path: str) -> _FactsKey:
    """The memo's key of lease ``path`` in the queue of ``fmt``: the values _path_facts is a function of."""
    return (fmt.queue_id, fmt.shard_count, fmt.lease_width_ns, path)


def _remember_facts(key: _FactsKey, facts: _PathFacts) -> None:
    if len(_FACTS) >= _FACTS_MAX:
        _FACTS.clear()
    _FACTS[key] = facts


def remember_own_lease_path(ctx: Context, dir_rel: str, path: str, shard: int, name: JobName) -> None:
    """Record what a lease path built by this process proves, without authenticating it again.

    A claim or renew has just made the name ``name`` (untagged: only its fields
    are compared with a lease, never its tag) with ``make_filename`` (tag
    included) in ``dir_rel`` (``ready/<shard>``), giving ``path``: the path
    authenticates by construction, and its boot is this handle's (``name``
    carries ``ctx.boot_raw``), so the facts are assembled from what the caller
    holds instead of parsed again. Every filesystem check of validate_source still runs.
    """
    _remember_facts(
        _facts_key(ctx.fmt, path), _PathFacts(tuple(path.split("/")), shard, name, ctx.boot_id, dir_rel=dir_rel)
    )


def forget_settled(ctx: Context, lease: Lease) -> None:
    """Drop what the memos hold for ``lease`` once it is acknowledged (no use of it can follow but a
    repeated ack, which finds the receipt): its path's facts (_FACTS) and its verified envelope
    (verify.py's). Left there until a full memo starts over, each job's entries (a dozen tracked
    objects) would keep the cyclic GC's allocation count rising, and the GC running every few
    dozen lifecycles; dropped, they are freed and the count falls back."""
    _FACTS.pop(_facts_key(ctx.fmt, lease.path), None)
    forget_verified(lease.dev, lease.ino)


def _compute_path_facts(queue_id: bytes, shard_count: int, lease_width_ns: int, path: str) -> _PathFacts:
    parts = tuple(path.split("/"))
    if len(parts) == 3 and parts[0] == READY_DIR:
        shard = parse_shard_dir(parts[1], shard_count)
        path_bucket = None
    elif len(parts) == 5 and parts[0] == LEASED_DIR:
        shard = parse_shard_dir(parts[3], shard_count)
        path_bucket = parse_bucket_dir(parts[2])
        if path_bucket is None:
            return _PathFacts(parts, early_error=f"lease path has an invalid bucket: {path}")
    else:
        return _PathFacts(parts, early_error=f"lease path is not a leased object path: {path}")
    if shard is None:
        return _PathFacts(parts, early_error=f"lease path has an invalid shard: {path}")
    try:
        name = parse_name(State.LEASED, parts[-1])
    except SteadQError as e:
        return _PathFacts(parts, early_error=f"lease path does not end in a leased name: {e}")
    path_boot = boot_dashed(name.boot_id or b"")
    if parts[0] == LEASED_DIR and parts[1] != path_boot:
        return _PathFacts(parts, early_error="legacy lease directory boot id differs from the name")
    late_error = None
    if path_bucket is not None and path_bucket != lease_bucket(name.boottime_deadline or 0, lease_width_ns):
        late_error = "legacy lease bucket does not match its deadline"
    elif not authenticate(queue_id, name, shard=shard, lease_width_ns=lease_width_ns):
        late_error = "leased name tag does not authenticate"
    return _PathFacts(parts, shard, name, path_boot, late_error=late_error, dir_rel="/".join(parts[:-1]))


def checked_path(
    ctx: Context, lease: Lease, poison: bool, job: bytes | None, shard: int | None = None
) -> tuple[_PathFacts, bytes]:
    """validate_source's checks that make no syscall, in its order: the handle's fields, the path's
    grammar, tag, boot and shard against the lease; (the path's facts, the job id). The C ack's caller
    (settle.ack) makes them before the core's open, with the job's ``shard`` it computed already
    (shard_of is pure and raised nothing there, so the comparison is the same)."""
    fmt = ctx.fmt
    if lease.dev == 0 or lease.ino == 0:
        raise _corrupt(ctx, poison, "lease handle has a zero device or inode (forged handle)")
    if lease.queue_id and lease.queue_id != fmt.queue_id:
        raise InvalidInput("lease belongs to another queue (queue_id differs)")
    key = _facts_key(fmt, lease.path)
    facts = _FACTS.get(key)  # _path_facts' memo
    if facts is None:
        facts = _path_facts(*key)
    if facts.early_error is not None:
        raise _corrupt(ctx, poison, facts.early_error)
    name, path_boot = facts.name, facts.path_boot
    assert name is not None and facts.shard is not None
    if path_boot != ctx.boot_id:
        raise InvalidInput(f"lease was taken in boot {path_boot}, this is boot {ctx.boot_id}; recovery will reap it")
    if path_boot != lease.boot_id:
        raise _corrupt(ctx, poison, "lease boot id differs from its path")
    if job is None:
        job = lease.job_id_bytes
    if shard is None:
        shard = shard_of(fmt.queue_id, job, fmt.shard_count)
    if shard != facts.shard:
        raise _corrupt(ctx, poison, "lease path is in the wrong shard for its job")
    if (
        name.job_id,
        name.generation,
        name.attempt,
        name.max_attempts,
        name.lease_token,
        name.boottime_deadline,
        name.wall_deadline,
    ) != (
        job,
        lease.generation,
        lease.attempt,
        lease.max_attempts,
        lease.token,
        lease.boottime_deadline_ns,
        lease.wall_deadline_ns,
    ):
        raise _corrupt(ctx, poison, "leased name does not match the lease")
    if facts.late_error is not None:
        raise _corrupt(ctx, poison, facts.late_error)
    return facts, job


def validate_source(
    ctx: Context, lease: Lease, *, poison: bool = True, moving: bool = False, job: bytes | None = None
) -> Source:
    """Prove the lease's exact file is still in place and unchanged.

    Raises LeaseLost when it is gone, QueueCorrupt (poisoning the handle for
    mutations) when something else is there, InvalidInput for a lease of
    another boot. ``moving``: the caller's next step on the path is a
    witnessed move of it, whose stat right before the rename proves that the
    path still names the opened file (with the same outcomes: gone is
    LeaseLost, another file poisons); a second stat here would ask the same.
    ``job``: ``lease.job_id_bytes``, when the caller has it already (ack).
    """
    facts, job = checked_path(ctx, lease, poison, job)
    fmt = ctx.fmt
    dir_rel = facts.dir_rel
    parts = facts.parts
    try:
        dir_fd = ctx.tree.dir(dir_rel)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise LeaseLost(f"lease directory {dir_rel} is gone") from e
        if e.errno == errno.ENOTDIR:
            raise _corrupt(ctx, poison, f"{dir_rel} is not a directory") from e
        raise not_committed(e, f"open {dir_rel}") from e
    try:
        fd = linux.open_at(dir_fd, parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise LeaseLost(f"lease of job {lease.job_id} is gone (acked, retried, reaped or lost)") from e
        if e.errno == errno.ELOOP:
            raise _corrupt(ctx, poison, "leased path is a symlink") from e
        raise not_committed(e, "open leased file") from e
    try:
        st = linux.fstat(fd)
        if (st.st_dev, st.st_ino) != (lease.dev, lease.ino):
            raise _corrupt(ctx, poison, "leased path names another file than the lease")
        try:
            env = read_envelope(fd, fmt.max_payload_length, st)
        except SteadQError as e:
            raise _corrupt(ctx, poison, f"leased file is corrupt: {e.message}") from e
        h = env.header
        if (h.job_id, h.max_attempts, h.envelope_digest, h.payload_length, h.payload_digest) != (
            job,
            lease.max_attempts,
            lease.envelope_digest,
            lease.payload_length,
            lease.payload_digest,
        ):
            raise _corrupt(ctx, poison, "leased file header does not match the lease")
        if moving:
            return Source(dir_fd, dir_rel, parts[-1], fd, env)
        try:
            again = linux.stat_at(dir_fd, parts[-1])
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise LeaseLost(f"lease of job {lease.job_id} is gone") from e
            raise not_committed(e, "stat leased file") from e
        if (again.st_dev, again.st_ino) != (lease.dev, lease.ino):
            raise _corrupt(ctx, poison, "leased path was replaced while validating")
        return Source(dir_fd, dir_rel, parts[-1], fd, env)
    except BaseException:
        linux.close(fd)
        raise


# The most a payload can be and still be whole in the envelope's first read (with no extension).
_HEAD_PAYLOAD_MAX = ENVELOPE_READ_BYTES - HEADER_SIZE


def core_payload(ctx: Context, lease: Lease, core: Any) -> tuple[bytes | None, Any]:
    """payload()'s happy path through the C core (bridge.Core.read_payload), checked_path's pure checks first.

    The core makes validate_source's syscalls from its open (open, fstat, first read, stat) and its
    checks, and verify.read_payload's digest of a payload the first read holds. (payload, None): read
    and verified, the file closed. (None, record): the core deviated somewhere; the caller runs the
    Python payload() from the start with the record's syscalls replayed (bridge.replaying), so every
    error, quarantine and later syscall is the Python's. (None, None): the core does not apply (a
    payload too long for the first read, the lease's directory not open in the tree, a Lease made by
    hand with fields of other types): the Python runs as it is. verify.py's memo is read as the Python
    reads it (a first read byte for byte the remembered one is not decoded or hashed again) but not
    filled: it only ever holds bytes that verified, whatever the core read since.
    """
    facts, job = checked_path(ctx, lease, False, None)
    pl = lease.payload_length
    if type(pl) is not int or pl > _HEAD_PAYLOAD_MAX:
        return None, None
    dir_fd = ctx.tree.cached_fd(facts.dir_rel)
    if dir_fd is None:
        return None, None
    try:
        known = verified_head(lease.dev, lease.ino)  # verify.py's memo, which the Python read would consult
        _, a, payload = core.read_payload(lease, job, dir_fd, facts.parts[-1], known)
    except (OverflowError, TypeError):  # a lease field C does not compare as the Python (before any syscall)
        return None, None
    if payload is None:
        return None, a
    linux.close_quietly(a.fd)  # Source.close: a read-only descriptor
    return payload, None


def renew(ctx: Context, lease: Lease, duration_ns: int) -> Lease:
    """Extend a lease: rename to a name with new deadlines (protocol.md "Renew")."""
    ctx.check_usable()
    refuse_boottime(ctx.boottime_problem, "renew")
    fmt = ctx.fmt
    bt = linux.boottime_ns()
    wall = ctx.wall_floor()
    bt_deadline, wall_deadline = bt + duration_ns, wall + duration_ns
    if bt_deadline > U64_MAX or wall_deadline > U64_MAX:
        raise InvalidInput("lease deadline overflows u64")
    generation = next_generation(lease.generation)
    job = lease.job_id_bytes
    shard = shard_of(fmt.queue_id, job, fmt.shard_count)
    target = leased_name(
        job,
        generation,
        lease.attempt,
        lease.max_attempts,
        boot_id=ctx.boot_raw,
        boottime_deadline=bt_deadline,
        wall_deadline=wall_deadline,
        lease_token=lease.token,
    )
    target_file = make_filename(fmt.queue_id, target, shard=shard, lease_width_ns=fmt.lease_width_ns)
    src = validate_source(ctx, lease, moving=True)
    try:
        dst_fd = ctx.ready_dir(shard)
        destination = LeasedLocation(ctx.boot_id, bt_deadline, wall_deadline)
        try:
            ctx.tree.move_witnessed(src.dir_fd, src.name, dst_fd, target_file, src.witness)
        except SourceMissing as e:
            raise LeaseLost(f"lease of job {lease.job_id} is gone") from e
        except Collision as e:
            raise NotCommitted("renew destination exists", ErrorKind.QUEUE_CORRUPT) from e
        except SourceChanged as e:
            raise _corrupt(ctx, True, f"leased file changed before renewal: {e}") from e
        except MoveFailed as e:
            raise NotCommitted(f"renew: {e}", kind_for_errno(e.errno)) from e  # ENOSPC -> ResourceExhausted
        except Indeterminate as e:
            raise indeterminate(ctx, lease, "renew", e, destination) from e
    finally:
        src.close()
    lease.generation = generation
    lease.boot_id = ctx.boot_id
    lease.boottime_deadline_ns = bt_deadline
    lease.wall_deadline_ns = wall_deadline
    dir_rel = ctx.ready_rels[shard]
    lease.path = f"{dir_rel}/{target_file}"
    remember_own_lease_path(ctx, dir_rel, lease.path, shard, target)
    return lease


def extension_of(src: Source) -> Extension | None:
    """Decode the authenticated extension of a validated source (None when empty)."""
    return decode_extension(src.envelope.extension) if src.envelope.extension else None


def lease_from_claim(
    ctx: Context,
    *,
    name_rel: str,
    env: Envelope,
    extension: Extension | None,
    generation: int,
    attempt: int,
    token: bytes,
    bt_deadline: int,
    wall_deadline: int,
    reader: Any,
) -> Lease:
    h = env.header
    return lease_of_claimed(
        ctx, name_rel, h.job_id.hex(), h.max_attempts, env.witness.dev, env.witness.ino, h.envelope_digest,
        h.payload_length, h.payload_digest, extension, generation, attempt, token, bt_deadline, wall_deadline, reader,
    )  # fmt: skip


def lease_of_claimed(
    ctx: Context,
    name_rel: str,
    job_hex: str,
    max_attempts: int,
    dev: int,
    ino: int,
    envelope_digest: bytes,
    payload_length: int,
    payload_digest: bytes,
    extension: Extension | None,
    generation: int,
    attempt: int,
    token: bytes,
    bt_deadline: int,
    wall_deadline: int,
    reader: Any,
) -> Lease:
    """The Lease a claim made, from its fields: claim_open's envelope, or the C claim core's record.

    Its 18 fields are passed by position, in the dataclass's order (queue_id, job_id, generation,
    attempt, max_attempts, token, boot_id, boottime_deadline_ns, wall_deadline_ns, dev, ino, path,
    envelope_digest, payload_length, payload_digest, content_type, extension, _reader): a class call
    with keywords builds a dict of them and unpacks it again for ``__init__``: 14.8k instructions a
    call → 5.9k (callgrind). tests/unit/test_lease_fields.py pins each field to its argument."""
    return Lease(
        ctx.fmt.queue_id, job_hex, generation, attempt, max_attempts, token, ctx.boot_id, bt_deadline,
        wall_deadline, dev, ino, name_rel, envelope_digest, payload_length, payload_digest,
        extension.content_type if extension else "", extension, reader,
    )  # fmt: skip
