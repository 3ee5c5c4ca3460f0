"""Read-mostly inspection of a queue tree: ``stats``, ``fsck`` and ``inspect``.

Spec: ``cli.md`` (``stats``, ``fsck``, ``inspect`` output formats),
``recovery.md`` ("fsck", "Quarantine"), ``open-questions.md`` items 17/27.

Why this lives apart from the protocol modules: none of it is a transition.
``stats`` and ``inspect`` only read; ``fsck --repair`` performs exactly one
kind of mutation (the unwitnessed quarantine move recovery also uses), so it
cannot break an invariant the transitions rely on.

Two flavours of ``stats`` exist on purpose:

* :func:`stats` reproduces the reference CLI byte for byte (every
  non-directory entry counts, colocated leases count as *ready*, *leased* is
  only the legacy tree) so dashboards built for the reference keep working;
* :func:`detailed_stats` is what an operator actually wants: objects are
  classified by their parsed *name*, so colocated leases are *leased*, stray
  files are not jobs, and temporaries get their own ``tmp`` line.

Both stream the tree with ``os.scandir`` (one directory iterator per level,
never a list of names), so memory stays flat for millions of jobs.

``fsck`` follows the reference's check order and finding types so its output
lines stay comparable, and goes further where the reference is weak:
non-ASCII names are reported (``invalid_name_encoding``), anything that does
not belong in the tree is a ``WARN unexpected_entry`` instead of being
silently skipped (including directories with non-canonical shard, bucket or
boot names, which are still walked), a delayed job in the wrong bucket
directory is reported
(``bucket_placement_mismatch``), objects that vanish mid-walk (a live queue:
claims, acks) are skipped instead of being reported as ``stat_failed``, and
unreadable directories are reported instead of ignored.
"""

from __future__ import annotations

