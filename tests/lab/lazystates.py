"""Crash states from a LazyFS journal: the oracle lane's own persistence model.

This is deliberately a second, separately written model (it shares no code
with :mod:`tests.lab.model`, which works on lane 1's syscall log): the
journal it reads was produced by the file system, not by steadqd.

Rules (a crash at point ``k`` means journal ops ``[0, k)`` were applied):

* everything before ``base`` (the workload's setup) is durable, as after ``sync``;
* a file's data and mode are durable as of its last ``fsync``/``fdatasync``;
  a directory's mode as of its last directory fsync;
* a name change in directory ``D`` (mkdir, create, link, unlink, rmdir) is
  durable once ``D`` was fsynced after it; a rename once *both* directories
  were (one, for a rename within a directory). A durable change drags along
  the earlier changes of the same inode (journalled file systems persist a
  rename no earlier than the create that made its source);
* a name change that is not durable may or may not have reached the disk,
  independently of the others, except that renames stay atomic and a change
  that reached the disk took its causes along (the earlier changes of its
  inode, the creation of its directory). A directory whose own entry did not
  persist takes everything below it along, durable or not;
* unsynced data may be gone (the last synced content), all there, torn (a
  prefix of the new content) or replaced by zeroes at the new size.

For each crash point the name-change outcomes enumerated are: none of the
undurable changes, all of them, every in-order prefix, every single one alone,
and ``samples`` seeded random subsets; each is combined with the data variants
that differ. Identical trees are deduplicated by fingerprint.
"""

from __future__ import annotations

import hashlib
import os
import random
import stat
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from .lazyfs import Chmod, Create, Fsync, JournalOp, Link, Mkdir, Rename, Truncate, Unlink, Write

_ROOT = 1
NameOp = Mkdir | Create | Link | Unlink | Rename
DATA_VARIANTS = ("synced", "all", "torn", "zeroed")


def _dirs_of(op: NameOp) -> tuple[int, ...]:
    if isinstance(op, Rename):
        return (op.src_parent,) if op.src_parent == op.dst_parent else (op.src_parent, op.dst_parent)
    return (op.parent,)


def _is_name_op(op: JournalOp) -> bool:
    return isinstance(op, Mkdir | Link | Unlink | Rename) or (isinstance(op, Create) and op.parent != 0)


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the mount root
    is_dir: bool
    mode: int
    data: bytes = b""
    link_of: str | None = None  # a second name of an already listed file


@dataclass(frozen=True)
class CrashState:
    point: int
    names: str  # which undurable name changes persisted
    data: str  # data variant
    lost: tuple[int, ...]  # journal indices of name changes that did not persist
    image: tuple[Entry, ...]
    fingerprint: str

    def describe(self, journal: list[JournalOp], paths: dict[int, str]) -> str:
        lost = "; ".join(f"#{i} {render(journal[i], paths)}" for i in self.lost[:8])
        more = f" (+{len(self.lost) - 8})" if len(self.lost) > 8 else ""
        return f"crash at op {self.point}/{len(journal)}, names: {self.names}, data: {self.data}, lost: [{lost}{more}]"


def render(op: JournalOp, paths: dict[int, str]) -> str:
    def at(parent: int, name: bytes) -> str:
        return f"{paths.get(parent, f'<dir {parent}>')}/{os.fsdecode(name)}"

    if isinstance(op, Rename):
        return f"rename {at(op.src_parent, op.src_name)} -> {at(op.dst_parent, op.dst_name)}"
    if isinstance(op, Mkdir | Create | Link | Unlink):
        return f"{type(op).__name__.lower()} {at(op.parent, op.name)}"
    return repr(op)


def dir_paths(journal: list[JournalOp]) -> dict[int, str]:
    """Directory inode -> the path it was created at (for messages)."""
    paths = {_ROOT: ""}
    for op in journal:
        if isinstance(op, Mkdir):
            paths[op.ino] = f"{paths.get(op.parent, '?')}/{os.fsdecode(op.name)}"
        elif isinstance(op, Rename) and op.ino in paths:
            paths[op.ino] = f"{paths.get(op.dst_parent, '?')}/{os.fsdecode(op.dst_name)}"
    return paths


