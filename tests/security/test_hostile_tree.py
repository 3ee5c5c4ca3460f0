"""A hostile queue tree: nothing in it can make steadqd act outside the queue.

Threat (docs/security.md): anyone in the queue's group can write every
directory of a shared queue. They can plant symlinks where directories
should be, swap files between our checks, write job files non-atomically
and forge headers. They must never get steadqd to read, list, write,
rename, chmod or delete anything *outside* the queue root, to deliver a file
other than the one it verified, or to allocate memory sized by a header.

How "nothing outside was touched" is observed: the outside directory is
frozen before the attack -- every entry's lstat (mode, owner, size, link
count, inode, atime, mtime, ctime) plus the content hash of each file --
with every atime set far into the past. Under ``relatime`` (the default
mount option; checked by a guard test) any read() or readdir() through a
followed symlink moves an atime forward, any write/rename/chmod/unlink
moves an mtime or ctime, so a single followed symlink fails the snapshot
comparison even when the operation "only looked".
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from steadqd import (
    Lease,
    NotCommitted,
    OutcomeUnknown,
    Queue,
    SteadQError,
)
from steadqd.constants import ENVELOPE_READ_BYTES, QuarantineReason
from steadqd.fs import linux, names
from steadqd.fs.compiled import bridge
from steadqd.fs.records import build_header

OLD_ATIME_NS = 1_000_000_000 * 10**9  # 2001: before any mtime we set, so relatime updates it on access
OLD_MTIME_NS = 1_500_000_000 * 10**9
SHARDS = 2


# --------------------------------------------------------------------------- the outside snapshot


def _entries(top: Path) -> list[str]:
    out = ["."]
    for dirpath, dirs, files in os.walk(top):
        for n in sorted(dirs + files):
            out.append(os.path.relpath(os.path.join(dirpath, n), top))
    return sorted(out)


@dataclass
class Frozen:
    """An outside tree whose every access from now on is visible in its metadata."""

    top: Path
    manifest: list[str] = field(default_factory=list)
    hashes: dict[str, str] = field(default_factory=dict)
    stats: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def freeze(self) -> None:
        self.manifest = _entries(self.top)
        for rel in self.manifest:
            p = self.top / rel
            if p.is_file() and not p.is_symlink():
                self.hashes[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        # Deepest first: setting a file's times never touches its directory's.
        for rel in reversed(self.manifest):
            os.utime(self.top / rel, ns=(OLD_ATIME_NS, OLD_MTIME_NS), follow_symlinks=False)
        self.stats = self._stat_all()

    def _stat_all(self) -> dict[str, tuple[int, ...]]:
        out = {}
        for rel in self.manifest:
            try:
                st = os.lstat(self.top / rel)
            except FileNotFoundError:
                out[rel] = ()
                continue
            out[rel] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_nlink, st.st_ino,
                        st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns)  # fmt: skip
        return out

    def assert_untouched(self) -> None:
        # Metadata first (lstat reads nothing), then the listing and the contents.
        after = self._stat_all()
        changed = {rel: (self.stats[rel], after[rel]) for rel in self.manifest if after[rel] != self.stats[rel]}
        assert not changed, f"outside entries were accessed or modified: {changed}"
        assert _entries(self.top) == self.manifest, "entries appeared in or vanished from the outside tree"
        for rel, digest in self.hashes.items():
            assert hashlib.sha256((self.top / rel).read_bytes()).hexdigest() == digest, rel


def test_atime_observes_reads_here(tmp_path: Path) -> None:
    """Guard: the snapshot can only see reads if this filesystem updates atime (relatime/strictatime)."""
    d = tmp_path / "probe"
    d.mkdir()
    (d / "f").write_bytes(b"x")
    fr = Frozen(d)
    fr.freeze()
    fr.assert_untouched()
    (d / "f").read_bytes()
    with pytest.raises(AssertionError, match="accessed or modified"):
        fr.assert_untouched()
    fr.freeze()
    os.listdir(d)
    with pytest.raises(AssertionError, match="accessed or modified"):
        fr.assert_untouched()


# --------------------------------------------------------------------------- crafting valid-looking objects


@dataclass
class Crafter:
    """Builds authentic job files and tagged names for this queue, to be placed anywhere."""

    q: Queue
    qpath: str

    @property
    def fmt(self):  # noqa: ANN201 - FormatRecord
        return self.q.format

    def job(self, payload: bytes) -> tuple[bytes, bytes]:
        """(job id, the bytes of a genuine job file), taken out of the queue again."""
        job, rel = self.q.enqueue_detailed(payload, max_attempts=3)
        p = Path(self.qpath, rel)
        data = p.read_bytes()
        p.unlink()
        return bytes.fromhex(job), data

    def shard(self, job: bytes) -> int:
        return names.shard_of(self.fmt.queue_id, job, self.fmt.shard_count)

    def fname(self, jn: names.JobName, job: bytes, bucket: int | None = None) -> str:
        return names.make_filename(
            self.fmt.queue_id, jn, shard=self.shard(job), bucket=bucket, lease_width_ns=self.fmt.lease_width_ns
        )

    def job_in_shard(self, shard: int, payload: bytes) -> tuple[bytes, bytes]:
        for i in range(200):
            job, data = self.job(payload + b" #%d" % i)
            if self.shard(job) == shard:
                return job, data
        raise AssertionError("no job id for the shard")


ANCIENT_NS = 10**9  # 1970 + 1 s: due, expired and past retention for every phase
ANCIENT_DELAYED_BUCKET = names.delayed_bucket(ANCIENT_NS, 10 * 10**9)
ANCIENT_TERMINAL_BUCKET = names.terminal_bucket(ANCIENT_NS, 3600 * 10**9)


@dataclass
class Plan:
    """Symlinks to plant: ``link rel in the queue -> {path inside its target: bytes}``."""

    links: dict[str, dict[str, bytes]] = field(default_factory=dict)
    job_ids: set[str] = field(default_factory=set)  # jobs that exist only outside
    quarantine_ids: set[str] = field(default_factory=set)


def _shards(files: dict[str, bytes]) -> dict[str, bytes]:
    """Make every shard directory exist in a bucket target, so a followed write would succeed."""
    out = dict(files)
    for s in range(SHARDS):
        out.setdefault(f"{names.shard_dir(s)}/", b"")
    return out


def plan_ready_shard(c: Crafter) -> Plan:
    job, data = c.job_in_shard(0, b"outside ready")
    name = c.fname(names.ready_name(job, 0, 0, 3), job)
    return Plan({"ready/0000": {name: data}}, {job.hex()})


def _delayed_file(c: Crafter, payload: bytes) -> tuple[bytes, str, bytes]:
    job, data = c.job(payload)
    jn = names.delayed_name(job, 1, 0, 3, not_before=ANCIENT_NS)
    return job, f"{names.shard_dir(c.shard(job))}/{c.fname(jn, job, ANCIENT_DELAYED_BUCKET)}", data


def _current_buckets(c: Crafter, width_ns: int, ahead_ns: int) -> list[str]:
    """The bucket an operation about to run will write to, and the next (a second may roll over)."""
    b = (c.q.wall_floor_ns() + ahead_ns) // width_ns
    return [names.bucket_dir(b), names.bucket_dir(b + 1)]


def plan_delayed_dir(c: Crafter) -> Plan:
    job, rel, data = _delayed_file(c, b"outside delayed")
    return Plan({"delayed": {f"{names.bucket_dir(ANCIENT_DELAYED_BUCKET)}/{rel}": data}}, {job.hex()})


def plan_delayed_buckets(c: Crafter) -> Plan:
    """A due bucket (promotion would read it) and the buckets retry/enqueue-later write to."""
    job, rel, data = _delayed_file(c, b"outside delayed bucket")
    links = {f"delayed/{names.bucket_dir(ANCIENT_DELAYED_BUCKET)}": _shards({rel: data})}
    width = c.fmt.delayed_width_ns
    for b in _current_buckets(c, width, 3600 * 10**9):
        links[f"delayed/{b}"] = _shards({"marker": b"write target"})
    return Plan(links, {job.hex()})


def plan_delayed_shard(c: Crafter) -> Plan:
    job, rel, data = _delayed_file(c, b"outside delayed shard")
    shard, name = rel.split("/")
    return Plan({f"delayed/{names.bucket_dir(ANCIENT_DELAYED_BUCKET)}/{shard}": {name: data}}, {job.hex()})


def _dead_file(c: Crafter) -> tuple[bytes, str, bytes]:
    job, data = c.job(b"outside dead")
    jn = names.dead_name(job, 1, 1, 3, reason=1)
    return job, f"{names.shard_dir(c.shard(job))}/{c.fname(jn, job, ANCIENT_TERMINAL_BUCKET)}", data


def plan_dead_dir(c: Crafter) -> Plan:
    job, rel, data = _dead_file(c)
    return Plan({"dead": {f"{names.bucket_dir(ANCIENT_TERMINAL_BUCKET)}/{rel}": data}}, {job.hex()})


def plan_dead_buckets(c: Crafter) -> Plan:
    job, rel, data = _dead_file(c)
    links = {f"dead/{names.bucket_dir(ANCIENT_TERMINAL_BUCKET)}": _shards({rel: data})}
    for b in _current_buckets(c, c.fmt.terminal_width_ns, 0):
        links[f"dead/{b}"] = _shards({"marker": b"write target"})
    return Plan(links, {job.hex()})


def _receipt_file(c: Crafter) -> tuple[bytes, str, bytes]:
    job, data = c.job(b"outside receipt")
    jn = names.receipt_name(job, 1, 1, 3, lease_token=os.urandom(16))
    return job, f"{names.shard_dir(c.shard(job))}/{c.fname(jn, job, ANCIENT_TERMINAL_BUCKET)}", data


def plan_receipts_dir(c: Crafter) -> Plan:
    """An expired bucket of full receipts: compaction would rewrite them, retention delete them."""
    job, rel, data = _receipt_file(c)
    return Plan({"receipts": {f"{names.bucket_dir(ANCIENT_TERMINAL_BUCKET)}/{rel}": data}}, {job.hex()})


def plan_receipts_buckets(c: Crafter) -> Plan:
    job, rel, data = _receipt_file(c)
    links = {f"receipts/{names.bucket_dir(ANCIENT_TERMINAL_BUCKET)}": _shards({rel: data})}
    for b in _current_buckets(c, c.fmt.terminal_width_ns, 0):
        links[f"receipts/{b}"] = _shards({"marker": b"write target"})
    return Plan(links, {job.hex()})


def plan_receipts_shard(c: Crafter) -> Plan:
    job, rel, data = _receipt_file(c)
    shard, name = rel.split("/")
    return Plan({f"receipts/{names.bucket_dir(ANCIENT_TERMINAL_BUCKET)}/{shard}": {name: data}}, {job.hex()})


def plan_quarantine_dir(c: Crafter) -> Plan:
    qid = os.urandom(16)
    return Plan({"quarantine": {names.make_quarantine_name(qid, 1): b"evidence of someone else"}},
                quarantine_ids={qid.hex()})  # fmt: skip


def plan_tmp_dir(c: Crafter) -> Plan:
    """Temps of another boot: cleanup deletes every one it sees."""
    boot = names.boot_dashed(os.urandom(16))
    return Plan({"tmp": {f"{boot}/0000/{names.make_temp_name(0, os.urandom(16))}": b"half a job"}})


def plan_leased_dir(c: Crafter) -> Plan:
    """A legacy lease of another boot: recovery would move it back to ready/."""
    job, data = c.job(b"outside legacy lease")
    boot = os.urandom(16)
    jn = names.leased_name(job, 1, 1, 3, boot_id=boot, boottime_deadline=1, wall_deadline=1, lease_token=os.urandom(16))
    bucket = names.lease_bucket(1, c.fmt.lease_width_ns)
    rel = f"{names.boot_dashed(boot)}/{names.bucket_dir(bucket)}/{names.shard_dir(c.shard(job))}/{c.fname(jn, job)}"
    return Plan({"leased": {rel: data}}, {job.hex()})


PLANS: dict[str, Callable[[Crafter], Plan]] = {
    "ready-shard": plan_ready_shard,
    "delayed": plan_delayed_dir,
    "delayed-buckets": plan_delayed_buckets,
    "delayed-bucket-shard": plan_delayed_shard,
    "dead": plan_dead_dir,
    "dead-buckets": plan_dead_buckets,
    "receipts": plan_receipts_dir,
    "receipts-buckets": plan_receipts_buckets,
    "receipts-bucket-shard": plan_receipts_shard,
    "quarantine": plan_quarantine_dir,
    "tmp": plan_tmp_dir,
    "leased": plan_leased_dir,
}
STATE_DIR_PLANS = {"delayed", "dead", "receipts", "quarantine", "tmp", "leased"}


def plant(qpath: str, outside: Path, plan: Plan, *, relative: bool) -> None:
    """Build each link target outside and put a symlink where the queue expects a directory.

    A real directory already at the link's place is moved aside *inside* the
    queue (an attacker would have to remove it; moving it keeps any fd a live
    handle has cached pointing inside the queue, which is not what we test).
    """
    for i, (link_rel, files) in enumerate(sorted(plan.links.items())):
        target = outside / f"t{i}"
        target.mkdir()
        for rel, data in files.items():
            p = target / rel
            if rel.endswith("/"):
                p.mkdir(parents=True, exist_ok=True)
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        link = Path(qpath, link_rel)
        link.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(link):
            os.rename(link, Path(qpath, f"stash-{i}"))
        os.symlink(os.path.relpath(target, link.parent) if relative else target, link)


# --------------------------------------------------------------------------- every operation, against the plan


def _swallow(fn: Callable[[], object]) -> object:
    """Run one public operation; a refusal (any SteadQError) is an acceptable outcome here."""
    try:
        return fn()
    except SteadQError as e:
        return e


def _refused_or(result: object, empty: object) -> bool:
    return isinstance(result, SteadQError) or result == empty


def exercise(q: Queue, plan: Plan, leases: list[Lease], tmp: Path) -> None:
    """Every operation that could touch a planted directory; asserts nothing outside is delivered."""
    outside_jobs = plan.job_ids

    def lease_some(n: int) -> list[Lease]:
        got = []
        for _ in range(n):
            r = _swallow(q.lease)
            if isinstance(r, Lease):
                assert r.job_id not in outside_jobs, "a job from outside the queue was delivered"
                got.append(r)
        return got

    for i in range(6):
        _swallow(lambda i=i: q.enqueue(b"new %d" % i))
        _swallow(lambda i=i: q.enqueue(b"later %d" % i, delay=3600))
    fresh = lease_some(4)
    pool = leases + fresh
    settle = [q.ack, lambda ls: q.retry(ls, delay=3600), q.retry, q.bury]
    for i, ls in enumerate(pool):
        _swallow(lambda ls=ls, i=i: settle[i % len(settle)](ls))
    for _ in range(2):
        r = _swallow(lambda: q.recover(budget_ops=100_000, budget_ms=10_000))
        assert not isinstance(r, OutcomeUnknown)
    lease_some(4)
    for deep in (False, True):
        _swallow(lambda deep=deep: q.fsck(deep=deep, repair=True))
    _swallow(q.stats)
    for job in outside_jobs:
        assert _refused_or(_swallow(lambda job=job: q.inspect(job)), [])
        assert _refused_or(_swallow(lambda job=job: q.find_dead(job)), None)
        assert isinstance(_swallow(lambda job=job: q.export_dead(job, str(tmp / "export"))), SteadQError)
        assert isinstance(_swallow(lambda job=job: q.remove_dead(job)), SteadQError)
        assert isinstance(_swallow(lambda job=job: q.requeue_dead(job)), SteadQError)
    listed = _swallow(lambda: [j.job_id for j in q.list_dead()])
    assert not (isinstance(listed, list) and set(listed) & outside_jobs)
    for qid in plan.quarantine_ids:
        assert isinstance(_swallow(lambda qid=qid: q.export_quarantine(qid, str(tmp / "qexport"))), SteadQError)
        assert isinstance(_swallow(lambda qid=qid: q.remove_quarantine(qid)), SteadQError)
    listed_q = _swallow(lambda: [o.quarantine_id for o in q.list_quarantine()])
    assert not (isinstance(listed_q, list) and set(listed_q) & plan.quarantine_ids)
    assert not (tmp / "export").exists() and not (tmp / "qexport").exists()


@pytest.fixture
def world(tmp_path: Path, make_queue: Callable[..., Queue], queue_path: str) -> tuple[str, Path, Path]:
    """A queue with no handle open, a directory outside it, and a scratch directory."""
    outside = tmp_path / "outside"
    outside.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    make_queue(shards=SHARDS).close()
    return queue_path, outside, scratch


@pytest.mark.parametrize("plan_name", sorted(PLANS))
def test_symlinked_directory_is_never_followed_by_a_live_handle(world: tuple[str, Path, Path], plan_name: str) -> None:
    """A handle opened *before* the symlinks were planted (its directory cache warm)."""
    qpath, outside, scratch = world
    with Queue.open(qpath) as q:
        c = Crafter(q, qpath)
        plan = PLANS[plan_name](c)
        for i in range(4):
            q.enqueue(b"pre %d" % i)
        leases = [ls for ls in (q.lease() for _ in range(3)) if ls is not None]
        q.enqueue(b"old ready", delay=0)
        plant(qpath, outside, plan, relative=plan_name in ("ready-shard", "delayed"))
        frozen = Frozen(outside)
        frozen.freeze()
        exercise(q, plan, leases, scratch)
    frozen.assert_untouched()


@pytest.mark.parametrize("plan_name", sorted(PLANS))
def test_symlinked_directory_is_refused_by_a_fresh_handle(world: tuple[str, Path, Path], plan_name: str) -> None:
    """A handle opened *after* the symlinks were planted; state directories make open refuse."""
    qpath, outside, scratch = world
    with Queue.open(qpath) as q:
        plan = PLANS[plan_name](Crafter(q, qpath))
        for i in range(4):
            q.enqueue(b"pre %d" % i)
    plant(qpath, outside, plan, relative=False)
    frozen = Frozen(outside)
    frozen.freeze()
    if plan_name in STATE_DIR_PLANS:
        with pytest.raises(SteadQError, match="is not a directory"):
            Queue.open(qpath)
    else:
        with Queue.open(qpath) as q:
            leases = [ls for ls in (_swallow(q.lease) for _ in range(2)) if isinstance(ls, Lease)]
            exercise(q, plan, leases, scratch)
    frozen.assert_untouched()


def test_shard_replaced_by_symlink_after_caching_is_not_followed(world: tuple[str, Path, Path]) -> None:
    """The shard directory a live handle has cached is deleted and replaced by a symlink.

    The cached descriptor names a deleted directory; enqueue notices (link
    fails), forgets it and re-resolves the path -- with open_beneath, which
    refuses the symlink instead of creating the job outside.
    """
    qpath, outside, _ = world
    with Queue.open(qpath) as q:
        c = Crafter(q, qpath)
        job, _data = c.job_in_shard(0, b"warm the cache")  # ready/0000 is now cached and empty
        shard0 = Path(qpath, "ready/0000")
        os.rmdir(shard0)
        os.symlink(outside, shard0)
        (outside / "keep").write_bytes(b"k")
        frozen = Frozen(outside)
        frozen.freeze()
        refused = 0
        for i in range(12):  # some of these land in shard 0
            try:
                q.enqueue(b"after the swap %d" % i)
            except NotCommitted:
                refused += 1
        assert refused > 0
        for _ in range(12):  # shard 1's jobs are claimed; the symlinked shard 0 is refused, never listed
            try:
                if q.lease() is None:
                    break
            except NotCommitted:
                pass
    frozen.assert_untouched()


# --------------------------------------------------------------------------- ".." and forged handle paths


@pytest.mark.parametrize(
    "forged",
    [
        "ready/0000/../../../outside/{name}",
        "ready/../../outside/{name}",
        "../outside/{name}",
        "/{outside}/{name}",
        "ready/0000/../0000/{name}",
        "ready/./0000/{name}",
        "leased/../../outside/x/{name}",
    ],
)
def test_handle_path_with_dotdot_is_refused_before_any_open(world: tuple[str, Path, Path], forged: str) -> None:
    """exact_source_path comes from a handle file (user input): only the exact
    grammar ``ready/<shard>/<leased name>`` is accepted, checked before any syscall uses it."""
    qpath, outside, _ = world
    with Queue.open(qpath) as q:
        q.enqueue(b"x")
        lease = q.lease()
        assert lease is not None
        name = lease.path.rsplit("/", 1)[1]
        # A copy of the leased file outside, at the place the forged path names.
        (outside / name).write_bytes(Path(qpath, lease.path).read_bytes())
        frozen = Frozen(outside)
        frozen.freeze()
        text = lease.to_handle(qpath).replace(lease.path, forged.format(name=name, outside=str(outside).strip("/")))
        forged_lease, _ = Lease.from_handle(text)
        with linux.trace() as events:
            for op in (q.ack, q.renew, q.retry, q.bury):
                with pytest.raises(NotCommitted):
                    op(forged_lease)
        opened = [e for e in events if e.op in ("open", "openat2", "stat", "rename_noreplace", "rename")]
        assert not any(".." in str(e.detail) or str(outside) in str(e.detail) for e in opened), opened
    frozen.assert_untouched()


# --------------------------------------------------------------------------- TOCTOU: swapped between check and use


@pytest.fixture
def one_shard(make_queue: Callable[..., Queue], queue_path: str) -> tuple[Queue, str]:
    """One shard: the file a test plants or swaps is in the directory the claim scans."""
    return make_queue(shards=1), queue_path


class Swapper:
    """After the Nth syscall ``op`` that names ``name``, rename a different file over it.

    Wraps the steadqd.fs.linux function the protocol modules call through the
    module attribute, so the swap happens exactly between two of our own
    syscalls -- the window a racing attacker would aim for.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, op: str, name: str, nth: int, swap: Callable[[], None]) -> None:
        self.fired = False
        self.count = 0
        real = getattr(linux, op)

        def wrapper(*args: object, **kwargs: object) -> object:
            result = real(*args, **kwargs)
            if not self.fired and any(a == name for a in args):
                self.count += 1
                if self.count == nth:
                    self.fired = True
                    swap()
            return result

        monkeypatch.setattr(linux, op, wrapper)


