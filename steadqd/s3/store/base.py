"""The object-store boundary: the operations StowQ/1 asks of a bucket, and the classes of their answers.

Why a boundary: the protocol is correct only if the store keeps a handful of
promises (store-profiles.md P1-P8), and only if every answer the transport
gives is sorted, before the protocol sees it, into exactly one of:

* success: :class:`Committed` for a write, the object or listing for a read;
* an expected loss: ``AlreadyExists`` (put-if-absent found the key taken),
  ``PreconditionFailed`` (a CAS named a version that is no longer current),
  ``NotFound``;
* ``NotCommitted``: provably nothing happened (the request never left, or
  the store refused it, or it was a read); retrying is safe;
* ``OutcomeUnknown``: a write left and no verdict came back (timeout,
  connection lost, a 5xx); the caller resolves it by reading the key, and the
  error's ``ticket`` is a :class:`PendingWrite` saying what to look for.

A read never raises ``OutcomeUnknown``: it changed nothing whatever happened.

Keys here are whole object keys inside one bucket (the queue prefix already
joined); their grammar is :mod:`steadqd.s3.keys`' business, not the store's.
ETags are opaque version tokens, kept without the quotes HTTP puts around
them. Store times are nanoseconds quantised down to the profile's
granularity ``G`` on every surface, so a time read by HEAD and the same time
read by LIST can never fall on two sides of a bucket or expiry boundary.
"""

from __future__ import annotations

import email.utils
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from steadqd.errors import InvalidInput, NotFound, PreconditionFailed

__all__ = [
    "CEPH_RGW",
    "Committed",
    "LIST_PAGE_MAX",
    "ListPage",
    "MEMORY",
    "ObjectMeta",
    "ObjectStore",
    "OPERATIONS",
    "PendingWrite",
    "S3_GENERIC",
    "SEAWEEDFS",
    "StoreProfile",
    "parse_last_modified",
    "StoredObject",
    "check_if_match",
    "check_max_bytes",
    "check_range",
    "check_sha256",
    "quantize",
    "sha256_of",
]

# The S3 ListObjectsV2 ceiling; every store pages at this bound or below.
LIST_PAGE_MAX = 1000

# Operation names, as traces and fault scripts spell them.
OPERATIONS = ("put_if_absent", "put_if_match", "get", "get_if_none_match", "head", "list", "delete")
MUTATIONS = frozenset({"put_if_absent", "put_if_match", "delete"})

SECOND_NS = 1_000_000_000
_SINGLE_PUT_ETAG = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class StoreProfile:
    """What an engine promises, declared; :mod:`steadqd.s3.certify` checks the declaration against the engine.

    ``granularity_ns`` is the profile's ``G`` (time.md: skew guard, lease and
    bucket widths must all be at least ``G``). ``time_surface`` is where store
    time is read ("list" or "head"). ``verifies_checksum`` says the store
    refuses a body whose ``x-amz-checksum-sha256`` is wrong (P7 by the
    store); when False, P7 is met by the protocol re-hashing what it reads
    back (every record carries its digest). ``strong_listing`` is P4; only an
    uncertified profile may say False, and only then may the fault injector
    serve stale listings. ``conditional_get`` is P8 (optional).
    ``if_match_quoted`` is how ``If-Match`` must carry the ETag: RFC 9110
    wants quotes, Ceph RGW matches only the bare value. ``if_match_prefix``
    says the engine takes any ``If-Match`` that *starts with* the current
    ETag as a match (Ceph RGW 16.2 compares only the stored ETag's length),
    so a client of it must send only ETags of the one shape a single PUT
    gets (:func:`check_if_match`): then a prefix match is an exact one.
    ``cas_race_unknown`` says a CAS that loses a race to a concurrent one
    may be answered with a 5xx instead of 412 (Ceph RGW: ECANCELED, "500
    UnknownError"): the loser sees ``OutcomeUnknown`` and resolves it by
    reading the key, so certification accepts such losers when declared.
    """

    name: str
    granularity_ns: int
    time_surface: str = "list"
    verifies_checksum: bool = True
    strong_listing: bool = True
    conditional_get: bool = True
    if_match_quoted: bool = True
    if_match_prefix: bool = False
    cas_race_unknown: bool = False

    def __post_init__(self) -> None:
        if self.granularity_ns < 1:
            raise InvalidInput(f"store profile {self.name!r}: granularity_ns must be at least 1 ns")
        if self.time_surface not in ("list", "head"):
            raise InvalidInput(f"store profile {self.name!r}: time_surface must be 'list' or 'head'")


