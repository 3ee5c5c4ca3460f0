"""Read-only views of a queue tree: ``stats`` (objects per state), ``inspect`` (one job), ``ls`` (every job),
``show`` (one job's whole story: its file judged, its payload verified).

Spec: ``cli.md`` (``stats``, ``inspect``), ``open-questions.md`` item 17.
``fsck`` (steadqd.fs.fsck) is the verifier; nothing here authenticates more
than ``inspect`` and the one definition of a dead job
(:func:`steadqd.fs.names.dead_job`) need, and nothing here writes.

Two flavours of ``stats`` exist on purpose, both counting a state's jobs by
the rule its listing uses, and anything else under a state directory as a
``stray`` (issue 30: stats once counted a planted FIFO in dead/ as a dead job
that no admin command would select):

* :func:`stats` keeps the reference CLI's shape (colocated leases count as
  *ready*, *leased* is only the legacy tree) so dashboards built for the
  reference keep working;
* :func:`detailed_stats` is what an operator actually wants: colocated
  leases are *leased*, and temporaries get their own ``tmp`` line.

Both stream the tree with ``os.scandir`` (one directory iterator per level,
never a list of names), so memory stays flat for millions of jobs.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from steadqd import view_records
from steadqd.constants import (
    DEAD_DIR,
    DELAYED_DIR,
    JOB_EXT,
    LEASED_DIR,
    QUARANTINE_DIR,
    READY_DIR,
    RECEIPT_EXT,
    RECEIPTS_DIR,
    TMP_DIR,
    State,
)
from steadqd.errors import CorruptObject, ErrorKind, SteadQError
from steadqd.fs import linux
from steadqd.fs.cbor import decode_extension
from steadqd.fs.context import Context
from steadqd.fs.names import (
    JobName,
    authenticate,
    boot_dashed,
    dead_job,
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
from steadqd.fs.receipt import verify_receipt
from steadqd.fs.verify import copy_payload as verify_copy_payload
from steadqd.fs.verify import iter_payload, read_envelope, verify_payload
from steadqd.view_records import CLASSIFIED_STATES, JobEntry, JobFile, StateStats, StateTally

__all__ = [
    "STATS_STATES",
    "DETAILED_STATS_STATES",
    "STRAY",
    "StateStats",
    "stats",
    "detailed_stats",
    "JobObject",
    "inspect_job",
    "JobEntry",
    "list_jobs",
    "JobFile",
    "read_job_file",
    "copy_job_payload",
    "JobStory",
    "job_story",
]

# =========================================================================== stats

# The reference's state directories, in its walk order (output is sorted by name).
STATS_STATES = (READY_DIR, LEASED_DIR, DELAYED_DIR, RECEIPTS_DIR, DEAD_DIR, QUARANTINE_DIR)
DETAILED_STATS_STATES = CLASSIFIED_STATES
# What stats counts an entry of a state directory that is no job (nor temp) of its place under.
STRAY = "stray"


def _stream_files(top: str) -> Iterator[tuple[tuple[str, ...], os.DirEntry[str]]]:
    """Yield ``(dirs, entry)`` for every non-directory entry below ``top``.

    ``dirs`` names the directories between ``top`` and the entry (empty for a
    direct child of ``top``). One ``os.scandir`` iterator per
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
    stack: list[tuple[tuple[str, ...], int, Iterator[os.DirEntry[str]]]] = []
    try:
        stack.append(((), top_fd, os.scandir(top_fd)))
    except BaseException:
        os.close(top_fd)
        raise
    try:
        while stack:
            dirs, dir_fd, it = stack[-1]
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
                yield dirs, entry
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
                stack.append(((*dirs, entry.name), child, os.scandir(child)))
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


_Classify = Callable[[tuple[str, ...], os.DirEntry[str]], str | None]


def _regular(entry: os.DirEntry[str]) -> bool:
    """A job object is a regular file: a symlink or a FIFO wearing a job's name is a stray (never followed)."""
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


def _classify_ready(dirs: tuple[str, ...], entry: os.DirEntry[str]) -> str | None:
    if len(dirs) != 1 or not _regular(entry):
        return None
    if NAME_PATTERNS[State.READY].fullmatch(entry.name):
        return "ready"
    if NAME_PATTERNS[State.LEASED].fullmatch(entry.name):
        return "leased"
    return None


