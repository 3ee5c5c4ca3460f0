"""``fsck``: check every object of a queue tree, and optionally quarantine the bad ones.

Spec: ``cli.md`` ("fsck" finding types), ``recovery.md`` ("fsck",
"Quarantine"), ``open-questions.md`` item 27.

Why this lives apart from the protocol modules: it is not a transition. It
only reads, except that ``repair`` performs exactly one kind of mutation (the
unwitnessed quarantine move recovery also uses), so it cannot break an
invariant the transitions rely on.

It follows the reference's check order and finding types so its findings
stay comparable, and goes further where the reference is weak: non-ASCII
names are reported (``invalid_name_encoding``), anything that does not belong
in the tree is a ``WARN unexpected_entry`` instead of being silently skipped
(including directories with non-canonical shard, bucket or boot names, which
are still walked), a delayed job in the wrong bucket directory is reported
(``bucket_placement_mismatch``), objects that vanish mid-walk (a live queue:
claims, acks) are skipped instead of being reported as ``stat_failed``, and
unreadable directories are reported instead of ignored.
"""

from __future__ import annotations

import dataclasses
import errno
import hmac
import os
import stat as stat_mod

from steadqd.constants import (
    DEAD_DIR,
    DELAYED_DIR,
    HEADER_SIZE,
    JOB_EXT,
    LEASED_DIR,
    MAX_EXTENSION_LENGTH,
    READY_DIR,
    RECEIPT_EXT,
    RECEIPTS_DIR,
    TAG_STATE_WORD,
    QuarantineReason,
    State,
)
from steadqd.errors import CorruptObject, SteadQError
from steadqd.fs import linux
from steadqd.fs.context import Context
from steadqd.fs.names import (
    JobName,
    boot_dashed,
    boot_raw,
    compute_tag,
    delayed_bucket,
    is_compact_temp_name,
    lease_bucket,
    parse_bucket_dir,
    parse_name,
    parse_quarantine_name,
    parse_ready_dir_entry,
    parse_shard_dir,
    shard_dir,
    shard_of,
)
from steadqd.fs.quarantine import quarantine
from steadqd.fs.receipt import verify_receipt
from steadqd.fs.records import JobHeader, check_envelope
from steadqd.fs.tree import Indeterminate, MoveError, Witness
from steadqd.fs.verify import Envelope, iter_payload
from steadqd.fsck_report import Finding, FsckResult

__all__ = ["Finding", "FsckResult", "fsck"]


class _Failed(Exception):
    """One object's first failing check: ends that object's checks."""

    def __init__(
        self, finding_type: str, details: str, reason: int | None, severity: str = "ERROR", *, locked_out: bool = False
    ) -> None:
        super().__init__(details)
        self.finding_type = finding_type
        self.details = details
        self.reason = reason  # quarantine reason for --repair; None: never repaired
        self.severity = severity
        self.locked_out = locked_out  # a receipt another process holds locked: repair must not touch it


