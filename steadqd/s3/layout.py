"""StowQ/1 queue layout: ``init`` writes ``meta/FORMAT``, ``open`` reads it back, and both refuse a bad store.

Why one object for the open queue: every transition needs the same four
facts (the store, the queue's key prefix, its queue id, its FORMAT) and the
same three moves (encode a record for a key, read and check the record at a
key, read an object's store time through the profile's surface). Keeping
them here gives each a single home, so no transition builds a key tag or
decodes a record its own way.

A queue is refused before anything is written to it when its store fails
the certification (store-profiles.md P1-P8: ``StoreProfileViolation`` names
the primitive), and on open when ``meta/FORMAT`` demands a feature bit this
version does not know (``UnsupportedFormat``), is corrupt, or is missing.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace

from steadqd.errors import (
    AlreadyExists,
    CorruptRecord,
    ErrorKind,
    InvalidInput,
    NotCommitted,
    NotFound,
    OutcomeUnknown,
    QueueCorrupt,
    UnsupportedFormat,
)
from steadqd.s3 import keys
from steadqd.s3.certify import certify
from steadqd.s3.records import (
    MAGIC,
    MAJOR,
    MINOR,
    QUEUE_ID_BYTES,
    RECORD_FIELDS_MAX,
    FeatureBit,
    FormatRecord,
    QuarantineReason,
    Record,
    encode_record,
    record_limit,
)
from steadqd.s3.store.base import LIST_PAGE_MAX, ListPage, ObjectMeta, ObjectStore, PendingWrite, sha256_of
from steadqd.s3.verify import read_format, read_record, validate_format

__all__ = [
    "DEFAULT_FORMAT",
    "default_worker_id",
    "with_worker",
    "Oversized",
    "QueueLayout",
    "READ_TRIES",
    "envelope_queue_id",
    "init_layout",
    "open_layout",
]

# How often a read that failed without a verdict (NotCommitted) is repeated
# before the caller hears of it; reads change nothing, so repeating is safe.
READ_TRIES = 3

# The FORMAT a queue gets unless told otherwise: the shapes of docs/stowq.md's
# listing (one-minute leases, five-minute delays, one-hour terminal buckets),
# 64 KiB inline payloads, quarantine records allowed.
DEFAULT_FORMAT = FormatRecord(
    shard_count=16,
    lease_bucket_width_ns=60 * 10**9,
    delayed_bucket_width_ns=300 * 10**9,
    terminal_bucket_width_ns=3600 * 10**9,
    inline_limit=65536,
    required_feature_bits=int(FeatureBit.QUARANTINE),
)

# The first bytes of every record: the 7-array head, the u64 magic, the version,
# then the 16-byte queue id's head (records.md, Framing).
_ENVELOPE_HEAD = bytes((0x87, 0x1B)) + MAGIC.to_bytes(8, "big") + bytes((MAJOR, MINOR, 0x40 | QUEUE_ID_BYTES))


def envelope_queue_id(data: bytes) -> bytes:
    """The queue id a FORMAT's envelope names, so that ``open`` needs only the prefix.

    Nothing is trusted by reading it: the record is then decoded with this id
    and the FORMAT key's tag, which the id must reproduce.
    """
    end = len(_ENVELOPE_HEAD) + QUEUE_ID_BYTES
    if len(data) < end or not data.startswith(_ENVELOPE_HEAD):
        raise QueueCorrupt("meta/FORMAT does not start with a StowQ/1 record envelope: this prefix is not a queue")
    return data[len(_ENVELOPE_HEAD) : end]


def _check_prefix(prefix: str) -> str:
    if prefix.startswith("/") or "//" in prefix:
        raise InvalidInput(f"queue prefix {prefix!r}: give it without a leading slash or empty segments")
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


class Oversized(CorruptRecord):
    """An object larger than anything that may be at its key; only its first bytes were fetched.

    ``meta`` is the object's (its store time dates the quarantine finding).
    """

    def __init__(self, message: str, meta: ObjectMeta, *, payload: bool = False) -> None:
        reason = QuarantineReason.PAYLOAD_CORRUPT if payload else QuarantineReason.ENVELOPE_CORRUPT
        super().__init__(message, reason, error_class="size", payload=payload)
        self.meta = meta


@dataclass(frozen=True)
class QueueLayout:
    """One open queue: where it is and what its FORMAT says. Immutable; share it between threads.

    ``skew_guard_ns`` is time.md's per-profile constant, at least the
    profile's granularity; ``worker_id`` names this participant in claims.
    """

    store: ObjectStore
    prefix: str
    queue_id: bytes
    format: FormatRecord
    skew_guard_ns: int
    worker_id: str

    @property
    def location(self) -> str:
        return f"{self.store.location}/{self.prefix}"

    def key(self, rel: str) -> str:
        """The store key of a queue-relative key."""
        return self.prefix + rel

    @property
    def record_limit(self) -> int:
        """The largest record this queue holds: readers fetch no more, writers write no more."""
        return record_limit(self.format.inline_limit)

    def encode(self, rel: str, record: Record) -> bytes:
        body = encode_record(record, self.queue_id, keys.key_tag(self.queue_id, rel))
        if len(body) > self.record_limit:
            raise InvalidInput(
                f"the record for {self.key(rel)} would be {len(body)} bytes, more than the {self.record_limit} "
                "a reader of this queue fetches; send a smaller payload (or fewer outputs)"
            )
        return body

    def feature(self, bit: FeatureBit) -> bool:
        return bool(self.format.required_feature_bits & bit)

    def get(self, rel: str, *, limit: int | None = None, payload: bool = False) -> tuple[bytes, ObjectMeta] | None:
        """The object at ``rel`` (None when absent), repeating a read that failed without a verdict.

        At most ``limit`` bytes are wanted (the queue's record limit unless
        given) and at most one more is fetched: a larger object raises
        :class:`Oversized` without being read whole (``payload``: it was a
        payload, so the finding is payload_corrupt).
        """
        wanted = self.record_limit if limit is None else limit
        for attempt in range(READ_TRIES):
            try:
                obj = self.store.get(self.key(rel), max_bytes=wanted + 1)
            except NotFound:
                return None
            except NotCommitted:
                if attempt + 1 == READ_TRIES:
                    raise
                continue
            if len(obj.body) > wanted or obj.meta.size > wanted:
                size = max(obj.meta.size, len(obj.body))
                raise Oversized(self.oversized(rel, size, wanted), obj.meta, payload=payload)
            return obj.body, obj.meta
        raise AssertionError("unreachable")

    def oversized(self, rel: str, size: int, limit: int) -> str:
        """The one wording of "this object is too big to be what its key says"."""
        return (
            f"{self.key(rel)} is {size} bytes, more than the {limit} anything at that key can be; "
            "not read (it was not written by this queue's protocol)"
        )

    def exists(self, rel: str) -> bool:
        for attempt in range(READ_TRIES):
            try:
                self.store.head(self.key(rel))
            except NotFound:
                return False
            except NotCommitted:
                if attempt + 1 == READ_TRIES:
                    raise
                continue
            return True
        raise AssertionError("unreachable")

    def list_page(self, prefix_rel: str, *, start_after: str | None = None, limit: int = LIST_PAGE_MAX) -> ListPage:
        """One LIST page under a queue-relative prefix (``start_after`` relative too); keys stay absolute."""
        after = None if start_after is None else self.key(start_after)
        for attempt in range(READ_TRIES):
            try:
                return self.store.list_page(self.key(prefix_rel), start_after=after, limit=limit)
            except NotCommitted:
                if attempt + 1 == READ_TRIES:
                    raise
        raise AssertionError("unreachable")

    def relative(self, key: str) -> str:
        return key[len(self.prefix) :]

    def read(self, rel: str) -> tuple[Record, ObjectMeta] | None:
        """The checked record at ``rel``, or None; a record that fails a check raises CorruptRecord."""
        found = self.get(rel)
        if found is None:
            return None
        body, meta = found
        return read_record(body, self.queue_id, rel, required_feature_bits=self.format.required_feature_bits), meta

    def store_time(self, rel: str, listed: ObjectMeta | None = None) -> int:
        """When the store created ``rel``, read through the profile's declared surface (time.md).

        ``listed`` is the object's LIST entry when the caller has one: on a
        list-surface profile it is already the answer.
        """
        for attempt in range(READ_TRIES):
            try:
                return self._store_time(rel, listed)
            except NotCommitted:
                if attempt + 1 == READ_TRIES:
                    raise
        raise AssertionError("unreachable")

    def _store_time(self, rel: str, listed: ObjectMeta | None) -> int:
        if self.store.profile.time_surface == "list":
            if listed is not None:
                return listed.store_time_ns
            page = self.store.list_page(self.key(rel), limit=1)
            if page.items and page.items[0].key == self.key(rel):
                return page.items[0].store_time_ns
            raise NotFound(f"{self.key(rel)}: not listed, although it was just written")
        return self.store.head(self.key(rel)).store_time_ns


def _guard(store: ObjectStore, skew_guard_ns: int | None) -> int:
    granularity = store.profile.granularity_ns
    if skew_guard_ns is None:
        return granularity
    if skew_guard_ns < granularity:
        raise InvalidInput(
            f"skew_guard_ns {skew_guard_ns} is below the store's time granularity {granularity} ns "
            "(time.md: skew_guard >= G); give at least that"
        )
    return skew_guard_ns


def _certify(store: ObjectStore) -> None:
    certify(store).require()


def init_layout(
    store: ObjectStore,
    prefix: str = "",
    *,
    queue_id: bytes | None = None,
    fmt: FormatRecord = DEFAULT_FORMAT,
    worker_id: str | None = None,
    skew_guard_ns: int | None = None,
    certify_store: bool = True,
) -> QueueLayout:
    """Create the queue at ``prefix``: certify the store, then write ``meta/FORMAT`` put-if-absent.

    An identical FORMAT already there (a retried init) is accepted; any
    other one means a queue exists there and is refused with AlreadyExists.
    """
    prefix = _check_prefix(prefix)
    validate_format(fmt)
    guard = _guard(store, skew_guard_ns)
    if certify_store:
        _certify(store)
    queue_id = queue_id if queue_id is not None else os.urandom(QUEUE_ID_BYTES)
    if len(queue_id) != QUEUE_ID_BYTES:
        raise InvalidInput(f"queue_id must be {QUEUE_ID_BYTES} bytes, got {len(queue_id)}")
    layout = QueueLayout(store, prefix, queue_id, fmt, guard, worker_id or default_worker_id())
    body = layout.encode(keys.FORMAT_KEY, fmt)
    key = layout.key(keys.FORMAT_KEY)
    unknown: OutcomeUnknown | None = None
    try:
        store.put_if_absent(key, body)
        return layout
    except AlreadyExists:
        pass
    except OutcomeUnknown as exc:
        unknown = exc  # resolved by reading the key, like any other create
    try:
        found = layout.get(keys.FORMAT_KEY)
    except NotCommitted as exc:
        if unknown is None:
            raise
        raise OutcomeUnknown(
            f"init of {layout.location}: the store gave no verdict on meta/FORMAT and reading it failed ({exc}); "
            f"read {key} to learn whether the queue exists",
            PendingWrite("put_if_absent", key, sha256_of(body)),
        ) from exc
    if found is None:
        raise NotCommitted(f"init of {layout.location}: meta/FORMAT was not written; run init again")
    if found[0] != body:
        raise AlreadyExists(f"{layout.location} already holds a queue (another meta/FORMAT); open it instead")
    return layout


def open_layout(
    store: ObjectStore,
    prefix: str = "",
    *,
    queue_id: bytes | None = None,
    worker_id: str | None = None,
    skew_guard_ns: int | None = None,
    certify_store: bool = True,
) -> QueueLayout:
    """Open the queue at ``prefix``: certify the store, read and check its FORMAT.

    ``queue_id``, when given, must be the queue's (a guard against opening
    the wrong prefix); otherwise the FORMAT's envelope names it.
    """
    prefix = _check_prefix(prefix)
    guard = _guard(store, skew_guard_ns)
    if certify_store:
        _certify(store)
    try:
        found = store.get(prefix + keys.FORMAT_KEY, max_bytes=RECORD_FIELDS_MAX + 1)
    except NotFound:
        raise NotFound(f"{store.location}/{prefix} is not a queue (no meta/FORMAT); create it with init") from None
    data = found.body
    if len(data) > RECORD_FIELDS_MAX or found.meta.size > RECORD_FIELDS_MAX:
        raise QueueCorrupt(
            f"{store.location}/{prefix}meta/FORMAT is {found.meta.size} bytes, more than a FORMAT record can be "
            f"({RECORD_FIELDS_MAX}): this prefix is not a queue"
        )
    found_id = envelope_queue_id(data)
    if queue_id is not None and bytes(queue_id) != found_id:
        raise QueueCorrupt(
            f"{store.location}/{prefix} is queue {found_id.hex()}, not {bytes(queue_id).hex()}: check the prefix"
        )
    try:
        fmt = read_format(data, found_id)
    except CorruptRecord as exc:
        if exc.kind is ErrorKind.UNSUPPORTED_FORMAT:
            raise UnsupportedFormat(f"{store.location}/{prefix}: {exc.message}") from exc
        raise
    return QueueLayout(store, prefix, found_id, fmt, guard, worker_id or default_worker_id())


def default_worker_id() -> str:
    """``steadqd@HOST/PID``: which machine and process wrote a claim, for the operator reading it.

    Only a renewal compares worker ids, and it takes the lease's own, so
    the id needs no stability across processes; it is what ``steadq show``
    and an ``aws s3 cp`` of a claim tell a person about its owner.
    """
    host = "".join(c if c.isascii() and c.isprintable() and c not in "/ " else "?" for c in socket.gethostname())
    return f"steadqd@{host[:64] or '?'}/{os.getpid()}"


def with_worker(layout: QueueLayout, worker_id: str) -> QueueLayout:
    """The same queue seen by another participant (the model tests' second worker)."""
    if not worker_id:
        raise InvalidInput("worker_id must not be empty")
    return replace(layout, worker_id=worker_id)
