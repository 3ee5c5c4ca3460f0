"""Store-profile certification: the primitives of store-profiles.md, checked against a live store.

Why it runs against the engine itself: an S3 look-alike can accept
``If-None-Match: *`` and ignore it, list from a lagging index, or drop a
checksum header, and each of those breaks a guarantee of the protocol (two
owners of one job, a job nobody sees, a torn record) without an error ever
being raised. So before a queue is created or opened on an endpoint, these
checks make the engine show each promise, and a queue refuses an engine that
fails one, naming the primitive (:meth:`Certification.require`).

What is checked (each :class:`Check` says what it saw):

* P1 put-if-absent: a second create is refused and the first body stays;
  ``race_width`` simultaneous creates of one key have exactly one winner;
* P2 compare-and-swap: a stale or made-up ETag is refused, so is an ETag for
  an absent key (a CAS must never create); the current one replaces; racing
  CASes have one winner;
* P3 read-after-write: a second client reads each write at once;
* P4 list-after-write: a second client lists each new key at once and stops
  listing a deleted one; keys shaped like StowQ/1's come back in byte order,
  pages are bounded and ``start_after`` is exclusive;
* P5 atomic whole-object PUT: readers racing overwrites of a body larger
  than an engine's chunk see only whole versions;
* P6 store time: every object has one, quantised to the profile's ``G``,
  the same on HEAD and LIST, never going back, moving on after ``G``;
* P7 checksum: a body sent with the wrong SHA-256 is refused (or, for a
  profile that declares read-back, stored as sent: the protocol re-hashes);
* P8 conditional GET (optional unless the profile declares it);
* ranged GET: half-open slices, the whole size reported, absence outside;
* delete: idempotent.

Checks that no StowQ/1 key can observe are reported but not required (byte
order across ``/`` between keys of different shapes: SeaweedFS lists in
directory-tree order). Everything is written under ``scratch_prefix`` and
deleted afterwards; nothing else in the bucket is touched.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from steadqd.errors import (
    AlreadyExists,
    ChecksumMismatch,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StoreProfileViolation,
)
from steadqd.s3.store.base import ObjectStore, StoredObject, StoreProfile

__all__ = ["Check", "Certification", "certify"]

# Above SeaweedFS's default 4 MiB chunk, so an overwrite is several chunks.
LARGE_BODY_BYTES = 4 * 1024 * 1024 + 4096
_JOB = "0123456789abcdef0123456789abcdef"  # a job id in the grammar's shape (32 hex)


@dataclass(frozen=True, slots=True)
class Check:
    """One promise and what the store did with it."""

    primitive: str
    title: str
    passed: bool
    required: bool
    detail: str
    seconds: float = 0.0
    # What a probe raised that was not a verdict (a missing bucket, refused credentials, no connection):
    # kept as the refusal's cause, so the opener can name it instead of ten failed promises.
    error: BaseException | None = field(default=None, compare=False, repr=False)

    def line(self) -> str:
        verdict = "ok" if self.passed else ("FAILED" if self.required else "not kept (not required)")
        return f"{self.primitive} {self.title}: {verdict}: {self.detail} ({self.seconds:.2f} s)"


@dataclass(frozen=True)
class Certification:
    """The result of :func:`certify`: every check, and what was measured on the way."""

    location: str
    profile: StoreProfile
    checks: tuple[Check, ...]
    measured: Mapping[str, str] = field(default_factory=dict)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.required and not c.passed)

    @property
    def certified(self) -> bool:
        return not self.failures

    def report(self) -> str:
        head = f"{self.location} (profile {self.profile.name}): " + (
            "certified" if self.certified else f"NOT certified, {len(self.failures)} failure(s)"
        )
        return "\n".join(
            [head, *(c.line() for c in self.checks), *(f"measured {k}: {v}" for k, v in self.measured.items())]
        )

    def require(self) -> None:
        """Refuse the store unless every required check passed; the error names the first failing primitive."""
        if self.certified:
            return
        first = self.failures[0]
        more = "; ".join(f"{c.primitive} {c.title}: {c.detail}" for c in self.failures[1:])
        raise StoreProfileViolation(
            f"{self.location} cannot hold a StowQ/1 queue: {first.detail}" + (f" (also {more})" if more else ""),
            primitive=f"{first.primitive} {first.title}",
        ) from first.error


T = TypeVar("T")


class _Failed(Exception):
    """A check's verdict, raised from deep in a probe."""


