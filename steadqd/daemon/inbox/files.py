"""One file of a watch folder becomes exactly one job, across restarts and SIGKILLs.

Why an intent record and not a job id computed from the file: SteadQ/1 draws
every job id from getrandom (protocol.md, "Enqueue"), and a computed id would
not be enough anyway: once the first job has been leased its ready name is
gone, so a second enqueue of the same id would publish a second job (with
the same id) instead of failing. So the folder draws a fresh random id
(``backend.new_job_id``) and writes it down *before* the enqueue, in an
intent record in the folder's state directory ``.steadq-inbox/``:

1. ``<job id>.intent`` is created and fsynced: the file's name and identity
   (device, inode, size, mtime) and where it is put before the enqueue;
2. the file is put there by one rename: ``after: move`` into ``move_to``,
   ``after: delete`` to ``.steadq-inbox/<job id>.file`` (``after: keep``
   leaves it alone). A file taken out of the folder this way can never be
   seen as a new file again;
3. the job is enqueued with that id (``Backend.enqueue(job_id=...)``);
4. the intent is finished: ``delete`` unlinks the ``.file``, ``keep`` renames
   the intent to ``<job id>.kept`` (the ledger of kept files, which is how a
   kept file is known on the next start), ``move`` unlinks the intent.

A restart finds each unfinished intent and asks the queue for its job
(``Backend.inspect``): there, only step 4 is left; not there, the enqueue
did not happen and steps 2-4 are done now, with the same id.

With ``inbox.unique`` (name, or identity: name, size and mtime) the id is not
drawn but derived from the file's key (:func:`unique_key`,
``steadqd.queue_control.unique_job_id``), and step 3 enqueues with that key;
the steps stay the same, so a crash resolves the same way. Before step 1 the
queue is asked for the key's job: one there (running, waiting, dead, or
acknowledged within the receipt retention) refuses the file, which is left
where it is (every ``after:``): nothing is lost, its uploader sees it was not
taken, and a member's file never goes anywhere the member cannot reach it. The
refusal is made again only when the file changes or the daemon restarts. A
producer enqueueing the same key between that look and step 3 makes step 3
fail with DuplicateJob: the file is put back and refused the same way. The one answer
that cannot be trusted is "not there" for an intent older than the receipt
retention (the job may have run and its receipt expired): such an intent is
renamed ``<job id>.unresolved`` and the operator is told, rather than risking
a second job; the file itself is never deleted on that path.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from dataclasses import dataclass

from steadqd.backend import Backend, new_job_id
from steadqd.daemon.config import InboxConfig
from steadqd.daemon.inbox.access import cannot_write_fix, exposed, handoff_risk, named_user
from steadqd.daemon.inbox.intent import (
    FILE,
    INTENT,
    INVALID,
    KEPT,
    STATE_DIR,
    TMP,
    UNRESOLVED,
    BadRecord,
    Intent,
    Unreadable,
    shown,
)
from steadqd.daemon.inbox.linux import rename_noreplace
from steadqd.errors import DuplicateJob, ErrorKind, InvalidInput, OutcomeUnknown, SteadQError
from steadqd.queue_control import unique_job_id

__all__ = ["Folder", "Result", "open_for_writing", "unique_key"]

_PATH_TYPE = "text/plain; charset=utf-8"
_CONTENT_TYPE = "application/octet-stream"

# Result.outcome values
ENQUEUED, REFUSED, LATER, DONE_BEFORE, UNKNOWN = "enqueued", "refused", "later", "done before", "unknown"


@dataclass(frozen=True)
class Result:
    outcome: str
    reason: str = ""
    job_id: str | None = None


def open_for_writing(path_fd: int) -> bool | None:
    """Whether some process has the file open for writing; None where the kernel will not say.

    A read lease is granted only on a file nobody has open for writing. Taking one
    needs the file's owner or CAP_LEASE and a local filesystem, so for an upload
    by another user this is None and the settle time alone decides. The lease is
    given back at once: a writer opening the file meanwhile waits for that, no longer.
    """
    try:
        fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)
    return False


def _prefixed(prefix: str, name: str, name_max: int) -> str:
    """``prefix + name``, its stem shortened where that is longer than a name may be.

    A name of 247 bytes or more in front of which the job id's digits go would fail with
    ENAMETOOLONG every time: the stem is cut (whole UTF-8 characters where the name is
    UTF-8) and an extension of up to 16 bytes is kept, so ``movie.mkv`` stays a ``.mkv``.
    """
    raw, head = os.fsencode(name), os.fsencode(prefix)
    if len(head) + len(raw) <= name_max:
        return prefix + name
    stem, dot, ext = raw.rpartition(b".")
    tail = dot + ext if stem and len(ext) < 16 else b""
    cut = raw[: name_max - len(head) - len(tail)]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        cut = cut.decode("utf-8", "ignore").encode()  # no character split in two
    return os.fsdecode(head + cut + tail)


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


def unique_key(config: InboxConfig, name: str, size: int, mtime_ns: int) -> str | None:
    """The file's unique key under ``inbox.unique`` (None when off): what an operator may also give
    ``steadq put --unique`` to hold a name back, or look the file's job up with (``steadq inspect``).

    ``inbox:<folder>/<name>``, and for identity `` size=<bytes> mtime_ns=<ns>`` after it: a name
    cannot hold ``/``, and the suffix always ends the key, so no two files share a key by their
    names alone. Not a secret nor a proof: a member who knows a coming file's name (and, for
    identity, its size and mtime, which its owner sets at will) can drop one first and have the
    real one refused as its duplicate; the refusal names the job and the file stays in place."""
    if config.unique == "off":
        return None
    key = f"inbox:{os.path.join(config.path, name)}"
    if config.unique == "identity":
        key += f" size={size} mtime_ns={mtime_ns}"
    return key


def _duplicate(job_id: str, mode: str) -> Result:
    """A file whose key's job is in the queue: refused, naming the job (counted like every refusal)."""
    same = {"name": "name", "identity": "name, size and modification time"}.get(mode, "unique key")
    return Result(
        REFUSED,
        f"has the same {same} as job {job_id}, which is still in the queue (inbox.unique: {mode}); "
        "it was left in place",
        job_id,
    )


