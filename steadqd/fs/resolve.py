"""Resolving an indeterminate transition from its ticket (errors.md "resolve").

After an OutcomeUnknown the caller holds a :class:`~steadqd.fs.json_records.TransitionTicket`
and does not know whether the rename happened. Both candidate paths follow
deterministically from the ticket, and each is judged independently by
*authenticating* whatever is there -- never by mere existence, because a file
at the expected path that does not verify proves nothing about this
transition (it is a conflict, i.e. corruption an operator must look at).

Per path the verdict is Match / Absent / Conflict / Error, and the pair is
combined by the table in errors.md. With ``stabilize`` the one matching
object is also made durable (file fsync, directory fsync) and re-checked by
reopening its directory beneath the root, so "observed" becomes "durable".

Resolve is read-only apart from those fsyncs, so it works on a poisoned
handle too (the handle that raised the OutcomeUnknown is the natural one to
ask). It opens every descriptor afresh beneath the root instead of using the
handle's directory cache: a cached fd may predate a deleted-and-recreated
directory, and resolve is exactly the situation where nothing may be assumed.
"""

from __future__ import annotations

import enum
import errno
import os
from dataclasses import dataclass
from operator import attrgetter

from steadqd.constants import (
    DEAD_DIR,
    DELAYED_DIR,
    HEADER_SIZE,
    JOB_EXT,
    READY_DIR,
    RECEIPT_EXT,
    RECEIPTS_DIR,
    Resolution,
    State,
)
from steadqd.errors import CorruptObject, ErrorKind, InvalidInput, SteadQError
from steadqd.fs import linux
from steadqd.fs.context import Context
from steadqd.fs.json_records import (
    DeadLocation,
    DelayedLocation,
    LeasedLocation,
    Location,
    ReadyLocation,
    ReceiptLocation,
    TransitionTicket,
)
from steadqd.fs.names import (
    JobName,
    authenticate,
    boot_raw,
    dead_name,
    delayed_bucket,
    delayed_name,
    leased_name,
    make_filename,
    parse_bucket_dir,
    parse_name,
    ready_name,
    receipt_name,
    shard_of,
    state_dir,
)
from steadqd.fs.receipt import ExpectedReceipt, verify_receipt
from steadqd.fs.tree import is_single_regular
from steadqd.fs.verify import read_envelope, verify_payload

__all__ = ["ResolveResult", "resolve", "ticket_paths"]


@dataclass(frozen=True)
class ResolveResult:
    """The verdict plus both derived paths; ``error`` explains a conflict or failure."""

    outcome: Resolution
    source_path: str
    destination_path: str
    error: str | None = None


# Which job, generation and attempt a name is: what a ticket's expected name must agree on.
_NAME_IDENTITY = attrgetter("job_id", "generation", "attempt", "max_attempts")


class _Verdict(enum.Enum):
    MATCH = "match"
    ABSENT = "absent"
    CONFLICT = "conflict"
    ERROR = "error"


@dataclass
class _Probe:
    """One path's verdict; a Match keeps its descriptors open for stabilisation."""

    verdict: _Verdict
    why: str | None = None
    dir_fd: int | None = None
    file_fd: int | None = None

    def close(self) -> None:
        for fd in (self.file_fd, self.dir_fd):
            if fd is not None:
                try:
                    linux.close(fd)
                except OSError:
                    pass  # read-only descriptors: nothing to lose
        self.file_fd = self.dir_fd = None


@dataclass(frozen=True)
class _Expected:
    """Everything one candidate path must prove about itself."""

    state: State
    rel_dir: str
    filename: str
    shard: int
    bucket: int | None  # directory bucket (delayed, dead, receipts); None for ready/<S>/
    name: JobName  # untagged expected identity

    @property
    def path(self) -> str:
        return f"{self.rel_dir}/{self.filename}"


# --------------------------------------------------------------------------- path derivation