class _Vanished(Exception):
    """The entry was moved away by a concurrent transition: not a finding."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_OBJECT_SUFFIXES = (JOB_EXT, RECEIPT_EXT)

# (state directory, directory levels between it and the objects, its grammar)
_FSCK_WALK: tuple[tuple[str, int, State], ...] = (
    (READY_DIR, 1, State.READY),
    (LEASED_DIR, 3, State.LEASED),
    (DELAYED_DIR, 2, State.DELAYED),
    (DEAD_DIR, 2, State.DEAD),
    (RECEIPTS_DIR, 2, State.RECEIPT),
)


def _decode_header(raw: bytes) -> JobHeader:
    """Decode like JobHeader.decode, but let an oversized extension length
    through so it is reported in the reference's order (``extension_too_large``
    after the name/header comparisons, not as a decode failure)."""
    try:
        return JobHeader.decode(raw)
    except CorruptObject:
        ext_len = int.from_bytes(raw[12:16], "big") if len(raw) == HEADER_SIZE else 0
        if ext_len <= MAX_EXTENSION_LENGTH:
            raise
        header = JobHeader.decode(raw[:12] + bytes(4) + raw[16:])  # still fails if anything else is wrong
        return dataclasses.replace(header, extension_length=ext_len)


def _read_exact(fd: int, n: int, offset: int, what: str, finding: str) -> bytes:
    """Exactly n bytes, or the finding. A short read is corruption (quarantine
    0x0001); an I/O error is reported but never repaired: moving a job out of
    the queue because a disk hiccupped would turn a transient error into a loss."""
    chunks: list[bytes] = []
    got = 0
    try:
        while got < n:
            chunk = linux.pread(fd, n - got, offset + got)
            if not chunk:
                raise _Failed(finding, f"{what}: short read ({got} of {n} bytes)", QuarantineReason.ENVELOPE_CORRUPT)
            chunks.append(chunk)
            got += len(chunk)
    except OSError as e:
        raise _Failed(finding, f"{what}: {e.strerror}", None) from e
    return b"".join(chunks)


class _Fsck:
    def __init__(self, ctx: Context, deep: bool, repair: bool) -> None:
        self.ctx = ctx
        self.fmt = ctx.fmt
        self.deep = deep
        self.repair = repair
        self.r = FsckResult()

    # -- findings and repair ------------------------------------------------

    def add(self, severity: str, path: str, finding_type: str, details: str) -> None:
        self.r.findings.append(Finding(severity, path, finding_type, details))

    def repair_entry(self, rel: str, dir_fd: int, name: str, reason: int) -> None:
        """Quarantine with an unwitnessed move (recovery.md) and report the outcome."""
        try:
            qname = quarantine(self.ctx, dir_fd, name, reason)
        except (MoveError, Indeterminate, OSError, SteadQError) as e:
            self.add("ERROR", rel, "quarantine_failed", f"{type(e).__name__}: {e}")
            return
        parsed = parse_quarantine_name(qname)
        qid = parsed[0].hex() if parsed else "?"
        self.r.quarantined += 1
        self.add("WARN", rel, "quarantined", f"moved to quarantine id={qid} name={qname}")

    # -- the walk -------------------------------------------------------------

    def run(self) -> FsckResult:
        root = self.ctx.root_fd
        for top, levels, state in _FSCK_WALK:
            try:
                fd = linux.open_beneath(root, top, _DIR_FLAGS)
            except FileNotFoundError:
                continue
            except OSError as e:
                self.add("ERROR", top, "directory_unreadable", e.strerror or str(e))
                continue
            try:
                self.walk_dir(fd, top, (), levels, state)
            finally:
                linux.close(fd)
        return self.r

    def walk_dir(self, fd: int, rel: str, comps: tuple[str, ...], levels: int, state: State) -> None:
        try:
            entries = linux.list_dir(fd)  # sorted: deterministic output; the listing is one directory
        except OSError as e:
            self.add("ERROR", rel, "directory_unreadable", e.strerror or str(e))
            return
        top = rel.split("/", 1)[0]
        for raw in entries:
            try:
                name = raw.decode("ascii")
            except UnicodeDecodeError:
                self.bad_encoding(fd, rel, raw, at_object_level=levels == 0)
                continue
            path = f"{rel}/{name}"
            if levels > 0:
                self.descend(fd, path, name, comps, levels, state)
            elif name.endswith(_OBJECT_SUFFIXES):
                self.check_object(fd, top, comps, name, state)
            else:
                self.not_an_object(fd, path, name, top)

    def bad_encoding(self, fd: int, rel: str, raw: bytes, *, at_object_level: bool) -> None:
        path = f"{rel}/<bytes:{raw.hex()}>"
        self.add("ERROR", path, "invalid_name_encoding", "entry name is not ASCII")
        if not (self.repair and at_object_level):
            return
        name = os.fsdecode(raw)  # surrogateescape: renames back to the same bytes
        try:
            st = linux.stat_at(fd, name)
        except OSError:
            return
        if not stat_mod.S_ISDIR(st.st_mode):
            self.repair_entry(path, fd, name, QuarantineReason.FILENAME_PARSE_FAILED)

    def descend(self, fd: int, path: str, name: str, comps: tuple[str, ...], levels: int, state: State) -> None:
        try:
            child = linux.open_at(fd, name, _DIR_FLAGS)
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                what = (
                    "job object outside a shard directory (not checked)"
                    if name.endswith(_OBJECT_SUFFIXES)
                    else "not a directory"
                )
                self.add("WARN", path, "unexpected_entry", what)
            else:
                self.add("ERROR", path, "directory_unreadable", e.strerror or str(e))
            return
        try:
            problem = self.directory_name_problem(name, levels)
            if problem:
                # Still walked: a job hidden in a bogus directory is worth finding.
                self.add("WARN", path, "unexpected_entry", problem)
            self.walk_dir(child, path, comps + (name,), levels - 1, state)
        finally:
            linux.close(child)

    def directory_name_problem(self, name: str, levels: int) -> str | None:
        """Why a directory name is not what layout.md puts at this level, or None.

        ``levels`` counts the directory levels left above the objects: 1 is
        the shard level, 2 a bucket, 3 a legacy boot directory.
        """
        if levels == 1:
            if parse_shard_dir(name, self.fmt.shard_count) is None:
                return f"not a shard directory (4 hex digits below {self.fmt.shard_count:04x})"
        elif levels == 2:
            if parse_bucket_dir(name) is None:
                return "not a bucket directory (16 lowercase hex digits)"
        else:
            try:
                boot_raw(name)
            except SteadQError:
                return "not a boot id directory (dashed lowercase UUID)"
        return None

    def not_an_object(self, fd: int, path: str, name: str, top: str) -> None:
        try:
            st = linux.stat_at(fd, name)
        except FileNotFoundError:
            return
        except OSError as e:
            self.add("WARN", path, "unexpected_entry", f"not an object name; stat failed: {e.strerror}")
            return
        if stat_mod.S_ISDIR(st.st_mode):
            what = "directory inside a shard directory"
        elif top == RECEIPTS_DIR and is_compact_temp_name(name):
            what = "stale receipt compaction temp (removed by the next compaction)"
        else:
            what = "not an object name"
        self.add("WARN", path, "unexpected_entry", what)

    # -- one object -------------------------------------------------------------

    def check_object(self, dir_fd: int, top: str, comps: tuple[str, ...], name: str, state: State) -> None:
        rel = "/".join((top, *comps, name))
        self.r.total_objects += 1
        try:
            self.check_object_inner(dir_fd, top, comps, name, state)
        except _Vanished:
            self.r.total_objects -= 1
        except _Failed as f:
            self.add(f.severity, rel, f.finding_type, f.details)
            if not self.repair or f.reason is None:
                return
            if f.locked_out:
                self.add("ERROR", rel, "quarantine_failed", "receipt is locked by another process (OFD lock busy)")
            else:
                self.repair_entry(rel, dir_fd, name, f.reason)

    def check_object_inner(self, dir_fd: int, top: str, comps: tuple[str, ...], name: str, state: State) -> None:
        try:
            jn = parse_ready_dir_entry(name) if top == READY_DIR else parse_name(state, name)
        except CorruptObject as e:
            raise _Failed("filename_parse_failed", e.message, QuarantineReason.FILENAME_PARSE_FAILED) from e
        try:
            st = linux.stat_at(dir_fd, name)
        except FileNotFoundError as e:
            raise _Vanished from e
        except OSError as e:
            raise _Failed("stat_failed", e.strerror or str(e), None) from e
        if not stat_mod.S_ISREG(st.st_mode):
            raise _Failed(
                "non_regular_file", f"file type 0o{stat_mod.S_IFMT(st.st_mode):o}", QuarantineReason.NON_REGULAR_FILE
            )
        if st.st_nlink != 1:
            raise _Failed("unexpected_hard_link", f"st_nlink={st.st_nlink}", QuarantineReason.UNEXPECTED_HARD_LINK)
        receipt = state is State.RECEIPT
        flags = (os.O_RDWR if receipt and self.repair else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = linux.open_at(dir_fd, name, flags)
        except FileNotFoundError as e:
            raise _Vanished from e
        except OSError as e:
            raise _Failed("open_failed", e.strerror or str(e), None) from e
        try:
            fst = linux.fstat(fd)
            if not Witness.of(st).matches(fst) or not stat_mod.S_ISREG(fst.st_mode) or fst.st_nlink != 1:
                raise _Vanished  # replaced between fstatat and open: a concurrent writer, look again next run
            if receipt:
                self.check_receipt(fd, fst, comps, name)
            else:
                self.check_job(fd, fst, top, comps, jn)
        finally:
            linux.close(fd)

    def check_receipt(self, fd: int, st: os.stat_result, comps: tuple[str, ...], name: str) -> None:
        locked = True
        if self.repair:
            # Compaction and retention lock receipts; a busy one may be mid-replacement.
            try:
                locked = linux.ofd_lock(fd, exclusive=True)
            except OSError:
                locked = False
        bucket = parse_bucket_dir(comps[0])
        shard = int(comps[1], 16) if len(comps[1]) == 4 and all(c in "0123456789abcdef" for c in comps[1]) else None
        try:
            if bucket is None or shard is None:
                raise CorruptObject(
                    "receipt is not in a canonical receipts/<bucket>/<shard>/ directory",
                    QuarantineReason.ENVELOPE_CORRUPT,
                )
            info = verify_receipt(self.fmt, fd, name, bucket, shard, st=st)
        except CorruptObject as e:
            reason = QuarantineReason.PAYLOAD_CORRUPT if e.payload else QuarantineReason.ENVELOPE_CORRUPT
            raise _Failed("receipt_verification_failed", e.message, reason, locked_out=not locked) from e
        except OSError as e:
            raise _Failed("receipt_verification_failed", f"I/O error: {e.strerror}", None) from e
        self.r.structurally_verified += 1
        if not info.compact:
            self.r.payloads_deep_verified += 1

    def check_job(self, fd: int, st: os.stat_result, top: str, comps: tuple[str, ...], jn: JobName) -> None:
        size = st.st_size
        if size == 0:
            raise _Failed("zero_length_publication_residue", "file is empty", QuarantineReason.ENVELOPE_CORRUPT, "WARN")
        raw = _read_exact(fd, HEADER_SIZE, 0, "header", "header_read_failed")
        try:
            header = _decode_header(raw)
        except CorruptObject as e:
            raise _Failed("header_decode_failed", e.message, QuarantineReason.ENVELOPE_CORRUPT) from e
        if header.job_id != jn.job_id:
            raise _Failed(
                "header_job_id_mismatch",
                f"header job_id {header.job_id.hex()}, name {jn.job_hex}",
                QuarantineReason.FILENAME_HEADER_MISMATCH,
            )
        if header.max_attempts != jn.max_attempts:
            raise _Failed(
                "header_max_attempts_mismatch",
                f"header maximum_attempts {header.max_attempts}, name {jn.max_attempts}",
                QuarantineReason.FILENAME_HEADER_MISMATCH,
            )
        ext_len = header.extension_length
        if ext_len > MAX_EXTENSION_LENGTH:
            raise _Failed(
                "extension_too_large",
                f"{ext_len} bytes, limit {MAX_EXTENSION_LENGTH}",
                QuarantineReason.ENVELOPE_CORRUPT,
            )
        extension = _read_exact(fd, ext_len, HEADER_SIZE, "extension", "extension_read_failed") if ext_len else b""
        try:
            check_envelope(header, raw, extension)
        except CorruptObject as e:
            raise _Failed("envelope_digest_mismatch", e.message, QuarantineReason.ENVELOPE_CORRUPT) from e
        payload_size = size - HEADER_SIZE - ext_len
        if payload_size < 0:
            raise _Failed("negative_file_size", f"file is {size} bytes", QuarantineReason.ENVELOPE_CORRUPT)
        if payload_size != header.payload_length:
            raise _Failed(
                "file_size_mismatch",
                f"file is {size} bytes, header says {header.file_size}",
                QuarantineReason.ENVELOPE_CORRUPT,
            )
        if header.payload_length > self.fmt.max_payload_length:
            raise _Failed(
                "payload_exceeds_limit",
                f"payload {header.payload_length} bytes, queue maximum {self.fmt.max_payload_length}",
                QuarantineReason.ENVELOPE_CORRUPT,
            )
        shard_name = comps[-1]
        if not hmac.compare_digest(compute_tag(self.fmt.queue_id, self.tag_context(top, comps, jn)), jn.tag or b""):
            raise _Failed(
                "name_tag_mismatch",
                "name tag does not authenticate for this directory",
                QuarantineReason.FILENAME_TAG_FAILED,
            )
        expected_shard = shard_dir(shard_of(self.fmt.queue_id, jn.job_id, self.fmt.shard_count))
        if shard_name != expected_shard:
            raise _Failed(
                "shard_placement_mismatch",
                f"job belongs in shard {expected_shard}, found in {shard_name}",
                QuarantineReason.FILENAME_TAG_FAILED,
            )
        if top == DELAYED_DIR:
            # Not checked by the reference: a job in the wrong bucket would be promoted at the wrong time.
            assert jn.not_before is not None
            want = delayed_bucket(jn.not_before, self.fmt.delayed_width_ns)
            if parse_bucket_dir(comps[0]) != want:
                raise _Failed(
                    "bucket_placement_mismatch",
                    f"not_before belongs in bucket {want:016x}, found in {comps[0]}",
                    QuarantineReason.FILENAME_TAG_FAILED,
                )
        self.r.structurally_verified += 1
        if self.deep:
            self.check_payload(fd, header, extension, st)

    def tag_context(self, top: str, comps: tuple[str, ...], jn: JobName) -> str:
        """The tag context recomputed from the path the object was found at
        (names.md); colocated leases use the leased context from their name."""
        base = jn.base()
        word = TAG_STATE_WORD[jn.state]
        if top == READY_DIR:
            (s,) = comps
            if jn.state is State.LEASED:
                assert jn.boot_id is not None and jn.boottime_deadline is not None
                bucket = lease_bucket(jn.boottime_deadline, self.fmt.lease_width_ns)
                return f"{word}/{boot_dashed(jn.boot_id)}/{bucket:016x}/{s}/{base}"
            return f"{word}/-/-/{s}/{base}"
        if top == LEASED_DIR:
            boot, b, s = comps
            return f"{word}/{boot}/{b}/{s}/{base}"
        b, s = comps
        return f"{word}/-/{b}/{s}/{base}"

    def check_payload(self, fd: int, header: JobHeader, extension: bytes, st: os.stat_result) -> None:
        env = Envelope(header, extension, st.st_size, Witness.of(st))
        try:
            for _ in iter_payload(fd, env):
                pass
        except CorruptObject as e:
            if e.payload:
                raise _Failed("payload_digest_mismatch", e.message, QuarantineReason.PAYLOAD_CORRUPT) from e
            raise _Failed("payload_read_failed", e.message, None) from e
        except OSError as e:
            raise _Failed("payload_read_failed", e.strerror or str(e), None) from e
        self.r.payloads_deep_verified += 1


def fsck(ctx: Context, *, deep: bool = False, repair: bool = False) -> FsckResult:
    """Check every object in ready, legacy leased, delayed, dead, receipts.

    Read-only unless ``repair``: then each object whose first failing check
    has a repair reason (recovery.md fsck table) is moved, unchanged, to
    ``quarantine/`` and a ``WARN quarantined`` finding is added after its
    ERROR (which stays, so the exit code is still 3). Receipts are always
    fully verified; job payloads only with ``deep``.
    """
    with ctx.tree.operation():
        return _Fsck(ctx, deep, repair).run()