class Folder:
    """A watch folder's descriptors, its ledger of kept files, and the per-file protocol."""

    def __init__(self, config: InboxConfig, queue: Backend, retention: float) -> None:
        self.config = config
        self.queue = queue
        self.retention = retention  # seconds a finished job stays findable (receipts, dead letters)
        self.fd = self._open_dir(config.path, "inbox.path")
        self.dev = os.fstat(self.fd).st_dev
        self.state_fd = -1
        self.move_fd: int | None = None
        self.kept: dict[int, Intent] = {}  # inode -> the kept file's record
        # Why a member could rename the state directory away ("" if nobody can).
        self.exposed = exposed(os.fstat(self.fd))
        try:
            if self.exposed and config.after == "keep":
                raise InvalidInput(
                    f"inbox.path {shown(config.path)} {self.exposed}: with after: keep, renaming "
                    f"{STATE_DIR} away would make every kept file a job again; make the folder sticky "
                    f"(chmod +t {shown(config.path)}, mode 3770) or use after: move or delete"
                )
            self.state_fd = self._state_dir()
            if config.move_to is not None:
                self.move_fd = self._open_dir(config.move_to, "inbox.move_to")
                if os.fstat(self.move_fd).st_dev != self.dev:
                    raise InvalidInput(
                        f"inbox.move_to {config.move_to} is on another filesystem than inbox.path {config.path}: "
                        "files are moved by rename; choose a folder on the same filesystem"
                    )
            if config.payload == "path":
                handed = config.move_to if config.after == "move" and config.move_to else config.path
                if why := handoff_risk(handed):
                    raise InvalidInput(
                        f"payload: path would hand jobs paths in {shown(handed)}, which {why}: once the job is "
                        "made, someone else could put a symbolic link in the file's place and the job would read "
                        "any file its user can; use after: move with a move_to only the daemon's user writes "
                        "(e.g. mode 2750, owned by it), or payload: content"
                    )
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _open_dir(path: str, key: str) -> int:
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise InvalidInput(f"{key} {path} does not exist: create it, writable by the daemon's user") from None
        except NotADirectoryError:
            raise InvalidInput(f"{key} {path} is not a directory") from None
        except PermissionError:
            raise InvalidInput(f"{key} {path} cannot be opened by the daemon's user (permission denied)") from None

    def _state_dir(self) -> int:
        """The state directory, verified to be the daemon's own, as a descriptor used from then on.

        The folder is writable by others (a group share): anyone there can make
        ``.steadq-inbox`` before the first start, or rename the daemon's away and put
        their own in its place, with records that name any file. Only a directory
        the daemon's user owns, that nobody else may write, is trusted; it is
        checked on the descriptor that is then used, so nothing can be swapped
        between the check and the use.
        """
        where = f"{shown(self.config.path)}/{STATE_DIR}"
        try:
            os.mkdir(STATE_DIR, 0o700, dir_fd=self.fd)
            os.fsync(self.fd)
        except FileExistsError:
            pass
        except OSError as e:
            raise InvalidInput(
                f"{where} cannot be created: {e.strerror}; {cannot_write_fix(self.config.path, e)}"
            ) from None
        try:
            fd = os.open(STATE_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError as e:
            # Never advise removing it when it may be another process's live state (a daemon of
            # another user, issue 33 #3): only something that is not a directory is in the way.
            fix = "remove what is there" if e.errno in (errno.ENOTDIR, errno.ELOOP) else "run as the daemon's user"
            raise InvalidInput(f"{where} must be a directory of the daemon ({e.strerror}); {fix}") from None
        st = os.fstat(fd)
        if st.st_dev != self.dev:
            os.close(fd)
            raise InvalidInput(f"{where} is a mount point; it must be part of the folder")
        euid = os.geteuid()
        if st.st_uid != euid or stat.S_IMODE(st.st_mode) & 0o077:
            os.close(fd)
            raise InvalidInput(
                f"watch folder state {where} is owned by uid {st.st_uid}{named_user(st.st_uid)} with mode "
                f"{stat.S_IMODE(st.st_mode):04o}, not by the daemon's uid {euid}{named_user(euid)} with mode 0700: "
                f"someone else made or replaced it, so its records are not trusted; look at what it holds, move it "
                f"out of the folder, make the folder sticky (chmod +t {shown(self.config.path)}) and start again"
            )
        return fd

    def close(self) -> None:
        for fd in (self.fd, self.state_fd, self.move_fd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.fd = self.state_fd = -1
        self.move_fd = None

    # -- the state directory -------------------------------------------------------

    def pending_intents(self) -> list[Intent | Unreadable]:
        """Load the ledger of kept files; return the unfinished intents and the entries not to act on."""
        self.kept.clear()
        pending: list[Intent | Unreadable] = []
        for entry in sorted(os.listdir(self.state_fd)):
            if entry.startswith(".") and entry.endswith(INTENT + TMP):  # never renamed into place: nothing followed
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=self.state_fd)
                continue
            if not entry.endswith((INTENT, KEPT)):
                continue
            try:
                record = self._read_record(entry)
            except BadRecord as e:
                pending.append(Unreadable(entry, str(e), cut_short=False))
                continue
            except (OSError, ValueError) as e:
                pending.append(Unreadable(entry, str(e), cut_short=entry.endswith(INTENT)))
                continue
            if entry.endswith(KEPT):
                self.kept[record.ino] = record
            else:
                pending.append(record)
        return pending

    def _read_record(self, entry: str) -> Intent:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.state_fd)
        try:
            return Intent.from_json(os.read(fd, 1 << 16), entry)
        finally:
            os.close(fd)

    def set_aside(self, entry: str) -> str:
        """Rename a record not to act on to ``<entry>.invalid``, for the operator; return the new name."""
        aside = entry + INVALID
        os.rename(entry, aside, src_dir_fd=self.state_fd, dst_dir_fd=self.state_fd)
        os.fsync(self.state_fd)
        return aside

    def drop_unreadable(self, entry: str) -> None:
        """An intent that does not parse was cut short while being written: nothing followed it."""
        os.unlink(entry, dir_fd=self.state_fd)
        os.fsync(self.state_fd)

    def _write_intent(self, intent: Intent) -> None:
        """Write the intent whole or not at all: under a temporary name, fsynced, then renamed.

        A full disk (ENOSPC) or a quota must leave nothing behind: an empty record
        would be taken for one cut short by a crash, and kept the file waiting for
        nothing. A temporary name a SIGKILL leaves is removed at the next start.
        """
        name, tmp = intent.job_id + INTENT, f".{intent.job_id}{INTENT}{TMP}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=self.state_fd)
            try:
                raw = intent.to_json()
                if os.write(fd, raw) != len(raw):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.state_fd, dst_dir_fd=self.state_fd)
            os.fsync(self.state_fd)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=self.state_fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.state_fd)
            raise

    def _drop_intent(self, intent: Intent) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(intent.job_id + INTENT, dir_fd=self.state_fd)
        os.fsync(self.state_fd)

    def forget(self, name: str) -> None:
        """A name left the folder: a kept record of it has nothing left to guard."""
        for ino, record in list(self.kept.items()):
            if record.name == name and not self._is_at(self.fd, name, ino):
                del self.kept[ino]
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(record.job_id + KEPT, dir_fd=self.state_fd)

    def forget_missing(self, names: set[str]) -> None:
        """After a scan: drop the kept records of files no longer in the folder."""
        for record in list(self.kept.values()):
            if record.name not in names:
                self.forget(record.name)

    @staticmethod
    def _is_at(dir_fd: int, name: str, ino: int) -> bool:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino == ino
        except FileNotFoundError:
            return False

    # -- one file ----------------------------------------------------------------

    def look(self, name: str) -> tuple[os.stat_result | None, str]:
        """The file's status if it may become a job, else None and why not ("" if it is simply gone)."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None, ""
        except OSError as e:
            return None, f"cannot be examined ({e.strerror})"
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            return None, "is a symbolic link; a watch folder takes regular files only (copy the file in)"
        if stat.S_ISDIR(mode):
            return None, "is a directory; a watch folder takes regular files only"
        if stat.S_ISFIFO(mode):
            return None, "is a FIFO; a watch folder takes regular files only"
        if not stat.S_ISREG(mode):
            return None, "is not a regular file (a socket or a device); a watch folder takes regular files only"
        if st.st_dev != self.dev:
            return None, "is on another filesystem (a mount point), not in the folder"
        if st.st_nlink != 1:
            return None, f"has {st.st_nlink} hard links, so it may belong to another folder; copy it in instead"
        return st, ""

    def already_kept(self, st: os.stat_result) -> str | None:
        """The job id of a kept file that is unchanged since it became that job."""
        record = self.kept.get(st.st_ino)
        if record is not None and (record.ino, record.size, record.mtime_ns) == _identity(st):
            return record.job_id
        return None

    def take(self, name: str, st: os.stat_result) -> Result:
        """Steps 1-4 for a file that settled; ``st`` is what :meth:`look` saw of it."""
        key = unique_key(self.config, name, st.st_size, st.st_mtime_ns)
        try:
            job_id = new_job_id() if key is None else unique_job_id(self.queue.queue_id, key)
        except InvalidInput as e:  # a key too long (the name's bytes): config allows the folder's path
            return Result(REFUSED, f"cannot have a unique key: {e}")
        after = self.config.after
        dest: str | None = None
        if after == "move":
            dest = name
            if self._exists(self.move_fd, name):
                assert self.move_fd is not None
                dest = _prefixed(f"{job_id[:8]}-", name, os.fpathconf(self.move_fd, "PC_NAME_MAX"))
        elif after == "delete":
            dest = job_id + FILE
        intent = Intent(job_id, name, *_identity(st), dest, key)
        fd = self._open_path(self.fd, name, st.st_ino)
        if fd is None:
            return Result(LATER, "changed while it was being taken")
        try:
            if open_for_writing(fd):
                return Result(LATER, "is still open for writing")
            if self.config.payload == "content" and (why := self._unreadable(fd)):
                return Result(REFUSED, why)  # before the intent: nothing is left behind for it
            if key is not None and (held := self._key_held(intent)) is not None:
                return held
            try:
                self._write_intent(intent)
            except OSError as e:  # a full disk: the file waits, and is tried again
                return Result(LATER, f"cannot be written down yet ({e.strerror})")
            if dest is not None:
                try:
                    self._place(intent)
                except OSError as e:
                    self._drop_intent(intent)
                    return Result(LATER, f"cannot be moved ({e.strerror})")
                if not self._is_at(self._dest_fd(intent), dest, st.st_ino):
                    self._undo(intent)
                    return Result(LATER, "was replaced while it was being taken")
            return self._enqueue_and_finish(intent, fd)
        finally:
            os.close(fd)

    def _key_held(self, intent: Intent) -> Result | None:
        """Why the file's key keeps it from being taken now: its job is in the queue, or the same
        key's intent is still unfinished (an unknown outcome being asked again); else None."""
        if self._exists(self.state_fd, intent.job_id + INTENT):
            return Result(LATER, f"waits for the outcome of job {intent.job_id}, which has the same unique key")
        try:
            there = self.queue.inspect(intent.job_id)
        except (SteadQError, OSError) as e:
            return Result(LATER, f"cannot be looked up in the queue yet ({e})")
        return _duplicate(intent.job_id, self.config.unique) if there else None

    def resolve(self, intent: Intent) -> Result:
        """Finish an intent an earlier run (or an unknown outcome) left behind."""
        if self.queue.inspect(intent.job_id):
            self._finish(intent)
            return Result(DONE_BEFORE, job_id=intent.job_id)
        age = time.time() - self._intent_mtime(intent)
        if age > self.retention:
            os.rename(
                intent.job_id + INTENT, intent.job_id + UNRESOLVED, src_dir_fd=self.state_fd, dst_dir_fd=self.state_fd
            )
            os.fsync(self.state_fd)
            return Result(
                REFUSED,
                f"may have become job {intent.job_id} {age:.0f}s ago, longer than the queue keeps finished jobs; "
                f"it was not enqueued again. If no such job ran, put the file back into the folder "
                f"and remove {STATE_DIR}/{intent.job_id}{UNRESOLVED}",
                intent.job_id,
            )
        placed = intent.dest is not None and self._is_at(self._dest_fd(intent), intent.dest, intent.ino)
        if placed:
            assert intent.dest is not None
            fd = self._open_path(self._dest_fd(intent), intent.dest, intent.ino)
        else:
            fd = self._open_path(self.fd, intent.name, intent.ino)
        if fd is None:
            self._drop_intent(intent)
            return Result(REFUSED, "went away before it became a job")
        try:
            if intent.dest is not None and not placed:
                self._place(intent)
            return self._enqueue_and_finish(intent, fd)
        finally:
            os.close(fd)

    def _intent_mtime(self, intent: Intent) -> float:
        return os.stat(intent.job_id + INTENT, dir_fd=self.state_fd).st_mtime

    def _dest_fd(self, intent: Intent) -> int:
        if intent.kind != "move":
            return self.state_fd
        if self.move_fd is None:
            raise InvalidInput(
                f"{shown(intent.name)} was being moved (job {intent.job_id}) but inbox.move_to is no longer set; "
                "set it back until the file is finished"
            )
        return self.move_fd

    @staticmethod
    def _exists(dir_fd: int | None, name: str) -> bool:
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    @staticmethod
    def _open_path(dir_fd: int, name: str, ino: int) -> int | None:
        """A descriptor of exactly that inode (O_PATH: opening a device or FIFO has no effect)."""
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        st = os.fstat(fd)
        if st.st_ino != ino or not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        return fd

    def _place(self, intent: Intent) -> None:
        assert intent.dest is not None
        dest_fd = self._dest_fd(intent)
        rename_noreplace(self.fd, intent.name, dest_fd, intent.dest)
        os.fsync(dest_fd)
        os.fsync(self.fd)

    def _undo(self, intent: Intent) -> None:
        """Put a placed file back where it was found; the enqueue did not happen."""
        if intent.dest is not None and self._is_at(self._dest_fd(intent), intent.dest, intent.ino):
            with contextlib.suppress(OSError):  # a new file of that name arrived: the file stays placed
                rename_noreplace(self._dest_fd(intent), intent.dest, self.fd, intent.name)
                os.fsync(self.fd)
        self._drop_intent(intent)

    @staticmethod
    def _unreadable(path_fd: int) -> str:
        """Why the daemon's user cannot read the file ("" if it can).

        A member's upload with umask 077 is theirs alone: waiting does not make it
        readable, and it must not stop the folder either; it is refused like a FIFO,
        once, until its mode or content changes.
        """
        try:
            os.close(os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK))
        except OSError as e:
            return (
                f"cannot be read by the daemon's user ({e.strerror}); make it readable by the folder's group "
                "(upload with umask 007, or chmod g+r)"
            )
        return ""

    def _payload(self, intent: Intent, path_fd: int) -> tuple[bytes | int, str]:
        if self.config.payload == "path":
            if intent.kind == "move":
                assert self.config.move_to is not None and intent.dest is not None
                where = os.path.join(self.config.move_to, intent.dest)
            else:
                where = os.path.join(self.config.path, intent.name)
            return os.fsencode(where), _PATH_TYPE
        return os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY), _CONTENT_TYPE

    def _enqueue_and_finish(self, intent: Intent, path_fd: int) -> Result:
        try:
            payload, content_type = self._payload(intent, path_fd)
        except OSError as e:  # made unreadable since it was looked at, or an intent of an earlier run
            self._undo(intent)
            return Result(REFUSED, f"cannot be read by the daemon's user ({e.strerror})")
        raw = os.fsencode(intent.name)
        try:
            display: str | bytes = raw.decode("utf-8")
        except UnicodeDecodeError:
            display = raw
        try:
            if isinstance(payload, int):
                with os.fdopen(payload, "rb") as stream:
                    self._enqueue(intent, stream, content_type, display)
            else:
                self._enqueue(intent, payload, content_type, display)
        except OutcomeUnknown as e:
            return Result(UNKNOWN, str(e), intent.job_id)
        except DuplicateJob as e:  # another producer made the key's job after the look: nothing was written
            self._undo(intent)
            return _duplicate(e.job_id or intent.job_id, self.config.unique)
        except SteadQError as e:
            self._undo(intent)
            if e.kind is ErrorKind.INVALID_INPUT:  # too large for the queue, say: waiting will not help
                return Result(REFUSED, f"cannot become a job: {e}")
            return Result(LATER, f"could not be enqueued ({e})")
        except OSError as e:
            self._undo(intent)
            return Result(LATER, f"could not be enqueued ({e})")
        self._finish(intent)
        return Result(ENQUEUED, job_id=intent.job_id)

    def _enqueue(self, intent: Intent, payload: object, content_type: str, display: str | bytes) -> None:
        self.queue.enqueue(
            payload,  # type: ignore[arg-type]
            max_attempts=self.config.max_attempts,
            content_type=content_type,
            metadata={"inbox_file": display},
            producer_id="steadqd-inbox",
            # A unique file's id is its key's: the store derives it again (and refuses a second job).
            job_id=intent.job_id if intent.unique is None else None,
            unique=intent.unique,
        )

    def _finish(self, intent: Intent) -> None:
        if intent.kind == "keep":
            old = self.kept.get(intent.ino)
            os.rename(intent.job_id + INTENT, intent.job_id + KEPT, src_dir_fd=self.state_fd, dst_dir_fd=self.state_fd)
            for ino, record in list(self.kept.items()):  # the key's earlier job, for a file since replaced
                if record.job_id == intent.job_id and ino != intent.ino:
                    del self.kept[ino]
            self.kept[intent.ino] = intent
            if old is not None and old.job_id != intent.job_id:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(old.job_id + KEPT, dir_fd=self.state_fd)
            os.fsync(self.state_fd)
            return
        if intent.kind == "delete":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(intent.job_id + FILE, dir_fd=self.state_fd)
        self._drop_intent(intent)