def _corrupt_copy(path: Path) -> Path:
    """A same-size, same-header twin with one payload byte changed (a different inode)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    twin = path.with_name("twin")
    twin.write_bytes(bytes(data))
    return twin


@pytest.mark.parametrize("claim_path", ["pure-python", "claim-core"])
@pytest.mark.parametrize(
    "op,nth",
    [
        ("open_at", 1),  # after open: the held fd is the original, the name is the twin
        ("stat_at", 1),  # inside the witnessed move, after its stat (the claim's re-check), before the rename
    ],
)
def test_claim_never_delivers_a_file_swapped_in_after_verification(
    one_shard: tuple[Queue, str], monkeypatch: pytest.MonkeyPatch, op: str, nth: int, claim_path: str
) -> None:
    """On both claim paths. The C claim core (steadqd.fs.compiled.bridge) calls libc itself unless the
    syscall hook traces, when its syscalls go through the steadqd.fs.linux functions the swap wraps:
    traced, the swap lands between the core's own syscalls."""
    q, qpath = one_shard
    if claim_path == "pure-python":
        q._ctx.c_core = None
    elif q._ctx.c_core is None:
        pytest.skip(bridge.path())
    job, rel = q.enqueue_detailed(b"the verified payload")
    path = Path(qpath, rel)
    original_ino = path.stat().st_ino
    twin = _corrupt_copy(path)
    twin_ino = twin.stat().st_ino
    stash = Path(qpath, "stash-original")

    def swap() -> None:
        os.rename(path, stash)  # keep the original alive so its inode number is not reused
        os.rename(twin, path)

    swapper = Swapper(monkeypatch, op, path.name, nth, swap)
    try:
        with linux.trace() if claim_path == "claim-core" else contextlib.nullcontext():
            got = q.lease()
    except (NotCommitted, OutcomeUnknown):
        got = None
    monkeypatch.undo()
    assert swapper.fired
    if got is not None:  # what is delivered is the inode that was verified, at the lease's path
        assert os.stat(Path(qpath, got.path)).st_ino == got.ino == original_ino
        assert got.payload() == b"the verified payload"
    shard = Path(qpath, "ready/0000")
    for entry in shard.iterdir():
        # The twin may have been quarantined, stayed ready, or (tiny window) been
        # renamed before the witness check poisoned the handle -- never delivered as a lease.
        if entry.stat().st_ino == twin_ino and got is not None:
            assert names.parse_ready_dir_entry(entry.name).state.name == "READY"


