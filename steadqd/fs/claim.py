"""Claiming a job: one scan of the ready shards (protocol.md "Claim").

The claim is a no-replace rename of ``<ready-name>`` to ``<leased-name>``
inside ``ready/<S>/``; whoever's rename succeeds owns the job. Before it,
the object is verified (name, tag, shard, file type, links, envelope,
extension); after it, the payload is hashed. Unlike the reference, an object
that fails verification does not fail the whole claim: it is moved to
quarantine with the spec's reason code and the scan goes on, so one bad file
can never block a queue (open-questions B11; on-disk compatible).
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

from steadqd.constants import (
    CLAIM_SCAN_CHUNK_BYTES,
    HEADER_SIZE,
    U32_MAX,
    U64_MAX,
    DeadReason,
    QuarantineReason,
    State,
)
from steadqd.errors import CorruptObject, ErrorKind, MaintenanceBusy, NotCommitted, OutcomeUnknown, SteadQError
from steadqd.fs import linux
from steadqd.fs.clock import refuse_boottime
from steadqd.fs.compiled import bridge
from steadqd.fs.context import Context
from steadqd.fs.json_records import LeasedLocation, ReadyLocation
from steadqd.fs.lease import Lease, lease_from_claim, lease_of_claimed, make_ticket, remember_own_lease_path
from steadqd.fs.names import (
    JobName,
    authenticate,
    dead_name,
    leased_identity,
    looks_ready,
    make_filename,
    next_attempt,
    next_generation,
    parse_name,
    shard_of,
    state_dir,
    terminal_bucket,
    trusted_leased_name,
)
from steadqd.fs.owner import unreadable_job_text
from steadqd.fs.quarantine import quarantine, quarantine_special
from steadqd.fs.records import JobHeader, decode_extension
from steadqd.fs.scan_order import next_scan_round, scan_order
from steadqd.fs.tree import Collision, Indeterminate, MoveError, SourceMissing, Witness
from steadqd.fs.verify import (
    Envelope,
    check_name_matches,
    read_envelope,
    remember_verified,
    reread_envelope,
    verify_payload,
)


@dataclass
class ScanReport:
    """What a scan ran into besides jobs; surfaced to callers and logs."""

    errors: list[str]
    quarantined: list[tuple[str, int, str]]  # (original path, reason, quarantine name)
    dead_lettered: list[str]
    # Entries that can never be jobs (non-ASCII names). Noted, not errors: one
    # stray file must not turn every "queue empty" answer into a failure.
    ignored: list[str]


_PROBE_RUN_MAX = 16  # shards looked up and probed together (_Scan.run)
# Claims in a row a handle takes from one shard's candidates before its scan order starts at a
# pseudo-random shard again (_Scan.stay): the bound on how long a busy shard can keep it.
STAY_MAX = 16
_READY = State.READY  # a global: an enum member read through its class is slow on 3.11 (names._READY)


class _Scan:
    def __init__(self, ctx: Context, duration_ns: int, reader: Any) -> None:
        self.ctx = ctx
        self.duration_ns = duration_ns
        self.reader = reader
        self.wall: int | None = None
        self.report = ScanReport([], [], [], [])
        self.core = ctx.c_core  # the C claim core (bridge), or None: the pure Python path
        self.lost = 0  # candidates gone when opened: names another consumer claimed first (stay)

    def wall_floor(self) -> int:
        if self.wall is None:
            self.wall = self.ctx.wall_floor()
        return self.wall

    def run(self) -> Lease | None:
        ctx = self.ctx
        lock = ctx.lock  # acquire/release, not ``with`` (tree.py's _LOCK_NOTE: ~1,000 instructions a with block)
        lock.acquire()
        try:
            round_ = ctx.scan_round
            ctx.scan_round = next_scan_round(round_)
            hint, ctx.last_enqueued_shard = ctx.last_enqueued_shard, None
            stay, ctx.claim_stay = ctx.claim_stay, None
        finally:
            lock.release()
        run = 1
        if hint is None and stay is not None:
            # The stay's shard is the first of the order and holds kept names, so the loop below
            # would scan it the full way (no probe): scanned here, before the order is made (most
            # leases of a busy consumer end here); the order then goes on after it.
            lease = self.scan_shard(stay)
            if lease is not None:
                self.stay(stay, stay)
                return lease
            hint, run = stay, 2
        elif (
            type(hint) is int
            and 0 <= hint < ctx.fmt.shard_count  # scan_order's check of the hint, passed (else it raises there)
            and ((cand := ctx.claim_candidates.get(hint)) is None or not cand.at_end or cand.names)
        ):
            # The hint's shard (the enqueue's) is the first of the order too; one the loop below would
            # not probe (drained_ready_dirs: not read to its end, or names kept) is scanned the full way
            # there, so it is scanned here the same way, before the order is made (a lease after an
            # enqueue of this handle ends here), and the order goes on after it, as after the stay's.
            lease = self.scan_shard(hint)
            if lease is not None:
                self.stay(hint, stay)
                return lease
            run = 2
        order = scan_order(ctx.fmt.queue_id, ctx.boot_raw, ctx.nonce, round_, ctx.fmt.shard_count, start_hint=hint)
        if run == 2:
            next(order)  # the stay's or the hint's shard, scanned above
        # A shard this handle found empty last time would be rewound and read
        # once, and the scan would go on if the read listed nothing: the probe
        # (linux.first_listing) makes that same rewind and read for a run of
        # them at a time, without the per-shard work. A shard whose read lists
        # anything is scanned the full way, from its own rewind. Runs grow from
        # one shard (a queue with work usually has it in the first) to
        # _PROBE_RUN_MAX; a loop, not a generator, for the lease that stops there.
        while block := list(islice(order, run)):
            fds = ctx.drained_ready_dirs(block)
            i = 0
            while i < len(block):
                if fds[i] is not None:
                    i = linux.first_listing(fds, i, CLAIM_SCAN_CHUNK_BYTES)
                    if i == len(block):
                        break
                lease = self.scan_shard(block[i])
                if lease is not None:
                    self.stay(block[i], stay)
                    return lease
                i += 1
            run = min(2 * run, _PROBE_RUN_MAX)
        return None

    def stay(self, shard: int, stayed: int | None) -> None:
        """After a claim from ``shard``: start the next scan there while this handle holds names of it.

        Every consumer claims a shard's names in the same directory order, so a handle that
        comes back to a shard after the others took from it finds its kept names gone, one
        failed ``open`` each (issue 35: 1-4 a job at 4 consumers). Staying on the shard
        whose names it holds, each consumer works through its own shard while the others
        work through theirs, and its names are fresh. A start hint, like the enqueue's
        (names.md "Claim scan order": the order is not observable on disk and need not be
        reproduced; open-questions 35: nothing depends on the order within a shard); the
        stride is unchanged and every shard is still visited when the stay finds nothing.
        A scan that lost a race (a name gone when opened) does not stay: another consumer
        works the same shard, and staying would have the two take turns at its names, each
        losing one a claim. Bounded: after STAY_MAX claims in a row from one shard, the next
        scan starts at the round's pseudo-random shard again, so a shard that never empties
        cannot keep a consumer from the others'.
        """
        ctx = self.ctx
        cand = ctx.claim_candidates.get(shard)
        lock = ctx.lock  # acquire/release, not ``with`` (tree.py's _LOCK_NOTE)
        lock.acquire()
        try:
            streak = ctx.claim_streak + 1 if stayed == shard else 1
            if cand is not None and cand.names and not self.lost and streak < STAY_MAX:
                ctx.claim_stay, ctx.claim_streak = shard, streak
            else:
                ctx.claim_streak = 0
        finally:
            lock.release()

    def scan_shard(self, shard: int) -> Lease | None:
        rel = self.ctx.ready_rels[shard]
        # A scan pins the directory cache; with more shards than the cache
        # holds, each shard gets a short-lived fd instead so one scan never
        # keeps thousands of descriptors open.
        transient = self.ctx.fmt.shard_count > self.ctx.tree.max_cached
        try:
            # ctx.ready_dir(shard) is ensure_dir of this rel: called without the step that looks it up again
            dir_fd = self.ctx.tree.ensure_dir(rel) if not transient else self.ctx.tree.open_transient(rel)
        except OSError as e:
            self.report.errors.append(f"{rel}: {e.strerror}")
            self.ctx.tree.forget(rel)
            return None
        try:
            return self._scan_entries(shard, dir_fd, rel)
        finally:
            if transient:
                linux.close(dir_fd)

    def _scan_entries(self, shard: int, dir_fd: int, rel: str) -> Lease | None:
        ctx = self.ctx
        cand = ctx.claim_candidates.get(shard)  # ctx.shard_candidates(shard)'s found case, without its call and lock
        if cand is None:
            cand = ctx.shard_candidates(shard)
        # Names left from this handle's last chunk of the shard come first: a
        # name that vanished meanwhile (claimed elsewhere) fails to open with
        # ENOENT and is skipped. With several consumers on a shard most of
        # them have (issue 35: ~0.7 a leased job at 4 consumers), so a leftover
        # is opened before its name is parsed and checked (_try_leftover).
        tried: set[str] = set()
        names_left = cand.names
        while names_left:  # tested, not popped into an IndexError: most scans find it empty
            name = names_left.popleft()
            tried.add(name)
            lease = self._try_leftover(shard, dir_fd, rel, name)
            if lease is not None:
                return lease
        # Then the directory, a chunk at a time from where this handle stopped
        # (the cached fd's offset is the cursor), so a deep shard costs a chunk
        # per lease, not a listing, and one sweep visits every entry however
        # many jobs keep arriving in front of the cursor. At the end the scan
        # rewinds once: an empty answer rests on a full pass from the first
        # entry made by this scan, so no job enqueued before the call is missed.
        from_start = False
        while True:
            try:
                if cand.at_end and not from_start:
                    # This handle's last scan of the shard ended at its end: start
                    # over at once (an empty shard costs a rewind and one read).
                    linux.rewind_dir(dir_fd)
                    from_start = True
                names = self._read_ready(dir_fd, rel)
                if names is None:  # the read listed nothing: the end of the shard
                    if from_start:
                        cand.at_end = True
                        return None
                    linux.rewind_dir(dir_fd)
                    from_start = True
                    continue
            except OSError as e:
                self.report.errors.append(f"{rel}: {e.strerror}")
                return None
            cand.at_end = False
            for i, name in enumerate(names):
                if name in tried:
                    continue
                tried.add(name)  # once per scan: the pass after the rewind may list it again
                lease = self._try_name(shard, dir_fd, rel, name)
                if lease is not None:
                    cand.names = deque(names[i + 1 :])
                    return lease

    def _read_ready(self, dir_fd: int, rel: str) -> list[str] | None:
        """The next chunk of the shard ``dir_fd`` (``rel``) from its offset: None when the read listed
        nothing (its end), else the names in it that look ready, in directory order; names past ASCII
        go to the report. One call of the C core where it runs (the same getdents, and its
        sorting of the names is _ready_looking's), else the Python's read and _ready_looking."""
        core = self.core
        if core is None:
            chunk = linux.read_dir_chunk(dir_fd, CLAIM_SCAN_CHUNK_BYTES)
            return self._ready_looking(rel, chunk) if chunk else None
        read = core.read_ready(dir_fd)
        if read is None:
            return None
        names, ignored = read
        for raw in ignored:
            self.ignore(rel, raw)
        return names

    def _ready_looking(self, rel: str, chunk: list[bytes]) -> list[str]:
        names: list[str] = []
        for raw in chunk:
            try:
                name = raw.decode("ascii")
            except UnicodeDecodeError:
                self.ignore(rel, raw)
                continue
            if looks_ready(name):  # leased names and strays are never candidates
                names.append(name)
        return names

    def ignore(self, rel: str, raw: bytes) -> None:
        """An entry of ``rel`` that can never be a job (a name past ASCII): noted in the report."""
        self.report.ignored.append(f"{rel}/{raw!r}")

    def _try_name(self, shard: int, dir_fd: int, rel: str, name: str) -> Lease | None:
        """One ready-looking name of the listing (or a leftover whose early open failed): through the C
        claim core where there is one, else the Python, which is the core's specification."""
        if self.core is not None:
            return self._fast(shard, dir_fd, rel, name, None)
        return self._try_name_python(shard, dir_fd, rel, name)

    def _try_name_python(self, shard: int, dir_fd: int, rel: str, name: str) -> Lease | None:
        try:
            job = parse_name(_READY, name)
        except CorruptObject:
            return None  # a lease, or not ours to judge here (fsck reports it)
        return self.consider(shard, dir_fd, rel, name, job)

    def _try_leftover(self, shard: int, dir_fd: int, rel: str, name: str) -> Lease | None:
        """A name kept from an earlier scan: the open comes first, so a name another
        consumer claimed meanwhile costs one failed ``openat`` and no parse, tag or hash.

        For a name that opens, the checks and every later syscall are those of
        _try_name; the open itself is the one consider() would make, just made
        before the checks (no syscall lies between them). A name that fails a
        check is closed and then skipped, quarantined or moved to dead as before:
        an open and a close more, on a read-only descriptor. The open does not
        trust the name: a forged name could as well carry a valid tag, the
        queue id being readable by whoever can write here. Any other open error
        falls back to _try_name, which opens again and judges it as always.
        """
        try:
            fd = linux.open_at(dir_fd, name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENOENT:
                self.lost += 1
                return None
            return self._try_name(shard, dir_fd, rel, name)
        if self.core is not None:
            return self._fast(shard, dir_fd, rel, name, fd)
        return self._leftover_opened(shard, dir_fd, rel, name, fd)

    def _leftover_opened(self, shard: int, dir_fd: int, rel: str, name: str, fd: int) -> Lease | None:
        try:
            job = parse_name(_READY, name)
        except CorruptObject:
            linux.close_quietly(fd)
            return None
        return self.consider(shard, dir_fd, rel, name, job, fd)

    def _fast(self, shard: int, dir_fd: int, rel: str, name: str, opened: int | None) -> Lease | None:
        """_try_name (``opened`` None) or the rest of _try_leftover (its fd) through the C claim core.

        The core takes the happy path; wherever it stops, the Python above and below runs from
        the start of this candidate with the syscalls the core made replayed (bridge.replaying),
        so the outcome, report and syscall sequence are the pure path's. Between the core's two
        calls the Python reads the wall floor, the clock and the token, where claim_open does. In
        Queue.batch() the core stops after the rename, the re-read and its checks, and the tree
        makes (postpones) the barrier as move_witnessed does (Tree.finish_move), then claim_open's end.
        """
        core = self.core
        assert core is not None
        stage, c = core.verify(dir_fd, name, shard, -1 if opened is None else opened)
        if stage == bridge.STOP_PURE:  # no syscall made: the pure path
            if opened is None:
                return self._try_name_python(shard, dir_fd, rel, name)
            return self._leftover_opened(shard, dir_fd, rel, name, opened)
        if stage == bridge.STOP_SYSCALL and opened is None and c.nrec == 1:
            # The open failed (another consumer won it, most often): consider's continuation, as it
            # calls it (the checks before the open passed in C: nothing of them to replay).
            e = bridge.failed_open(c)
            if not isinstance(e, OSError):
                raise e
            self.open_failed(dir_fd, rel, name, e)
            return None
        if stage != bridge.VERIFIED:
            job = parse_name(_READY, name)  # the core opened, so the name parsed
            with bridge.replaying(c, skip_open=False):
                return self.consider(shard, dir_fd, rel, name, job, opened)
        fd = c.fd
        try:
            return self._fast_move(shard, dir_fd, rel, name, c, fd)
        finally:
            linux.close_quietly(fd)  # consider's close, on both its paths

    def _fast_move(self, shard: int, dir_fd: int, rel: str, name: str, c: Any, fd: int) -> Lease | None:
        """claim_open after a verified envelope: the extension's CBOR, the clocks and token here, the move in C."""
        ctx = self.ctx
        ffi = bridge.ffi
        # The verified header and extension (the first read; the move leaves them): sliced once, for the
        # extension's decoding here and the Envelope below.
        head = ffi.buffer(c.head)[: HEADER_SIZE + c.extension_length]
        ext = head[HEADER_SIZE:]
        extension = None
        if ext:
            try:
                extension = decode_extension(ext)
            except CorruptObject:  # the Python from the start: its claim_open quarantines it
                job = parse_name(_READY, name)
                with bridge.replaying(c, skip_open=True):
                    return self.claim_open(shard, dir_fd, rel, name, job, fd)
        wall = self.wall_floor()
        bt = linux.boottime_ns()
        bt_deadline, wall_deadline = bt + self.duration_ns, wall + self.duration_ns
        if bt_deadline > U64_MAX or wall_deadline > U64_MAX:
            return None
        token = ctx.random(16)
        g, a = c.generation, c.attempt
        # next_generation / next_attempt, which raise at the limits (pure: before the move)
        generation = g + 1 if g < U64_MAX else next_generation(g)
        attempt = a + 1 if a < U32_MAX else next_attempt(a)
        core = self.core
        assert core is not None
        stage = core.move(c, ctx.boot_raw, bt_deadline, wall_deadline, token, not ctx.tree.batching)
        if stage != bridge.MOVED and stage != bridge.MOVED_PAYLOAD_LEFT and stage != bridge.MOVED_BARRIER_LEFT:
            job = parse_name(_READY, name)
            with bridge.replaying(c, skip_open=True):
                return self.claim_open(shard, dir_fd, rel, name, job, fd, (wall, bt, token))
        target_rel = f"{rel}/{ffi.string(c.target).decode('ascii')}"
        st = c.stats[0]  # the verified file's fstat: the witness
        lease = lease_of_claimed(
            ctx, target_rel, name[:32], c.max_attempts, st.dev, st.ino, ffi.buffer(c.envelope_digest)[:],
            c.payload_length, ffi.buffer(c.payload_digest)[:], extension, generation, attempt, token,
            bt_deadline, wall_deadline, self.reader,
        )  # fmt: skip
        target = leased_identity(
            bytes.fromhex(name[:32]),
            generation,
            attempt,
            c.max_attempts,
            ctx.boot_raw,
            bt_deadline,
            wall_deadline,
            token,
        )
        if stage == bridge.MOVED_BARRIER_LEFT:
            # In Queue.batch(): renamed, re-read and checked; the rest of move_witnessed (the
            # postponed barrier) and its outcome are claim_open's, then its end on the re-read.
            try:
                ctx.tree.finish_move(dir_fd, dir_fd, force=True)
            except Indeterminate as e:
                raise _claim_unknown(ctx, lease, g, a, e) from e
        remember_own_lease_path(ctx, rel, target_rel, shard, target)
        if stage == bridge.MOVED_PAYLOAD_LEFT or not c.payload_in_head:
            # Moved and synced (or, in a batch, its barrier postponed), and the payload not checked
            # by the core (past the re-read, or not matching): the check is claim_open's own end, on
            # the re-read's envelope (reread_envelope's: the verified header and extension, the new first read).
            env = _core_envelope(c, st, head, ext)
            return self.check_claimed_payload(lease, (g, a), fd, env, dir_fd, rel, target_rel.rsplit("/", 1)[1])
        # The core's re-read holds the whole file and it all verified (envelope and payload digests;
        # in a batch too, before the barrier the tree postponed above): what check_claimed_payload would
        # find, with no syscall. payload(), a worker's copy and the ack re-read these bytes, which
        # verify.py's memo then recognises instead of decoding and hashing them again, as after
        # claim_open's check.
        try:
            remember_verified(_core_envelope(c, st, head, ext))
        except CorruptObject:  # cannot be, the core verified it; then payload() checks it in full
            pass
        return lease

    def isolate(self, dir_fd: int, rel: str, name: str, reason: int, witness: Any = None) -> None:
        try:
            if witness is not None and reason in (
                QuarantineReason.NON_REGULAR_FILE,
                QuarantineReason.UNEXPECTED_HARD_LINK,
            ):
                # The witnessed move insists on a singly linked regular file, which
                # this object is by definition not (it would fail as SourceChanged
                # and block every scan): check the identity here, move unwitnessed.
                st = linux.stat_at(dir_fd, name)
                if not witness.matches(st):
                    self.report.errors.append(f"{rel}/{name} was replaced before quarantine")
                    return
                if not stat.S_ISREG(st.st_mode):
                    self.isolate_special(dir_fd, rel, name, st)
                    return
                witness = None
            qname = quarantine(self.ctx, dir_fd, name, reason, witness)
            self.report.quarantined.append((f"{rel}/{name}", reason, qname))
        except SourceMissing:
            pass
        except (MoveError, Indeterminate, OSError) as e:
            # The object is in ready/ or in quarantine; either is safe, no lease exists.
            self.report.errors.append(f"quarantine {rel}/{name}: {e}")

    def isolate_special(self, dir_fd: int, rel: str, name: str, st: os.stat_result) -> None:
        """A FIFO, socket or directory wearing a job's name: quarantined, or reported once if it cannot be."""
        try:
            qname = quarantine_special(self.ctx, dir_fd, name, QuarantineReason.NON_REGULAR_FILE, st)
        except SourceMissing:
            return
        except (MoveError, Indeterminate, OSError) as e:
            self.report.errors.append(f"quarantine {rel}/{name} ({linux.file_kind(st.st_mode)}): {e}")
            return
        if qname is None:
            self.report.ignored.append(f"{rel}/{name}")  # reported by an earlier scan of this process
        else:
            self.report.quarantined.append((f"{rel}/{name}", QuarantineReason.NON_REGULAR_FILE, qname))

    def unreadable(self, dir_fd: int, rel: str, name: str, e: OSError) -> str:
        """For EACCES, whose the job is and the fix (a root `put` into the daemon's private queue left such jobs)."""
        if e.errno != errno.EACCES:
            return ""
        try:
            st = linux.stat_at(dir_fd, name)
        except OSError:
            return ""
        return f": {unreadable_job_text(st, os.path.join(self.ctx.path, rel, name))}"

    def consider(
        self, shard: int, dir_fd: int, rel: str, name: str, job: JobName, opened: int | None = None
    ) -> Lease | None:
        """Check ``name`` and claim it; ``opened``: its descriptor, when the caller opened it first (_try_leftover)."""
        fmt = self.ctx.fmt
        if not authenticate(fmt.queue_id, job, shard=shard, lease_width_ns=fmt.lease_width_ns) or (
            shard_of(fmt.queue_id, job.job_id, fmt.shard_count) != shard
        ):
            if opened is not None:
                linux.close_quietly(opened)
            self.isolate(dir_fd, rel, name, QuarantineReason.FILENAME_TAG_FAILED)
            return None
        if job.attempt >= job.max_attempts:
            if opened is not None:
                linux.close_quietly(opened)
            self.exhausted_to_dead(shard, dir_fd, name, job)
            return None
        if opened is not None:
            fd = opened
        else:
            try:
                fd = linux.open_at(dir_fd, name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as e:
                self.open_failed(dir_fd, rel, name, e)
                return None
        try:
            return self.claim_open(shard, dir_fd, rel, name, job, fd)
        finally:
            linux.close_quietly(fd)  # read-only fd: a failed close must not turn a committed claim into NotCommitted

    def open_failed(self, dir_fd: int, rel: str, name: str, e: OSError) -> None:
        """The candidate's open failed: skipped (gone), quarantined (not a regular file) or reported."""
        if e.errno == errno.ENOENT:
            self.lost += 1
            return
        if e.errno == errno.ELOOP:  # a symlink wearing a job name: never followed
            self.isolate(dir_fd, rel, name, QuarantineReason.NON_REGULAR_FILE)
            return
        special = linux.not_regular(dir_fd, name)  # ENXIO: a socket; EACCES: maybe a directory
        if special is not None:
            self.isolate_special(dir_fd, rel, name, special)
            return
        self.report.errors.append(f"open {rel}/{name}: {e.strerror}{self.unreadable(dir_fd, rel, name, e)}")

    def claim_open(
        self,
        shard: int,
        dir_fd: int,
        rel: str,
        name: str,
        job: JobName,
        fd: int,
        drawn: tuple[int, int, bytes] | None = None,
    ) -> Lease | None:
        """Verify, move and check the opened candidate; ``drawn``: the (wall floor, boottime,
        token) the C claim core's caller read already at this point (bridge), else read here."""
        ctx, fmt = self.ctx, self.ctx.fmt
        try:
            st = linux.fstat(fd)
            env = read_envelope(fd, fmt.max_payload_length, st)
            check_name_matches(env.header, job)
            extension = decode_extension(env.extension) if env.extension else None
        except CorruptObject as e:
            self.isolate(dir_fd, rel, name, e.reason, _witness_of(fd))
            return None
        except OSError as e:
            self.report.errors.append(f"read {rel}/{name}: {e.strerror}")
            return None
        # The spec's re-stat of the path after verifying is the witnessed move's
        # own stat (tree.move_witnessed, right before the rename): between the two
        # only clocks are read, so one stat proves it, and the later one proves more.
        wall, bt, token = drawn if drawn is not None else (self.wall_floor(), linux.boottime_ns(), b"")
        bt_deadline, wall_deadline = bt + self.duration_ns, wall + self.duration_ns
        if bt_deadline > U64_MAX or wall_deadline > U64_MAX:
            return None
        if drawn is None:
            token = ctx.random(16)
        generation, attempt = next_generation(job.generation), next_attempt(job.attempt)
        # Every part was parsed by the grammar or computed and checked just above.
        target = trusted_leased_name(job, generation, attempt, ctx.boot_raw, bt_deadline, wall_deadline, token)
        target_file = make_filename(fmt.queue_id, target, shard=shard, lease_width_ns=fmt.lease_width_ns)
        target_rel = f"{rel}/{target_file}"
        lease = lease_from_claim(
            ctx,
            name_rel=target_rel,
            env=env,
            extension=extension,
            generation=generation,
            attempt=attempt,
            token=token,
            bt_deadline=bt_deadline,
            wall_deadline=wall_deadline,
            reader=self.reader,
        )

        after_rename: list[Envelope] = []

        def recheck_evidence() -> None:
            # After the rename, the held descriptor must still show the verified bytes.
            after_rename.append(reread_envelope(fd, env, fmt.max_payload_length))

        try:
            ctx.tree.move_witnessed(dir_fd, name, dir_fd, target_file, env.witness, after=recheck_evidence, force=True)
        except SourceMissing:
            return None  # another consumer won the rename
        except Collision:
            self.report.errors.append(f"{target_rel} already exists")
            return None
        except MoveError as e:
            self.report.errors.append(f"claim {rel}/{name}: {e}")
            return None
        except Indeterminate as e:
            raise _claim_unknown(ctx, lease, job.generation, job.attempt, e) from e
        remember_own_lease_path(ctx, rel, target_rel, shard, target)
        return self.check_claimed_payload(lease, job, fd, after_rename[-1], dir_fd, rel, target_file)

    def check_claimed_payload(
        self,
        lease: Lease,
        job: JobName | tuple[int, int],
        fd: int,
        env: Envelope,
        dir_fd: int,
        rel: str,
        target_file: str,
    ) -> Lease | None:
        """The end of claim_open, once moved: the payload as read after the rename (the recheck's
        read, ``env``) must match its digest. ``job``: the ready name, or its (generation, attempt)."""
        try:
            verify_payload(fd, env)
        except CorruptObject:
            self.isolate(dir_fd, rel, target_file, QuarantineReason.PAYLOAD_CORRUPT, env.witness)
            return None
        except OSError as e:
            generation, attempt = (job.generation, job.attempt) if isinstance(job, JobName) else job
            cause = Indeterminate("source_directory_durable", f"read payload: {e.strerror}")
            raise _claim_unknown(self.ctx, lease, generation, attempt, cause) from e
        return lease

    def exhausted_to_dead(self, shard: int, dir_fd: int, name: str, job: JobName) -> None:
        """A ready job with no attempts left goes to dead (reason 0x0004)."""
        ctx, fmt = self.ctx, self.ctx.fmt
        bucket = terminal_bucket(self.wall_floor(), fmt.terminal_width_ns)
        target = dead_name(
            job.job_id,
            next_generation(job.generation),
            job.attempt,
            job.max_attempts,
            reason=DeadReason.ATTEMPTS_EXHAUSTED,
        )
        target_file = make_filename(fmt.queue_id, target, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns)
        dead_rel = state_dir(State.DEAD, shard, bucket)
        try:
            dead_fd = ctx.tree.ensure_dir(dead_rel)
            ctx.tree.move_unwitnessed(dir_fd, name, dead_fd, target_file)
            self.report.dead_lettered.append(f"{dead_rel}/{target_file}")
        except SourceMissing:
            pass
        except (MoveError, Indeterminate, OSError) as e:
            ctx.poison(f"exhausted ready cleanup of {job.job_hex}: {e}")
            raise NotCommitted(f"moving exhausted job {job.job_hex} to dead failed: {e}", ErrorKind.IO_FAILURE) from e


def _core_envelope(c: Any, st: Any, head: bytes, ext: bytes) -> Envelope:
    """The Envelope of a file the C claim core verified, moved and re-read (reread_envelope's result):
    the header and extension of its first read (``head``, its header and ``ext``), which the core
    compared with the re-read, and the re-read's bytes as ``head``."""
    return Envelope(
        JobHeader.decode(head[:HEADER_SIZE]), ext, st.size, Witness(st.dev, st.ino),
        bridge.ffi.buffer(c.head2, c.head2_len)[:],
    )  # fmt: skip


def _witness_of(fd: int) -> Witness | None:
    try:
        return Witness.of(linux.fstat(fd))
    except OSError:
        return None


def _claim_unknown(ctx: Context, lease: Lease, generation: int, attempt: int, e: Indeterminate) -> SteadQError:
    """A claim whose outcome is unknown after its rename: the handle poisoned, and the ticket, whose
    source identity is the ready object's (its ``generation`` and ``attempt``) and whose destination
    is the lease's name (its deadlines)."""
    source_view = replace(lease, generation=generation, attempt=attempt)
    destination = LeasedLocation(ctx.boot_id, lease.boottime_deadline_ns, lease.wall_deadline_ns)
    ctx.poison(f"claim of {source_view.job_id}: {e.cause}")
    ticket = make_ticket(ctx, source_view, "claim", e.phase, destination, source=ReadyLocation())
    return OutcomeUnknown(f"claim outcome unknown: {e.cause}", ticket)


def claim(ctx: Context, duration_ns: int, reader: Any) -> tuple[Lease | None, ScanReport]:
    """One scan. Returns (lease or None, report); raises NotCommitted when the
    scan found nothing and hit errors, so "empty" is never claimed falsely."""
    if ctx.poisoned is not None:  # check_usable's test, without its call (every lease)
        ctx.check_usable()
    if ctx.boottime_problem is not None:  # refuse_boottime's
        refuse_boottime(ctx.boottime_problem, "lease")
    scan = _Scan(ctx, duration_ns, reader)
    try:
        lease = scan.run()
    except MaintenanceBusy as e:
        raise NotCommitted(str(e), ErrorKind.MAINTENANCE_BUSY) from e
    if lease is None and scan.report.errors:
        raise NotCommitted("scan completed with errors: " + "; ".join(scan.report.errors[:5]), ErrorKind.IO_FAILURE)
    return lease, scan.report