class _Disk:
    """Volatile and durable state while walking the journal forward."""

    def __init__(self) -> None:
        self.vol_data: dict[int, bytearray] = {}
        self.dur_data: dict[int, bytes] = {}
        self.vol_mode: dict[int, int] = {_ROOT: stat.S_IFDIR | 0o755}
        self.dur_mode: dict[int, int] = {_ROOT: stat.S_IFDIR | 0o755}
        self.durable: list[int] = []  # journal indices of durable name changes, in order
        self.pending: list[int] = []  # undurable name changes, in order
        self.last_dir_sync: dict[int, int] = {}

    def apply(self, i: int, op: JournalOp, journal: list[JournalOp]) -> None:
        if isinstance(op, Mkdir):
            self.vol_mode[op.ino] = stat.S_IFDIR | op.mode
            self.dur_mode.setdefault(op.ino, stat.S_IFDIR | op.mode)
        elif isinstance(op, Create):
            self.vol_data.setdefault(op.ino, bytearray())
            self.vol_mode[op.ino] = stat.S_IFREG | op.mode
            self.dur_mode.setdefault(op.ino, stat.S_IFREG | op.mode)
        elif isinstance(op, Write):
            buf = self.vol_data.setdefault(op.ino, bytearray())
            if len(buf) < op.offset:
                buf.extend(bytes(op.offset - len(buf)))
            buf[op.offset : op.offset + len(op.data)] = op.data
        elif isinstance(op, Truncate):
            buf = self.vol_data.setdefault(op.ino, bytearray())
            del buf[op.size :]
            buf.extend(bytes(op.size - len(buf)))
        elif isinstance(op, Chmod):
            self.vol_mode[op.ino] = stat.S_IFMT(self.vol_mode.get(op.ino, stat.S_IFREG)) | op.mode
        elif isinstance(op, Fsync):
            self.dur_mode[op.ino] = self.vol_mode.get(op.ino, self.dur_mode.get(op.ino, 0))
            if op.is_dir:
                self.last_dir_sync[op.ino] = i
                self._settle(journal)
            else:
                self.dur_data[op.ino] = bytes(self.vol_data.get(op.ino, b""))
        if _is_name_op(op):
            self.pending.append(i)

    def _settle(self, journal: list[JournalOp]) -> None:
        """Move every pending name change whose directories are now synced (and its inode's history) to durable."""
        newly: set[int] = set()
        for i in self.pending:
            op = journal[i]
            if all(self.last_dir_sync.get(d, -1) > i for d in _dirs_of(op)):  # type: ignore[arg-type]
                newly.add(i)
        if not newly:
            return
        newly |= _inode_closure(newly, self.pending, journal)
        self.durable = sorted(set(self.durable) | newly)
        self.pending = [i for i in self.pending if i not in newly]

    def sync_everything(self) -> None:
        self.durable = sorted(self.durable + self.pending)
        self.pending = []
        self.dur_data = {ino: bytes(b) for ino, b in self.vol_data.items()}
        self.dur_mode = dict(self.vol_mode)


def _inodes(op: JournalOp) -> set[int]:
    inos = {op.ino}  # type: ignore[union-attr]
    if isinstance(op, Rename) and op.replaced is not None:
        inos.add(op.replaced)
    return inos


def _inode_closure(chosen: set[int], pool: list[int], journal: list[JournalOp]) -> set[int]:
    """``chosen`` plus every earlier op in ``pool`` that touched one of the same inodes (transitively)."""
    out = set(chosen)
    for i in sorted(pool, reverse=True):
        if i in out:
            continue
        mine = _inodes(journal[i])
        if any(j > i and mine & _inodes(journal[j]) for j in out):
            out.add(i)
    return out


def _namespace(indices: list[int], journal: list[JournalOp]) -> dict[int, dict[bytes, int]]:
    """Replay name changes. Lenient on purpose: a change whose source did not persist still lands."""
    ns: dict[int, dict[bytes, int]] = {_ROOT: {}}
    for i in indices:
        op = journal[i]
        if isinstance(op, Mkdir):
            ns.setdefault(op.parent, {})[op.name] = op.ino
            ns.setdefault(op.ino, {})
        elif isinstance(op, Create | Link):
            ns.setdefault(op.parent, {})[op.name] = op.ino
        elif isinstance(op, Unlink):
            d = ns.setdefault(op.parent, {})
            if d.get(op.name) == op.ino:
                del d[op.name]
        elif isinstance(op, Rename):
            src = ns.setdefault(op.src_parent, {})
            if src.get(op.src_name) == op.ino:
                del src[op.src_name]
            ns.setdefault(op.dst_parent, {})[op.dst_name] = op.ino
    return ns


