"""Directory handles, on-demand directories, the move primitives and barriers.

This is the only module that turns "move this object" into syscalls. Every
transition of the protocol is one of the moves below followed by its
barrier; keeping them here means the fsync ordering of protocol.md is
written once:

* the **witnessed** move re-checks that the source path still names the
  inode the caller verified, renames without replacing, checks the
  destination names that same inode, then fsyncs the destination directory
  and, if different, the source directory;
* the **unwitnessed** move (recovery, cleanup) renames without replacing and
  fsyncs destination then source unconditionally;
* a directory created on the way is made durable in its parent **before**
  anything is moved into it.

Failures are reported as the small exception types below; the protocol
layer maps them to NotCommitted / OutcomeUnknown / LeaseLost.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from steadqd.constants import PRIVATE_MODES, READY_DIR, Modes
from steadqd.fs import linux
from steadqd.fs.names import parse_shard_dir, shard_dir
from steadqd.fs.owner import give_to_owner

# Tries of ensure_dir when a directory on the way vanishes under it (recovery
# removing an empty bucket at that moment): bounded, a removal cannot recur forever.
_ENSURE_ATTEMPTS = 4

# --- Move outcomes below the public error model. ---


class MoveError(Exception):
    """Base: the move did not linearize (nothing changed) unless stated."""


class SourceMissing(MoveError):
    """The source name is gone (someone else moved it first)."""


class Collision(MoveError):
    """The destination name is occupied; nothing moved."""


class SourceChanged(MoveError):
    """The source path now names another inode or a non-regular file."""


class MoveFailed(MoveError):
    """A syscall failed before linearization (carries the errno)."""

    def __init__(self, err: int | None, what: str) -> None:
        # An OSError raised by a syscall always carries its errno; EIO stands in
        # for the impossible None so that callers can classify by errno alone.
        err = errno.EIO if err is None else err
        super().__init__(f"{what}: {os.strerror(err)}")
        self.errno = err


class DestinationGone(MoveFailed):
    """The destination directory was removed under us; nothing moved.

    Recovery removes empty delayed buckets (and expired receipt buckets), so
    a move into a directory opened earlier can meet a deleted one. It is a
    MoveFailed (ENOENT, not committed) for callers that do not retry, never a
    vanished source: the caller may :meth:`Tree.refresh` the directory and
    move again.
    """

    def __init__(self, what: str) -> None:
        super().__init__(errno.ENOENT, what)


class Indeterminate(Exception):
    """The move linearized (or may have); a step after it failed.

    ``phase`` is the ticket phase of errors.md: ``linearized`` or
    ``destination_directory_durable``.
    """

    def __init__(self, phase: str, cause: str) -> None:
        super().__init__(f"{cause} (phase {phase})")
        self.phase = phase
        self.cause = cause


# Frozen dataclasses here get their fields as one new dict, set through object.__setattr__:
# a dict made from an instance's inline values (``self.__dict__`` then item stores) keeps
# them outside its entries, where CPython 3.11's cached attribute read cannot find them, so
# every later read of a field took the slow path (~350 instructions instead of ~100).
_SET_FIELDS = object.__setattr__


@dataclass(frozen=True, init=False)
class Witness:
    """Identity of a verified object: renames keep (st_dev, st_ino).

    The constructor sets the frozen fields as one dict (``_SET_FIELDS``; every read of a job makes one).
    """

    dev: int
    ino: int

    def __init__(self, dev: int, ino: int) -> None:
        _SET_FIELDS(
            self,
            "__dict__",
            {
                "dev": dev,
                "ino": ino,
            },
        )

    @classmethod
    def of(cls, st: os.stat_result) -> Witness:
        return cls(st.st_dev, st.st_ino)

    def matches(self, st: os.stat_result) -> bool:
        return st.st_dev == self.dev and st.st_ino == self.ino

    def names_single_file(self, st: os.stat_result) -> bool:
        """``matches(st) and is_single_regular(st)``, written out in one frame: each witnessed move asks it twice."""
        return st.st_dev == self.dev and st.st_ino == self.ino and stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def is_single_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


# _LOCK_NOTE: the methods every operation calls (dir, ensure_dir, cached_fd, cached_fd_pair, pin,
# unpin: ~13 a strict lifecycle) take the lock with acquire()/try/finally release(), not ``with``:
# entering a with block looks up and binds __enter__ and __exit__, two method objects a call,
# ~1,000 instructions (callgrind, watermark.WallFloor.for_mutation). The same lock, the same
# release on every exit.


class Tree:
    """Directory fds beneath one queue root, and the barrier policy.

    Directory fds are cached per handle (the reference caches "ensured"
    paths the same way) so a steady stream of operations costs no extra
    opens. The cache is a bounded LRU: a daemon that lives for weeks touches
    a new receipt bucket every hour and must not run out of descriptors.
    With ``deferred`` the directory fsyncs are collected and issued by
    :meth:`sync`; the pending set owns duplicates of the fds, so evicting a
    cached fd can never lose or misdirect a barrier. File fsyncs are never
    deferred.
    """

    max_cached = 256

    def __init__(self, root_fd: int, shard_count: int, *, deferred: bool = False, modes: Modes = PRIVATE_MODES) -> None:
        self.root_fd = root_fd
        self.modes = modes
        self.shard_count = shard_count
        self.deferred = deferred
        self._dirs: OrderedDict[str, int] = OrderedDict()
        # (st_dev, st_ino) per cached fd, None until asked: an open fd's directory
        # never changes, so it is asked once per fd, and forgotten when the fd is closed.
        self._ids: dict[int, tuple[int, int] | None] = {}
        self._dirty: dict[tuple[int, int], int] = {}
        self._pins = 0
        self._unsynced: set[str] = set()  # parents whose new entries may not be durable yet
        self._complete_buckets: set[str] = set()  # sharded buckets this handle filled with every shard
        self.batching = 0  # > 0 inside Queue.batch(): every barrier waits for sync()
        self._lock = threading.RLock()

    # -- directory handles --------------------------------------------------

    def dir(self, rel: str) -> int:
        """An fd for an existing directory ``rel`` beneath the root (cached)."""
        lock = self._lock  # acquire/release, not ``with`` (_LOCK_NOTE)
        lock.acquire()
        try:
            fd = self._touch(rel)
            if fd is not None:
                return fd
            fd = linux.open_beneath(self.root_fd, rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            self._dirs[rel] = fd
            self._ids[fd] = None
            if not self._pins:
                self._trim()
            return fd
        finally:
            lock.release()

    def _touch(self, rel: str) -> int | None:
        """The cache's one lookup rule (the caller holds the lock): ``rel``'s cached fd, now the most
        recently used, or None where it is not cached; opens and evicts nothing."""
        fd = self._dirs.get(rel)
        if fd is not None:
            self._dirs.move_to_end(rel)
        return fd

    def cached_fd(self, rel: str) -> int | None:
        """:meth:`cached_fds` of one directory, without the list (payload(), a small enqueue)."""
        lock = self._lock  # acquire/release, not ``with`` (_LOCK_NOTE)
        lock.acquire()
        try:
            return self._touch(rel)
        finally:
            lock.release()

    def cached_fds(self, rels: Iterable[str | None]) -> list[int | None]:
        """The cached fd of each of ``rels`` (now the most recently used), None for one not cached; opens nothing."""
        fds: list[int | None] = []
        with self._lock:
            for rel in rels:
                fds.append(None if rel is None else self._touch(rel))
        return fds

    def cached_fd_pair(self, a: str, b: str) -> tuple[int | None, int | None]:
        """:meth:`cached_fds` of two directories (the C ack's lease and receipt directories), a then b,
        as a tuple: without the list and its two appends."""
        lock = self._lock  # acquire/release, not ``with`` (_LOCK_NOTE)
        lock.acquire()
        try:
            return self._touch(a), self._touch(b)
        finally:
            lock.release()

    def operation(self) -> _Pinned:
        """Pin the cache for one public operation (a context manager).

        Callers hold cached fds across several calls; closing one of them
        mid-operation could let the number be reused for another directory.
        Eviction therefore happens only when no operation is in flight.
        """
        return _Pinned(self)

    def pin(self) -> None:
        lock = self._lock  # acquire/release, not ``with`` (_LOCK_NOTE)
        lock.acquire()
        try:
            self._pins += 1
        finally:
            lock.release()

    def unpin(self) -> None:
        lock = self._lock  # acquire/release, not ``with`` (_LOCK_NOTE)
        lock.acquire()
        try:
            self._pins -= 1
            if not self._pins and len(self._dirs) > self.max_cached:  # _trim's test, without its call
                self._trim()
        finally:
            lock.release()

    def _trim(self) -> None:
        while len(self._dirs) > self.max_cached:
            _, old = self._dirs.popitem(last=False)
            self._ids.pop(old, None)
            linux.close(old)

    def open_transient(self, rel: str) -> int:
        """An uncached fd for ``rel`` (created if missing); the caller closes it."""
        try:
            return linux.open_beneath(self.root_fd, rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            self.ensure_dir(rel)
            return linux.open_beneath(self.root_fd, rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)

    def forget(self, rel: str) -> None:
        """Drop a cached fd, e.g. after the directory was found deleted."""
        with self._lock:
            self._complete_buckets.discard(rel)
            fd = self._dirs.pop(rel, None)
            if fd is not None:
                self._ids.pop(fd, None)
                linux.close(fd)

    def refresh(self, rel: str) -> int:
        """An fd for ``rel`` after a move found the cached one deleted: re-created, durably.

        Empty buckets are removed by recovery while handles keep their fds, so
        the directory itself and any cached ancestor (its bucket) may be gone.
        """
        with self._lock:
            self.forget(rel)
            return self.ensure_dir(rel)

    def _forget_removed(self, rel: str) -> None:
        """Drop every cached fd on the way to ``rel`` whose directory was removed."""
        parts = rel.split("/")
        for i in range(len(parts), 0, -1):
            prefix = "/".join(parts[:i])
            fd = self._dirs.get(prefix)
            if fd is not None and is_removed_dir(fd):
                self.forget(prefix)

    def ensure_dir(self, rel: str) -> int:
        """Create ``rel`` (and parents) if needed, durably; return its fd.

        layout.md "ensure_dir": each component actually created is fsynced
        in its parent; a new sharded bucket (``delayed/<b>/<s>`` and the
        like) gets all its shard directories and one bucket fsync, so a
        freshly used bucket always contains every shard. A directory that
        recovery removes meanwhile (an empty bucket), or had removed while its
        fd stayed cached, is made again.
        """
        lock = self._lock  # acquire/release, not ``with`` (_LOCK_NOTE)
        lock.acquire()
        try:
            fd = self._touch(rel)
            if fd is not None:  # what _ensure_dir would return, without its three calls (every claim scan, per shard)
                return fd
            for _ in range(_ENSURE_ATTEMPTS - 1):
                try:
                    return self._ensure_dir(rel)
                except FileNotFoundError:
                    self._forget_removed(rel)
            return self._ensure_dir(rel)
        finally:
            lock.release()

    def _ensure_dir(self, rel: str) -> int:
        with self._lock:
            if rel in self._dirs:
                return self.dir(rel)
            parts = rel.split("/")
            parent_rel = "/".join(parts[:-1])
            is_sharded_bucket = (
                len(parts) >= 3 and parts[0] != READY_DIR and parse_shard_dir(parts[-1], self.shard_count) is not None
            )
            if is_sharded_bucket:
                bucket_fd = self._ensure_dir(parent_rel)
                if parent_rel in self._complete_buckets:
                    # This handle already made every shard of the bucket (layout.md
                    # rule 4): open the one wanted; recreate only if it vanished.
                    try:
                        return self.dir(rel)
                    except FileNotFoundError:
                        self._complete_buckets.discard(parent_rel)
                names = [shard_dir(s) for s in range(self.shard_count)]
            else:
                bucket_fd = self.root_fd if not parent_rel else self._ensure_dir(parent_rel)
                names = [parts[-1]]
            self._mkdirs_durably(parent_rel, bucket_fd, names)
            if is_sharded_bucket:
                self._complete_buckets.add(parent_rel)
            return self.dir(rel)

    def _mkdirs_durably(self, parent_rel: str, parent_fd: int, names: list[str]) -> None:
        """mkdir each name; if anything was (or may have been) created, fsync the parent.

        The fsync is not postponed by deferred mode: whatever moves in next
        may be forced durable, and it is only durable if its directory is.
        Inside an explicit batch every barrier, this one included, waits for
        the batch's sync, before which nothing in the batch is reported
        durable (the crash lab checks this). A parent whose
        mkdir or fsync failed stays marked unsynced, so a later attempt that
        only sees EEXIST still makes the entry durable.
        """
        created = parent_rel in self._unsynced
        try:
            for name in names:
                # Without S_ISGID: the setgid parent gives it to the new directory, and
                # seccomp's RestrictSUIDSGID= (the units) refuses mkdir with it (EPERM).
                if linux.mkdir_at(parent_fd, name, self.modes.dir & 0o777):
                    created = True
                    if self.modes.owner is not None:
                        give_dir_to_owner(parent_fd, name, self.modes.owner)
                    if self.modes.enforce:
                        enforce_dir_mode(parent_fd, name, self.modes.dir)
        except OSError:
            self._unsynced.add(parent_rel)
            raise
        if created:
            self._unsynced.add(parent_rel)
            self.barrier(parent_fd, force=True)
            self._unsynced.discard(parent_rel)

    # -- barriers -----------------------------------------------------------

    def barrier(self, dir_fd: int, *, force: bool = False) -> None:
        """fsync a directory now, or remember it for :meth:`sync`.

        ``force`` marks barriers that deferred mode must not postpone
        (claim, ack, retry, bury: protocol.md defers only enqueue and renew);
        an explicit batch postpones them too.
        """
        if self.batching or (self.deferred and not force):
            st = linux.fstat(dir_fd)
            key = (st.st_dev, st.st_ino)
            with self._lock:
                if key not in self._dirty:
                    self._dirty[key] = linux.dup(dir_fd)
            return
        linux.fsync(dir_fd)

    def sync(self) -> None:
        """Issue every postponed directory fsync (deferred mode)."""
        with self._lock:
            pending = list(self._dirty.items())
        for key, fd in pending:
            linux.fsync(fd)  # on failure the entry stays pending; the caller poisons
            with self._lock:
                if self._dirty.get(key) == fd:
                    del self._dirty[key]
            linux.close(fd)

    @property
    def pending_barriers(self) -> int:
        return len(self._dirty)

    # -- moves --------------------------------------------------------------

    def move_witnessed(
        self,
        src_fd: int,
        src_name: str,
        dst_fd: int,
        dst_name: str,
        witness: Witness,
        *,
        after: Callable[[], None] | None = None,
        force: bool = False,
    ) -> None:
        """Rename an object the caller verified, then make it durable."""
        try:
            st = linux.stat_at(src_fd, src_name)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise SourceMissing(src_name) from e
            raise MoveFailed(e.errno, "stat source") from e
        if not witness.names_single_file(st):
            raise SourceChanged(f"{src_name} no longer names the verified file")
        self._rename(src_fd, src_name, dst_fd, dst_name, witness)
        dst_st: os.stat_result | None
        try:
            dst_st = linux.stat_at(dst_fd, dst_name)
        except OSError as e:
            # A destination in ready/ (retry_now, named-temp enqueue) can be
            # claimed by another consumer between our successful rename and this
            # stat. The rename returned success and the source name is gone, so
            # the move did linearize; only its barrier is still owed.
            if e.errno != errno.ENOENT or not _absent(src_fd, src_name):
                raise Indeterminate("linearized", f"stat destination: {e.strerror}") from e
            dst_st = None
        if dst_st is not None and not witness.names_single_file(dst_st):
            raise Indeterminate("linearized", "destination does not name the moved file")
        if after is not None:
            try:
                after()
            except Exception as e:  # the hook's failure cannot undo the rename
                raise Indeterminate("linearized", str(e)) from e
        self.finish_move(src_fd, dst_fd, force=force)

    def finish_move(self, src_fd: int, dst_fd: int, *, force: bool = False) -> None:
        """A witnessed move's barriers, once its rename and destination check are done (also the C
        ack's and claim's continuation in a batch, whose barriers only this tree can postpone:
        settle._ack_fast, claim._Scan._fast_move)."""
        self._barrier_pair(src_fd, dst_fd, always_both=False, force=force)

    def move_unwitnessed(self, src_fd: int, src_name: str, dst_fd: int, dst_name: str) -> None:
        """Rename without a prior identity check (recovery, cleanup)."""
        self._rename(src_fd, src_name, dst_fd, dst_name, None)
        self._barrier_pair(src_fd, dst_fd, always_both=True, force=True)

    def rmdir(self, parent_fd: int, parent_rel: str, name: str) -> bool:
        """Remove an empty directory; False if it is not empty (a normal outcome).

        protocol.md "Removing an empty directory". The caller owes the
        parent's barrier, once for all its removals: a removal that a crash
        undoes leaves an empty directory, which is valid and removed again.
        A publisher racing with the removal either linked first (the rmdir
        fails) or finds its directory deleted and makes it again
        (:class:`DestinationGone`, :meth:`refresh`).
        """
        try:
            linux.rmdir_at(parent_fd, name)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise SourceMissing(name) from e
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise MoveFailed(e.errno, "rmdir") from e
        self.forget(f"{parent_rel}/{name}")
        return True

    def unlink(self, dir_fd: int, name: str) -> None:
        """Unlink (the linearization point), then fsync the directory."""
        try:
            linux.unlink_at(dir_fd, name)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise SourceMissing(name) from e
            raise MoveFailed(e.errno, "unlink") from e
        try:
            self.barrier(dir_fd, force=True)
        except OSError as e:
            raise Indeterminate("linearized", f"fsync directory: {e.strerror}") from e

    def _rename(self, src_fd: int, src_name: str, dst_fd: int, dst_name: str, witness: Witness | None) -> None:
        try:
            linux.rename_noreplace(src_fd, src_name, dst_fd, dst_name)
            return
        except OSError as e:
            if e.errno == errno.EEXIST:
                raise Collision(dst_name) from e
            if e.errno == errno.ENOENT:
                if is_removed_dir(dst_fd) and not _absent(src_fd, src_name):
                    raise DestinationGone(f"rename into removed directory (as {dst_name})") from e
                raise SourceMissing(src_name) from e
            err = e
        # An unexpected errno does not prove the rename did not happen (a
        # filesystem may fail after moving the entry). Look before claiming
        # "not committed": where is the object now?
        if witness is None:
            raise MoveFailed(err.errno, "rename") from err
        src_st = _stat_or_none(src_fd, src_name)
        dst_st = _stat_or_none(dst_fd, dst_name)
        if dst_st is not None and witness.matches(dst_st):
            if src_st is None:
                return  # it moved: carry on with the barriers
            raise Indeterminate("linearized", f"rename reported {err.strerror} and both names exist")
        if src_st is not None and witness.matches(src_st):
            raise MoveFailed(err.errno, "rename") from err
        raise Indeterminate("linearized", f"rename reported {err.strerror}; object not found at either name")

    def _barrier_pair(self, src_fd: int, dst_fd: int, *, always_both: bool, force: bool) -> None:
        try:
            self.barrier(dst_fd, force=force)
        except OSError as e:
            raise Indeterminate("linearized", f"fsync destination directory: {e.strerror}") from e
        if not always_both and (src_fd == dst_fd or self._same_dir(src_fd, dst_fd)):
            return
        try:
            self.barrier(src_fd, force=force)
        except OSError as e:
            raise Indeterminate("destination_directory_durable", f"fsync source directory: {e.strerror}") from e

    def known_ids(self, a: int, b: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """What :meth:`_dir_id` knows of ``a`` and ``b`` without a syscall (the C ack's _same_dir)."""
        ids = self._ids
        return ids.get(a), ids.get(b)

    def learn_ids(self, a: int, b: int, stats: Any, known: tuple[Any, Any]) -> None:
        """Keep the ids the C ack read with fstat (``stats[3]``, ``stats[4]``), as :meth:`_dir_id` keeps them."""
        with self._lock:
            if a == b:
                return
            if known[0] is None and a in self._ids:
                self._ids[a] = (stats[3].dev, stats[3].ino)
            if known[1] is None and b in self._ids:
                self._ids[b] = (stats[4].dev, stats[4].ino)

    def _same_dir(self, a: int, b: int) -> bool:
        # _dir_id's cache hit for each, without its call (every batched ack and claim asks this): a miss is
        # _dir_id's, a before b, as before (reading b's entry first changes nothing: a dict lookup)
        ids = self._ids
        ia, ib = ids.get(a), ids.get(b)
        try:
            return (ia if ia is not None else self._dir_id(a)) == (ib if ib is not None else self._dir_id(b))
        except OSError:
            return False

    def _dir_id(self, fd: int) -> tuple[int, int]:
        ident = self._ids.get(fd)
        if ident is not None:
            return ident
        st = linux.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        with self._lock:
            if fd in self._ids:  # still cached (pinned by the operation in flight): remember it
                self._ids[fd] = ident
        return ident

    def close(self) -> None:
        with self._lock:
            for fd in self._dirs.values():
                try:
                    linux.close(fd)
                except OSError:
                    pass
            self._dirs.clear()
            self._ids.clear()
            for fd in self._dirty.values():
                linux.close(fd)
            self._dirty.clear()


def give_dir_to_owner(parent_fd: int, name: str, owner: tuple[int, int]) -> None:
    """chown a directory root just created in another user's queue to that user
    (``Modes.owner``), through an O_NOFOLLOW fd like :func:`enforce_dir_mode`."""
    fd = linux.open_dir(parent_fd, name)
    try:
        give_to_owner(fd, owner)
    finally:
        linux.close(fd)


def enforce_dir_mode(parent_fd: int, name: str, mode: int) -> None:
    """chmod a directory we just created, through an O_NOFOLLOW fd so a
    swapped-in symlink can never redirect the chmod."""
    fd = linux.open_dir(parent_fd, name)
    try:
        # Only when needed: a chmod that sets S_ISGID is refused by RestrictSUIDSGID=
        # (the units), and under their UMask=0007 the new directory is already right.
        if stat.S_IMODE(linux.fstat(fd).st_mode) != mode:
            linux.fchmod(fd, mode)
    finally:
        linux.close(fd)


def is_removed_dir(dir_fd: int) -> bool:
    """True if ``dir_fd`` names a directory that was removed (st_nlink == 0)."""
    try:
        return linux.fstat(dir_fd).st_nlink == 0
    except OSError:
        return False


def _stat_or_none(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return linux.stat_at(dir_fd, name)
    except OSError:
        return None


def _absent(dir_fd: int, name: str) -> bool:
    """True only if ``name`` provably does not exist (ENOENT); other errors prove nothing."""
    try:
        linux.stat_at(dir_fd, name)
    except OSError as e:
        return e.errno == errno.ENOENT
    return False


class _Pinned:
    """``with tree.operation():`` -- a class, not a generator: it wraps every public call."""

    __slots__ = ("tree",)

    def __init__(self, tree: Tree) -> None:
        self.tree = tree

    def __enter__(self) -> None:
        self.tree.pin()

    def __exit__(self, *exc: object) -> None:
        self.tree.unpin()
