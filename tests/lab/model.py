"""The persistence model: which trees a crash can leave, given an op log.

The model (docs/crash-lab.md has the long form) is deliberately more
pessimistic than ext4 ``data=ordered``, XFS and btrfs:

* **Crash points.** A crash can happen before any op: for a log of N ops
  there are N+1 points ``k`` (ops ``[0, k)`` were issued).
* **Directory entries.** A directory-entry change (mkdir, rmdir, named
  create, link, rename, unlink) is *durable* at ``k`` once every directory it
  changes was fsynced after it and before ``k`` (a rename needs both its
  source and its destination directory). A change not yet durable may or may
  not have reached the disk, **independently of the others** (no journal
  order is assumed), subject only to causality: an op that needs an earlier
  op's effect (its source name, its parent directory, the name it frees, an
  emptied directory for rmdir) cannot persist without it. A durable op whose
  prerequisites were lost is lost too (fsync of a directory does not make
  the directory's own entry in its parent durable).
* **Renames are atomic**: both names or the old one, never none or both
  (ext4, XFS and btrfs all journal a rename as one transaction).
* **File data** (writes and fchmod of an inode) is durable after an fsync of
  that file. Unsynced data may be fully present, completely absent (the
  file keeps its last synced content, usually empty), torn (cut in the
  middle) or zero-filled at its final size (the XFS "NULL bytes" case), and
  all of this is independent of whether the name pointing at the file
  persisted. A file that is reachable by name but was never fsynced is
  exactly what a "link before fsync" bug produces, and the model shows it.
  ``sync_file_range`` (enqueue_many's writeback hint) is not in the log at
  all: it makes nothing durable, so only the fsync after it counts.

Enumeration is bounded: for each crash point the non-durable directory ops
``U`` are enumerated exhaustively when ``|U| <= exhaustive_bits``, otherwise
the all/none/every-prefix/every-single-omission/every-single-inclusion
subsets plus seeded random ones are used; each resulting tree comes in the
"full data" and "synced data only" variants plus torn and zero-filled
variants for every named file with unsynced data. Identical trees are
deduplicated by a content fingerprint.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

from .recorder import (
    Chmod,
    Create,
    FsyncDir,
    FsyncFile,
    Image,
    Link,
    Mkdir,
    Op,
    Rename,
    Rmdir,
    Unlink,
    Write,
    describe,
    is_dir_op,
)

_INF = 1 << 62


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def _touched(op: Op) -> tuple[set[str], set[str]]:
    """(names created, names removed) by a directory op."""
    match op:
        case Mkdir(path=p) | Link(path=p):
            return {p}, set()
        case Create(path=p) if p is not None:
            return {p}, set()
        case Rename(src=s, dst=d):
            return {d}, {s}
        case Rmdir(path=p) | Unlink(path=p):
            return set(), {p}
    return set(), set()


@dataclass(frozen=True)
class CrashState:
    """One tree a crash may leave, with how it came about (for reports)."""

    point: int  # ops [0, point) were issued
    lost: tuple[int, ...]  # indices of issued directory ops that did not persist
    variant: str  # data variant: full, synced, torn:<path>, zeroed:<path>
    image: Image
    fingerprint: str

    def describe(self, ops: list[Op]) -> str:
        last = describe(ops[self.point - 1]) if self.point else "(nothing issued)"
        lost = ", ".join(f"#{i} {describe(ops[i])}" for i in self.lost) or "none"
        return f"crash after op #{self.point - 1} {last}; lost dir ops: {lost}; data: {self.variant}"


class Model:
    """Precomputed dependencies and barriers of one op log."""

    def __init__(self, pre: Image, ops: list[Op], *, exhaustive_bits: int = 8, samples: int = 24, seed: int = 0):
        self.pre = pre
        self.ops = ops
        self.exhaustive_bits = exhaustive_bits
        self.samples = samples
        self.seed = seed
        self.dir_ops = [i for i, op in enumerate(ops) if is_dir_op(op)]
        self.deps: dict[int, frozenset[int]] = {}
        self.durable_from: dict[int, int] = {}
        self._compute_deps()
        self._compute_durability()
        self.file_ops: dict[int, list[int]] = {}
        self.file_syncs: dict[int, list[int]] = {}
        self.created: dict[int, tuple[int, int]] = {}  # fid -> (op index, mode)
        for i, op in enumerate(ops):
            match op:
                case Write(fid=fid) | Chmod(fid=int() as fid):
                    self.file_ops.setdefault(fid, []).append(i)
                case FsyncFile(fid=fid):
                    self.file_syncs.setdefault(fid, []).append(i)
                case Create(fid=fid, mode=mode):
                    self.created[fid] = (i, mode)

    # -- precomputation ---------------------------------------------------------------

    def _compute_deps(self) -> None:
        info = {i: _touched(self.ops[i]) for i in self.dir_ops}
        for jx, j in enumerate(self.dir_ops):
            cj, rj = info[j]
            tj = cj | rj
            parents_j = {_parent(p) for p in tj}
            rmdir_j = self.ops[j].path if isinstance(self.ops[j], Rmdir) else None
            deps = set()
            for i in self.dir_ops[:jx]:
                ci, ri = info[i]
                ti = ci | ri
                if ti & tj or parents_j & ci:
                    deps.add(i)
                elif rmdir_j is not None and any(_parent(p) == rmdir_j for p in ti):
                    deps.add(i)
            self.deps[j] = frozenset(deps)

    def _compute_durability(self) -> None:
        fsyncs: dict[str, list[int]] = {}
        for i, op in enumerate(self.ops):
            if isinstance(op, FsyncDir):
                fsyncs.setdefault(op.path, []).append(i)
        for i in self.dir_ops:
            created, removed = _touched(self.ops[i])
            need = 0
            for d in {_parent(p) for p in created | removed}:
                nxt = next((j for j in fsyncs.get(d, ()) if j > i), None)
                need = max(need, _INF if nxt is None else nxt + 1)
            self.durable_from[i] = need

    # -- enumeration -------------------------------------------------------------------

    def _masks(self, n: int, k: int) -> Iterator[tuple[bool, ...]]:
        if n <= self.exhaustive_bits:
            for m in range(1 << n):
                yield tuple(bool(m >> b & 1) for b in range(n))
            return
        yield (True,) * n
        yield (False,) * n
        for m in range(1, n):
            yield tuple(b < m for b in range(n))  # in-order journal: a prefix persisted
        for x in range(n):
            yield tuple(b != x for b in range(n))
            yield tuple(b == x for b in range(n))
        rng = random.Random(self.seed * 1_000_003 + k)
        for _ in range(self.samples):
            yield tuple(rng.random() < 0.5 for _ in range(n))

    def dir_subsets(self, k: int) -> Iterator[frozenset[int]]:
        """Every distinct set of issued directory ops (indices < k) that may have persisted."""
        issued = [i for i in self.dir_ops if i < k]
        loose = [i for i in issued if self.durable_from[i] > k]
        seen: set[frozenset[int]] = set()
        for mask in self._masks(len(loose), k):
            choice = dict(zip(loose, mask, strict=True))
            chosen: set[int] = set()
            for i in issued:
                if not self.deps[i] <= chosen:
                    continue  # a prerequisite was lost: so is this op
                if choice.get(i, True):
                    chosen.add(i)
            s = frozenset(chosen)
            if s not in seen:
                seen.add(s)
                yield s

    def _content(self, fid: int, k: int, synced_only: bool) -> tuple[bytes, int] | None:
        """(data, mode) of ``fid`` at crash point ``k``; None if not created yet."""
        if fid in self.created:
            ci, mode = self.created[fid]
            if ci >= k:
                return None
            data = bytearray()
        elif fid in self.pre.data:
            data, mode = bytearray(self.pre.data[fid]), self.pre.modes[fid]
        else:
            return None
        limit = k
        if synced_only:
            syncs = [j for j in self.file_syncs.get(fid, ()) if j < k]
            limit = syncs[-1] if syncs else -1
        for j in self.file_ops.get(fid, ()):
            if j >= limit:
                break
            op = self.ops[j]
            if isinstance(op, Write):
                end = op.offset + len(op.data)
                if len(data) < end:
                    data.extend(bytes(end - len(data)))
                data[op.offset : end] = op.data
            elif isinstance(op, Chmod):
                mode = op.mode
        return bytes(data), mode

    def _apply_dirs(self, k: int, chosen: frozenset[int]) -> Image | None:
        img = self.pre.copy()
        for i in range(k):
            op = self.ops[i]
            if isinstance(op, Chmod) and op.path is not None and op.path in img.dirs:
                img.dirs[op.path] = op.mode  # directory modes: applied once issued
            if i not in chosen:
                continue
            if not _apply(img, op):
                return None
        return img

    def states(self, k: int) -> Iterator[CrashState]:
        """Every crash state of point ``k`` (not deduplicated across points)."""
        issued = [i for i in self.dir_ops if i < k]
        for chosen in self.dir_subsets(k):
            img = self._apply_dirs(k, chosen)
            if img is None:
                continue
            lost = tuple(i for i in issued if i not in chosen)
            fids = sorted(set(img.names.values()))
            full = {f: self._content(f, k, False) for f in fids}
            synced = {f: self._content(f, k, True) for f in fids}
            variants: list[tuple[str, dict[int, tuple[bytes, int] | None]]] = [("full", full)]
            if synced != full:
                variants.append(("synced", synced))
                for f in fids:
                    a, b = full[f], synced[f]
                    if a is None or b is None or a == b:
                        continue
                    path = min(p for p, x in img.names.items() if x == f)
                    cut = (len(b[0]) + len(a[0])) // 2
                    torn = dict(full)
                    torn[f] = (a[0][:cut], a[1])
                    zeroed = dict(full)
                    zeroed[f] = (b[0] + bytes(len(a[0]) - len(b[0])) if len(a[0]) > len(b[0]) else b[0], a[1])
                    variants += [(f"torn:{path}", torn), (f"zeroed:{path}", zeroed)]
            for name, contents in variants:
                out = Image(img.dirs, img.names, {}, {})
                for f, c in contents.items():
                    if c is None:
                        continue
                    out.data[f], out.modes[f] = c
                yield CrashState(k, lost, name, out, fingerprint(out))

    def all_states(self) -> Iterator[CrashState]:
        """Every crash state of the log, in crash-point order.

        A tree is repeated when it recurs at a later crash point: the same
        tree can be acceptable while an operation is in flight and a bug
        once that operation has returned, so the caller deduplicates on
        (tree, expectation), not on the tree alone.
        """
        for k in range(len(self.ops) + 1):
            seen: set[str] = set()
            for st in self.states(k):
                if st.fingerprint not in seen:
                    seen.add(st.fingerprint)
                    yield st


def _apply(img: Image, op: Op) -> bool:
    """Apply one directory op; False if its preconditions fail (not a reachable state)."""

    def free(p: str) -> bool:
        return p not in img.names and p not in img.dirs and _parent(p) in img.dirs

    match op:
        case Mkdir(path=p, mode=mode):
            if not free(p):
                return False
            img.dirs[p] = mode
        case Rmdir(path=p):
            prefix = p + "/"
            if (
                p not in img.dirs
                or any(x.startswith(prefix) for x in img.dirs)
                or any(x.startswith(prefix) for x in img.names)
            ):
                return False
            del img.dirs[p]
        case Create(fid=fid, path=str() as p) | Link(fid=fid, path=p):
            if not free(p):
                return False
            img.names[p] = fid
        case Rename(src=s, dst=d, replace=replace):
            if s not in img.names or _parent(d) not in img.dirs or d in img.dirs:
                return False
            if d in img.names and not replace:
                return False
            img.names[d] = img.names.pop(s)
        case Unlink(path=p):
            if p not in img.names:
                return False
            del img.names[p]
        case _:
            return False
    return True


def fingerprint(img: Image) -> str:
    """A digest of the tree: equal digests mean the same crash state."""
    h = hashlib.sha256()
    for p in sorted(img.dirs):
        h.update(f"d {p} {img.dirs[p]:o}\n".encode())
    by_fid: dict[int, list[str]] = {}
    for p, f in img.names.items():
        by_fid.setdefault(f, []).append(p)
    for paths in sorted(sorted(v) for v in by_fid.values()):
        f = img.names[paths[0]]
        h.update(f"f {' '.join(paths)} {img.modes[f]:o} {hashlib.sha256(img.data[f]).hexdigest()}\n".encode())
    return h.hexdigest()


def materialise(img: Image, dest: str) -> None:
    """Write the tree into ``dest`` (which must not exist)."""
    os.mkdir(dest)
    for p in sorted(img.dirs):
        if p:
            os.mkdir(os.path.join(dest, p))
    by_fid: dict[int, list[str]] = {}
    for p, f in img.names.items():
        by_fid.setdefault(f, []).append(p)
    for f, paths in by_fid.items():
        paths.sort()
        first = os.path.join(dest, paths[0])
        fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, img.data[f])
            os.fchmod(fd, img.modes[f])
        finally:
            os.close(fd)
        for other in paths[1:]:
            os.link(first, os.path.join(dest, other))
    for p in sorted(img.dirs, reverse=True):
        os.chmod(os.path.join(dest, p) if p else dest, img.dirs[p])