def _classifier(state: State, key: str, depth: int) -> _Classify:
    pattern = NAME_PATTERNS[state]

    def classify(dirs: tuple[str, ...], entry: os.DirEntry[str]) -> str | None:
        if len(dirs) != depth - 1:
            return None
        if pattern.fullmatch(entry.name) and _regular(entry):
            return key
        if state is State.RECEIPT and is_compact_temp_name(entry.name):
            return "tmp"
        return None

    return classify


def _dead_classifier(ctx: Context) -> _Classify:
    """``dead`` for exactly what the admin commands select (:func:`names.dead_job`), else None."""
    fmt = ctx.fmt

    def classify(dirs: tuple[str, ...], entry: os.DirEntry[str]) -> str | None:
        if len(dirs) != 2 or not NAME_PATTERNS[State.DEAD].fullmatch(entry.name):
            return None  # the cheap test first: most strays fail it
        bucket, shard = parse_bucket_dir(dirs[0]), parse_shard_dir(dirs[1], fmt.shard_count)
        if bucket is None or shard is None:
            return None
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError:
            return None
        found = dead_job(fmt.queue_id, fmt.shard_count, fmt.lease_width_ns, bucket, shard, entry.name, mode)
        return None if found is None else "dead"

    return classify


def _classify_quarantine(_dirs: tuple[str, ...], entry: os.DirEntry[str]) -> str | None:
    return "quarantine" if parse_quarantine_name(entry.name) is not None else None


def _tally(ctx: Context, walks: list[tuple[str, _Classify]], keys: Collection[str], now_ns: int | None,
           merge: dict[str, str] | None = None) -> dict[str, StateStats]:  # fmt: skip
    """Walk each top directory that exists (a symlinked one is never followed; each gets a key of its name) and
    count each entry under the key ``classify`` names, renamed by ``merge``; one it names nothing is a ``stray``,
    a key present only when there is one."""
    now = time.time_ns() if now_ns is None else now_ns
    tallies = {k: StateTally() for k in keys}
    merge = merge or {}
    for top, classify in walks:
        path = os.path.join(ctx.path, top)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        tallies.setdefault(top, StateTally())
        for dirs, entry in _stream_files(path):
            key = classify(dirs, entry)
            key = STRAY if key is None else merge.get(key, key)
            mtime = _mtime_ns(entry)
            if mtime is not None:
                tallies.setdefault(key, StateTally()).add(mtime)
    return {k: t.result(now) for k, t in tallies.items()}


def stats(ctx: Context, *, now_ns: int | None = None) -> dict[str, StateStats]:
    """Per-state counts in the reference CLI's shape (cli.md "stats"): ``steadq stats``.

    Keys are the state directories that exist among ready, leased, delayed,
    receipts, dead, quarantine, and ``stray`` when there is any. Colocated
    leases count as *ready* and *leased* is the legacy tree only, as in the
    reference. Unlike the reference (open-questions 17), a state counts only
    its jobs, by the rule its listing uses (``ls``; for dead,
    :func:`names.dead_job`, what requeue and purge select): a symlink, a FIFO,
    a stray temp or a name that does not parse there is a ``stray``, which
    ``fsck`` names one by one (issue 30).
    """
    walks: list[tuple[str, _Classify]] = [
        (READY_DIR, _classify_ready),  # "leased" here is a colocated lease: the reference counts it as ready
        (LEASED_DIR, _classifier(State.LEASED, "legacy", 4)),
        (DELAYED_DIR, _classifier(State.DELAYED, "delayed", 3)),
        (RECEIPTS_DIR, _classifier(State.RECEIPT, "receipts", 3)),
        (DEAD_DIR, _dead_classifier(ctx)),
        (QUARANTINE_DIR, _classify_quarantine),
    ]
    return _tally(ctx, walks, (), now_ns, {"leased": "ready", "legacy": "leased", "tmp": STRAY})


