"""An independent checker of the SteadQ/1 tree invariants, for tests.

Why independent: a checker that reused the library's name parser, tag and
shard functions, record decoders or digest checks would share their bugs, and
a check switched off in the library would go unseen here too. So this module
imports nothing from ``steadqd``: it walks the tree with plain ``os`` calls
and judges every entry with tests/spec_oracle.py and tests/spec_cbor.py,
which read the format from the shared spec alone (layout.md, names.md,
records.md, clocks.md). tests/unit/test_spec_oracle.py holds them to the
spec's vectors and proves the independence.

What :func:`check_tree` enforces (every violation is collected, then one
AssertionError lists them all with exact paths):

* the top level holds only FORMAT, the eight state directories (and nothing
  half-initialised); FORMAT decodes;
* ``control/`` has its three lock files and an authentic watermark; only the
  hidden names layout.md lists may sit next to them;
* every entry of ``ready/<S>/`` parses as a ready or leased name; every
  object under ``delayed``/``dead``/``receipts``/legacy ``leased`` parses for
  its state; every name tag authenticates for its directory context; shard
  placement holds (``shard_of(job) == S``); bucket placement holds where the
  bucket is derived from the name (delayed, legacy leased);
* every job file is a singly linked regular file whose envelope and payload
  digest verify (the payload is hashed here), whose extension decodes and
  whose header matches its name; receipts may be full job files or verified
  128-byte compact records;
* a job id appears in **at most one** live-or-terminal place (ready, leased,
  delayed, dead, receipt);
* no file is left under ``tmp/`` (unless ``allow_temps``), quarantine
  entries have canonical names (and none exist unless ``allow_quarantine``).

The returned :class:`TreeState` exposes per-state job-id sets and the exact
object paths so tests can compare the tree before and after an operation.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field

from tests.spec_cbor import decode_extension
from tests.spec_oracle import (
    COMPACT_RECEIPT_SIZE,
    COMPACT_TEMP_NAME,
    CONTROL_LOCKS,
    CONTROL_TEMP_NAME,
    FORMAT_FILE,
    RECOVERY_CURSOR_FILE,
    STATE_DIRS,
    TEMP_NAME,
    WATERMARK_FILE,
    Format,
    Name,
    SpecViolation,
    State,
    boot_dashed,
    bucket_start,
    decode_compact_receipt,
    decode_format,
    decode_watermark,
    delayed_bucket,
    is_compact_receipt,
    lease_bucket,
    name_tag,
    parse_bucket_dir,
    parse_name,
    parse_quarantine_name,
    parse_ready_entry,
    parse_shard_dir,
    shard_of,
    tag_context,
    verify_job,
)

__all__ = ["JobObject", "TreeState", "check_tree", "job_states", "live_tree"]

_JOB_STATES = (State.READY, State.LEASED, State.DELAYED, State.DEAD, State.RECEIPT)
# layout.md "Which state lives where": the top directory of each bucketed state.
_BUCKETED = (("delayed", State.DELAYED), ("dead", State.DEAD), ("receipts", State.RECEIPT))
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class JobObject:
    """One verified job object (or receipt) found in the tree."""

    state: State
    job_id: str  # 32 hex
    path: str  # relative to the queue root
    name: Name
    shard: int
    bucket: int | None  # directory bucket (None for ready/ and current-layout leases)
    compact: bool = False  # a compact 128-byte receipt

    @property
    def generation(self) -> int:
        return self.name.generation

    @property
    def attempt(self) -> int:
        return self.name.attempt


@dataclass
class TreeState:
    """What :func:`check_tree` saw: every job object by id, plus scratch and quarantine.

    States are :class:`tests.spec_oracle.State` members; they equal the
    library's ``State`` members of the same value (both are ``StrEnum``), but
    are not the same objects: compare with ``==``, never ``is``.
    """

    fmt: Format
    objects: dict[str, JobObject] = field(default_factory=dict)
    quarantine: list[tuple[str, int]] = field(default_factory=list)  # (file name, reason)
    temps: list[str] = field(default_factory=list)  # relative paths of files under tmp/ (and compaction temps)

    def ids(self, state: str) -> frozenset[str]:
        """Job ids currently in ``state`` (a state word, or either module's State member)."""
        st = State(state)
        return frozenset(j for j, o in self.objects.items() if o.state is st)

    @property
    def ready(self) -> frozenset[str]:
        return self.ids(State.READY)

    @property
    def leased(self) -> frozenset[str]:
        return self.ids(State.LEASED)

    @property
    def delayed(self) -> frozenset[str]:
        return self.ids(State.DELAYED)

    @property
    def dead(self) -> frozenset[str]:
        return self.ids(State.DEAD)

    @property
    def receipts(self) -> frozenset[str]:
        return self.ids(State.RECEIPT)

    @property
    def all_ids(self) -> frozenset[str]:
        return frozenset(self.objects)

    def by_state(self) -> dict[State, frozenset[str]]:
        """Per-state id sets (every state present, possibly empty) for before/after equality."""
        return {s: self.ids(s) for s in _JOB_STATES}

    def paths(self) -> frozenset[str]:
        """Exact relative paths of every job object: equal sets mean no name changed."""
        return frozenset(o.path for o in self.objects.values())

    def state_of(self, job_id: str) -> State | None:
        obj = self.objects.get(job_id)
        return obj.state if obj is not None else None

    def get(self, job_id: str) -> JobObject | None:
        return self.objects.get(job_id)


def job_states(ts: TreeState) -> dict[str, str]:
    """``{job_id: state word}``: a compact, printable summary for assertion messages."""
    return {j: o.state.value for j, o in sorted(ts.objects.items())}


class _Walk:
    def __init__(self, root: str, allow_temps: bool, allow_quarantine: bool) -> None:
        self.root = root
        self.allow_temps = allow_temps
        self.allow_quarantine = allow_quarantine
        self.problems: list[str] = []
        self.fmt: Format | None = None
        self.state: TreeState | None = None

    # -- helpers ----------------------------------------------------------------

    def bad(self, rel: str, why: str) -> None:
        self.problems.append(f"{rel}: {why}")

    def abs(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def entries(self, rel: str) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(self.abs(rel)) as it:
                return sorted(it, key=lambda e: e.name)
        except OSError as e:
            self.bad(rel, f"cannot list: {e.strerror}")
            return []

    def subdirs_only(self, rel: str, entries: list[os.DirEntry[str]]) -> list[os.DirEntry[str]]:
        """Directory levels (bucket, shard) hold only directories."""
        out = []
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                out.append(e)
            else:
                self.bad(f"{rel}/{e.name}", "unexpected non-directory at a directory level")
        return out

    def shard_dirs(self, rel: str) -> list[tuple[str, int]]:
        """(relative path, shard) of every canonical shard directory under ``rel``."""
        assert self.fmt is not None
        out = []
        for sd in self.subdirs_only(rel, self.entries(rel)):
            shard = parse_shard_dir(sd.name, self.fmt.shard_count)
            if shard is None:
                self.bad(f"{rel}/{sd.name}", "not a canonical shard directory below shard_count")
            else:
                out.append((f"{rel}/{sd.name}", shard))
        return out

    def bucket_dirs(self, rel: str) -> list[tuple[str, int]]:
        """(relative path, bucket) of every canonical 16-hex bucket directory under ``rel``."""
        out = []
        for bd in self.subdirs_only(rel, self.entries(rel)):
            bucket = parse_bucket_dir(bd.name)
            if bucket is None:
                self.bad(f"{rel}/{bd.name}", "not a canonical 16-hex bucket directory")
            else:
                out.append((f"{rel}/{bd.name}", bucket))
        return out

    # -- the walk ---------------------------------------------------------------

    def run(self) -> TreeState:
        self.check_top()
        assert self.fmt is not None
        self.state = TreeState(self.fmt)
        self.check_control()
        self.check_ready()
        for top, st in _BUCKETED:
            self.check_bucketed(top, st)
        self.check_legacy_leased()
        self.check_quarantine()
        self.check_tmp()
        if self.problems:
            raise AssertionError(
                f"queue tree {self.root} violates {len(self.problems)} invariant(s):\n  " + "\n  ".join(self.problems)
            )
        return self.state

    def check_top(self) -> None:
        try:
            with open(self.abs(FORMAT_FILE), "rb") as f:
                data = f.read()
        except OSError as err:
            raise AssertionError(f"{self.root}/FORMAT unreadable: {err}") from None
        try:
            self.fmt = decode_format(data)
        except SpecViolation as err:
            raise AssertionError(f"{self.root}/FORMAT does not decode: {err}") from None
        root_dev = os.stat(self.root).st_dev
        names = {e.name: e for e in self.entries("")}
        for d in STATE_DIRS:
            e = names.pop(d, None)
            if e is None or not e.is_dir(follow_symlinks=False):
                self.bad(d, "state directory missing or not a directory")
            elif e.stat(follow_symlinks=False).st_dev != root_dev:
                self.bad(d, "state directory on another device")
        names.pop(FORMAT_FILE, None)
        for extra in sorted(names):
            self.bad(extra, "unexpected entry at the queue root (interrupted init or foreign file)")

    def check_control(self) -> None:
        names = {e.name: e for e in self.entries("control")}
        for lock in CONTROL_LOCKS:
            e = names.pop(lock, None)
            if e is None or not e.is_file(follow_symlinks=False):
                self.bad(f"control/{lock}", "lock file missing or not a regular file")
        e = names.pop(WATERMARK_FILE, None)
        if e is None or not e.is_file(follow_symlinks=False):
            self.bad(f"control/{WATERMARK_FILE}", "watermark missing or not a regular file")
        else:
            self.check_watermark(f"control/{WATERMARK_FILE}")
        names.pop(RECOVERY_CURSOR_FILE, None)
        # steadqd's own control files, which SteadQ/1 readers never open (steadqd/fs/control.py): the pause
        # record (a regular file when steadqd wrote it) and the lock of unique enqueues.
        for own in ("paused", "unique.lock"):
            e = names.pop(own, None)
            if e is not None and not e.is_file(follow_symlinks=False):
                self.bad(f"control/{own}", "not a regular file")
        for n in sorted(names):
            if CONTROL_TEMP_NAME.fullmatch(n) is None:  # never swept, so tolerated
                self.bad(f"control/{n}", "unexpected entry in control/")

    def check_watermark(self, rel: str) -> None:
        """records.md "Wall watermark record", read rules: one link, and the record authenticates."""
        try:
            fd = os.open(self.abs(rel), _OPEN_FLAGS)
        except OSError as e:
            self.bad(rel, f"cannot open: {e.strerror}")
            return
        try:
            if os.fstat(fd).st_nlink > 1:
                self.bad(rel, "watermark has more than one hard link")
            decode_watermark(os.pread(fd, 65, 0))
        except SpecViolation as err:
            self.bad(rel, f"does not authenticate: {err}")
        except OSError as err:
            self.bad(rel, f"I/O error reading the watermark: {err.strerror}")
        finally:
            os.close(fd)

    def check_ready(self) -> None:
        for rel, shard in self.shard_dirs("ready"):
            for e in self.entries(rel):
                path = f"{rel}/{e.name}"
                name = parse_ready_entry(e.name)
                if name is None:
                    self.bad(path, "neither a ready nor a leased name (names.md grammar)")
                else:
                    self.job(path, e, name, shard=shard, bucket=None)

    def check_bucketed(self, top: str, state: State) -> None:
        for brel, bucket in self.bucket_dirs(top):
            for rel, shard in self.shard_dirs(brel):
                for e in self.entries(rel):
                    path = f"{rel}/{e.name}"
                    if state is State.RECEIPT and COMPACT_TEMP_NAME.fullmatch(e.name):
                        self.temp(path)
                        continue
                    name = parse_name(state, e.name)
                    if name is None:
                        self.bad(path, f"not a {state.value} name (names.md grammar)")
                    else:
                        self.job(path, e, name, shard=shard, bucket=bucket)

    def check_legacy_leased(self) -> None:
        for boot in self.subdirs_only("leased", self.entries("leased")):
            for brel, bucket in self.bucket_dirs(f"leased/{boot.name}"):
                for rel, shard in self.shard_dirs(brel):
                    for e in self.entries(rel):
                        path = f"{rel}/{e.name}"
                        name = parse_name(State.LEASED, e.name)
                        if name is None:
                            self.bad(path, "not a leased name (names.md grammar)")
                            continue
                        assert name.boot_id is not None
                        if boot_dashed(name.boot_id) != boot.name:
                            self.bad(path, "legacy lease boot directory differs from the name's boot id")
                        self.job(path, e, name, shard=shard, bucket=bucket)

    def check_quarantine(self) -> None:
        assert self.state is not None
        for e in self.entries("quarantine"):
            path = f"quarantine/{e.name}"
            parsed = parse_quarantine_name(e.name)
            if parsed is None or not e.is_file(follow_symlinks=False):
                self.bad(path, "not a canonical quarantine file")
                continue
            self.state.quarantine.append((e.name, parsed[1]))
            if not self.allow_quarantine:
                self.bad(path, f"object quarantined (reason 0x{parsed[1]:04x}) where none was expected")

    def check_tmp(self) -> None:
        for dirpath, dirs, files in os.walk(self.abs("tmp")):
            rel_dir = os.path.relpath(dirpath, self.root)
            for n in sorted(files):
                self.temp(f"{rel_dir}/{n}")
            for d in list(dirs):
                if os.path.islink(os.path.join(dirpath, d)):
                    self.bad(f"{rel_dir}/{d}", "symlink under tmp/")
                    dirs.remove(d)

    def temp(self, path: str) -> None:
        assert self.state is not None
        self.state.temps.append(path)
        if not self.allow_temps:
            kind = "named temp" if TEMP_NAME.fullmatch(os.path.basename(path)) else "file"
            self.bad(path, f"leftover {kind} (orphan temp)")

    # -- one object -------------------------------------------------------------

    def job(self, path: str, entry: os.DirEntry[str], name: Name, *, shard: int, bucket: int | None) -> None:
        fmt, ts = self.fmt, self.state
        assert fmt is not None and ts is not None
        # names.md "Name tag": the context comes from where the file was found.
        auth_bucket = None if name.state in (State.READY, State.LEASED) else bucket
        context = tag_context(name, shard=shard, bucket=auth_bucket, lease_width_ns=fmt.lease_width_ns)
        if name_tag(fmt.queue_id, context) != name.tag:
            self.bad(path, "name tag does not authenticate for this directory")
            return
        if shard_of(fmt.queue_id, name.job_id, fmt.shard_count) != shard:
            self.bad(path, "job is in the wrong shard directory")
            return
        if name.state is State.DELAYED and bucket != delayed_bucket(name.not_before or 0, fmt.delayed_width_ns):
            self.bad(path, "delayed bucket is not ceil(not_before / delayed width)")
        if name.state is State.LEASED and bucket is not None:
            if bucket != lease_bucket(name.boottime_deadline or 0, fmt.lease_width_ns):
                self.bad(path, "legacy lease bucket does not match its boottime deadline")
        if name.state in (State.LEASED, State.RECEIPT) and not 1 <= name.attempt <= name.max_attempts:
            self.bad(path, f"attempt {name.attempt} outside 1..{name.max_attempts} for a {name.state.value} object")
        if name.max_attempts == 0:
            self.bad(path, "maximum attempts is 0")
        compact = self.verify_file(path, name, bucket)
        if compact is None:
            return
        job = name.job_hex
        other = ts.objects.get(job)
        if other is not None:
            self.bad(
                path, f"job {job} has two objects: {other.path} ({other.state.value}) and this ({name.state.value})"
            )
            return
        ts.objects[job] = JobObject(name.state, job, path, name, shard, bucket, compact)

    def verify_file(self, path: str, name: Name, bucket: int | None) -> bool | None:
        """Verify the bytes; True for a compact receipt, False for a full job file, None if bad."""
        fmt = self.fmt
        assert fmt is not None
        try:
            fd = os.open(self.abs(path), _OPEN_FLAGS)
        except OSError as e:
            self.bad(path, f"cannot open object: {e.strerror}")
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                self.bad(path, f"not a singly linked regular file (mode {st.st_mode:o}, links {st.st_nlink})")
                return None
            if name.state is State.RECEIPT:
                prefix = os.pread(fd, COMPACT_RECEIPT_SIZE, 0)
                if is_compact_receipt(prefix, st.st_size):
                    return self.verify_compact(path, name, bucket, prefix)
            header, extension = verify_job(lambda off, n: os.pread(fd, n, off), st.st_size, fmt.max_payload_length)
            if (header.job_id, header.max_attempts) != (name.job_id, name.max_attempts):
                self.bad(path, "name does not match the header (job id or maximum attempts)")
                return None
            if extension:  # records.md: a length of 0 is accepted (content type reported as empty)
                decode_extension(extension)
            return False
        except SpecViolation as e:
            self.bad(path, f"object does not verify: {e}")
            return None
        except OSError as e:
            self.bad(path, f"I/O error verifying object: {e.strerror}")
            return None
        finally:
            os.close(fd)

    def verify_compact(self, path: str, name: Name, bucket: int | None, data: bytes) -> bool | None:
        """records.md "Receipt verification" step 5, compact form."""
        fmt = self.fmt
        assert fmt is not None and bucket is not None
        try:
            rec = decode_compact_receipt(data)
        except SpecViolation as e:
            self.bad(path, f"compact receipt does not verify: {e}")
            return None
        if (rec.job_id, rec.lease_token, rec.final_attempt) != (name.job_id, name.lease_token, name.attempt):
            self.bad(path, "compact receipt record does not match its name")
            return None
        if rec.bucket_start_ns != bucket_start(bucket, fmt.terminal_width_ns):
            self.bad(path, "compact receipt bucket start does not match its directory")
            return None
        if rec.payload_length > fmt.max_payload_length:
            self.bad(path, "compact receipt payload length exceeds the queue maximum")
            return None
        return True


def check_tree(path: str | os.PathLike[str], *, allow_temps: bool = False, allow_quarantine: bool = True) -> TreeState:
    """Walk the queue at ``path``, enforce every invariant, and return what is there.

    ``allow_temps`` tolerates files under ``tmp/`` (e.g. right after a crash
    simulation, before recovery); ``allow_quarantine=False`` makes any
    quarantined object a violation (fault tests: an I/O error must never be
    mistaken for corruption). Raises AssertionError listing every violation.
    """
    return _Walk(os.fspath(path), allow_temps, allow_quarantine).run()


def live_tree(path: str | os.PathLike[str], *, attempts: int = 5, interval: float = 0.02) -> TreeState:
    """check_tree on a queue that daemons are changing (temps allowed).

    A walk is not a snapshot: a job renamed from ready/ to receipts/ between
    the two directory listings is seen twice, and one renamed the other way
    round not at all. A walk that fails is therefore repeated; a violation
    that persists over ``attempts`` walks is real and is raised.
    """
    for _ in range(attempts - 1):
        try:
            return check_tree(path, allow_temps=True)
        except AssertionError:
            time.sleep(interval)
    return check_tree(path, allow_temps=True)
