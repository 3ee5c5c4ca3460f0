"""The recovery pass (recovery.md): a bounded, restartable maintenance sweep.

Liveness of a SteadQ/1 queue depends on somebody running this pass: expired
leases go back to ``ready/`` (or to ``dead/`` once their attempts are used
up), due delayed jobs are promoted, abandoned temp files disappear, full
receipts are compacted to 128-byte records and receipts past retention are
deleted. Every step is a single rename/unlink followed by its barrier, so the
pass is safe to interrupt after any syscall and to run from any number of
processes (the ``control/recovery.lock`` OFD lock lets one run at a time; the
no-replace renames would keep concurrent runs correct anyway).

Recovery never poisons the handle and never raises for on-disk problems:
every problem is recorded in the :class:`RecoveryReport` and the pass goes
on with the next entry.

Design choices (all on-disk compatible with the reference):

* **Cursor.** ``control/recovery-cursor.json`` is read and validated at the
  start of each pass (an invalid cursor stops the pass, as in the reference)
  and a *reference-written* phase position is honoured. We only ever write
  the "reset" form (records.md recommendation): every phase position null,
  ``phase`` = the next phase to run. The fine-grained position of a pass that
  ran out of budget is kept **in-process only** (per queue id); a later pass
  of this process resumes after that entry, any other process restarts the
  interrupted phase from its beginning, which costs a rescan but never skips
  work. Keeping the position matters for liveness: without it, a pass with a
  tiny budget whose first entry keeps failing (a collision, an unlinkable
  file) would retry that entry forever. The file is rewritten only when its
  bytes change, so an idle queue costs no fsyncs.
* **Colocated leases** that fail authentication or structural validation are
  quarantined (0x0004 for a tag/shard-placement failure, 0x0001 otherwise)
  instead of being skipped forever as the reference does (open-questions
  B12); legacy leases and delayed jobs are quarantined exactly as specified.
* Stale ``.compact-*.tmp`` files are counted in ``temp_files_deleted``.
* **Dead-letter retention** (open-questions A7: the reference has none) is
  opt-in per handle (``OpenOptions.dead_retention_ns``, default None = keep
  forever). It runs inside ``delete_receipts`` after the receipt buckets (the
  cursor's phase names are fixed by the spec, so no phase is added), with the
  receipt rules: bucket ``B`` of ``dead/`` is due once ``B × w + w +
  retention ≤ wall``; only names that parse as dead, authenticate for their
  directory and pass structural validation are unlinked (after a re-stat that
  proves the path still names the verified inode); anything else is kept and
  reported; emptied shard and bucket directories are removed. Its in-process
  position keys start with ``_DEAD_KEY``, which sorts after every receipt
  key, so a resumed pass never repeats the receipt walk.
* The scan budget (library only) is reduced to a per-listing cap of 65 536
  entries; unreadable directories are recorded and simply rescanned by the
  next pass (allowed by recovery.md), so ``hierarchy_retries`` stays empty.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from steadqd.constants import (
    CONTROL_DIR,
    DEAD_DIR,
    DELAYED_DIR,
    JOB_EXT,
    LEASED_DIR,
    READY_DIR,
    RECEIPT_EXT,
    RECEIPTS_DIR,
    RECOVERY_CURSOR_FILE,
    RECOVERY_LOCK,
    TEMP_EXT,
    TMP_DIR,
    U32_MAX,
    DeadReason,
    Modes,
    QuarantineReason,
    State,
)
from steadqd.errors import CorruptObject, InvalidInput, QueueCorrupt, SteadQError
from steadqd.fs import linux
from steadqd.fs.context import Context
from steadqd.fs.names import (
    JobName,
    authenticate,
    boot_raw,
    bucket_dir,
    bucket_end,
    bucket_start,
    dead_name,
    delayed_bucket,
    is_compact_temp_name,
    lease_bucket,
    make_compact_temp_name,
    make_filename,
    next_generation,
    parse_bucket_dir,
    parse_name,
    parse_shard_dir,
    parse_temp_name,
    ready_name,
    shard_dir,
    shard_of,
    terminal_bucket,
)
from steadqd.fs.quarantine import quarantine
from steadqd.fs.receipt import verify_receipt
from steadqd.fs.records import CURSOR_PHASES, CompactReceipt, reset_cursor_json, validate_cursor
from steadqd.fs.tree import Collision, Indeterminate, MoveError, MoveFailed, SourceMissing, Witness, is_single_regular
from steadqd.fs.verify import Envelope, check_name_matches, check_object_stat, read_envelope

__all__ = ["PHASES", "RecoveryReport", "run_recovery"]

PHASES = CURSOR_PHASES  # reap_leases, promote_delayed, cleanup_temp, compact_receipts, delete_receipts
MAX_BUDGET_MS = 24 * 3600 * 1000
_LISTING_CAP = 65_536
_CURSOR_TMP_PREFIX = ".recovery-cursor."
_NS_PER_MS = 1_000_000
# Position-key prefix of the dead-letter sub-walk of delete_receipts: 0xff sorts
# after any bucket name, so the receipt walk's keys all come first.
_DEAD_KEY: tuple[bytes] = (b"\xffdead",)

Key = tuple[bytes, ...]

# Fine-grained resume positions of budget-limited passes, per queue id:
# (phase, last fully processed entry key). In-process only (see module doc).
_resume_lock = threading.Lock()
_resume: dict[bytes, tuple[str, Key]] = {}


@dataclass
class RecoveryReport:
    """What one pass did. ``errors`` holds ``(code, message)`` pairs; any
    error (even a benign one such as a busy lock) makes the CLI exit 6."""

    leases_reaped: int = 0
    leases_to_dead: int = 0
    delayed_promoted: int = 0
    temp_files_deleted: int = 0
    receipts_compacted: int = 0
    receipts_deleted: int = 0
    quarantined: int = 0
    # Dead jobs deleted by dead-letter retention (only with OpenOptions.dead_retention_ns).
    dead_deleted: int = 0
    operations_attempted: int = 0
    budget_exhausted: bool = False
    errors: list[tuple[str, str]] = field(default_factory=list)
    # (original relative path, quarantine reason, quarantine file name)
    quarantined_objects: list[tuple[str, int, str]] = field(default_factory=list)
    directories_removed: int = 0
    wall_floor_available: bool = False
    # The phase the persisted cursor names (where the next pass starts); None if not persisted.
    next_phase: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def changed(self) -> int:
        """Objects moved, deleted or rewritten by this pass."""
        return (
            self.leases_reaped
            + self.leases_to_dead
            + self.delayed_promoted
            + self.temp_files_deleted
            + self.receipts_compacted
            + self.receipts_deleted
            + self.dead_deleted
            + self.quarantined
            + self.directories_removed
        )


class _Exhausted(Exception):
    """The work budget ran out; unwinds the phase, keeping its position."""


def _ascii(raw: bytes) -> str | None:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return None


def _parse_boot(raw: bytes) -> bytes | None:
    """Raw boot id of a canonical boot directory name, else None."""
    try:
        return boot_raw(raw)
    except InvalidInput:
        return None


_NOT_BOOT = "not a canonical boot id"
_NOT_BUCKET = "not a 16-hex bucket"
_NOT_SHARD = "not a shard of this queue"


@dataclass(frozen=True)
class _Level:
    """One directory level of a walk (boot, bucket or shard directories).

    Every phase walks ``top/<level>/.../<entry>`` the same way; only what a
    level's names mean and which of them to enter differ, so that is all a
    phase describes. ``parse`` gives a name's value (None: not a name of this
    level; 0 is a valid value); ``invalid`` is the error recorded for such a
    name (None: skipped silently); ``wanted`` sees the values so far, this
    level's last, and returns False for a directory that must not be opened.
    """

    parse: Callable[[bytes], Any]
    invalid: str | None
    wanted: Callable[[tuple[Any, ...]], bool] | None = None


def _check_budget_args(budget_ops: object, budget_ms: object) -> tuple[int, int]:
    if isinstance(budget_ops, bool) or not isinstance(budget_ops, int) or not 1 <= budget_ops <= U32_MAX:
        raise InvalidInput(f"budget_ops must be an integer in 1..{U32_MAX}, got {budget_ops!r}")
    if isinstance(budget_ms, bool) or not isinstance(budget_ms, int) or not 1 <= budget_ms <= MAX_BUDGET_MS:
        raise InvalidInput(f"budget_ms must be an integer in 1..{MAX_BUDGET_MS}, got {budget_ms!r}")
    return budget_ops, budget_ms


def run_recovery(
    ctx: Context,
    *,
    budget_ops: int = 1000,
    budget_ms: int = 100,
    now_boottime: int | None = None,
    phases: tuple[str, ...] | None = None,
) -> RecoveryReport:
    """Run one recovery pass on an open queue context.

    An invalid budget raises InvalidInput and a poisoned handle raises
    QueuePoisoned before anything is touched; everything else that goes wrong
    is recorded in the returned report. ``now_boottime`` replaces the
    CLOCK_BOOTTIME reading (tests use it to age leases and temps without
    sleeping).

    ``phases`` (default: all) restricts the pass to the named phases, run in
    the usual order, each from its beginning; such a pass neither reads nor
    writes the recovery cursor and leaves this process's remembered position
    alone, so a promoter's promote-only passes never disturb the progress of
    full passes (and still run when the cursor names a later phase).
    """
    ops, ms = _check_budget_args(budget_ops, budget_ms)
    if phases is not None and (not isinstance(phases, tuple) or not phases or any(p not in PHASES for p in phases)):
        raise InvalidInput(f"phases must be a non-empty tuple of {', '.join(PHASES)}; got {phases!r}")
    if now_boottime is not None and (
        isinstance(now_boottime, bool) or not isinstance(now_boottime, int) or now_boottime < 0
    ):
        raise InvalidInput(f"now_boottime must be a non-negative integer, got {now_boottime!r}")
    ctx.check_usable()
    report = RecoveryReport()
    # Our own descriptor: the handle's directory cache may evict (close) its
    # entries between operations, and a pass spans many operations.
    try:
        control = linux.open_beneath(ctx.root_fd, CONTROL_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        report.errors.append(("recovery_lock", f"cannot open control/: {e.strerror}"))
        return report
    try:
        lock_fd = _open_lock(control, report, ctx.modes)
        if lock_fd is None:
            return report
        try:
            if not _try_lock(lock_fd, report):
                return report
            _Pass(ctx, report, control, ops, ms, now_boottime, phases).run()
        finally:
            with contextlib.suppress(OSError):
                linux.close(lock_fd)  # releases the OFD lock
    finally:
        with contextlib.suppress(OSError):
            linux.close(control)
    return report


def _open_lock(control: int, report: RecoveryReport, modes: Modes) -> int | None:
    """Open ``control/recovery.lock``, creating it durably if it is missing."""
    for _ in range(2):
        try:
            return linux.open_at(control, RECOVERY_LOCK, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as e:
            if e.errno != errno.ENOENT:
                report.errors.append(("recovery_lock", f"cannot open control/{RECOVERY_LOCK}: {e.strerror}"))
                return None
        try:
            fd = linux.open_at(control, RECOVERY_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, modes.file)
        except OSError as e:
            if e.errno == errno.EEXIST:
                continue  # created by a concurrent pass: open it
            report.errors.append(("recovery_lock", f"cannot create control/{RECOVERY_LOCK}: {e.strerror}"))
            return None
        try:
            if modes.enforce:
                linux.fchmod(fd, modes.file)
            linux.fsync(fd)
            linux.fsync(control)
        except OSError as e:
            linux.close(fd)
            report.errors.append(("recovery_lock", f"cannot make control/{RECOVERY_LOCK} durable: {e.strerror}"))
            return None
        return fd
    report.errors.append(("recovery_lock", f"control/{RECOVERY_LOCK} keeps disappearing"))
    return None


def _try_lock(fd: int, report: RecoveryReport) -> bool:
    try:
        if linux.ofd_lock(fd, exclusive=True):
            return True
        report.errors.append(("recovery_lock", "another recovery pass holds control/recovery.lock"))
    except OSError as e:
        report.errors.append(("recovery_lock", f"cannot lock control/{RECOVERY_LOCK}: {e.strerror}"))
    return False


class _Pass:
    """One pass: the clocks read at its start, its budget and its position."""

    def __init__(
        self,
        ctx: Context,
        report: RecoveryReport,
        control: int,
        max_ops: int,
        budget_ms: int,
        now_bt: int | None,
        only: tuple[str, ...] | None = None,
    ) -> None:
        self.only = only  # restricted pass: these phases only, cursor untouched
        self.ctx = ctx
        self.fmt = ctx.fmt
        self.report = report
        self.control = control
        self.max_ops = max_ops
        self.budget_ms = budget_ms
        self.now_bt_override = now_bt
        self.bt_now = 0
        self.wall: int | None = None
        self.deadline = 0
        self.pos: Key | None = None

    # -- driver ------------------------------------------------------------------

    def run(self) -> None:
        if self.only is None:
            cursor = self._read_cursor()
            if cursor is None:
                return
            start, positions = cursor
        else:
            start, positions = PHASES[0], {}
        try:
            self.bt_now = self.now_bt_override if self.now_bt_override is not None else linux.boottime_ns()
        except OSError as e:
            self._error("clock", f"cannot read CLOCK_BOOTTIME: {e.strerror}")
            return
        try:
            self.wall = self.ctx.wall.for_mutation()
            self.report.wall_floor_available = True
        except (SteadQError, OSError) as e:
            self.wall = None
            self._error(
                "wall_floor", f"wall floor unavailable: {e}; skipping promotion, receipt deletion, reap-to-dead"
            )
        try:
            self.deadline = linux.monotonic_ns() + self.budget_ms * _NS_PER_MS
        except OSError as e:
            self._error("clock", f"cannot read CLOCK_MONOTONIC: {e.strerror}")
            return
        runners = {
            "reap_leases": self._reap_leases,
            "promote_delayed": self._promote_delayed,
            "cleanup_temp": self._cleanup_temp,
            "compact_receipts": self._compact_receipts,
            "delete_receipts": self._delete_receipts,
        }
        next_phase = PHASES[0]
        remembered: tuple[str, Key] | None = None
        for phase in PHASES[PHASES.index(start) :]:
            if self.only is not None and phase not in self.only:
                continue
            self.pos = positions.get(phase)
            try:
                runners[phase]()
            except _Exhausted:
                self.report.budget_exhausted = True
                next_phase = phase
                if self.pos is not None:
                    remembered = (phase, self.pos)
                break
            except OSError as e:
                # Not an on-disk problem (every file operation records its own
                # errors): the clock or getrandom failed. Stop as if out of
                # budget, but restart this phase from its beginning: the entry
                # at the position may be half done.
                self._error("recovery_aborted", f"{phase}: {e.strerror or e}")
                next_phase = phase
                break
        if self.only is not None:
            return  # a restricted pass leaves the cursor and the remembered position alone
        with _resume_lock:
            if remembered is not None:
                _resume[self.ctx.queue_id] = remembered
            else:
                _resume.pop(self.ctx.queue_id, None)
        self._write_cursor(next_phase)

    # -- cursor ------------------------------------------------------------------

    def _read_cursor(self) -> tuple[str, dict[str, Key | None]] | None:
        """(start phase, positions) or None when the cursor is invalid (error recorded)."""
        qid = self.ctx.queue_id
        try:
            fd = linux.open_at(self.control, RECOVERY_CURSOR_FILE, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return self._with_memory(PHASES[0], {})
            self._error("recovery_cursor", f"cannot open control/{RECOVERY_CURSOR_FILE}: {e.strerror}")
            return None
        try:
            st = linux.fstat(fd)
            if not is_single_regular(st):
                raise QueueCorrupt("recovery cursor is not a singly linked regular file")
            doc = validate_cursor(linux.pread(fd, 16_385, 0), qid)
        except QueueCorrupt as e:
            self._error("recovery_cursor", e.message)
            return None
        except OSError as e:
            self._error("recovery_cursor", f"cannot read control/{RECOVERY_CURSOR_FILE}: {e.strerror}")
            return None
        finally:
            linux.close(fd)
        cur = doc["cursor"]
        positions: dict[str, Key | None] = {}
        for phase in PHASES:
            p = cur[phase]
            if p is None:
                continue
            if phase == "reap_leases":  # legacy tree: (boot, bucket, shard, entry)
                positions[phase] = (b"a", p["first"], p["second"], p["third"], p["resume_after"])
            else:
                positions[phase] = (p["first"], p["second"], p["resume_after"])
        return self._with_memory(cur["phase"], positions)

    def _with_memory(self, start: str, positions: dict[str, Key | None]) -> tuple[str, dict[str, Key | None]]:
        """Add this process's own resume position when the cursor still names its phase."""
        with _resume_lock:
            mem = _resume.pop(self.ctx.queue_id, None)
        if mem is not None and mem[0] == start and positions.get(start) is None:
            positions[start] = mem[1]
        return start, positions

    def _write_cursor(self, phase: str) -> None:
        """Persist the reset form naming ``phase`` (skipped when the bytes are already there)."""
        data = reset_cursor_json(self.ctx.queue_id, phase)
        control = self.control
        try:
            fd = linux.open_at(control, RECOVERY_CURSOR_FILE, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                if is_single_regular(linux.fstat(fd)) and linux.pread(fd, len(data) + 1, 0) == data:
                    self.report.next_phase = phase
                    return
            finally:
                linux.close(fd)
        except OSError:
            pass  # missing or unreadable: write it
        try:
            tmp = _CURSOR_TMP_PREFIX + self.ctx.random(16).hex() + TEMP_EXT
        except OSError as e:
            self._error("recovery_cursor", f"cannot persist the recovery cursor: getrandom: {e.strerror}")
            return
        try:
            fd = linux.open_at(control, tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, self.ctx.modes.file)
        except OSError as e:
            self._error("recovery_cursor", f"cannot create control/{tmp}: {e.strerror}")
            if e.errno != errno.EEXIST:
                # The create may have happened before the error (layout.md: the
                # temp is unlinked on failure; nothing ever sweeps control/).
                with contextlib.suppress(OSError):
                    linux.unlink_at(control, tmp)
            return
        renamed = False
        try:
            try:
                self.ctx.new_file_mode(fd)
                linux.write_all(fd, data)
                linux.fsync(fd)
            finally:
                linux.close(fd)
            linux.rename_replace(control, tmp, control, RECOVERY_CURSOR_FILE)
            renamed = True
            linux.fsync(control)
            self.report.next_phase = phase
        except OSError as e:
            self._error("recovery_cursor", f"cannot persist the recovery cursor: {e.strerror}")
        finally:
            if not renamed:
                with contextlib.suppress(OSError):
                    linux.unlink_at(control, tmp)

    # -- bookkeeping ---------------------------------------------------------------

    def _error(self, code: str, message: str) -> None:
        self.report.errors.append((code, message))

    def _check_budget(self) -> None:
        if self.report.operations_attempted >= self.max_ops or linux.monotonic_ns() >= self.deadline:
            raise _Exhausted()

    def _op(self) -> None:
        self.report.operations_attempted += 1

    def _skip_dir(self, key: Key) -> bool:
        """Every entry below ``key`` compares ≤ the position: already done."""
        return self.pos is not None and key < self.pos[: len(key)]

    @contextlib.contextmanager
    def _open(self, parent_fd: int, rel: str, name: bytes | str) -> Iterator[int | None]:
        """Our own fd for a directory we walk (never the tree cache: receipt
        directories may be removed by this very pass)."""
        try:
            fd = linux.open_dir(parent_fd, name)
        except OSError as e:
            if e.errno != errno.ENOENT:
                self._error("directory", f"cannot open {rel}: {e.strerror}")
            yield None
            return
        try:
            yield fd
        finally:
            with contextlib.suppress(OSError):
                linux.close(fd)

    def _list(self, dir_fd: int, rel: str) -> list[bytes]:
        try:
            names = linux.list_dir(dir_fd)
        except OSError as e:
            self._error("directory", f"cannot list {rel}: {e.strerror}")
            return []
        if len(names) > _LISTING_CAP:
            self._error("directory", f"{rel} holds {len(names)} entries; this pass looks at the first {_LISTING_CAP}")
            names = names[:_LISTING_CAP]
        return names

    def _subdirs(self, dir_fd: int, rel: str, prefix: Key) -> Iterator[tuple[bytes, Key]]:
        """Child names not yet done, checking the budget before each."""
        for raw in self._list(dir_fd, rel):
            key = prefix + (raw,)
            if self._skip_dir(key):
                continue
            self._check_budget()
            yield raw, key

    def _entries(self, dir_fd: int, rel: str, prefix: Key) -> Iterator[bytes]:
        """Leaf entries after the position; the position moves to each one
        before it is processed (recovery.md "Pass structure")."""
        for raw in self._list(dir_fd, rel):
            key = prefix + (raw,)
            if self.pos is not None and key <= self.pos:
                continue
            self._check_budget()
            self.pos = key
            yield raw

    def _dirs(
        self,
        parent_fd: int,
        parent_rel: str,
        prefix: Key,
        level: _Level,
        values: tuple[Any, ...],
        not_entered: list[bytes] | None = None,
    ) -> Iterator[tuple[tuple[Any, ...], int, str, str, Key]]:
        """Each child directory of one level not yet done, opened:
        ``(values + (its value,), fd, rel, name, key)``; the fd is closed when
        the consumer asks for the next one. Children it did not enter (invalid,
        unwanted, unopenable; not those already done) are appended to
        ``not_entered``. A consumer that raises must close the generator."""
        for raw, key in self._subdirs(parent_fd, parent_rel, prefix):
            value = level.parse(raw)
            vals = values + (value,)
            if value is None or (level.wanted is not None and not level.wanted(vals)):
                if value is None and level.invalid is not None:
                    self._error("invalid_name", f"{parent_rel}/{raw!r}: {level.invalid}")
                if not_entered is not None:
                    not_entered.append(raw)
                continue
            name = raw.decode("ascii")
            rel = f"{parent_rel}/{name}"
            with self._open(parent_fd, rel, name) as fd:
                if fd is None:
                    if not_entered is not None:
                        not_entered.append(raw)
                    continue
                yield vals, fd, rel, name, key

    def _walk(
        self, top: str, levels: tuple[_Level, ...], prefix: Key = ()
    ) -> Iterator[tuple[tuple[Any, ...], int, str, bytes]]:
        """``(level values, dir fd, dir rel, entry)`` for every leaf entry of
        ``top/<levels...>/`` after the position, in cursor order: the one walk
        (sorted listings, cursor skips, budget checks, our own fds) every
        bucketed phase shares."""
        with self._open(self.ctx.root_fd, top, top) as fd:
            if fd is not None:
                yield from self._descend(fd, top, prefix, levels, ())

    def _descend(
        self, fd: int, rel: str, key: Key, levels: tuple[_Level, ...], values: tuple[Any, ...]
    ) -> Iterator[tuple[tuple[Any, ...], int, str, bytes]]:
        if not levels:
            for raw in self._entries(fd, rel, key):
                yield values, fd, rel, raw
            return
        for vals, sub_fd, sub_rel, _, sub_key in self._dirs(fd, rel, key, levels[0], values):
            yield from self._descend(sub_fd, sub_rel, sub_key, levels[1:], vals)

    def _shard_level(self, invalid: str | None = _NOT_SHARD) -> _Level:
        count = self.fmt.shard_count
        return _Level(lambda raw: parse_shard_dir(raw, count), invalid)

    def _leaf_name(self, raw: bytes, rel: str, ext: str) -> str | None:
        """ASCII entry names with extension ``ext``; non-ASCII is an error."""
        name = _ascii(raw)
        if name is None:
            self._error("invalid_name", f"{rel}: non-ASCII entry {raw!r}")
            return None
        return name if name.endswith(ext) else None

    # -- shared actions ------------------------------------------------------------

    def _quarantine(self, dir_fd: int, rel: str, name: str, reason: int) -> None:
        self._op()
        try:
            with self.ctx.tree.operation():  # pins the cached quarantine/ fd
                qname = quarantine(self.ctx, dir_fd, name, reason)
        except SourceMissing:
            return  # someone else moved it: nothing left to isolate
        except (MoveError, Indeterminate, SteadQError, OSError) as e:
            self._error("quarantine_failed", f"{rel}/{name} (reason 0x{reason:04x}): {e}")
            return
        self.report.quarantined += 1
        self.report.quarantined_objects.append((f"{rel}/{name}", int(reason), qname))

    def _move(self, kind: str, src_fd: int, src_rel: str, name: str, dst_rel: str, dst_name: str) -> bool:
        """Unwitnessed move into ``dst_rel`` (created durably if missing) with
        its outcome recorded as ``<kind>_<outcome>``."""
        tree = self.ctx.tree
        where = f"{src_rel}/{name} -> {dst_rel}/{dst_name}"
        with tree.operation():  # the cached destination fd stays open until the barriers are done
            try:
                dst_fd = tree.ensure_dir(dst_rel)
            except OSError as e:
                self._error(f"{kind}_not_committed", f"cannot open {dst_rel}: {e.strerror}")
                return False
            return self._rename(kind, where, src_fd, name, dst_fd, dst_name)

    def _rename(self, kind: str, where: str, src_fd: int, name: str, dst_fd: int, dst_name: str) -> bool:
        self._op()
        try:
            self.ctx.tree.move_unwitnessed(src_fd, name, dst_fd, dst_name)
            return True
        except Collision:
            self._error(f"{kind}_collision", f"{where}: destination exists")
        except SourceMissing:
            self._error(f"{kind}_source_missing", f"{where}: source is gone")
        except MoveFailed as e:
            self._error(f"{kind}_not_committed", f"{where}: {e}")
        except Indeterminate as e:
            self._error(f"{kind}_outcome_unknown", f"{where}: {e}")
        return False

    def _validate(
        self,
        dir_fd: int,
        name: str,
        job: JobName,
        *,
        shard: int,
        bucket: int | None = None,
        path_boot: bytes | None = None,
    ) -> Envelope:
        """``validate_active_object``: everything but the payload hash.

        Raises CorruptObject/QueueCorrupt for corruption, OSError for I/O
        (FileNotFoundError when the object is simply gone).
        """
        fmt = self.fmt
        st = linux.stat_at(dir_fd, name)
        check_object_stat(st)
        try:
            fd = linux.open_at(dir_fd, name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise CorruptObject("is a symlink", QuarantineReason.NON_REGULAR_FILE) from e
            raise
        try:
            fst = linux.fstat(fd)
            if not Witness.of(st).matches(fst):
                raise OSError(errno.EAGAIN, "replaced while being validated")
            env = read_envelope(fd, fmt.max_payload_length, fst)
        finally:
            linux.close(fd)
        if not authenticate(fmt.queue_id, job, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns):
            raise CorruptObject("name tag does not authenticate", QuarantineReason.FILENAME_TAG_FAILED)
        if job.state is State.LEASED and bucket is not None:
            assert job.boottime_deadline is not None
            if lease_bucket(job.boottime_deadline, fmt.lease_width_ns) != bucket:
                raise CorruptObject(
                    "legacy lease is in the wrong bucket directory", QuarantineReason.FILENAME_TAG_FAILED
                )
            if job.boot_id != path_boot:
                raise CorruptObject("legacy lease is in another boot's directory", QuarantineReason.FILENAME_TAG_FAILED)
        if job.state is State.DELAYED:
            assert job.not_before is not None
            if delayed_bucket(job.not_before, fmt.delayed_width_ns) != bucket:
                raise CorruptObject(
                    "delayed job is in the wrong bucket directory", QuarantineReason.FILENAME_TAG_FAILED
                )
        check_name_matches(env.header, job)
        if shard_of(fmt.queue_id, job.job_id, fmt.shard_count) != shard:
            raise CorruptObject("is in the wrong shard directory", QuarantineReason.FILENAME_TAG_FAILED)
        return env

    def _valid(
        self,
        dir_fd: int,
        rel: str,
        name: str,
        job: JobName,
        code: str,
        *,
        shard: int,
        bucket: int | None = None,
        path_boot: bytes | None = None,
    ) -> bool:
        """True if the object passes ``_validate``; a corrupt one is quarantined
        (0x0001), an I/O failure recorded as ``code``, a vanished one ignored."""
        try:
            self._validate(dir_fd, name, job, shard=shard, bucket=bucket, path_boot=path_boot)
        except FileNotFoundError:
            return False
        except (CorruptObject, QueueCorrupt):
            self._quarantine(dir_fd, rel, name, QuarantineReason.ENVELOPE_CORRUPT)
            return False
        except (OSError, SteadQError) as e:
            self._error(code, f"{rel}/{name}: {e}")
            return False
        return True

    def _reap(self, src_fd: int, src_rel: str, name: str, job: JobName, shard: int, *, same_dir: bool) -> None:
        """An expired lease goes back to ready/<S> (same attempt), or to dead
        with reason 0x0004 when its attempts are used up."""
        fmt = self.fmt
        try:
            generation = next_generation(job.generation)
        except SteadQError as e:
            self._error("reap_state_exhausted", f"{src_rel}/{name}: {e}")
            return
        if job.attempt >= job.max_attempts:
            if self.wall is None:
                self._error("reap_to_dead_no_wall_floor", f"{src_rel}/{name}: exhausted lease left in place")
                return
            tb = terminal_bucket(self.wall, fmt.terminal_width_ns)
            target = dead_name(
                job.job_id, generation, job.attempt, job.max_attempts, reason=DeadReason.ATTEMPTS_EXHAUSTED
            )
            target_file = make_filename(fmt.queue_id, target, shard=shard, bucket=tb, lease_width_ns=fmt.lease_width_ns)
            dst_rel = f"{DEAD_DIR}/{bucket_dir(tb)}/{shard_dir(shard)}"
            if self._move("reap_to_dead", src_fd, src_rel, name, dst_rel, target_file):
                self.report.leases_to_dead += 1
            return
        target = ready_name(job.job_id, generation, job.attempt, job.max_attempts)
        target_file = make_filename(fmt.queue_id, target, shard=shard, lease_width_ns=fmt.lease_width_ns)
        if same_dir:
            # Colocated lease: rename within ready/<S> (the directory is fsynced twice).
            where = f"{src_rel}/{name} -> {target_file}"
            if self._rename("reap_to_ready", where, src_fd, name, src_fd, target_file):
                self.report.leases_reaped += 1
            return
        dst_rel = f"{READY_DIR}/{shard_dir(shard)}"
        if self._move("reap_to_ready", src_fd, src_rel, name, dst_rel, target_file):
            self.report.leases_reaped += 1

    # -- phase 1: reap leases --------------------------------------------------------
    # Position keys: (b"a", boot, bucket, shard, entry) for the legacy tree,
    # (b"b", shard, entry) for colocated leases, so 1a sorts before 1b.

    def _reap_leases(self) -> None:
        self._reap_legacy()
        self._reap_colocated()

    def _reap_legacy(self) -> None:
        me = self.ctx.boot_raw
        now_bucket = self.bt_now // self.fmt.lease_width_ns
        levels = (
            _Level(_parse_boot, _NOT_BOOT),
            # A current-boot bucket after now holds only running leases.
            _Level(parse_bucket_dir, _NOT_BUCKET, lambda v: not (v[0] == me and v[1] > now_bucket)),
            self._shard_level(),
        )
        for (boot, bucket, shard), fd, rel, raw in self._walk(LEASED_DIR, levels, (b"a",)):
            self._legacy_entry(fd, rel, raw, boot, boot == me, bucket, shard)

    def _legacy_entry(
        self, dir_fd: int, rel: str, raw: bytes, boot: bytes, current: bool, bucket: int, shard: int
    ) -> None:
        name = self._leaf_name(raw, rel, JOB_EXT)
        if name is None:
            return
        try:
            job = parse_name(State.LEASED, name)
        except CorruptObject:
            self._quarantine(dir_fd, rel, name, QuarantineReason.FILENAME_PARSE_FAILED)
            return
        assert job.boottime_deadline is not None
        if current and job.boottime_deadline > self.bt_now:
            return
        if self._valid(dir_fd, rel, name, job, "reap_validate", shard=shard, bucket=bucket, path_boot=boot):
            self._reap(dir_fd, rel, name, job, shard, same_dir=False)

    def _reap_colocated(self) -> None:
        fmt = self.fmt
        for shard in range(fmt.shard_count):
            sname = shard_dir(shard)
            skey: Key = (b"b", sname.encode("ascii"))
            if self._skip_dir(skey):
                continue
            self._check_budget()
            rel = f"{READY_DIR}/{sname}"
            try:
                # Uncached: a pass may visit thousands of shards.
                dir_fd = self.ctx.tree.open_transient(rel)
            except OSError as e:
                self._error("directory", f"cannot open {rel}: {e.strerror}")
                continue
            try:
                self._colocated_shard(dir_fd, rel, skey, shard)
            finally:
                with contextlib.suppress(OSError):
                    linux.close(dir_fd)

    def _colocated_shard(self, dir_fd: int, rel: str, skey: Key, shard: int) -> None:
        fmt = self.fmt
        for raw in self._entries(dir_fd, rel, skey):
            name = self._leaf_name(raw, rel, JOB_EXT)
            if name is None:
                continue
            try:
                job = parse_name(State.LEASED, name)
            except CorruptObject:
                continue  # a ready job (or fsck's business)
            if not authenticate(fmt.queue_id, job, shard=shard, lease_width_ns=fmt.lease_width_ns) or (
                shard_of(fmt.queue_id, job.job_id, fmt.shard_count) != shard
            ):
                # No holder can own a name that does not authenticate here.
                self._quarantine(dir_fd, rel, name, QuarantineReason.FILENAME_TAG_FAILED)
                continue
            assert job.boottime_deadline is not None
            if job.boot_id == self.ctx.boot_raw and job.boottime_deadline > self.bt_now:
                continue  # a running lease
            if self._valid(dir_fd, rel, name, job, "reap_validate", shard=shard):
                self._reap(dir_fd, rel, name, job, shard, same_dir=True)

    # -- phase 2: promote delayed ----------------------------------------------------

    def _promote_delayed(self) -> None:
        if self.wall is None:
            return
        due = self.wall // self.fmt.delayed_width_ns
        # Later buckets are not yet eligible: never opened.
        levels = (_Level(parse_bucket_dir, _NOT_BUCKET, lambda v: v[0] <= due), self._shard_level())
        for (bucket, shard), fd, rel, raw in self._walk(DELAYED_DIR, levels):
            self._delayed_entry(fd, rel, raw, bucket, shard)

    def _delayed_entry(self, dir_fd: int, rel: str, raw: bytes, bucket: int, shard: int) -> None:
        fmt = self.fmt
        name = self._leaf_name(raw, rel, JOB_EXT)
        if name is None:
            return
        try:
            job = parse_name(State.DELAYED, name)
        except CorruptObject:
            return  # not a delayed name: skipped silently (recovery.md)
        if not self._valid(dir_fd, rel, name, job, "promote_validate", shard=shard, bucket=bucket):
            return
        try:
            generation = next_generation(job.generation)
        except SteadQError as e:
            self._error("promote_state_exhausted", f"{rel}/{name}: {e}")
            return
        target = ready_name(job.job_id, generation, job.attempt, job.max_attempts)
        target_file = make_filename(fmt.queue_id, target, shard=shard, lease_width_ns=fmt.lease_width_ns)
        dst_rel = f"{READY_DIR}/{shard_dir(shard)}"
        if self._move("promote", dir_fd, rel, name, dst_rel, target_file):
            self.report.delayed_promoted += 1

    # -- phase 3: temp cleanup -------------------------------------------------------

    def _cleanup_temp(self) -> None:
        ttl = self.ctx.options.temp_ttl_ns
        # Names that are not boot directories are skipped silently (doctor probes live directly in tmp/).
        levels = (_Level(_parse_boot, None), self._shard_level())
        for (boot, _), fd, rel, raw in self._walk(TMP_DIR, levels):
            if not raw.endswith(TEMP_EXT.encode()):
                continue
            if boot == self.ctx.boot_raw:
                parsed = parse_temp_name(raw)
                if parsed is None or self.bt_now - parsed[0] <= ttl:
                    continue  # young, or not ours to judge
            self._delete_temp(fd, rel, os.fsdecode(raw))

    def _delete_temp(self, dir_fd: int, rel: str, name: str) -> None:
        self._op()
        try:
            self.ctx.tree.unlink(dir_fd, name)
        except SourceMissing:
            return
        except MoveFailed as e:
            self._error("temp_delete_failed", f"{rel}/{name}: {e}")
            return
        except Indeterminate as e:
            self._error("temp_delete_outcome_unknown", f"{rel}/{name}: {e}")
            return
        self.report.temp_files_deleted += 1

    # -- phases 4 and 5: receipts -------------------------------------------------------

    def _compact_receipts(self) -> None:
        levels = (_Level(parse_bucket_dir, _NOT_BUCKET), self._shard_level())
        for (bucket, shard), fd, rel, raw in self._walk(RECEIPTS_DIR, levels):
            if is_compact_temp_name(raw):
                self._delete_temp(fd, rel, raw.decode("ascii"))
                continue
            name = self._leaf_name(raw, rel, RECEIPT_EXT)
            if name is not None:
                self._compact_one(fd, rel, name, bucket, shard)

    @contextlib.contextmanager
    def _locked_receipt(self, dir_fd: int, rel: str, name: str, code: str) -> Iterator[int | None]:
        """The receipt opened O_RDWR with an exclusive OFD lock; None when it
        is gone or busy (another maintainer has it: skip silently)."""
        try:
            fd = linux.open_at(dir_fd, name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENOENT:
                self._error(code, f"cannot open {rel}/{name}: {e.strerror}")
            yield None
            return
        try:
            try:
                locked = linux.ofd_lock(fd, exclusive=True)
            except OSError as e:
                self._error(code, f"cannot lock {rel}/{name}: {e.strerror}")
                locked = False
            yield fd if locked else None
        finally:
            with contextlib.suppress(OSError):
                linux.close(fd)

    def _compact_one(self, dir_fd: int, rel: str, name: str, bucket: int, shard: int) -> None:
        fmt = self.fmt
        with self._locked_receipt(dir_fd, rel, name, "receipt_compact_failed") as fd:
            if fd is None:
                return
            try:
                info = verify_receipt(fmt, fd, name, bucket, shard)
            except SteadQError as e:
                self._error("receipt_compact_invalid", f"{rel}/{name}: {e}")
                return
            except OSError as e:
                self._error("receipt_compact_failed", f"{rel}/{name}: {e.strerror}")
                return
            if info.compact:
                return
            assert info.name.lease_token is not None
            self._op()
            try:
                record = CompactReceipt(
                    job_id=info.name.job_id,
                    envelope_digest=info.envelope_digest,
                    final_attempt=info.name.attempt,
                    lease_token=info.name.lease_token,
                    bucket_start_ns=bucket_start(bucket, fmt.terminal_width_ns),
                    payload_length=info.payload_length,
                ).encode()
            except SteadQError as e:
                self._error("receipt_compact_failed", f"{rel}/{name}: {e}")
                return
            if self._replace_receipt(dir_fd, rel, name, record, info.witness):
                self.report.receipts_compacted += 1

    def _replace_receipt(self, dir_fd: int, rel: str, name: str, record: bytes, witness: Witness) -> bool:
        """temp + fsync, identity re-check, plain rename over the receipt
        (the linearization point), fsync of the shard directory."""
        try:
            tmp = make_compact_temp_name(self.ctx.random(16))
        except OSError as e:
            self._error("receipt_compact_failed", f"{rel}/{name}: getrandom: {e.strerror}")
            return False
        try:
            tfd = linux.open_at(dir_fd, tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, self.ctx.modes.file)
        except OSError as e:
            self._error("receipt_compact_failed", f"cannot create {rel}/{tmp}: {e.strerror}")
            return False
        renamed = False
        try:
            try:
                self.ctx.new_file_mode(tfd)
                linux.write_all(tfd, record)
                linux.fsync(tfd)
            finally:
                linux.close(tfd)
            try:
                st = linux.stat_at(dir_fd, name)
            except FileNotFoundError:
                return False  # deleted meanwhile: nothing to compact
            if not (witness.matches(st) and is_single_regular(st)):
                self._error("receipt_compact_failed", f"{rel}/{name}: destination changed")
                return False
            linux.rename_replace(dir_fd, tmp, dir_fd, name)
            renamed = True
        except OSError as e:
            self._error("receipt_compact_failed", f"{rel}/{name}: {e.strerror}")
            return False
        finally:
            if not renamed:
                with contextlib.suppress(OSError):
                    linux.unlink_at(dir_fd, tmp)
        try:
            linux.fsync(dir_fd)
        except OSError as e:
            # Either record is a valid receipt; only durability is in doubt.
            self._error("receipt_compact_outcome_unknown", f"{rel}/{name}: fsync directory: {e.strerror}")
            return False
        return True

    def _delete_receipts(self) -> None:
        """Phase 5: receipts past retention, then (opt-in) dead letters past theirs."""
        if self.wall is None:
            return
        self._expire_tree(RECEIPTS_DIR, (), self.ctx.options.receipt_retention_ns, self._delete_in_shard)
        dead_retention = self.ctx.options.dead_retention_ns
        if dead_retention is not None:
            self._expire_tree(DEAD_DIR, _DEAD_KEY, dead_retention, self._delete_dead_in_shard)

    def _expire_tree(
        self,
        top_rel: str,
        prefix: Key,
        retention: int,
        delete_in_shard: Callable[[int, str, Key, int, int], bool],
    ) -> None:
        """Empty every ``top/<B>/<S>/`` with ``B × w + w + retention ≤ wall``
        through ``delete_in_shard`` (True: every entry seen is gone) and remove
        the directories it emptied."""
        assert self.wall is not None
        wall = self.wall
        width = self.fmt.terminal_width_ns

        def expired(values: tuple[Any, ...]) -> bool:
            try:
                return bucket_end(values[0], width) + retention <= wall
            except SteadQError:
                return False

        # Not the generic walk: directories are removed on the way back up.
        # Bad names are compact_receipts' (or fsck's) to report; a shard
        # directory we did not enter keeps its bucket directory.
        buckets, shards = _Level(parse_bucket_dir, None, expired), self._shard_level(None)
        with self._open(self.ctx.root_fd, top_rel, top_rel) as top:
            if top is None:
                return
            with contextlib.closing(self._dirs(top, top_rel, prefix, buckets, ())) as bucket_dirs:
                for (bucket,), kfd, krel, kname, kkey in bucket_dirs:
                    not_entered: list[bytes] = []
                    bucket_empty = True
                    with contextlib.closing(self._dirs(kfd, krel, kkey, shards, (bucket,), not_entered)) as shard_dirs:
                        for (_, shard), sfd, srel, sname, skey in shard_dirs:
                            if not (
                                delete_in_shard(sfd, srel, skey, bucket, shard) and self._remove_dir(kfd, krel, sname)
                            ):
                                bucket_empty = False
                    if bucket_empty and not not_entered:
                        self._remove_dir(top, top_rel, kname)

    def _delete_in_shard(self, dir_fd: int, rel: str, prefix: Key, bucket: int, shard: int) -> bool:
        """Delete every verified receipt; True if every entry seen is gone."""
        all_gone = True
        for raw in self._entries(dir_fd, rel, prefix):
            name = _ascii(raw)
            if name is None or not name.endswith(RECEIPT_EXT):
                all_gone = False
                continue
            try:
                parse_name(State.RECEIPT, name)
            except CorruptObject:
                self._error("receipt_parse", f"{rel}/{name}: not a receipt name")
                all_gone = False
                continue
            if not self._delete_one(dir_fd, rel, name, bucket, shard):
                all_gone = False
        return all_gone

    def _delete_one(self, dir_fd: int, rel: str, name: str, bucket: int, shard: int) -> bool:
        """True when the receipt is gone (deleted now or by someone else)."""
        with self._locked_receipt(dir_fd, rel, name, "receipt_delete_failed") as fd:
            if fd is None:
                return not _exists(dir_fd, name)
            try:
                info = verify_receipt(self.fmt, fd, name, bucket, shard)
            except SteadQError as e:
                self._error("receipt_delete_invalid", f"{rel}/{name}: {e}; kept")
                return False
            except OSError as e:
                self._error("receipt_delete_failed", f"{rel}/{name}: {e.strerror}")
                return False
            gone, deleted = self._unlink_verified(dir_fd, rel, name, info.witness, "receipt_delete")
            self.report.receipts_deleted += deleted
            return gone

    def _delete_dead_in_shard(self, dir_fd: int, rel: str, prefix: Key, bucket: int, shard: int) -> bool:
        """Delete every verified dead job of an expired bucket; True if every entry seen is gone.

        Only objects that prove to be this queue's dead jobs for this very
        directory are deleted: a stray or corrupt file may be evidence
        somebody needs, so it stays (fsck reports it) and keeps its directory.
        """
        all_gone = True
        for raw in self._entries(dir_fd, rel, prefix):
            name = _ascii(raw)
            if name is None or not name.endswith(JOB_EXT):
                all_gone = False
                continue
            try:
                job = parse_name(State.DEAD, name)
            except CorruptObject:
                self._error("dead_parse", f"{rel}/{name}: not a dead job name; kept")
                all_gone = False
                continue
            if not self._delete_dead_one(dir_fd, rel, name, job, bucket, shard):
                all_gone = False
        return all_gone

    def _delete_dead_one(self, dir_fd: int, rel: str, name: str, job: JobName, bucket: int, shard: int) -> bool:
        """True when the dead job is gone (deleted now or by someone else, e.g.
        an ``admin requeue``/``dead-remove`` that won the race)."""
        try:
            # Tag (dead/B/S context), shard placement, envelope, name vs header.
            env = self._validate(dir_fd, name, job, shard=shard, bucket=bucket)
        except FileNotFoundError:
            return True
        except (CorruptObject, QueueCorrupt) as e:
            self._error("dead_delete_invalid", f"{rel}/{name}: {e}; kept")
            return False
        except (OSError, SteadQError) as e:
            self._error("dead_delete_failed", f"{rel}/{name}: {e}")
            return False
        gone, deleted = self._unlink_verified(dir_fd, rel, name, env.witness, "dead_delete")
        self.report.dead_deleted += deleted
        return gone

    def _unlink_verified(self, dir_fd: int, rel: str, name: str, witness: Witness, code: str) -> tuple[bool, bool]:
        """Unlink an object only if the path still names the inode that was
        verified; returns (gone, deleted by this call). A file swapped in
        after verification is evidence and is kept."""
        try:
            st = linux.stat_at(dir_fd, name)
        except FileNotFoundError:
            return True, False
        except OSError as e:
            self._error(f"{code}_failed", f"{rel}/{name}: {e.strerror}")
            return False, False
        if not (witness.matches(st) and is_single_regular(st)):
            self._error(f"{code}_failed", f"{rel}/{name}: replaced while being verified; kept")
            return False, False
        self._op()
        try:
            self.ctx.tree.unlink(dir_fd, name)
        except SourceMissing:
            return True, False
        except MoveFailed as e:
            self._error(f"{code}_failed", f"{rel}/{name}: {e}")
            return False, False
        except Indeterminate as e:
            self._error(f"{code}_outcome_unknown", f"{rel}/{name}: {e}")
            return True, False
        return True, True

    def _remove_dir(self, parent_fd: int, parent_rel: str, name: str) -> bool:
        """rmdir + fsync of the parent; "not empty" is a normal outcome (False)."""
        self._check_budget()
        self._op()
        rel = f"{parent_rel}/{name}"
        try:
            linux.rmdir_at(parent_fd, name)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return True
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                self._error("rmdir_failed", f"{rel}: {e.strerror}")
            return False
        self.ctx.tree.forget(rel)
        self.report.directories_removed += 1
        try:
            linux.fsync(parent_fd)
        except OSError as e:
            self._error("rmdir_outcome_unknown", f"{rel}: fsync {parent_rel}: {e.strerror}")
        return True


def _exists(dir_fd: int, name: str) -> bool:
    try:
        linux.stat_at(dir_fd, name)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True