def _content(disk: _Disk, ino: int, variant: str) -> bytes:
    dur = disk.dur_data.get(ino, b"")
    vol = bytes(disk.vol_data.get(ino, b""))
    if variant == "synced" or vol == dur:
        return dur
    if variant == "all":
        return vol
    if variant == "torn":
        keep = max(len(dur), 1)
        return vol[: keep + (len(vol) - keep) // 2] if len(vol) > keep else vol[: len(vol) // 2]
    return dur[: len(vol)] + bytes(max(0, len(vol) - len(dur)))  # zeroed


def _image(disk: _Disk, ns: dict[int, dict[bytes, int]], variant: str) -> tuple[tuple[Entry, ...], set[int]]:
    """Walk from the root; return the entries and the file inodes whose unsynced data shows."""
    entries: list[Entry] = []
    first: dict[int, str] = {}
    dirty: set[int] = set()
    todo = [(_ROOT, "")]
    modes = disk.vol_mode if variant == "all" else disk.dur_mode
    while todo:
        ino, path = todo.pop()
        for name, child in sorted(ns.get(ino, {}).items()):
            sub = f"{path}/{os.fsdecode(name)}" if path else os.fsdecode(name)
            mode = modes.get(child, disk.vol_mode.get(child, 0))
            if stat.S_ISDIR(mode):
                entries.append(Entry(sub, True, stat.S_IMODE(mode)))
                todo.append((child, sub))
            elif child in first:
                entries.append(Entry(sub, False, stat.S_IMODE(mode), link_of=first[child]))
            else:
                first[child] = sub
                if bytes(disk.vol_data.get(child, b"")) != disk.dur_data.get(child, b""):
                    dirty.add(child)
                entries.append(Entry(sub, False, stat.S_IMODE(mode), _content(disk, child, variant)))
    return tuple(sorted(entries, key=lambda e: e.path)), dirty


def _fingerprint(image: tuple[Entry, ...]) -> str:
    h = hashlib.sha256()
    for e in image:
        h.update(f"{e.path}\0{e.is_dir}\0{e.mode}\0{e.link_of}\0".encode())
        h.update(hashlib.sha256(e.data).digest())
    return h.hexdigest()


def _causal_closure(chosen: set[int], pending: list[int], journal: list[JournalOp]) -> set[int]:
    """A change that reached the disk took its causes along: the earlier changes of its
    inode and the creation of the directories it names. (A *durable* change does not:
    fsync(D) says nothing about D's own entry, so that rule is only for undurable ones.)"""
    made_by = {journal[i].ino: i for i in pending if isinstance(journal[i], Mkdir)}  # type: ignore[union-attr]
    out = set(chosen)
    while True:
        grown = _inode_closure(out, pending, journal)
        for i in list(grown):
            for d in _dirs_of(journal[i]):  # type: ignore[arg-type]
                if d in made_by and made_by[d] < i:
                    grown.add(made_by[d])
        if grown == out:
            return out
        out = grown


def _subsets(
    pending: list[int], journal: list[JournalOp], samples: int, rng: random.Random
) -> Iterator[tuple[str, set[int]]]:
    if not pending:
        yield "nothing pending", set()
        return
    yield "none of the undurable", set()
    yield "all of the undurable", set(pending)
    for p in range(1, len(pending)):
        yield f"first {p} of {len(pending)}", set(pending[:p])  # journal order: causes come first
    if len(pending) > 1:
        for i in pending:
            yield f"only #{i}", _causal_closure({i}, pending, journal)
        for n in range(samples):
            pick = {i for i in pending if rng.random() < 0.5}
            yield f"random subset {n}", _causal_closure(pick, pending, journal)


def crash_states(
    journal: list[JournalOp],
    base: int,
    *,
    samples: int = 8,
    seed: int = 0,
    points: Collection[int] | None = None,
) -> Iterator[CrashState]:
    """Every crash state of ``journal`` at points ``base .. len(journal)`` (or just at
    ``points``), distinct within a point. A point's first state is always the one
    where nothing undurable persisted, with synced data only (the strict state)."""
    disk = _Disk()
    for i in range(base):
        disk.apply(i, journal[i], journal)
    disk.sync_everything()
    for k in range(base, len(journal) + 1):
        if k > base:
            disk.apply(k - 1, journal[k - 1], journal)
        if points is not None and k not in points:
            continue
        rng = random.Random(f"{seed}:{k}")
        seen: set[str] = set()
        tried: set[frozenset[int]] = set()
        for label, chosen in _subsets(disk.pending, journal, samples, rng):
            key = frozenset(chosen)
            if key in tried:
                continue
            tried.add(key)
            ns = _namespace(sorted(set(disk.durable) | chosen), journal)
            lost = tuple(i for i in disk.pending if i not in chosen)
            base_image, dirty = _image(disk, ns, "synced")
            variants = DATA_VARIANTS if dirty else DATA_VARIANTS[:1]
            for variant in variants:
                image = base_image if variant == "synced" else _image(disk, ns, variant)[0]
                fp = _fingerprint(image)
                if fp in seen:
                    continue
                seen.add(fp)
                yield CrashState(k, label, variant, lost, image, fp)


def materialise(image: tuple[Entry, ...], dest: str) -> None:
    """Write a crash state into ``dest`` (which must exist and be empty)."""
    dirs: list[Entry] = []
    for e in image:  # sorted by path: parents first
        path = os.path.join(dest, e.path)
        if e.is_dir:
            os.mkdir(path, 0o700)
            dirs.append(e)
        elif e.link_of is None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, e.data)
            finally:
                os.close(fd)
    for e in image:
        if e.link_of is not None:
            os.link(os.path.join(dest, e.link_of), os.path.join(dest, e.path))
    for e in image:
        if not e.is_dir and e.link_of is None:
            os.chmod(os.path.join(dest, e.path), e.mode)
    for e in sorted(dirs, key=lambda e: e.path.count("/"), reverse=True):
        os.chmod(os.path.join(dest, e.path), e.mode)
