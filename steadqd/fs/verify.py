"""Verifying job files read through an open descriptor.

Everything is checked against the descriptor the caller holds, never against
a path, so a file swapped after opening cannot slip through. Sizes are
checked against the header *before* anything is read into memory: a header
that declares a huge extension or payload is rejected, never allocated.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from steadqd.constants import ENVELOPE_READ_BYTES, HEADER_SIZE, QuarantineReason
from steadqd.errors import CorruptObject
from steadqd.fs import linux
from steadqd.fs.names import JobName
from steadqd.fs.records import JobHeader, check_envelope
from steadqd.fs.tree import Witness

CHUNK = 1 << 20

# Small job files (whole in their first read) whose envelope and payload both verified, by
# (st_dev, st_ino): their Envelope. Decoding and both digests are pure functions of the bytes, so
# a later read of the file that returns exactly the bytes of that envelope's read (payload(),
# then ack, re-read the file the claim verified) would give the same envelope and verify again:
# it is returned without decoding or hashing again (the argument of reread_envelope). Any other
# bytes (the file changed, or another file has the inode now) are checked in full; the checks of
# the read against its own stat and the queue maximum still run.
_VERIFIED: dict[tuple[int, int], Envelope] = {}
_VERIFIED_MAX = 512  # a few hundred jobs in flight per process (at most 2 MiB); a full memo just starts over


# Frozen dataclasses here get their fields as one new dict, set through object.__setattr__:
# a dict made from an instance's inline values (``self.__dict__`` then item stores) keeps
# them outside its entries, where CPython 3.11's cached attribute read cannot find them, so
# every later read of a field took the slow path (~350 instructions instead of ~100).
_SET_FIELDS = object.__setattr__


@dataclass(frozen=True, init=False)
class Envelope:
    """A job file whose header and extension authenticated.

    The constructor sets the frozen fields as one dict (``_SET_FIELDS``): a strict lifecycle reads
    four envelopes, and the generated one sets each field through ``object.__setattr__``.
    """

    header: JobHeader
    extension: bytes
    size: int
    witness: Witness
    # The file's first bytes as read with the header (up to ENVELOPE_READ_BYTES):
    # for a small job the whole file, so the payload needs no second read.
    head: bytes = field(default=b"", repr=False, compare=False)
    # Where the payload starts: the header's extension length, fixed with the header.
    # Stored, not a property: every read of a job asks it once or twice.
    payload_offset: int = field(init=False, repr=False, compare=False)

    def __init__(self, header: JobHeader, extension: bytes, size: int, witness: Witness, head: bytes = b"") -> None:
        _SET_FIELDS(
            self,
            "__dict__",
            {
                "header": header,
                "extension": extension,
                "size": size,
                "witness": witness,
                "head": head,
                "payload_offset": HEADER_SIZE + header.extension_length,
            },
        )


def check_object_stat(st: os.stat_result) -> None:
    """Only singly linked regular files are objects (layout.md)."""
    if not stat.S_ISREG(st.st_mode):
        raise CorruptObject("not a regular file", QuarantineReason.NON_REGULAR_FILE)
    if st.st_nlink != 1:
        raise CorruptObject(f"has {st.st_nlink} hard links, expected 1", QuarantineReason.UNEXPECTED_HARD_LINK)


def read_envelope(fd: int, max_payload: int, st: os.stat_result | None = None) -> Envelope:
    """Decode the header, check the exact size, authenticate the extension."""
    if st is None:
        st = linux.fstat(fd)
    if not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1):  # check_object_stat's test; it names the fault
        check_object_stat(st)
    if st.st_size < HEADER_SIZE:
        raise CorruptObject(
            f"file is {st.st_size} bytes, shorter than the 128-byte header", QuarantineReason.ENVELOPE_CORRUPT
        )
    # One read for header, extension and (small) payload alike; the size
    # checks below still run against the header before anything else is read.
    head = linux.pread(fd, min(st.st_size, ENVELOPE_READ_BYTES), 0)
    if len(head) < HEADER_SIZE:
        raise CorruptObject("short read of the header", QuarantineReason.ENVELOPE_CORRUPT)
    known = _VERIFIED.get((st.st_dev, st.st_ino))
    if known is not None and known.head == head:
        header = known.header  # these bytes decoded to it
    else:
        known = None
        header = JobHeader.decode(head[:HEADER_SIZE])
    if header.payload_length > max_payload:
        raise CorruptObject(
            f"payload length {header.payload_length} exceeds the queue maximum {max_payload}",
            QuarantineReason.ENVELOPE_CORRUPT,
        )
    expected = HEADER_SIZE + header.extension_length + header.payload_length
    if st.st_size != expected:
        raise CorruptObject(f"file is {st.st_size} bytes, header says {expected}", QuarantineReason.ENVELOPE_CORRUPT)
    if known is not None:  # the whole file, byte for byte the one that verified: the same envelope
        return known
    ext_end = HEADER_SIZE + header.extension_length
    extension = head[HEADER_SIZE:ext_end]
    if len(extension) < header.extension_length:
        extension += linux.pread(fd, ext_end - len(head), len(head))
    if len(extension) != header.extension_length:
        raise CorruptObject("short read of the extension", QuarantineReason.ENVELOPE_CORRUPT)
    check_envelope(header, head[:HEADER_SIZE], extension)
    return Envelope(header, extension, st.st_size, Witness(st.st_dev, st.st_ino), head)


def reread_envelope(fd: int, env: Envelope, max_payload: int) -> Envelope:
    """Read the envelope of ``env``'s file again through ``fd``; it must be byte for byte ``env``'s.

    The claim re-reads its evidence after the rename (protocol.md "Claim").
    Bytes identical to ones that decoded and authenticated decode and
    authenticate the same, so comparing them to the verified read proves
    what decoding and hashing them again would; anything else is the file
    having changed. The returned envelope carries the new read, which the
    payload check then hashes.
    """
    st = linux.fstat(fd)
    if not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1):  # check_object_stat's test; it names the fault
        check_object_stat(st)
    if st.st_size != env.size or (st.st_dev, st.st_ino) != (env.witness.dev, env.witness.ino):
        raise CorruptObject("claimed file changed", QuarantineReason.ENVELOPE_CORRUPT)
    if env.payload_offset > len(env.head):  # an extension too big for one read: the full path
        again = read_envelope(fd, max_payload, st)
        if again.header != env.header or again.extension != env.extension:
            raise CorruptObject("claimed file changed", QuarantineReason.ENVELOPE_CORRUPT)
        return again
    head = linux.pread(fd, min(st.st_size, ENVELOPE_READ_BYTES), 0)
    end = env.payload_offset
    if len(head) != len(env.head) or head[:end] != env.head[:end]:
        raise CorruptObject("claimed file changed", QuarantineReason.ENVELOPE_CORRUPT)
    return Envelope(env.header, env.extension, env.size, env.witness, head)


def check_name_matches(header: JobHeader, name: JobName) -> None:
    """The name's job id and attempt limit must be the header's."""
    if header.job_id != name.job_id or header.max_attempts != name.max_attempts:
        raise CorruptObject(
            "name does not match the header (job id or maximum attempts)", QuarantineReason.FILENAME_HEADER_MISMATCH
        )


def iter_payload(fd: int, env: Envelope) -> Iterator[bytes]:
    """Yield the payload in chunks, then verify its digest.

    The digest is checked after the last chunk, so a consumer that streams
    must treat the data as untrusted until the iterator finishes.
    """
    head = _head_payload(env)
    if head is not None:
        # Read together with the header: verify exactly the bytes delivered.
        if head:
            yield head
        _check_payload_digest(hashlib.sha256(head).digest(), env)
        return
    h = hashlib.sha256()
    offset = env.payload_offset
    remaining = env.header.payload_length
    while remaining:
        chunk = linux.pread(fd, min(CHUNK, remaining), offset)
        if not chunk:
            raise CorruptObject("payload ends early", QuarantineReason.ENVELOPE_CORRUPT)
        h.update(chunk)
        offset += len(chunk)
        remaining -= len(chunk)
        yield chunk
    _check_payload_digest(h.digest(), env)


def _head_payload(env: Envelope) -> bytes | None:
    """The payload, when the envelope's first read held all of it (a small job)."""
    offset = env.payload_offset
    end = offset + env.header.payload_length
    return env.head[offset:end] if end <= len(env.head) else None


