"""The one walk every bucketed phase shares: sorted listings, cursor skips,
budget checks and our own descriptors.

Each phase walks ``top/<level>/.../<entry>`` the same way, so the rules of
recovery.md "Pass structure" are written here once: listings are sorted
bytewise, entries ≤ the position are skipped, the position moves to each entry
before it is processed and the budget is checked before each entry and each
directory. Directories are opened with descriptors of our own, never the tree
cache: receipt directories may be removed by this very pass.

The scan budget (library only) is reduced to a per-listing cap of 65 536
entries; unreadable directories are recorded and simply rescanned by the
next pass (allowed by recovery.md), so ``hierarchy_retries`` stays empty.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from steadqd.constants import JOB_EXT, State
from steadqd.errors import CorruptObject, InvalidInput
from steadqd.fs import linux
from steadqd.fs.names import JobName, boot_raw, parse_name, parse_shard_dir
from steadqd.fs.recovery.state import Key, Pass

_LISTING_CAP = 65_536

NOT_BOOT = "not a canonical boot id"
NOT_BUCKET = "not a 16-hex bucket"
NOT_SHARD = "not a shard of this queue"

# One child directory, opened: (values so far, fd, rel, name, key).
Child = tuple[tuple[Any, ...], int, str, str, Key]
# One leaf entry: (level values, dir fd, dir rel, raw entry name).
Leaf = tuple[tuple[Any, ...], int, str, bytes]


@dataclass(frozen=True)
class Level:
    """One directory level of a walk (boot, bucket or shard directories).

    Only what a level's names mean and which of them to enter differ between
    phases, so that is all a phase describes. ``parse`` gives a name's value
    (None: not a name of this level; 0 is a valid value); ``invalid`` is the
    error recorded for such a name (None: skipped silently); ``wanted`` sees
    the values so far, this level's last, and returns False for a directory
    that must not be opened.
    """

    parse: Callable[[bytes], Any]
    invalid: str | None
    wanted: Callable[[tuple[Any, ...]], bool] | None = None


def ascii_name(raw: bytes) -> str | None:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return None


def parse_boot(raw: bytes) -> bytes | None:
    """Raw boot id of a canonical boot directory name, else None."""
    try:
        return boot_raw(raw)
    except InvalidInput:
        return None


def shard_level(p: Pass, invalid: str | None = NOT_SHARD) -> Level:
    count = p.fmt.shard_count
    return Level(lambda raw: parse_shard_dir(raw, count), invalid)


def leaf_name(p: Pass, raw: bytes, rel: str, ext: str) -> str | None:
    """ASCII entry names with extension ``ext``; non-ASCII is an error."""
    name = ascii_name(raw)
    if name is None:
        p.error("invalid_name", f"{rel}: non-ASCII entry {raw!r}")
        return None
    return name if name.endswith(ext) else None


def leaf_job(p: Pass, raw: bytes, rel: str, state: State) -> tuple[str, JobName | None] | None:
    """A job file's entry (``.job``) parsed as a ``state`` name: None if the entry is no job file
    (non-ASCII is an error), else its name and the parsed name, None when it does not parse
    (each caller says what a job file of a bad name is to it)."""
    name = leaf_name(p, raw, rel, JOB_EXT)
    if name is None:
        return None
    try:
        return name, parse_name(state, name)
    except CorruptObject:
        return name, None


@contextlib.contextmanager
def open_dir(p: Pass, parent_fd: int, rel: str, name: bytes | str) -> Iterator[int | None]:
    """Our own fd for a directory we walk; None when it is gone or unopenable."""
    try:
        fd = linux.open_dir(parent_fd, name)
    except OSError as e:
        if e.errno != errno.ENOENT:
            p.error("directory", f"cannot open {rel}: {e.strerror}")
        yield None
        return
    try:
        yield fd
    finally:
        with contextlib.suppress(OSError):
            linux.close(fd)


def _list(p: Pass, dir_fd: int, rel: str) -> list[bytes]:
    try:
        names = linux.list_dir(dir_fd)
    except OSError as e:
        p.error("directory", f"cannot list {rel}: {e.strerror}")
        return []
    if len(names) > _LISTING_CAP:
        p.error("directory", f"{rel} holds {len(names)} entries; this pass looks at the first {_LISTING_CAP}")
        names = names[:_LISTING_CAP]
    return names


def _subdirs(p: Pass, dir_fd: int, rel: str, prefix: Key) -> Iterator[tuple[bytes, Key]]:
    """Child names not yet done, checking the budget before each."""
    for raw in _list(p, dir_fd, rel):
        key = prefix + (raw,)
        if p.done_before(key):
            continue
        p.check_budget()
        yield raw, key


def entries(
    p: Pass, dir_fd: int, rel: str, prefix: Key, keep: Callable[[bytes], bool] | None = None
) -> Iterator[bytes]:
    """Leaf entries after the position; the position moves to each one
    before it is processed (recovery.md "Pass structure"). Names ``keep``
    refuses are not the phase's business: they are passed over without a
    budget check, as if they were not there."""
    for raw in _list(p, dir_fd, rel):
        if keep is not None and not keep(raw):
            continue
        key = prefix + (raw,)
        if p.pos is not None and key <= p.pos:
            continue
        p.check_budget()
        p.enter(key)
        yield raw


def dirs(
    p: Pass,
    parent_fd: int,
    parent_rel: str,
    prefix: Key,
    level: Level,
    values: tuple[Any, ...],
    not_entered: list[bytes] | None = None,
) -> Generator[Child, None, None]:
    """Each child directory of one level not yet done, opened; the fd is
    closed when the consumer asks for the next one. Children it did not enter
    (invalid, unwanted, unopenable; not those already done) are appended to
    ``not_entered``. A consumer that raises must close the generator."""
    for raw, key in _subdirs(p, parent_fd, parent_rel, prefix):
        value = level.parse(raw)
        vals = values + (value,)
        if value is None or (level.wanted is not None and not level.wanted(vals)):
            if value is None and level.invalid is not None:
                p.error("invalid_name", f"{parent_rel}/{raw!r}: {level.invalid}")
            if not_entered is not None:
                not_entered.append(raw)
            continue
        name = raw.decode("ascii")
        rel = f"{parent_rel}/{name}"
        with open_dir(p, parent_fd, rel, name) as fd:
            if fd is None:
                if not_entered is not None:
                    not_entered.append(raw)
                continue
            yield vals, fd, rel, name, key


def walk(p: Pass, top: str, levels: tuple[Level, ...], prefix: Key = ()) -> Iterator[Leaf]:
    """Every leaf entry of ``top/<levels...>/`` after the position, in cursor order."""
    with open_dir(p, p.ctx.root_fd, top, top) as fd:
        if fd is not None:
            yield from _descend(p, fd, top, prefix, levels, ())


def _descend(
    p: Pass, fd: int, rel: str, key: Key, levels: tuple[Level, ...], values: tuple[Any, ...]
) -> Iterator[Leaf]:
    if not levels:
        for raw in entries(p, fd, rel, key):
            yield values, fd, rel, raw
        return
    for vals, sub_fd, sub_rel, _, sub_key in dirs(p, fd, rel, key, levels[0], values):
        yield from _descend(p, sub_fd, sub_rel, sub_key, levels[1:], vals)