def _expect(condition: bool, detail: str) -> None:
    if not condition:
        raise _Failed(detail)


def _refused(error: type[Exception], call: Callable[[], T], detail: str | Callable[[T], str]) -> None:
    """The check fails unless ``call`` raises ``error``; ``detail`` says what the store did instead.

    A callable ``detail`` is given what the call returned (the body a read should not have found)."""
    try:
        answer = call()
    except error:
        return
    raise _Failed(detail if isinstance(detail, str) else detail(answer))


def _sha(body: bytes) -> bytes:
    return hashlib.sha256(body).digest()


@dataclass
class _Run:
    store: ObjectStore
    peer: ObjectStore
    base: str
    sleep: Callable[[float], None]
    race_width: int
    large_body_bytes: int
    checks: list[Check] = field(default_factory=list)
    measured: dict[str, str] = field(default_factory=dict)

    def key(self, name: str) -> str:
        return self.base + name

    def check(self, primitive: str, title: str, probe: Callable[[], str], *, required: bool = True) -> None:
        started = time.monotonic()
        error: Exception | None = None
        try:
            detail, passed = probe(), True
        except _Failed as failed:
            detail, passed = str(failed), False
        except Exception as exc:  # an unexpected answer is a failed promise, never a crash of the suite
            detail, passed, error = f"unexpected {type(exc).__name__}: {exc}", False, exc
        self.checks.append(Check(primitive, title, passed, required, detail, time.monotonic() - started, error))