# The in-memory store: nanosecond times from its own clock, every primitive.
MEMORY = StoreProfile("memory", granularity_ns=1)
# Measured against SeaweedFS 4.48 (docs/stowq.md, "Store requirements"): every
# primitive, Last-Modified in whole seconds on HEAD and LIST alike.
SEAWEEDFS = StoreProfile("seaweedfs", granularity_ns=SECOND_NS)
# Measured against Ceph RGW 16.2.15 (docs/stowq.md, "Engines"): If-Match wants the bare ETag and
# matches by prefix, a CAS race's losers may get 500, x-amz-checksum-sha256 is ignored, Last-Modified
# in whole seconds on HEAD (LIST has milliseconds: quantised to the same second).
CEPH_RGW = StoreProfile(
    "ceph-rgw",
    granularity_ns=SECOND_NS,
    verifies_checksum=False,
    if_match_quoted=False,
    if_match_prefix=True,
    cas_race_unknown=True,
)
# Amazon S3 and the engines that copy it closely (store-profiles.md: G = 1 s).
S3_GENERIC = StoreProfile("s3", granularity_ns=SECOND_NS)


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """One object as the store describes it; ``size`` is the whole object's, even for a ranged read."""

    key: str
    etag: str
    size: int
    store_time_ns: int


@dataclass(frozen=True, slots=True)
class StoredObject:
    meta: ObjectMeta
    body: bytes


@dataclass(frozen=True, slots=True)
class ListPage:
    """Keys in byte order; ``next_start_after`` is set when more may follow (pass it back as ``start_after``)."""

    items: tuple[ObjectMeta, ...]
    next_start_after: str | None


@dataclass(frozen=True, slots=True)
class Committed:
    """The store acknowledged the write: the object at ``key`` is now at version ``etag``."""

    key: str
    etag: str


def parse_last_modified(value: str) -> datetime:
    """Parse Last-Modified (ISO 8601 in LIST, RFC 1123 in headers) without dateutil's general parser.

    botocore's default parser costs ~50 µs a timestamp, half the CPU of a
    100-key LIST page; these two forms are all S3 sends. Here, beside the
    store interface, because both S3 transports (``s3`` and ``s3_direct``)
    parse it; botocore, an extra, is imported only for a third form.
    """
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        import botocore.utils

        parsed: datetime = botocore.utils.parse_timestamp(value)
        return parsed


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """The ticket of an ``OutcomeUnknown`` from a store: the write whose verdict never arrived.

    Resolution reads ``key``: an object whose body hashes to ``sha256`` means
    the write (or an identical one) happened; for a delete, absence does.
    """

    op: str
    key: str
    sha256: bytes | None
    if_match: str | None = None

    def describe(self) -> str:
        what = f"{self.op} {self.key}"
        return what if self.if_match is None else f"{what} (If-Match {self.if_match})"

    def outcome_lines(self) -> list[str]:
        """What a command prints about it (``steadqd.backend.OutcomeTicket``)."""
        return [f"unanswered write: {self.describe()}"]