def detailed_stats(ctx: Context, *, now_ns: int | None = None) -> dict[str, StateStats]:
    """Per-state counts of *objects*, classified by their parsed names.

    Keys (always all present): ready, leased (colocated in ``ready/<S>/``
    **and** legacy ``leased/``), delayed, dead, receipts, quarantine, tmp
    (publication temps under ``tmp/`` plus stale receipt-compaction temps),
    stray (entries of the state directories that are no object of theirs:
    the same rule as :func:`stats`; ``fsck`` names them). Ages use mtime like
    :func:`stats` (cheap: no file is opened); a rename keeps mtime, so a
    job's age is its publication age.
    """
    walks: list[tuple[str, _Classify]] = [
        (READY_DIR, _classify_ready),
        (LEASED_DIR, _classifier(State.LEASED, "leased", 4)),
        (DELAYED_DIR, _classifier(State.DELAYED, "delayed", 3)),
        (DEAD_DIR, _dead_classifier(ctx)),
        (RECEIPTS_DIR, _classifier(State.RECEIPT, "receipts", 3)),
        (QUARANTINE_DIR, _classify_quarantine),
        (TMP_DIR, lambda _d, _e: "tmp"),
    ]
    return _tally(ctx, walks, DETAILED_STATS_STATES, now_ns)


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
    name: JobName = field(compare=False, repr=False)  # the parsed file name
    details: dict[str, object] = field(default_factory=dict, compare=False)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


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
        out.append(JobObject(state, jn.generation, jn.attempt, jn.max_attempts, rel, jn, details))

    def bucket_rels(top: str) -> Iterator[tuple[int, str]]:
        """(bucket, the job's shard directory in it) for each bucket directory of ``top``."""
        for b in _list_names(root, top):
            bucket = parse_bucket_dir(b)
            if bucket is not None:
                yield bucket, f"{top}/{b.decode()}/{s}"

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
            for bucket, rel in bucket_rels(top):
                for name in matching(rel):
                    try:
                        jn = parse_name(state, name)
                    except CorruptObject:
                        continue
                    if auth(jn, bucket):
                        add(jn, f"{rel}/{name}", state.value, _details(jn))
        for bucket, rel in bucket_rels(RECEIPTS_DIR):
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
    return JobObject("receipt", jn.generation, jn.attempt, jn.max_attempts, f"{rel}/{name}", jn, details)


# =========================================================================== ls


def list_jobs(ctx: Context, states: Collection[str]) -> Iterator[JobEntry]:
    """Every job object in ``states`` (state words: ready, leased, delayed, dead, receipt), streamed.

    A plain directory walk in sorted order, one directory listed at a time
    so memory stays flat. A job object is a regular file whose name parses
    for its directory; dead jobs are exactly :func:`names.dead_job`'s (what
    requeue and purge select), the only state whose tags are checked here
    (``fsck`` is the verifier). Anything else is skipped (``stats`` counts it
    as a stray); a symlinked directory is not followed, and an unreadable one
    lists as empty.
    """
    queue_root = ctx.path
    fmt = ctx.fmt

    def listdir(rel: str) -> list[str]:
        path = os.path.join(queue_root, rel)
        if os.path.islink(path):
            return []
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def entries(rel: str, parse: Callable[[str, int], JobName | None]) -> Iterator[JobEntry]:
        for name in listdir(rel):
            try:
                st = os.lstat(os.path.join(queue_root, rel, name))
            except OSError:
                continue  # moved on since it was listed
            jn = parse(name, st.st_mode)
            if jn is None or jn.state.value not in states:
                continue
            deadline = jn.wall_deadline if jn.state is State.LEASED else jn.not_before
            yield JobEntry(jn.state.value, jn.job_hex, jn.generation, jn.attempt, jn.max_attempts, f"{rel}/{name}",
                           st.st_mtime_ns, deadline, jn.reason)  # fmt: skip

    def parsed(parse: Callable[[str], JobName]) -> Callable[[str, int], JobName | None]:
        def job(name: str, mode: int) -> JobName | None:
            if not stat.S_ISREG(mode):
                return None
            try:
                return parse(name)
            except SteadQError:
                return None

        return job

    def dead_in(bucket: int, shard: int) -> Callable[[str, int], JobName | None]:
        return lambda name, mode: dead_job(fmt.queue_id, fmt.shard_count, fmt.lease_width_ns, bucket, shard, name,
                                           mode)  # fmt: skip

    if {State.READY.value, State.LEASED.value} & set(states):
        for shard in listdir(READY_DIR):
            yield from entries(f"{READY_DIR}/{shard}", parsed(parse_ready_dir_entry))
    for top, state in ((DELAYED_DIR, State.DELAYED), (DEAD_DIR, State.DEAD), (RECEIPTS_DIR, State.RECEIPT)):
        if state.value not in states:
            continue
        for bucket in listdir(top):
            for shard in listdir(f"{top}/{bucket}"):
                if state is State.DEAD:
                    b, sh = parse_bucket_dir(bucket), parse_shard_dir(shard, fmt.shard_count)
                    if b is None or sh is None:
                        continue
                    yield from entries(f"{top}/{bucket}/{shard}", dead_in(b, sh))
                else:
                    yield from entries(f"{top}/{bucket}/{shard}", parsed(functools.partial(parse_name, state)))
    if State.LEASED.value in states:
        for boot in listdir(LEASED_DIR):
            for bucket in listdir(f"{LEASED_DIR}/{boot}"):
                for shard in listdir(f"{LEASED_DIR}/{boot}/{bucket}"):
                    yield from entries(
                        f"{LEASED_DIR}/{boot}/{bucket}/{shard}", parsed(functools.partial(parse_name, State.LEASED))
                    )