def _expected(ctx: Context, ticket: TransitionTicket, loc: Location, common: tuple[int, int]) -> _Expected:
    """The exact object the ticket predicts for ``loc`` (errors.md "From a ticket both paths...")."""
    fmt = ctx.fmt
    job, mx, token = ticket.job_id, ticket.maximum_attempts, ticket.lease_token
    gen, att = common
    shard = shard_of(fmt.queue_id, job, fmt.shard_count)
    bucket: int | None = None
    if isinstance(loc, ReadyLocation):
        name = ready_name(job, gen, att, mx)
    elif isinstance(loc, LeasedLocation):
        # Colocated lease in ready/<S>/; the tag context uses the lease bucket
        # of the deadline (make_filename derives it from the name).
        name = leased_name(
            job,
            gen,
            att,
            mx,
            boot_id=boot_raw(loc.boot_id),
            boottime_deadline=loc.boottime_deadline_ns,
            wall_deadline=loc.wall_deadline_ns,
            lease_token=token,
        )
    elif isinstance(loc, DelayedLocation):
        bucket = delayed_bucket(loc.not_before_ns, fmt.delayed_width_ns)
        name = delayed_name(job, gen, att, mx, not_before=loc.not_before_ns)
    elif isinstance(loc, ReceiptLocation):
        bucket = loc.terminal_bucket
        name = receipt_name(job, gen, att, mx, lease_token=token)
    elif isinstance(loc, DeadLocation):
        bucket = loc.terminal_bucket
        name = dead_name(job, gen, att, mx, reason=loc.reason)
    else:  # pragma: no cover - validate() rejects anything else
        raise InvalidInput(f"ticket location {loc!r} is not a state")
    filename = make_filename(fmt.queue_id, name, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns)
    return _Expected(name.state, state_dir(name.state, shard, bucket), filename, shard, bucket, name)


def _expected_pair(ctx: Context, ticket: TransitionTicket) -> tuple[_Expected, _Expected]:
    if not isinstance(ticket, TransitionTicket):
        raise SteadQError(
            f"invalid transition ticket: expected a TransitionTicket, got {ticket!r}", ErrorKind.INVALID_TICKET
        )
    ticket.validate()  # InvalidTicket: hand-built tickets get the same checks as parsed ones
    if ticket.queue_id != ctx.queue_id:
        raise InvalidInput(
            f"ticket is for queue {ticket.queue_id.hex()}, this queue is {ctx.queue_id.hex()} (queue_id differs)"
        )
    try:
        src = _expected(ctx, ticket, ticket.source, (ticket.generation, ticket.attempt))
        dst = _expected(ctx, ticket, ticket.destination, ticket.destination_identity())
    except SteadQError as e:
        # e.g. a delayed bucket or deadline no name can hold: the ticket cannot
        # describe an object of this queue.
        raise InvalidInput(f"ticket is not valid for this queue: {e.message}") from e
    return src, dst


def ticket_paths(ctx: Context, ticket: TransitionTicket) -> tuple[str, str]:
    """(source path, destination path) relative to the queue root.

    Raises InvalidTicket for a ticket that fails validation and InvalidInput
    for one that is valid but not for this queue (another queue id).
    """
    src, dst = _expected_pair(ctx, ticket)
    return src.path, dst.path


# --------------------------------------------------------------------------- probing one path