class ObjectStore(Protocol):
    """One bucket of one engine. Every method is one request (or one bounded retry loop of identical requests).

    Implementations: :class:`~steadqd.s3.store.memory.MemoryStore`,
    :class:`~steadqd.s3.store.faults.FaultyStore` (around any other),
    :class:`~steadqd.s3.store.s3.S3Store`. All are safe to share between threads.
    """

    @property
    def profile(self) -> StoreProfile: ...

    @property
    def location(self) -> str:
        """Where the bucket is, for messages (``s3://bucket at http://host:port``); never a credential."""
        ...

    def put_if_absent(self, key: str, body: bytes, *, sha256: bytes | None = None) -> Committed:
        """P1: create ``key`` only if nothing is there (``AlreadyExists`` otherwise).

        ``sha256`` is the digest the caller vouches for (the body's by
        default); a store that verifies checksums refuses a mismatch with
        ``ChecksumMismatch`` and writes nothing.
        """
        ...

    def put_if_match(self, key: str, body: bytes, etag: str, *, sha256: bytes | None = None) -> Committed:
        """P2: replace ``key`` only if it is at version ``etag`` (``PreconditionFailed`` otherwise, also if absent)."""
        ...

    def get(self, key: str, byte_range: tuple[int, int] | None = None, *, max_bytes: int | None = None) -> StoredObject:
        """The object, or the half-open ``[start, end)`` slice of it; an empty, inverted or past-EOF
        range is ``NotFound``, as store-profiles.md's ranged-read rules want.

        ``max_bytes`` (not with ``byte_range``) bounds what is transferred:
        the body is the object's first ``max_bytes`` bytes (all of it when
        shorter) and ``meta.size`` the whole object's, so a reader learns an
        object is too big for what it expects without fetching it. Every
        object in a bucket may have been written by another tenant, so the
        protocol reads nothing unbounded.
        """
        ...

    def get_if_none_match(self, key: str, etag: str) -> StoredObject | None:
        """P8: the object if it is no longer at version ``etag``, None if it still is."""
        ...

    def head(self, key: str) -> ObjectMeta: ...

    def list_page(self, prefix: str, *, start_after: str | None = None, limit: int = LIST_PAGE_MAX) -> ListPage:
        """P4: up to ``limit`` keys under ``prefix`` strictly after ``start_after``; ``limit`` 0 is an empty last page."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; deleting what is not there succeeds (GC retries deletes blindly)."""
        ...

    def close(self) -> None: ...


def sha256_of(body: bytes) -> bytes:
    return hashlib.sha256(body).digest()


def check_sha256(sha256: bytes | None, body: bytes) -> bytes:
    """The digest to send with ``body``: the caller's, after checking it is 32 bytes, or the body's own."""
    if sha256 is None:
        return sha256_of(body)
    if len(sha256) != 32:
        raise InvalidInput(f"sha256 must be 32 bytes, got {len(sha256)}: pass the raw digest, not hex or base64")
    return bytes(sha256)


def check_range(key: str, byte_range: tuple[int, int] | None, size: int) -> tuple[int, int] | None:
    """Validate a half-open range against an object of ``size`` bytes; absence (NotFound) per the ranged-read rules."""
    if byte_range is None:
        return None
    start, end = byte_range
    if start < 0:
        raise InvalidInput(f"byte range of {key}: start {start} is negative")
    if start >= end or end > size:
        raise NotFound(f"{key}: no bytes [{start}, {end}) in an object of {size} bytes")
    return start, end


def check_max_bytes(key: str, byte_range: tuple[int, int] | None, max_bytes: int | None) -> None:
    """Refuse a bound that cannot be honoured: a bounded read is of the object's head, not of a range."""
    if max_bytes is None:
        return
    if byte_range is not None:
        raise InvalidInput(f"get {key}: give a byte range or max_bytes, not both")
    if max_bytes < 1:
        raise InvalidInput(f"get {key}: max_bytes {max_bytes} must be at least 1")


def check_if_match(profile: StoreProfile, key: str, etag: str) -> str:
    """The ETag to send in a CAS, refused (``PreconditionFailed``) if a prefix-matching engine could misread it.

    Every object the protocol writes is one PUT, whose ETag is the body's
    MD5 in 32 hex digits; an ETag of another shape names no version the
    store can hold, and on an ``if_match_prefix`` engine it could match one
    (the current ETag followed by anything), so it is never sent there.
    """
    if profile.if_match_prefix and not _SINGLE_PUT_ETAG.fullmatch(etag):
        raise PreconditionFailed(
            f"{key}: {etag!r} is not a single-PUT ETag (32 hex digits), so it is not the current version; "
            f"not sent, as profile {profile.name!r} matches any If-Match that starts with the current ETag"
        )
    return etag


def check_list_limit(limit: int) -> int:
    if limit < 0:
        raise InvalidInput(f"list limit {limit} is negative")
    return min(limit, LIST_PAGE_MAX)


def quantize(ns: int, granularity_ns: int) -> int:
    """Round a store time down to the profile granularity (time.md: mixed surfaces must agree)."""
    return ns - ns % granularity_ns