import dataclasses
import errno
import hmac
import json
import os
import re
import stat as stat_mod
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from steadqd.constants import (
    DEAD_DIR,
    DELAYED_DIR,
    HEADER_SIZE,
    JOB_EXT,
    LEASED_DIR,
    MAX_EXTENSION_LENGTH,
    NS_PER_SECOND,
    QUARANTINE_DIR,
    READY_DIR,
    RECEIPT_EXT,
    RECEIPTS_DIR,
    TAG_STATE_WORD,
    TMP_DIR,
    QuarantineReason,
    State,
)
from steadqd.errors import CorruptObject, SteadQError
from steadqd.fs import linux
from steadqd.fs.context import Context
from steadqd.fs.names import (
    JobName,
    authenticate,
    boot_dashed,
    boot_raw,
    compute_tag,
    delayed_bucket,
    is_compact_temp_name,
    lease_bucket,
    parse_bucket_dir,
    parse_job_id,
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

__all__ = [
    "STATS_STATES",
    "DETAILED_STATS_STATES",
    "StateStats",
    "stats",
    "detailed_stats",
    "format_stats_text",
    "format_stats_json",
    "format_stats_prometheus",
    "Finding",
    "FsckResult",
    "fsck",
    "format_fsck_lines",
    "format_fsck_summary",
    "JobObject",
    "inspect_job",
    "format_inspect_line",
]

# =========================================================================== stats

# The reference's state directories, in its walk order (output is sorted by name).
STATS_STATES = (READY_DIR, LEASED_DIR, DELAYED_DIR, RECEIPTS_DIR, DEAD_DIR, QUARANTINE_DIR)
DETAILED_STATS_STATES = ("dead", "delayed", "leased", "quarantine", "ready", "receipts", "tmp")


@dataclass(frozen=True)
class StateStats:
    """Objects in one state and the age of the oldest (by mtime), in whole seconds.

    ``oldest_age_seconds`` is None exactly when ``objects`` is 0.
    """

    objects: int
    oldest_age_seconds: int | None


class _Tally:
    """Count and minimum mtime of one state, accumulated while streaming."""

    __slots__ = ("count", "oldest_ns")

    def __init__(self) -> None:
        self.count = 0
        self.oldest_ns: int | None = None

    def add(self, mtime_ns: int) -> None:
        self.count += 1
        if self.oldest_ns is None or mtime_ns < self.oldest_ns:
            self.oldest_ns = mtime_ns

    def result(self, now_ns: int) -> StateStats:
        if self.oldest_ns is None:
            return StateStats(self.count, None)
        # floor(now - oldest) in seconds; an mtime in the future is age 0.
        return StateStats(self.count, max(0, now_ns - self.oldest_ns) // NS_PER_SECOND)


def _stream_files(top: str) -> Iterator[tuple[int, os.DirEntry[str]]]:
    """Yield ``(depth, entry)`` for every non-directory entry below ``top``.

    Depth 1 is a direct child of ``top``. One ``os.scandir`` iterator per
    open level, nothing else is retained, so memory does not grow with the
    number of entries. Symlinks are entries, never followed: every level,
    ``top`` included, is opened with O_NOFOLLOW relative to its parent's fd,
    so a symlink planted as (or swapped in for) a directory can never make
    stats list a directory outside the queue. A subdirectory that vanishes
    mid-walk (receipt retention removing a bucket) or is replaced by a
    non-directory is skipped; ``top`` itself failing to open raises, as do
    read errors of any level, which the CLI reports as ``stats: <path>: <err>``.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    top_fd = os.open(top, flags)
    stack: list[tuple[int, int, Iterator[os.DirEntry[str]]]] = []
    try:
        stack.append((1, top_fd, os.scandir(top_fd)))
    except BaseException:
        os.close(top_fd)
        raise
    try:
        while stack:
            depth, dir_fd, it = stack[-1]
            entry = next(it, None)
            if entry is None:
                it.close()  # type: ignore[attr-defined]
                os.close(dir_fd)
                stack.pop()
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not is_dir:
                yield depth, entry
                continue
            try:
                child = os.open(entry.name, flags, dir_fd=dir_fd)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as e:
                if e.errno == errno.ELOOP:  # became a symlink since it was listed
                    continue
                raise
            try:
                stack.append((depth + 1, child, os.scandir(child)))
            except BaseException:
                os.close(child)
                raise
    finally:
        for _, fd, it in stack:
            it.close()  # type: ignore[attr-defined]
            os.close(fd)


def _mtime_ns(entry: os.DirEntry[str]) -> int | None:
    """lstat mtime, or None if the entry was moved away since it was listed."""
    try:
        return entry.stat(follow_symlinks=False).st_mtime_ns
    except FileNotFoundError:
        return None


def stats(queue_root: str, *, now_ns: int | None = None) -> dict[str, StateStats]:
    """Per-state counts with the reference CLI's exact semantics (cli.md "stats").

    Keys are the state directories that exist among ready, leased, delayed,
    receipts, dead, quarantine. Every non-directory entry below each one
    counts, whatever its name (open-questions 17): colocated leases count as
    *ready*, *leased* is the legacy tree only, stray temps count too. Use
    :func:`detailed_stats` for a classification by name.
    """
    now = time.time_ns() if now_ns is None else now_ns
    out: dict[str, StateStats] = {}
    for state in STATS_STATES:
        top = os.path.join(os.fspath(queue_root), state)
        if not os.path.isdir(top) or os.path.islink(top):  # a symlinked state dir is never followed
            continue
        tally = _Tally()
        for _, entry in _stream_files(top):
            mtime = _mtime_ns(entry)
            if mtime is not None:
                tally.add(mtime)
        out[state] = tally.result(now)
    return out


# The names.md grammars as regular expressions: stats only needs "does this
# name parse", and a compiled fullmatch is ~10x cheaper than building a
# JobName for each of millions of entries. tests/integration/test_inspect.py
# checks these agree with names.parse_name.
_H = "[0-9a-f]"


def _grammar_re(fields: str, ext: str) -> re.Pattern[str]:
    return re.compile(rf"{_H}{{32}}\.g{_H}{{16}}\.a{_H}{{8}}\.m{_H}{{8}}{fields}\.k{_H}{{16}}\{ext}")


NAME_PATTERNS: dict[State, re.Pattern[str]] = {
    State.READY: _grammar_re("", JOB_EXT),
    State.LEASED: _grammar_re(rf"\.o{_H}{{32}}\.b{_H}{{16}}\.w{_H}{{16}}\.t{_H}{{32}}", JOB_EXT),
    State.DELAYED: _grammar_re(rf"\.d{_H}{{16}}", JOB_EXT),
    State.DEAD: _grammar_re(rf"\.x{_H}{{4}}", JOB_EXT),
    State.RECEIPT: _grammar_re(rf"\.t{_H}{{32}}", RECEIPT_EXT),
}


def _classify_ready(depth: int, name: str) -> str | None:
    if depth != 2:
        return None
    if NAME_PATTERNS[State.READY].fullmatch(name):
        return "ready"
    if NAME_PATTERNS[State.LEASED].fullmatch(name):
        return "leased"
    return None


def _classifier(state: State, key: str, depth: int) -> Callable[[int, str], str | None]:
    pattern = NAME_PATTERNS[state]

    def classify(d: int, name: str) -> str | None:
        if d != depth:
            return None
        if pattern.fullmatch(name):
            return key
        if state is State.RECEIPT and is_compact_temp_name(name):
            return "tmp"
        return None

    return classify


def _classify_quarantine(depth: int, name: str) -> str | None:
    return "quarantine" if depth == 1 and parse_quarantine_name(name) is not None else None


def detailed_stats(ctx: Context, *, now_ns: int | None = None) -> dict[str, StateStats]:
    """Per-state counts of *objects*, classified by their parsed names.

    Keys (always all present): ready, leased (colocated in ``ready/<S>/``
    **and** legacy ``leased/``), delayed, dead, receipts, quarantine, tmp
    (publication temps under ``tmp/`` plus stale receipt-compaction temps).
    Entries whose names do not parse for their place are not counted here;
    ``fsck`` reports them. Ages use mtime like :func:`stats` (cheap: no file
    is opened); a rename keeps mtime, so a job's age is its publication age.
    """
    now = time.time_ns() if now_ns is None else now_ns
    tallies = {k: _Tally() for k in DETAILED_STATS_STATES}
    walks: list[tuple[str, Callable[[int, str], str | None]]] = [
        (READY_DIR, _classify_ready),
        (LEASED_DIR, _classifier(State.LEASED, "leased", 4)),
        (DELAYED_DIR, _classifier(State.DELAYED, "delayed", 3)),
        (DEAD_DIR, _classifier(State.DEAD, "dead", 3)),
        (RECEIPTS_DIR, _classifier(State.RECEIPT, "receipts", 3)),
        (QUARANTINE_DIR, _classify_quarantine),
        (TMP_DIR, lambda _d, _n: "tmp"),
    ]
    for top, classify in walks:
        path = os.path.join(ctx.path, top)
        if not os.path.isdir(path) or os.path.islink(path):  # a symlinked state dir is never followed
            continue
        for depth, entry in _stream_files(path):
            key = classify(depth, entry.name)
            if key is None:
                continue
            mtime = _mtime_ns(entry)
            if mtime is not None:
                tallies[key].add(mtime)
    return {k: t.result(now) for k, t in tallies.items()}


def format_stats_text(s: dict[str, StateStats]) -> str:
    """cli.md plain output, including the final newline: ``ready: 1 (oldest 0s)`` / ``dead: 0``."""
    lines = []
    for state in sorted(s):
        st = s[state]
        if st.objects and st.oldest_age_seconds is not None:
            lines.append(f"{state}: {st.objects} (oldest {st.oldest_age_seconds}s)")
        else:
            lines.append(f"{state}: {st.objects}")
    return "".join(line + "\n" for line in lines)


def format_stats_json(s: dict[str, StateStats]) -> str:
    """cli.md ``--json``: 2-space pretty JSON, keys sorted, final newline included."""
    doc = {k: {"objects": v.objects, "oldest_age_seconds": v.oldest_age_seconds} for k, v in s.items()}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def format_stats_prometheus(s: dict[str, StateStats]) -> str:
    """cli.md ``--prometheus``: object gauges for every state, then age gauges
    for states with objects; no HELP, labels or timestamps; final newline included."""
    lines: list[str] = []
    for state in sorted(s):
        lines.append(f"# TYPE steadq_{state}_objects gauge")
        lines.append(f"steadq_{state}_objects {s[state].objects}")
    for state in sorted(s):
        st = s[state]
        if st.objects and st.oldest_age_seconds is not None:
            lines.append(f"# TYPE steadq_{state}_oldest_age_seconds gauge")
            lines.append(f"steadq_{state}_oldest_age_seconds {st.oldest_age_seconds}")
    return "".join(line + "\n" for line in lines)


# =========================================================================== fsck


@dataclass(frozen=True)
class Finding:
    """One fsck observation; ``path`` is relative to the queue root."""

    severity: str  # "ERROR" | "WARN"
    path: str
    finding_type: str
    details: str


@dataclass
class FsckResult:
    total_objects: int = 0
    structurally_verified: int = 0
    payloads_deep_verified: int = 0
    findings: list[Finding] = field(default_factory=list)
    quarantined: int = 0

    @property
    def exit_code(self) -> int:
        """cli.md: 3 if any ERROR exists (even one that was repaired), else 0."""
        return 3 if any(f.severity == "ERROR" for f in self.findings) else 0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "ERROR"]


def format_fsck_lines(r: FsckResult) -> list[str]:
    """stdout lines: ``<SEVERITY> <relative path>: <finding_type> (<details>)``."""
    return [f"{f.severity} {f.path}: {f.finding_type} ({f.details})" for f in r.findings]


def format_fsck_summary(r: FsckResult) -> str:
    """The stderr first line of ``steadq fsck`` (no newline)."""
    return (
        f"objects: {r.total_objects}, structurally verified: {r.structurally_verified}, "
        f"payload verified: {r.payloads_deep_verified}"
    )


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
                b = lease_bucket(jn.boottime_deadline, self.fmt.lease_width_ns)
                return f"{word}/{boot_dashed(jn.boot_id)}/{b:016x}/{s}/{base}"
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


# =========================================================================== inspect


@dataclass(frozen=True)
class JobObject:
    """One object of a job, as ``steadq inspect`` lists it.

    ``state`` is one of ready, leased, delayed, dead, receipt. ``details``
    holds the state's name fields: leased → layout (colocated/legacy),
    boot_id, boottime_deadline_ns, wall_deadline_ns, token; delayed →
    not_before_ns; dead → reason; receipt → token, compact.
    """

    state: str
    generation: int
    attempt: int
    max_attempts: int
    path: str
    details: dict[str, object] = field(default_factory=dict, compare=False)
    name: JobName | None = field(default=None, compare=False, repr=False)  # the parsed file name


def format_inspect_line(obj: JobObject) -> str:
    """``<state> gen=<g> attempt=<a>/<max> <relative path>`` (cli.md)."""
    return f"{obj.state} gen={obj.generation} attempt={obj.attempt}/{obj.max_attempts} {obj.path}"


def _list_names(root_fd: int, rel: str) -> list[bytes]:
    try:
        fd = linux.open_beneath(root_fd, rel, _DIR_FLAGS)
    except OSError:
        return []
    try:
        return linux.list_dir(fd)
    except OSError:
        return []
    finally:
        linux.close(fd)


def _details(jn: JobName, layout: str | None = None) -> dict[str, object]:
    if jn.state is State.LEASED:
        assert jn.boot_id is not None and jn.lease_token is not None
        return {
            "layout": layout,
            "boot_id": boot_dashed(jn.boot_id),
            "boottime_deadline_ns": jn.boottime_deadline,
            "wall_deadline_ns": jn.wall_deadline,
            "token": jn.lease_token.hex(),
        }
    if jn.state is State.DELAYED:
        return {"not_before_ns": jn.not_before}
    if jn.state is State.DEAD:
        return {"reason": jn.reason}
    return {}


def inspect_job(ctx: Context, job_id: str) -> list[JobObject]:
    """Every authentic object of ``job_id``, looking only in its shard.

    Order (cli.md): ``ready/<S>`` (ready and colocated leased names), legacy
    ``leased/*/*/<S>``, ``delayed/*/<S>``, ``dead/*/<S>``, ``receipts/*/<S>``;
    sorted within a directory. Names must authenticate for the directory
    they are in (and legacy leases must sit in their boot/bucket directory);
    receipts must pass full receipt verification, as in the reference.
    Quarantined objects carry no job id in their name and are not searched.
    Raises InvalidInput for a job id that is not 32 lowercase hex digits.
    """
    job = parse_job_id(job_id)
    fmt = ctx.fmt
    shard = shard_of(fmt.queue_id, job, fmt.shard_count)
    s = shard_dir(shard)
    root = ctx.root_fd
    prefix = job.hex().encode()
    out: list[JobObject] = []

    def matching(rel: str) -> Iterator[str]:
        for raw in _list_names(root, rel):
            if raw.startswith(prefix):
                yield raw.decode("ascii", "replace")

    def auth(jn: JobName, bucket: int | None) -> bool:
        return authenticate(fmt.queue_id, jn, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns)

    def add(jn: JobName, rel: str, state: str, details: dict[str, object]) -> None:
        out.append(JobObject(state, jn.generation, jn.attempt, jn.max_attempts, rel, details, jn))

    with ctx.tree.operation():
        rel = f"{READY_DIR}/{s}"
        for name in matching(rel):
            try:
                jn = parse_ready_dir_entry(name)
            except CorruptObject:
                continue
            if auth(jn, None):
                add(jn, f"{rel}/{name}", jn.state.value, _details(jn, "colocated"))
        for boot in sorted(_list_names(root, LEASED_DIR)):
            bt = boot.decode("ascii", "replace")
            for b in _list_names(root, f"{LEASED_DIR}/{bt}"):
                bd = b.decode("ascii", "replace")
                rel = f"{LEASED_DIR}/{bt}/{bd}/{s}"
                for name in matching(rel):
                    try:
                        jn = parse_name(State.LEASED, name)
                    except CorruptObject:
                        continue
                    assert jn.boot_id is not None and jn.boottime_deadline is not None
                    in_place = (
                        bt == boot_dashed(jn.boot_id)
                        and bd == f"{lease_bucket(jn.boottime_deadline, fmt.lease_width_ns):016x}"
                    )
                    if in_place and auth(jn, None):
                        add(jn, f"{rel}/{name}", "leased", _details(jn, "legacy"))
        for top, state in ((DELAYED_DIR, State.DELAYED), (DEAD_DIR, State.DEAD)):
            for b in _list_names(root, top):
                bucket = parse_bucket_dir(b)
                if bucket is None:
                    continue
                rel = f"{top}/{b.decode()}/{s}"
                for name in matching(rel):
                    try:
                        jn = parse_name(state, name)
                    except CorruptObject:
                        continue
                    if auth(jn, bucket):
                        add(jn, f"{rel}/{name}", state.value, _details(jn))
        for b in _list_names(root, RECEIPTS_DIR):
            bucket = parse_bucket_dir(b)
            if bucket is None:
                continue
            rel = f"{RECEIPTS_DIR}/{b.decode()}/{s}"
            for name in matching(rel):
                obj = _verified_receipt(ctx, rel, name, bucket, shard)
                if obj is not None:
                    out.append(obj)
    return out


def _verified_receipt(ctx: Context, rel: str, name: str, bucket: int, shard: int) -> JobObject | None:
    try:
        fd = linux.open_beneath(ctx.root_fd, f"{rel}/{name}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = verify_receipt(ctx.fmt, fd, name, bucket, shard)
    except (CorruptObject, OSError):
        return None
    finally:
        linux.close(fd)
    jn = info.name
    assert jn.lease_token is not None
    details: dict[str, object] = {"token": jn.lease_token.hex(), "compact": info.compact}
    return JobObject("receipt", jn.generation, jn.attempt, jn.max_attempts, f"{rel}/{name}", details, jn)