def _probe(ctx: Context, ticket: TransitionTicket, exp: _Expected) -> _Probe:
    """Judge one candidate path: Match, Absent, Conflict or Error."""
    # 1. The object kind must fit the state directory.
    top = exp.rel_dir.split("/", 1)[0]
    want_top = {State.READY: READY_DIR, State.LEASED: READY_DIR, State.DELAYED: DELAYED_DIR, State.DEAD: DEAD_DIR,
                State.RECEIPT: RECEIPTS_DIR}[exp.state]  # fmt: skip
    want_ext = RECEIPT_EXT if exp.state is State.RECEIPT else JOB_EXT
    if top != want_top or not exp.filename.endswith(want_ext):
        return _Probe(_Verdict.CONFLICT, f"{exp.path}: object kind does not fit its state directory")
    # 2. Directory, then the file, both beneath the root and without following links.
    root_fd = ctx.root_fd
    try:
        dir_fd = linux.open_beneath(root_fd, exp.rel_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return _Probe(_Verdict.ABSENT)
        return _Probe(_Verdict.ERROR, f"open {exp.rel_dir}: {e.strerror}")
    probe = _Probe(_Verdict.ERROR, dir_fd=dir_fd)
    try:
        try:
            probe.file_fd = linux.open_at(dir_fd, exp.filename, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENOENT:
                probe.verdict = _Verdict.ABSENT
            elif e.errno == errno.ELOOP:
                probe.verdict, probe.why = _Verdict.CONFLICT, f"{exp.path} is a symlink"
            else:
                probe.why = f"open {exp.path}: {e.strerror}"
            probe.close()
            return probe
        verdict, why = _judge(ctx, ticket, exp, probe.file_fd)
        probe.verdict, probe.why = verdict, why
    except BaseException:
        probe.close()
        raise
    if probe.verdict is not _Verdict.MATCH:
        probe.close()
    return probe


def _judge(ctx: Context, ticket: TransitionTicket, exp: _Expected, fd: int) -> tuple[_Verdict, str | None]:
    """Steps 2 (file type, header length) to 4 of errors.md for an open candidate."""
    fmt = ctx.fmt
    try:
        st = linux.fstat(fd)
        if not is_single_regular(st):
            return _Verdict.CONFLICT, f"{exp.path} is not a singly linked regular file"
        if len(linux.pread(fd, HEADER_SIZE, 0)) < HEADER_SIZE:
            return _Verdict.CONFLICT, f"{exp.path} is shorter than the 128-byte header"
        if exp.state is State.RECEIPT:
            assert exp.bucket is not None
            expected = ExpectedReceipt(
                generation=exp.name.generation,
                attempt=exp.name.attempt,
                max_attempts=exp.name.max_attempts,
                lease_token=ticket.lease_token,
                envelope_digest=ticket.envelope_digest,
                payload_length=ticket.payload_length,
            )
            verify_receipt(fmt, fd, exp.filename, exp.bucket, exp.shard, expected, st)
            return _Verdict.MATCH, None
        env = read_envelope(fd, fmt.max_payload_length, st)
        h = env.header
        if (h.job_id, h.max_attempts, h.envelope_digest, h.payload_length) != (
            ticket.job_id,
            ticket.maximum_attempts,
            ticket.envelope_digest,
            ticket.payload_length,
        ):
            return _Verdict.CONFLICT, f"{exp.path}: header does not match the ticket"
        name = parse_name(exp.state, exp.filename)
        if _NAME_IDENTITY(name) != _NAME_IDENTITY(exp.name):
            return _Verdict.CONFLICT, f"{exp.path}: name identity does not match the ticket"
        if exp.state is State.LEASED and name.lease_token != ticket.lease_token:
            return _Verdict.CONFLICT, f"{exp.path}: lease token does not match the ticket"
        if not authenticate(fmt.queue_id, name, shard=exp.shard, bucket=exp.bucket, lease_width_ns=fmt.lease_width_ns):
            return _Verdict.CONFLICT, f"{exp.path}: name tag does not authenticate"
        if shard_of(fmt.queue_id, name.job_id, fmt.shard_count) != exp.shard:
            return _Verdict.CONFLICT, f"{exp.path}: wrong shard for its job"
        if exp.bucket is not None and parse_bucket_dir(exp.rel_dir.split("/")[1]) != exp.bucket:
            return _Verdict.CONFLICT, f"{exp.path}: wrong bucket directory"  # pragma: no cover - derived together
        verify_payload(fd, env)  # the payload hash is part of "full job verification"
        return _Verdict.MATCH, None
    except CorruptObject as e:
        return _Verdict.CONFLICT, f"{exp.path}: {e.message}"
    except SteadQError as e:
        return _Verdict.CONFLICT, f"{exp.path}: {e.message}"
    except OSError as e:
        return _Verdict.ERROR, f"read {exp.path}: {e.strerror or e}"


# --------------------------------------------------------------------------- stabilising


def _stabilize(ctx: Context, exp: _Expected, probe: _Probe) -> tuple[Resolution | None, str | None]:
    """fsync file and directory, then prove the path still names the same objects.

    Returns (None, None) on success, else the failing outcome and why. An
    fsync error is a failure to resolve (nothing is known to be durable); a
    changed identity means another actor touched the path meanwhile.
    """
    assert probe.file_fd is not None and probe.dir_fd is not None
    try:
        linux.fsync(probe.file_fd)
        linux.fsync(probe.dir_fd)
    except OSError as e:
        return Resolution.RESOLUTION_FAILED, f"fsync {exp.path}: {e.strerror}"
    try:
        held_dir = linux.fstat(probe.dir_fd)
        held_file = linux.fstat(probe.file_fd)
    except OSError as e:
        return Resolution.RESOLUTION_FAILED, f"fstat {exp.path}: {e.strerror}"
    try:
        again_fd = linux.open_beneath(ctx.root_fd, exp.rel_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return Resolution.CONFLICTING_OBJECT, f"{exp.rel_dir} changed while stabilising"
        return Resolution.RESOLUTION_FAILED, f"reopen {exp.rel_dir}: {e.strerror}"
    try:
        try:
            again_dir = linux.fstat(again_fd)
            again_file = linux.stat_at(again_fd, exp.filename)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return Resolution.CONFLICTING_OBJECT, f"{exp.path} vanished while stabilising"
            return Resolution.RESOLUTION_FAILED, f"stat {exp.path}: {e.strerror}"
    finally:
        try:
            linux.close(again_fd)
        except OSError:
            pass
    if (again_dir.st_dev, again_dir.st_ino) != (held_dir.st_dev, held_dir.st_ino):
        return Resolution.CONFLICTING_OBJECT, f"{exp.rel_dir} was replaced while stabilising"
    if (again_file.st_dev, again_file.st_ino) != (held_file.st_dev, held_file.st_ino) or not is_single_regular(
        again_file
    ):
        return Resolution.CONFLICTING_OBJECT, f"{exp.path} was replaced while stabilising"
    return None, None


# --------------------------------------------------------------------------- resolve


def resolve(ctx: Context, ticket: TransitionTicket, *, stabilize: bool = False) -> ResolveResult:
    """Decide what happened to an indeterminate transition (errors.md "resolve").

    Raises InvalidTicket / InvalidInput only for a ticket that cannot be
    resolved against this queue; every on-disk finding, including I/O
    errors, is reported in the result (RESOLUTION_FAILED), never raised.
    """
    src_exp, dst_exp = _expected_pair(ctx, ticket)

    def result(outcome: Resolution, error: str | None = None) -> ResolveResult:
        return ResolveResult(outcome, src_exp.path, dst_exp.path, error)

    src = _probe(ctx, ticket, src_exp)
    try:
        dst = _probe(ctx, ticket, dst_exp)
        try:
            verdicts = (src.verdict, dst.verdict)
            conflicts = [p.why or "conflict" for p in (src, dst) if p.verdict is _Verdict.CONFLICT]
            if conflicts:  # Conflict takes precedence over Error
                return result(Resolution.CONFLICTING_OBJECT, "; ".join(conflicts))
            errors = [p.why or "error" for p in (src, dst) if p.verdict is _Verdict.ERROR]
            if errors:
                return result(Resolution.RESOLUTION_FAILED, "; ".join(errors))
            if verdicts == (_Verdict.ABSENT, _Verdict.ABSENT):
                return result(Resolution.NEITHER_OBSERVED)
            if verdicts == (_Verdict.MATCH, _Verdict.MATCH):
                return result(Resolution.BOTH_OBSERVED, "both source and destination observed (corruption)")
            if src.verdict is _Verdict.MATCH:
                side, exp, observed, stable = src, src_exp, Resolution.SOURCE_OBSERVED, Resolution.SOURCE_STABILIZED
            else:
                side, exp, observed, stable = (
                    dst, dst_exp, Resolution.DESTINATION_OBSERVED, Resolution.DESTINATION_STABILIZED,
                )  # fmt: skip
            if not stabilize:
                return result(observed)
            failed, why = _stabilize(ctx, exp, side)
            return result(stable) if failed is None else result(failed, why)
        finally:
            dst.close()
    finally:
        src.close()