def _race(width: int, attempt: Callable[[int], object]) -> tuple[list[int], list[BaseException]]:
    """Run ``attempt(i)`` in ``width`` threads released together; (indexes that returned, errors raised)."""
    barrier = threading.Barrier(width)
    won: list[int] = []
    lost: list[BaseException] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        try:
            barrier.wait()
            attempt(i)
        except BaseException as exc:  # collected and judged by the caller
            with lock:
                lost.append(exc)
        else:
            with lock:
                won.append(i)

    threads = [threading.Thread(target=run, args=(i,), name=f"certify-race-{i}") for i in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost


def _creator(store: ObjectStore, key: str) -> Callable[[int], object]:
    return lambda i: store.put_if_absent(key, f"racer {i}".encode())


def _one_winner(won: list[int], lost: list[BaseException], loser: type[Exception], what: str) -> None:
    strays = [e for e in lost if not isinstance(e, loser)]
    _expect(not strays, f"{what}: a racer failed with {strays[0]!r}" if strays else "")
    _expect(len(won) == 1, f"{what}: {len(won)} of {len(won) + len(lost)} simultaneous writers were told they won")


def _p1(run: _Run) -> str:
    key = run.key(f"p1/claims/0000/{_JOB}/00000001")
    run.store.put_if_absent(key, b"first")
    _refused(
        AlreadyExists,
        lambda: run.store.put_if_absent(key, b"second"),
        "a second create of an existing key was accepted: If-None-Match: * is ignored",
    )
    _expect(run.store.get(key).body == b"first", "the second create changed the body although it was refused")
    for r in range(3):
        raced = run.key(f"p1/race/{r}")
        won, lost = _race(run.race_width, _creator(run.store, raced))
        _one_winner(won, lost, AlreadyExists, f"create race {r}")
        _expect(run.peer.get(raced).body == f"racer {won[0]}".encode(), "the stored body is not the winner's")
    return f"second create refused; 3 races of {run.race_width} creates, one winner each"


def _p2(run: _Run) -> str:
    key = run.key("p2/meta/watermark")
    v1 = run.store.put_if_absent(key, b"v1")
    for wrong in ("0" * 32, v1.etag + "0"):
        _refused(
            PreconditionFailed,
            functools.partial(run.store.put_if_match, key, b"wrong", wrong),
            f"a CAS naming version {wrong} replaced version {v1.etag}: If-Match is ignored",
        )
    v2 = run.store.put_if_match(key, b"v2", v1.etag)
    _expect(v2.etag != v1.etag, "the replaced object kept its ETag: versions cannot be told apart")
    _expect(run.store.get(key).body == b"v2", "the CAS reported success but the body did not change")
    _refused(
        PreconditionFailed,
        lambda: run.store.put_if_match(key, b"v3", v1.etag),
        "a CAS with a stale ETag (the previous version's) was accepted",
    )
    absent = run.key("p2/absent")
    _refused(
        PreconditionFailed,
        lambda: run.store.put_if_match(absent, b"x", v1.etag),
        "a CAS on an absent key created it: If-Match must fail when nothing is there",
    )
    _refused(NotFound, lambda: run.store.head(absent), "a refused CAS on an absent key left an object there")
    current = run.store.head(key).etag
    won, lost = _race(run.race_width, lambda i: run.store.put_if_match(key, f"racer {i}".encode(), current))
    unknown = [e for e in lost if isinstance(e, OutcomeUnknown)] if run.store.profile.cas_race_unknown else []
    _one_winner(won, [e for e in lost if e not in unknown], PreconditionFailed, "CAS race")
    # An unknown outcome is resolved as the protocol resolves it, by reading the key: only the winner's body is there.
    _expect(run.peer.get(key).body == f"racer {won[0]}".encode(), "after the CAS race the body is not the winner's")
    if unknown:
        run.measured["P2 race losers"] = (
            f"{len(unknown)} of {len(lost)} answered with an unknown outcome (5xx), read: lost"
        )
    return f"stale, made-up and absent-key CASes refused; the current ETag replaces; {run.race_width} racing CASes, one winner"


def _p3(run: _Run) -> str:
    for i in range(5):
        key = run.key(f"p3/jobs/0000/{_JOB[:-1]}{i}")
        body = f"job {i}".encode()
        done = run.store.put_if_absent(key, body)
        _expect(run.peer.get(key).body == body, f"a second client did not read {key} right after it was written")
        _expect(run.peer.head(key).etag == done.etag, f"a second client saw another version of {key}")
    key = run.key("p3/cas")
    first = run.store.put_if_absent(key, b"old")
    run.store.put_if_match(key, b"new", first.etag)
    _expect(run.peer.get(key).body == b"new", "a second client read the version before a CAS")
    return "5 creates and a CAS read at once by a second client"


def _keys_in_order(run: _Run, prefix: str) -> list[str]:
    keys: list[str] = []
    after = None
    for _ in range(1000):
        page = run.peer.list_page(prefix, start_after=after, limit=2)
        _expect(len(page.items) <= 2, f"a page bounded at 2 keys held {len(page.items)}")
        keys += [m.key for m in page.items]
        if page.next_start_after is None:
            return keys
        after = page.next_start_after
    raise _Failed("paging never ended")


def _p4(run: _Run) -> str:
    prefix = run.key("p4/")
    shapes = [f"claims/0000/{_JOB}/{g:08x}" for g in (1, 2, 16, 255)]
    shapes += [f"leases/{b:016x}/0000/{_JOB}.{1:08x}" for b in (7, 8)] + [f"jobs/{s:04x}/{_JOB}" for s in (0, 10, 255)]
    written: list[str] = []
    for name in shapes:
        key = prefix + name
        run.store.put_if_absent(key, b"")
        written.append(key)
        listed = [m.key for m in run.peer.list_page(prefix).items]
        _expect(key in listed, f"{key} was not listed right after it was written")
    listed = [m.key for m in run.peer.list_page(prefix).items]
    _expect(listed == sorted(written), f"LIST is not in byte order: {listed}")
    _expect(_keys_in_order(run, prefix) == sorted(written), "paging by 2 did not return every key once, in order")
    after = sorted(written)[3]
    rest = [m.key for m in run.peer.list_page(prefix, start_after=after).items]
    _expect(rest == sorted(written)[4:], f"start_after {after} is not exclusive: {rest[:2]}")
    empty = run.peer.list_page(prefix, limit=0)
    _expect(empty.items == () and empty.next_start_after is None, "a LIST of 0 keys was not an empty last page")
    gone = sorted(written)[0]
    run.store.delete(gone)
    _expect(gone not in [m.key for m in run.peer.list_page(prefix).items], f"{gone} was still listed after delete")
    return f"{len(written)} keys of StowQ/1 shapes listed at once, in byte order, paged by 2; a delete unlists"


def _p4_slash(run: _Run) -> str:
    keys = [run.key(name) for name in ("p4x/a/b", "p4x/a-c", "p4x/a.d")]
    for key in keys:
        run.store.put_if_absent(key, b"")
    listed = [m.key for m in run.peer.list_page(run.key("p4x/")).items]
    _expect(
        listed == sorted(keys),
        f"keys listed as {[k[len(run.base) :] for k in listed]}, byte order is "
        f"{[k[len(run.base) :] for k in sorted(keys)]} (no StowQ/1 key shape can meet this case)",
    )
    return "byte order holds across '/' too"


def _p5(run: _Run) -> str:
    key = run.key("p5/big")
    versions = [bytes([v]) * run.large_body_bytes for v in range(4)]
    etag = run.store.put_if_absent(key, versions[0]).etag
    done = threading.Event()
    torn: list[str] = []
    reads = [0]

    def reader() -> None:
        while not done.is_set() and reads[0] < 200:
            body = run.peer.get(key).body
            reads[0] += 1
            # Version v is the byte v repeated: comparing with it is a memcmp, not a hash.
            if not body or body[0] >= len(versions) or body != versions[body[0]]:
                torn.append(f"a read of {len(body)} bytes matched no version written")

    threads = [threading.Thread(target=reader, name=f"certify-reader-{i}") for i in range(2)]
    for t in threads:
        t.start()
    try:
        for body in versions[1:]:
            etag = run.store.put_if_match(key, body, etag).etag
    finally:
        done.set()
        for t in threads:
            t.join()
    _expect(not torn, torn[0] if torn else "")
    _expect(run.peer.get(key).body == versions[-1], "after the last overwrite the body is not the last version")
    return f"{reads[0]} reads racing 3 overwrites of {run.large_body_bytes} bytes saw only whole versions"


def _p6(run: _Run) -> str:
    g = run.store.profile.granularity_ns
    times: list[int] = []
    offsets: list[int] = []
    prefix = run.key("p6/meta/clock/")
    for i in range(4):
        key = f"{prefix}{i:032x}"
        before = time.time_ns()
        run.store.put_if_absent(key, b"")
        stamp = run.store.head(key).store_time_ns
        offsets.append(stamp - before)
        _expect(stamp > 0, f"{key} has no store time (Last-Modified missing)")
        _expect(stamp % g == 0, f"store time {stamp} is not quantised to the profile's {g} ns")
        times.append(stamp)
    _expect(times == sorted(times), f"store time went back between writes: {times}")
    listed = {m.key: m.store_time_ns for m in run.peer.list_page(prefix).items}
    for i, stamp in enumerate(times):
        other = listed.get(f"{prefix}{i:032x}")
        _expect(other == stamp, f"beacon {i}: HEAD says {stamp}, LIST says {other} (surfaces disagree past G)")
    run.sleep(g / 1e9 * 1.2)
    key = f"{prefix}{4:032x}"
    run.store.put_if_absent(key, b"")
    later = run.store.head(key).store_time_ns
    _expect(
        later > times[-1], f"store time did not move in {g / 1e9 * 1.2:.3g} s (G = {g} ns): {times[-1]} then {later}"
    )
    run.measured["store time minus local clock"] = f"{min(offsets) / 1e6:.0f} to {max(offsets) / 1e6:.0f} ms"
    return f"5 beacons: quantised to {g} ns, HEAD and LIST agree, monotone, moving on after G"


def _p7(run: _Run) -> str:
    key = run.key("p7/wrong-checksum")
    declared = run.store.profile.verifies_checksum
    try:
        run.store.put_if_absent(key, b"body", sha256=_sha(b"not the body"))
        refused = False
    except ChecksumMismatch:
        refused = True
    if refused:
        _refused(NotFound, lambda: run.store.head(key), "the store refused a wrong SHA-256 but kept the object")
    _expect(
        refused or not declared,
        "the store accepted a body whose SHA-256 is wrong, but the profile declares store-side verification",
    )
    every_byte = bytes(range(256)) * 17
    check = run.key("p7/read-back")
    run.store.put_if_absent(check, every_byte)
    _expect(_sha(run.peer.get(check).body) == _sha(every_byte), "the body read back is not the body written")
    run.measured["P7 mode"] = (
        "the store verifies SHA-256" if refused else "read-back (the store does not verify SHA-256)"
    )
    return ("a wrong SHA-256 is refused" if refused else "P7 by read-back, as declared") + "; bodies read back intact"


def _p8(run: _Run) -> str:
    key = run.key("p8/tail")
    first = run.store.put_if_absent(key, b"one")
    _expect(run.peer.get_if_none_match(key, first.etag) is None, "a conditional GET of the current version returned it")
    run.store.put_if_match(key, b"two", first.etag)
    changed = run.peer.get_if_none_match(key, first.etag)
    _expect(
        changed is not None and changed.body == b"two",
        "a conditional GET of a stale version did not return the new one",
    )
    return "If-None-Match answers not-modified for the current version, the object for a stale one"


def _ranges(run: _Run) -> str:
    key = run.key("ranges/payload")
    run.store.put_if_absent(key, b"0123456789")
    for span, want in (((2, 5), b"234"), ((0, 10), b"0123456789"), ((9, 10), b"9")):
        got = run.peer.get(key, span)
        _expect(got.body == want, f"bytes {span} came back as {got.body!r}")
        _expect(got.meta.size == 10, f"bytes {span}: size {got.meta.size} reported, the object has 10")
    for span in ((0, 11), (12, 13), (5, 5), (6, 2)):
        _refused(NotFound, functools.partial(run.peer.get, key, span), functools.partial(_not_absence, span))
    return "half-open slices with the whole size; past-EOF, empty and inverted ranges are absence"


def _not_absence(span: tuple[int, int], got: StoredObject) -> str:
    return f"bytes [{span[0]}, {span[1]}) of a 10-byte object returned {got.body!r}, not absence"


def _delete(run: _Run) -> str:
    key = run.key("delete/once")
    run.store.put_if_absent(key, b"x")
    run.store.delete(key)
    run.store.delete(key)
    run.store.delete(run.key("delete/never-written"))
    _refused(NotFound, lambda: run.peer.head(key), "a deleted object is still there")
    return "deleting twice, or what was never written, succeeds"


def _clean(run: _Run) -> None:
    for _ in range(100):
        page = run.store.list_page(run.base)
        if not page.items:
            return
        for meta in page.items:
            run.store.delete(meta.key)


def certify(
    store: ObjectStore,
    *,
    peer: ObjectStore | None = None,
    scratch_prefix: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    race_width: int = 8,
    large_body_bytes: int = LARGE_BODY_BYTES,
) -> Certification:
    """Check every primitive on ``store``; ``peer`` (another client of the same bucket) reads what it writes.

    Never raises for a broken promise: the :class:`Certification` says which
    one failed and why. Takes about two granularities of wall time (P6 waits
    for the store clock to move).
    """
    base = scratch_prefix if scratch_prefix is not None else f"steadq-certify/{uuid.uuid4().hex}/"
    run = _Run(store, peer or store, base, sleep, race_width, large_body_bytes)
    run.measured["second client"] = "yes" if peer is not None else "no (the same handle read its own writes)"
    try:
        run.check("P1", "put-if-absent", lambda: _p1(run))
        run.check("P2", "compare-and-swap", lambda: _p2(run))
        run.check("P3", "read-after-write", lambda: _p3(run))
        run.check("P4", "list-after-write", lambda: _p4(run))
        run.check("P4", "byte order across '/'", lambda: _p4_slash(run), required=False)
        run.check("P5", "atomic whole-object PUT", lambda: _p5(run))
        run.check("P6", "store time", lambda: _p6(run))
        run.check("P7", "checksum", lambda: _p7(run))
        run.check("P8", "conditional GET", lambda: _p8(run), required=store.profile.conditional_get)
        run.check("ranged GET", "half-open ranges", lambda: _ranges(run))
        run.check("delete", "idempotent delete", lambda: _delete(run))
    finally:
        try:
            _clean(run)
        except Exception as exc:  # a store too broken to clean up after is already reported above
            run.measured["cleanup"] = f"left objects under {base}: {type(exc).__name__}: {exc}"
    return Certification(store.location, store.profile, tuple(run.checks), dict(run.measured))