def _check_payload_digest(digest: bytes, env: Envelope) -> None:
    if digest != env.header.payload_digest:
        raise CorruptObject("payload digest mismatch", QuarantineReason.PAYLOAD_CORRUPT, payload=True)


def _check_head_payload(head: bytes, env: Envelope) -> None:
    """The digest check of a payload read with the envelope (so the whole file is ``env.head``):
    skipped for bytes that verified before, remembered when it passes."""
    w = env.witness
    key = (w.dev, w.ino)
    known = _VERIFIED.get(key)
    if known is env or (known is not None and known.head == env.head):
        return
    _check_payload_digest(hashlib.sha256(head).digest(), env)
    remember_verified(env)


def verified_head(dev: int, ino: int) -> bytes | None:
    """The remembered first read of file (dev, ino), whole and verified, or None: what the C core compares
    its own first read with (lease.core_payload, settle._ack_fast) to skip the digests as this module does."""
    known = _VERIFIED.get((dev, ino))
    return None if known is None else known.head


def remember_verified(env: Envelope) -> None:
    """Note ``env`` (a small file whose header, extension and payload all verified, whole in
    ``env.head``) so that a read of exactly its bytes is not decoded and hashed again."""
    if len(_VERIFIED) >= _VERIFIED_MAX:
        _VERIFIED.clear()
    _VERIFIED[(env.witness.dev, env.witness.ino)] = env


def forget_verified(dev: int, ino: int) -> None:
    """Drop file (dev, ino)'s entry, once no read of it can come (its lease acknowledged): a memo that
    only grows until full keeps each job's envelope (seven tracked objects) alive, and the cyclic GC,
    which runs by the net count of such objects, then runs every few dozen lifecycles."""
    _VERIFIED.pop((dev, ino), None)


def verify_payload(fd: int, env: Envelope) -> None:
    """Hash the whole payload; a small one is already in hand (no generator for it)."""
    head = _head_payload(env)
    if head is None:
        for _ in iter_payload(fd, env):
            pass
    else:
        _check_head_payload(head, env)


def read_payload(fd: int, env: Envelope) -> bytes:
    head = _head_payload(env)
    if head is None:
        return b"".join(iter_payload(fd, env))
    _check_head_payload(head, env)
    return head


def copy_payload(fd: int, env: Envelope, out: BinaryIO) -> int:
    """Stream the payload into ``out``; raises after the copy if it is corrupt."""
    head = _head_payload(env)
    if head is not None:
        # iter_payload's small payload without its generator (every job a worker copies), its digest
        # checked as read_payload checks it: after the copy, skipped for bytes that verified before.
        if head:
            out.write(head)
        _check_head_payload(head, env)
        return len(head)
    n = 0
    for chunk in iter_payload(fd, env):
        out.write(chunk)
        n += len(chunk)
    return n
