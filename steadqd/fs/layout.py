"""Creating and opening a queue tree (layout.md "init" and "open").

``init`` follows the reference's order step by step: the FORMAT rename is its
linearization point, so a crash anywhere before it leaves no FORMAT and
``.initializing`` tells the next opener what happened. ``open`` performs
every check the reference performs, and refuses what cannot be safe
(filesystems without the needed guarantees, a symlinked root, an unknown
major version) with a message naming the cause.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from steadqd.constants import (
    CONTROL_DIR,
    CONTROL_LOCKS,
    DEFAULT_DELAYED_WIDTH_NS,
    DEFAULT_LEASE_WIDTH_NS,
    DEFAULT_RECEIPT_RETENTION_NS,
    DEFAULT_SHARDS,
    DEFAULT_TEMP_TTL_NS,
    DEFAULT_TERMINAL_WIDTH_NS,
    DIR_MODE,
    FILE_MODE,
    FORMAT_FILE,
    FORMAT_SIZE,
    FORMAT_TMP_PREFIX,
    INITIALIZING_FILE,
    MAINTENANCE_LOCK,
    MAX_PAYLOAD_LENGTH,
    MAX_RETENTION_PROBE_BUCKETS,
    PARENT_DIR_MODE,
    READY_DIR,
    RECOVERY_CURSOR_FILE,
    REFUSED_FILESYSTEMS,
    SHARED_ROOT_MODE,
    STATE_DIRS,
    SUPPORTED_FILESYSTEMS,
    WATERMARK_FILE,
    WATERMARK_INIT_TMP_PREFIX,
    WATERMARK_LOCK,
    Modes,
    modes_for_root,
)
from steadqd.errors import (
    AlreadyExists,
    BadRecoveryCursor,
    InvalidInput,
    MaintenanceBusy,
    QueueCorrupt,
    UnsupportedFilesystem,
)
from steadqd.fs import linux
from steadqd.fs.boot_id import read_boot_id
from steadqd.fs.json_records import validate_cursor
from steadqd.fs.names import shard_dir, watermark_bucket
from steadqd.fs.records import FormatRecord, Watermark, validate_queue_config
from steadqd.fs.tree import enforce_dir_mode
from steadqd.fs.watermark import publish_watermark

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


@dataclass(frozen=True)
class QueueConfig:
    """The FORMAT fields chosen at init."""

    shards: int = DEFAULT_SHARDS
    lease_width_ns: int = DEFAULT_LEASE_WIDTH_NS
    delayed_width_ns: int = DEFAULT_DELAYED_WIDTH_NS
    terminal_width_ns: int = DEFAULT_TERMINAL_WIDTH_NS
    max_payload_length: int = MAX_PAYLOAD_LENGTH


@dataclass(frozen=True)
class OpenOptions:
    """Per-handle options (clocks.md); two handles may differ."""

    receipt_retention_ns: int = DEFAULT_RECEIPT_RETENTION_NS
    temp_ttl_ns: int = DEFAULT_TEMP_TTL_NS
    # Dead-letter retention (a port extension, open-questions A7): None keeps
    # dead jobs until an operator removes them, as the reference does; a
    # value lets recovery's delete_receipts phase delete verified dead jobs of
    # terminal buckets that ended at least this long before the wall floor.
    dead_retention_ns: int | None = None
    deferred: bool = False
    allow_unsupported_fs: bool = False
    # False only for the one tool that removes a bad cursor (recovery.cursor.remove_bad_cursor):
    # every other open refuses the queue, as the reference's does.
    check_cursor: bool = True


def filesystem_name(magic: int) -> str:
    return SUPPORTED_FILESYSTEMS.get(magic) or REFUSED_FILESYSTEMS.get(magic) or f"unknown filesystem 0x{magic:x}"


def check_filesystem(magic: int, where: str, allow_unsupported: bool) -> None:
    """Refuse filesystems whose rename/fsync semantics SteadQ/1 does not certify."""
    if magic in SUPPORTED_FILESYSTEMS or allow_unsupported:
        return
    name = filesystem_name(magic)
    raise UnsupportedFilesystem(
        f"refusing a strict queue on {name} (statfs magic 0x{magic:08x}) at {where}: "
        "SteadQ/1 needs ext4, xfs, btrfs, f2fs or zfs for crash-safe renames and fsync"
    )


def check_retention(terminal_width_ns: int, retention_ns: int) -> None:
    """The duplicate-ack probe must stay bounded (layout.md open step 4)."""
    probe = -(-retention_ns // terminal_width_ns) + 2
    if probe > MAX_RETENTION_PROBE_BUCKETS:
        raise InvalidInput(
            f"receipt retention {retention_ns} ns needs {probe} terminal buckets of {terminal_width_ns} ns; "
            f"at most {MAX_RETENTION_PROBE_BUCKETS} are allowed (use a wider terminal bucket or a shorter retention)"
        )


def _existing_ancestor(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _mkdirs_durably(path: str, root_mode: int) -> None:
    """Create the root and missing parents, fsyncing each new entry's parent."""
    path = os.path.abspath(path)
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        parent = os.path.dirname(d)
        pfd = linux.open_at(-100, parent, _DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            linux.mkdir_at(pfd, os.path.basename(d), root_mode if d == path else PARENT_DIR_MODE)
            linux.fsync(pfd)
        finally:
            linux.close(pfd)


def open_root(path: str) -> int:
    """Open the queue root itself, refusing a symlink."""
    try:
        fd = linux.open_at(-100, path, _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise InvalidInput(f"queue root {path} is a symlink; open the real directory instead") from e
        if e.errno == errno.ENOENT:
            raise InvalidInput(f"queue root {path} does not exist") from e
        if e.errno == errno.ENOTDIR:
            raise InvalidInput(f"queue root {path} is not a directory") from e
        raise
    return fd


def _create_or_open(dir_fd: int, name: str, modes: Modes) -> int:
    try:
        fd = linux.open_at(dir_fd, name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, modes.file)
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise
        return _open_fixed(dir_fd, name, os.O_RDWR, f"{CONTROL_DIR}/{name}")
    if modes.enforce:
        linux.fchmod(fd, modes.file)
    return fd


def _open_fixed(dir_fd: int, name: str, flags: int, label: str) -> int:
    """Open a file the layout names (FORMAT, control/*): never blocks, never anything but a
    regular file; QueueCorrupt naming ``label`` otherwise, ENOENT passed on."""
    try:
        fd, _st = linux.open_regular(dir_fd, name, flags, label=label)
    except linux.NotRegularFile as e:
        raise QueueCorrupt(str(e)) from e
    return fd


def _mkdir(parent: int, name: str, modes: Modes) -> None:
    if linux.mkdir_at(parent, name, modes.dir & 0o777) and modes.enforce:  # S_ISGID: see Tree._mkdirs_durably
        enforce_dir_mode(parent, name, modes.dir)


def init_queue(
    path: str, config: QueueConfig = QueueConfig(), *, allow_unsupported_fs: bool = False, shared: bool = False
) -> FormatRecord:
    """Create a queue at ``path`` (layout.md "init procedure", exact order).

    ``shared`` makes the root setgid and group-writable (2770) so that
    producers and daemons in the directory's group can all use the queue;
    a root that already grants its group access is treated the same way.
    """
    validate_queue_config(
        config.shards,
        config.lease_width_ns,
        config.delayed_width_ns,
        config.terminal_width_ns,
        config.max_payload_length,
    )
    # Refuse a width the default retention could not open later (open-questions E44).
    check_retention(config.terminal_width_ns, DEFAULT_RECEIPT_RETENTION_NS)
    check_filesystem(linux.statfs_type(_existing_ancestor(path)), path, allow_unsupported_fs)
    if os.path.islink(path):
        raise InvalidInput(f"queue root {path} is a symlink; initialise the real directory instead")
    if not os.path.lexists(path):
        _mkdirs_durably(path, SHARED_ROOT_MODE if shared else DIR_MODE)
    root = open_root(path)
    try:
        if shared:
            linux.fchmod(root, SHARED_ROOT_MODE)
        return _init_in(root, config, modes_for_root(linux.fstat(root).st_mode))
    finally:
        linux.close(root)


def _init_in(root: int, config: QueueConfig, modes: Modes) -> FormatRecord:
    try:
        linux.stat_at(root, FORMAT_FILE)
        raise AlreadyExists("queue is already initialized (FORMAT exists)")
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise
    marker_flags = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_RDWR
    try:
        marker = linux.open_at(root, INITIALIZING_FILE, marker_flags, FILE_MODE)
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise
        try:  # a crashed earlier init left it; FORMAT is absent
            linux.unlink_at(root, INITIALIZING_FILE)
            marker = linux.open_at(root, INITIALIZING_FILE, marker_flags, FILE_MODE)
        except OSError as e2:
            raise AlreadyExists("another init is in progress (.initializing)") from e2
    linux.close(marker)
    keep_marker = False
    lock_fd = -1
    try:
        _mkdir(root, CONTROL_DIR, modes)
        control = linux.open_dir(root, CONTROL_DIR)
        try:
            lock_fd = _create_or_open(control, MAINTENANCE_LOCK, modes)
            if not linux.ofd_lock(lock_fd, exclusive=True):
                raise MaintenanceBusy("another process holds the maintenance lock")
            queue_id = linux.getrandom(16)
            created_at = linux.realtime_ns()
            for d in STATE_DIRS:
                _mkdir(root, d, modes)
            linux.fsync(root)
            ready = linux.open_dir(root, READY_DIR)
            try:
                for s in range(config.shards):
                    _mkdir(ready, shard_dir(s), modes)
                linux.fsync(ready)
            finally:
                linux.close(ready)
            linux.fsync(root)
            for name in CONTROL_LOCKS:
                fd = _create_or_open(control, name, modes)
                try:
                    linux.fsync(fd)
                finally:
                    linux.close(fd)
            linux.fsync(control)
            linux.fsync(root)
            initial = Watermark(bucket=watermark_bucket(created_at, config.delayed_width_ns), sequence=0)
            publish_watermark(control, initial, WATERMARK_INIT_TMP_PREFIX, modes)
        finally:
            linux.close(control)
        record = FormatRecord(
            queue_id=queue_id,
            created_at_ns=created_at,
            shard_count=config.shards,
            lease_width_ns=config.lease_width_ns,
            delayed_width_ns=config.delayed_width_ns,
            terminal_width_ns=config.terminal_width_ns,
            max_payload_length=config.max_payload_length,
        )
        tmp = FORMAT_TMP_PREFIX + linux.getrandom(16).hex()
        fd = linux.open_at(root, tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, modes.file)
        try:
            try:
                linux.write_all(fd, record.encode())
                linux.fsync(fd)
                linux.fchmod(fd, modes.format)
            finally:
                linux.close(fd)
            linux.rename_noreplace(root, tmp, root, FORMAT_FILE)  # linearization point of init
        except OSError as e:
            try:
                linux.unlink_at(root, tmp)
            except OSError:
                pass
            if e.errno == errno.EEXIST:
                raise AlreadyExists("another initializer created FORMAT first") from e
            raise
        try:
            linux.fsync(root)
        except OSError:
            keep_marker = True  # indeterminate publication: leave the marker for open to report
            raise
        return record
    finally:
        if not keep_marker:
            try:
                linux.unlink_at(root, INITIALIZING_FILE)
                linux.fsync(root)
            except OSError:
                pass
        if lock_fd >= 0:
            linux.close(lock_fd)


@dataclass
class OpenedRoot:
    """What ``open`` established: the caller owns both descriptors."""

    root_fd: int
    maintenance_fd: int
    format: FormatRecord
    fs_magic: int
    boot_id: str


def open_queue_root(path: str, options: OpenOptions) -> OpenedRoot:
    """layout.md "open procedure", every check of the reference, in order."""
    root = open_root(path)
    maintenance = -1
    try:
        try:
            ffd = _open_fixed(root, FORMAT_FILE, os.O_RDONLY, FORMAT_FILE)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise QueueCorrupt(f"cannot open FORMAT: {e.strerror}") from e
            try:
                linux.stat_at(root, INITIALIZING_FILE)
            except OSError:
                raise QueueCorrupt(f"{path} is not a queue: FORMAT file is missing") from None
            raise QueueCorrupt("initialization was interrupted; remove .initializing and retry init") from None
        try:
            data = linux.pread(ffd, FORMAT_SIZE + 1, 0)
        finally:
            linux.close(ffd)
        fmt = FormatRecord.decode(data)
        check_retention(fmt.terminal_width_ns, options.receipt_retention_ns)
        magic = linux.fstatfs_type(root)
        check_filesystem(magic, path, options.allow_unsupported_fs)
        root_dev = linux.fstat(root).st_dev
        for d in STATE_DIRS:
            try:
                sst = linux.stat_at(root, d)
            except OSError as e:
                raise QueueCorrupt(f"state directory {d}/ is missing") from e
            if not stat.S_ISDIR(sst.st_mode):
                raise QueueCorrupt(f"state directory {d}/ is not a directory")
            if sst.st_dev != root_dev:
                raise QueueCorrupt(f"state directory {d}/ is on another device than the queue root")
        try:
            boot_id = read_boot_id()
        except ValueError as e:
            raise InvalidInput(str(e)) from e
        control = linux.open_dir(root, CONTROL_DIR)
        try:
            try:
                maintenance = _open_fixed(control, MAINTENANCE_LOCK, os.O_RDONLY, f"{CONTROL_DIR}/{MAINTENANCE_LOCK}")
            except OSError as e:
                raise QueueCorrupt(f"cannot open control/{MAINTENANCE_LOCK}: {e.strerror}") from e
            if not linux.ofd_lock(maintenance, exclusive=False):
                raise MaintenanceBusy("queue is being initialised or maintained (maintenance lock held)")
            if options.check_cursor:
                check_cursor(control, fmt.queue_id)
            try:
                watermark = linux.stat_at(control, WATERMARK_FILE)
            except OSError as e:
                raise QueueCorrupt("wall watermark missing (control/wall-watermark)") from e
            _refuse_special(WATERMARK_FILE, watermark)
            # A FIFO there opens (O_NONBLOCK) and locks like a file at every
            # watermark advance, so this is the one place that names it.
            _refuse_special(WATERMARK_LOCK, linux.not_regular(control, WATERMARK_LOCK))
        finally:
            linux.close(control)
        return OpenedRoot(root, maintenance, fmt, magic, boot_id)
    except BaseException:
        if maintenance >= 0:
            linux.close(maintenance)
        linux.close(root)
        raise


def _refuse_special(name: str, st: os.stat_result | None) -> None:
    """QueueCorrupt when the lstat of ``control/<name>`` shows anything but a regular file."""
    if st is not None and not stat.S_ISREG(st.st_mode):
        e = linux.NotRegularFile(f"{CONTROL_DIR}/{name}", st.st_mode)
        raise QueueCorrupt(str(e)) from e


CURSOR_FIX = "it only records where maintenance stands: `steadq fsck --repair` removes it and recovery starts over"


def check_cursor(control: int, queue_id: bytes) -> None:
    """A malformed cursor makes the reference refuse the queue; say so early, and name the fix."""
    try:
        try:
            fd = _open_fixed(control, RECOVERY_CURSOR_FILE, os.O_RDONLY, f"{CONTROL_DIR}/{RECOVERY_CURSOR_FILE}")
        except OSError as e:
            if e.errno == errno.ENOENT:
                return
            raise QueueCorrupt(f"cannot open control/{RECOVERY_CURSOR_FILE}: {e.strerror}") from e
        try:
            data = linux.pread(fd, 16_385, 0)
        finally:
            linux.close(fd)
        validate_cursor(data, queue_id)
    except QueueCorrupt as e:
        where = f"{CONTROL_DIR}/{RECOVERY_CURSOR_FILE}"
        raise BadRecoveryCursor(
            f"{e.message} ({CURSOR_FIX})" if where in e.message else f"{e.message} ({where}; {CURSOR_FIX})"
        ) from e