def _after_listing(real: Callable[..., list[bytes]], swap: Callable[[], None]) -> Callable[..., list[bytes]]:
    """``real`` (a directory read), with ``swap`` run once right after its first call."""
    done = [False]

    def wrapper(fd: int, *args: object) -> list[bytes]:
        out = real(fd, *args)
        if not done[0]:
            done[0] = True
            swap()
        return out

    return wrapper


def test_claim_of_a_twin_swapped_before_open_quarantines_it(
    one_shard: tuple[Queue, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Swapped before the open: the twin is the object verified; its bad payload sends it to quarantine."""
    q, qpath = one_shard
    _, rel = q.enqueue_detailed(b"the verified payload")
    path = Path(qpath, rel)
    twin = _corrupt_copy(path)
    twin_ino = twin.stat().st_ino
    # The claim scan reads the shard in chunks: swap right after the read that found the name. Traced,
    # so that the C core's read of the chunk goes through linux.read_dir_chunk too (its hooked table).
    monkeypatch.setattr(linux, "read_dir_chunk", _after_listing(linux.read_dir_chunk, lambda: os.replace(twin, path)))
    with linux.trace():
        assert q.lease() is None
    monkeypatch.undo()
    quarantined = list(Path(qpath, "quarantine").iterdir())
    assert [p.stat().st_ino for p in quarantined] == [twin_ino]
    assert quarantined[0].name.endswith(f".x{QuarantineReason.PAYLOAD_CORRUPT:04x}.raw")


@pytest.mark.parametrize("when", ["before", "after_open"])  # after_open: validated by fd, caught by the move's stat
def test_ack_refuses_a_swapped_leased_file(
    one_shard: tuple[Queue, str], monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A leased file replaced by an identical copy (same bytes, another inode) is not acknowledged."""
    q, qpath = one_shard
    q.enqueue(b"payload")
    lease = q.lease()
    assert lease is not None
    path = Path(qpath, lease.path)
    twin = path.with_name("twin")
    twin.write_bytes(path.read_bytes())  # identical content: only the identity check can tell
    twin_ino = twin.stat().st_ino

    def swap() -> None:
        os.rename(path, Path(qpath, "stash-original"))
        os.rename(twin, path)

    if when == "before":
        swap()
    else:
        swapper = Swapper(monkeypatch, "open_at", path.name, 1, swap)
    with pytest.raises(NotCommitted) as info:
        q.ack(lease)
    monkeypatch.undo()
    assert when == "before" or swapper.fired
    assert "changed" in str(info.value) or "another file" in str(info.value) or "replaced" in str(info.value)
    assert path.stat().st_ino == twin_ino  # the twin stays where it was; it was not turned into a receipt
    assert not any(Path(qpath, "receipts").rglob("*.rct"))


# --------------------------------------------------------------------------- careless producers, forged headers


@pytest.mark.parametrize("written", [0, 60, 128, 150])
def test_half_written_file_in_ready_is_quarantined_never_delivered(one_shard: tuple[Queue, str], written: int) -> None:
    """A producer that writes straight into ready/ (no temp + rename): whatever
    prefix exists when a scan looks is quarantined as 0x0001 (envelope corrupt)
    and nothing is delivered; the producer's later writes land in the
    quarantined inode, so the evidence ends up complete."""
    q, qpath = one_shard
    c = Crafter(q, qpath)
    job, data = c.job(b"P" * 100)
    name = c.fname(names.ready_name(job, 0, 0, 3), job)
    fd = os.open(Path(qpath, "ready/0000", name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data[:written])
        assert q.lease() is None
        os.write(fd, data[written:])
    finally:
        os.close(fd)
    assert q.lease() is None  # the completed file is in quarantine, not ready
    (qfile,) = Path(qpath, "quarantine").iterdir()
    assert qfile.name.endswith(".x0001.raw") and qfile.read_bytes() == data
    assert q.last_scan is not None and q.last_scan.errors == []


JOB_ID_OFFSET = 32  # records.md: magic 8, major 2, minor 2, ext len 4, payload len 8, flags 4, alg 1, res 3


def _forged(q: Queue, case: str) -> tuple[bytes, bytes]:
    """(job id, a 200-byte file whose header declares a huge extension or payload)."""
    job = os.urandom(16)
    ext = bytes(65536) if case == "extension 65536" else b""  # valid envelope digest for the 64 KiB case
    header = build_header(job_id=job, max_attempts=3, created_at_ns=q.wall_floor_ns(), extension=ext,
                          payload_length=4, payload_digest=bytes(32)).encode()  # fmt: skip
    raw = bytearray(header)
    assert raw[JOB_ID_OFFSET : JOB_ID_OFFSET + 16] == job
    if case == "extension 2^32-1":
        raw[12:16] = (2**32 - 1).to_bytes(4, "big")
    elif case == "payload 2^40":
        raw[16:24] = (1 << 40).to_bytes(8, "big")
    elif case == "payload 2^64-1":
        raw[16:24] = (2**64 - 1).to_bytes(8, "big")
    return job, (bytes(raw) + ext[:72] + bytes(200))[:200]


@pytest.mark.parametrize("case", ["extension 65536", "extension 2^32-1", "payload 2^40", "payload 2^64-1"])
def test_huge_declared_lengths_are_rejected_before_allocation(one_shard: tuple[Queue, str], case: str) -> None:
    """tracemalloc shows < 1 MiB allocated while a scan rejects the file
    (test_corruption's 2^40 case only bounds it at 64 MiB)."""
    q, qpath = one_shard
    job, data = _forged(q, case)
    name = names.make_filename(q.format.queue_id, names.ready_name(job, 0, 0, 3), shard=0,
                               lease_width_ns=q.format.lease_width_ns)  # fmt: skip
    Path(qpath, "ready/0000", name).write_bytes(data)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with linux.trace() as events:
            got = q.lease()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got is None
    # One bounded read of the file's first bytes (ENVELOPE_READ_BYTES, never a
    # declared length) is all a scan does before the size check rejects it.
    reads = [e.detail[1] for e in events if e.op == "read"]
    assert reads and max(reads) <= ENVELOPE_READ_BYTES, f"read beyond the fixed envelope read: {reads}"
    assert peak < 1 << 20, f"{peak} bytes allocated while rejecting a 200-byte file"
    (qfile,) = Path(qpath, "quarantine").iterdir()
    assert qfile.name.endswith(".x0001.raw") and qfile.read_bytes() == data


# --------------------------------------------------------------------------- permission model: producers' umask


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")
def test_shared_queue_modes_do_not_depend_on_the_producers_umask(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A producer with a private umask (0077) still creates group-usable objects and
    directories (the library fchmods them to 0660/2770), so a consumer of another
    uid in the group can claim, settle and recover them."""
    from tests.integration.test_shared_queue import CONSUMER, PRODUCER, QUEUE_GID, as_user

    base = tmp_path_factory.mktemp("umask")
    parent = str(base)
    while parent != "/":
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
        parent = os.path.dirname(parent)
    path = str(base / "q")
    os.mkdir(path, 0o700)
    os.chown(path, 0, QUEUE_GID)
    Queue.init(path, shards=2, shared=True).close()

    def produce() -> None:
        os.umask(0o077)
        with Queue.open(path) as q:
            for i in range(4):
                q.enqueue(b"job %d" % i)
            q.enqueue(b"later", delay=3600)  # creates delayed/<bucket>/<shards> as this user

    def consume() -> None:
        os.umask(0o077)
        done = 0
        with Queue.open(path) as q:
            while (lease := q.lease()) is not None:
                q.ack(lease)  # creates receipts/<bucket>/<shards> as this user
                done += 1
            q.recover()
        assert done == 4, f"consumed {done} of 4 jobs"

    assert as_user(PRODUCER, produce) == "ok"
    assert as_user(CONSUMER, consume) == "ok"
    for dirpath, dirs, files in os.walk(path):
        for name in dirs:
            st = os.lstat(os.path.join(dirpath, name))
            assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o2770, QUEUE_GID), f"{dirpath}/{name}"
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            want = 0o040 if name == "FORMAT" else 0o060  # FORMAT is read-only (0440) by design
            assert st.st_gid == QUEUE_GID and st.st_mode & want == want, f"{dirpath}/{name}"
            assert st.st_mode & 0o007 == 0, f"{dirpath}/{name} is accessible to others"


def test_blocking_lease_never_watches_through_a_symlinked_shard(tmp_path):
    """inotify watches use IN_DONT_FOLLOW|IN_ONLYDIR: a shard replaced by a
    symlink is not watched through, so activity outside the queue can
    neither wake the consumer nor be observed by it."""
    import shutil

    from steadqd import Queue

    path = str(tmp_path / "q")
    outside = tmp_path / "outside"
    outside.mkdir()
    Queue.init(path, shards=2).close()
    shard = os.path.join(path, "ready", "0000")
    shutil.rmtree(shard)
    os.symlink(outside, shard)
    with Queue.open(path) as q:
        with pytest.raises(NotCommitted, match="ready/0000"):  # the scan refuses the symlink
            q.lease(wait=0.05)  # and sets up the watches first
        fd = q._inotify.fileno()
        with open(f"/proc/self/fdinfo/{fd}") as f:
            watched = {
                int(part.split(":")[1], 16)
                for line in f
                if line.startswith("inotify")
                for part in line.split()
                if part.startswith("ino:")
            }
        assert os.stat(outside).st_ino not in watched
        assert os.stat(os.path.join(path, "ready", "0001")).st_ino in watched