# =========================================================================== show (one job's whole story)


def read_job_file(ctx: Context, path: str, head_bytes: int) -> JobFile:
    """Read and judge the job file at ``path`` (relative to the root) without following a symlink.

    Why a corrupt file is an answer, not an error: ``steadq show`` is where
    an operator looks at a quarantined or damaged job, and what failed is the
    story. Only a vanished file raises (FileNotFoundError): the job moved on.
    """
    try:
        fd = linux.open_beneath(ctx.root_fd, path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise
        why = "a symlink (never followed)" if e.errno == errno.ELOOP else (e.strerror or str(e))
        return JobFile(path, problem=f"cannot open: {why}")
    try:
        st = linux.fstat(fd)
        try:
            env = read_envelope(fd, ctx.fmt.max_payload_length, st)
        except CorruptObject as e:
            return JobFile(path, changed_ns=st.st_ctime_ns, problem=e.message)
        h = env.header
        try:
            ext = decode_extension(env.extension) if env.extension else None
        except CorruptObject as e:
            return JobFile(path, h.created_at_ns, st.st_ctime_ns, payload_length=h.payload_length, problem=e.message)
        head = bytearray()
        problem = None
        try:
            for chunk in iter_payload(fd, env):
                if len(head) < head_bytes:
                    head += chunk[: head_bytes - len(head)]
        except CorruptObject as e:
            problem = e.message
        return JobFile(
            path,
            h.created_at_ns,
            st.st_ctime_ns,
            ext.content_type if ext else "application/octet-stream",
            dict(ext.metadata) if ext and ext.metadata else None,
            ext.producer_id if ext else None,
            ext.initial_not_before if ext else None,
            h.payload_length,
            bytes(head),
            problem is None,
            problem,
        )
    finally:
        linux.close(fd)


def copy_job_payload(ctx: Context, path: str, out: BinaryIO) -> int:
    """Write the payload of the job file at ``path`` to ``out``, only once it has verified.

    The file is read twice through one descriptor: first to check the digest
    (so nothing unverified reaches ``out``, which may be a terminal or a pipe
    that cannot be taken back), then to copy, which checks it again.
    CorruptObject when it fails; FileNotFoundError when the job moved on.
    """
    fd = linux.open_beneath(ctx.root_fd, path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        env = read_envelope(fd, ctx.fmt.max_payload_length)
        verify_payload(fd, env)
        return verify_copy_payload(fd, env, out)
    finally:
        linux.close(fd)


# What ``show`` tells of a job, with this backend's objects.
JobStory = view_records.JobStory[JobObject]


# A job moves while it is looked at (a worker claims it, the sweeper reaps
# it); the story is read again from the start, a few times at most.
_STORY_TRIES = 4


def job_story(
    ctx: Context, job_id: str, head_bytes: int, find_quarantined: Callable[[str], tuple[str, str, int] | None]
) -> JobStory | None:
    """The job's story, or None if no object of it exists (``find_quarantined`` gives
    (quarantine id, path, reason) of a quarantined file that names it)."""
    for _ in range(_STORY_TRIES):
        objects = inspect_job(ctx, job_id)
        live = [o for o in objects if o.state != State.RECEIPT.value]
        try:
            if live:
                cur = live[0]
                reason = cur.name.reason if cur.state == State.DEAD.value else None
                return JobStory(job_id, cur.state, cur.path, objects, cur, read_job_file(ctx, cur.path, head_bytes),
                                reason)  # fmt: skip
            if objects:
                return JobStory(job_id, objects[0].state, objects[0].path, objects, objects[0], None)
            found = find_quarantined(job_id)
            if found is None:
                return None
            qid, path, reason = found
            return JobStory(job_id, "quarantine", path, [], None, read_job_file(ctx, path, head_bytes), reason, qid)
        except FileNotFoundError:
            continue
    raise SteadQError(f"job {job_id} kept moving while it was read; try again", ErrorKind.IO_FAILURE)
