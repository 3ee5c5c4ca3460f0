"""The job extension header: a tiny deterministic CBOR subset (records.md).

The extension bytes are covered by the envelope digest, so the encoder must
reproduce the Rust reference byte for byte, and the decoder must be exactly as
strict as the reference's: a job this decoder accepts but the reference
rejects would be leased by one implementation and fail on every claim by the
other (open-questions.md E45). That is why this is a hand-written codec for
exactly five keys instead of a general CBOR library, which would accept (or
emit) forms the reference refuses. The canonical rules themselves (shortest
arguments, the major types) have one home, ``steadqd/cbor.py``, shared with
StowQ/1; its docstring says how the value sets of the two formats differ.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass

from steadqd.cbor import ARRAY as _ARRAY
from steadqd.cbor import BYTES as _BYTES
from steadqd.cbor import FALSE as _FALSE
from steadqd.cbor import MAP as _MAP
from steadqd.cbor import NEGINT as _NEGINT
from steadqd.cbor import SIMPLE as _SIMPLE
from steadqd.cbor import TAG as _TAG
from steadqd.cbor import TEXT as _TEXT
from steadqd.cbor import TRUE as _TRUE
from steadqd.cbor import UINT as _UINT
from steadqd.cbor import encode_head as _head
from steadqd.cbor import shortest
from steadqd.constants import (
    MAX_CBOR_MAP_DECLARED,
    MAX_CONTENT_TYPE,
    MAX_EXTENSION_LENGTH,
    MAX_METADATA_ENTRIES,
    MAX_METADATA_KEY,
    MAX_METADATA_VALUE,
    MAX_PRODUCER_ID,
    MAX_TRACE_CONTEXT,
    U64_MAX,
    QuarantineReason,
)
from steadqd.errors import CorruptObject, InvalidInput

__all__ = ["Extension", "MetadataValue", "decode_extension", "encode_extension"]

MetadataValue = bool | int | str | bytes

# Top-level keys (records.md, "Extension header").
KEY_INITIAL_NOT_BEFORE = 1
KEY_CONTENT_TYPE = 2
KEY_METADATA = 3
KEY_PRODUCER_ID = 4
KEY_TRACE_CONTEXT = 5

_I64_MIN = -(1 << 63)
_NEG_ARG_MAX = (1 << 63) - 1  # -1 - n must fit i64

_METADATA_KEY_RE = re.compile(rb"[a-z0-9][a-z0-9._-]{0,63}")
_KEY_RULE = "[a-z0-9][a-z0-9._-]{0,63}"


@dataclass(frozen=True)
class Extension:
    """Decoded job extension header.

    ``metadata`` is stored as a read-only mapping: the encoded bytes are
    hashed into the envelope digest, so an extension must not change after
    it has been encoded. An empty mapping means the same as ``None`` (key 3
    is omitted when encoding).
    """

    content_type: str
    initial_not_before: int | None = None
    metadata: Mapping[str, MetadataValue] | None = None
    producer_id: str | None = None
    trace_context: bytes | None = None

    def __post_init__(self) -> None:
        if self.metadata is None:
            return
        if not isinstance(self.metadata, Mapping):
            raise InvalidInput("metadata: must be a mapping of text keys to values")
        # Normalising {} to None makes the decoded form of the accepted-but-
        # never-written `03 a0` compare equal to the omitted key.
        frozen = types.MappingProxyType(dict(self.metadata)) if self.metadata else None
        object.__setattr__(self, "metadata", frozen)


# --------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------


def _utf8(value: str, field: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates cannot be stored as CBOR text
        raise InvalidInput(f"{field}: not valid Unicode text ({exc.reason})") from None


def _content_type_problem(raw: bytes) -> str | None:
    if not 1 <= len(raw) <= MAX_CONTENT_TYPE:
        return f"must be 1..{MAX_CONTENT_TYPE} bytes, got {len(raw)}"
    for b in raw:
        if not 0x20 <= b <= 0x7E:
            return f"byte 0x{b:02x} outside printable ASCII 0x20..0x7e"
    return None


def _encode_metadata_value(key: str, value: object) -> bytes:
    # bool first: Python's bool is an int subclass, but True must become
    # 0xf5, never the integer 1 (and the reverse on decode).
    if isinstance(value, bool):
        return bytes((_TRUE if value else _FALSE,))
    if isinstance(value, int):
        if 0 <= value <= U64_MAX:
            return _head(_UINT, value)
        if _I64_MIN <= value < 0:
            return _head(_NEGINT, -1 - value)
        raise InvalidInput(f"metadata value for {key!r}: integer {value} outside u64/i64 range")
    if isinstance(value, str):
        raw = _utf8(value, f"metadata value for {key!r}")
        if len(raw) > MAX_METADATA_VALUE:
            raise InvalidInput(f"metadata value for {key!r}: text is {len(raw)} bytes, limit {MAX_METADATA_VALUE}")
        return _head(_TEXT, len(raw)) + raw
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if len(raw) > MAX_METADATA_VALUE:
            raise InvalidInput(f"metadata value for {key!r}: bytes are {len(raw)} long, limit {MAX_METADATA_VALUE}")
        return _head(_BYTES, len(raw)) + raw
    raise InvalidInput(f"metadata value for {key!r}: unsupported type {type(value).__name__} (bool, int, str or bytes)")


def _encode_metadata(metadata: Mapping[str, MetadataValue]) -> bytes:
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise InvalidInput(f"metadata: {len(metadata)} entries, limit {MAX_METADATA_ENTRIES}")
    entries: list[tuple[bytes, bytes]] = []
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise InvalidInput(f"metadata key {key!r}: must be text")
        raw = _utf8(key, f"metadata key {key!r}")
        if not 1 <= len(raw) <= MAX_METADATA_KEY or _METADATA_KEY_RE.fullmatch(raw) is None:
            raise InvalidInput(f"metadata key {key!r}: must match {_KEY_RULE}")
        entries.append((_head(_TEXT, len(raw)) + raw, _encode_metadata_value(key, value)))
    # Canonical order is bytewise over the *encoded* key (header included),
    # i.e. shorter keys first: "done" (64...) precedes "active" (66...).
    entries.sort(key=lambda e: e[0])
    return _head(_MAP, len(entries)) + b"".join(k + v for k, v in entries)


def encode_extension(ext: Extension) -> bytes:
    """Encode ``ext`` exactly as the reference's ``ExtensionHeader::encode``.

    Raises InvalidInput naming the offending field; enqueue reports that
    before anything touches the disk.
    """
    parts: list[bytes] = []
    if ext.initial_not_before is not None:
        nb = ext.initial_not_before
        if isinstance(nb, bool) or not isinstance(nb, int) or not 0 <= nb <= U64_MAX:
            raise InvalidInput(f"initial_not_before: must be an integer in 0..2^64-1, got {nb!r}")
        parts.append(_head(_UINT, KEY_INITIAL_NOT_BEFORE) + _head(_UINT, nb))

    if not isinstance(ext.content_type, str):
        raise InvalidInput("content_type: must be text")
    ct = _utf8(ext.content_type, "content_type")
    problem = _content_type_problem(ct)
    if problem is not None:
        raise InvalidInput(f"content_type: {problem}")
    parts.append(_head(_UINT, KEY_CONTENT_TYPE) + _head(_TEXT, len(ct)) + ct)

    if ext.metadata:
        parts.append(_head(_UINT, KEY_METADATA) + _encode_metadata(ext.metadata))

    if ext.producer_id is not None:
        if not isinstance(ext.producer_id, str):
            raise InvalidInput("producer_id: must be text")
        pid = _utf8(ext.producer_id, "producer_id")
        if len(pid) > MAX_PRODUCER_ID:
            raise InvalidInput(f"producer_id: {len(pid)} bytes, limit {MAX_PRODUCER_ID}")
        if b"\0" in pid:
            raise InvalidInput("producer_id: must not contain NUL")
        parts.append(_head(_UINT, KEY_PRODUCER_ID) + _head(_TEXT, len(pid)) + pid)

    if ext.trace_context is not None:
        if not isinstance(ext.trace_context, bytes | bytearray | memoryview):
            raise InvalidInput("trace_context: must be bytes")
        tc = bytes(ext.trace_context)
        if len(tc) > MAX_TRACE_CONTEXT:
            raise InvalidInput(f"trace_context: {len(tc)} bytes, limit {MAX_TRACE_CONTEXT}")
        parts.append(_head(_UINT, KEY_TRACE_CONTEXT) + _head(_BYTES, len(tc)) + tc)

    out = _head(_MAP, len(parts)) + b"".join(parts)
    if len(out) > MAX_EXTENSION_LENGTH:
        raise InvalidInput(f"extension: encodes to {len(out)} bytes, limit {MAX_EXTENSION_LENGTH}")
    return out


# --------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------


def _corrupt(message: str) -> CorruptObject:
    return CorruptObject(f"extension CBOR: {message}", QuarantineReason.ENVELOPE_CORRUPT)


_SIMPLE_NAMES = {0xF6: "null", 0xF7: "undefined", 0xF9: "half float", 0xFA: "float", 0xFB: "double", 0xFF: "break"}


class _Reader:
    """Cursor over the input; every read is bounds-checked before slicing."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.remaining:
            raise _corrupt(f"{what}: declares {n} bytes but only {self.remaining} remain")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def head(self, what: str) -> tuple[int, int]:
        """Return (major, argument); for major 7 the argument is the raw initial byte.

        Rejects, wherever they appear: indefinite lengths, reserved
        additional info, tags, arrays and non-shortest arguments.
        """
        if self.remaining < 1:
            raise _corrupt(f"{what}: truncated")
        initial = self.data[self.pos]
        self.pos += 1
        major, info = initial >> 5, initial & 0x1F
        if major == _SIMPLE:
            return major, initial
        if major == _TAG:
            raise _corrupt(f"{what}: tags (major type 6) are not allowed")
        if major == _ARRAY:
            raise _corrupt(f"{what}: arrays (major type 4) are not allowed")
        if info == 31:
            raise _corrupt(f"{what}: indefinite-length items are not allowed")
        if info >= 28:
            raise _corrupt(f"{what}: reserved additional information {info}")
        if info < 24:
            return major, info
        arg = int.from_bytes(self.take(1 << (info - 24), what), "big")
        if not shortest(info, arg):
            raise _corrupt(f"{what}: non-shortest encoding of {arg}")
        return major, arg

    def map_len(self, n: int, what: str) -> None:
        # Each entry needs at least two bytes; refusing larger declarations
        # up front bounds all work by the input size.
        if n > MAX_CBOR_MAP_DECLARED:
            raise _corrupt(f"{what}: declared map length {n} exceeds {MAX_CBOR_MAP_DECLARED}")
        if 2 * n > self.remaining:
            raise _corrupt(f"{what}: declared map length {n} exceeds half of the {self.remaining} remaining bytes")

    def text(self, n: int, what: str) -> str:
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _corrupt(f"{what}: text is not valid UTF-8") from None


def _reject_simple(initial: int, what: str) -> CorruptObject:
    name = _SIMPLE_NAMES.get(initial, f"simple value 0x{initial:02x}")
    return _corrupt(f"{what}: {name} is not allowed")


def _expect(r: _Reader, major: int, what: str, type_name: str) -> int:
    got, arg = r.head(what)
    if got == _SIMPLE:
        if arg in (_TRUE, _FALSE):
            raise _corrupt(f"{what}: expected {type_name}, got a boolean")
        raise _reject_simple(arg, what)
    if got != major:
        raise _corrupt(f"{what}: expected {type_name}, got major type {got}")
    return arg


def _decode_metadata_value(r: _Reader, what: str) -> MetadataValue:
    major, arg = r.head(what)
    if major == _SIMPLE:
        if arg == _TRUE:
            return True
        if arg == _FALSE:
            return False
        raise _reject_simple(arg, what)
    if major == _UINT:
        return arg
    if major == _NEGINT:
        if arg > _NEG_ARG_MAX:
            raise _corrupt(f"{what}: negative integer does not fit i64")
        return -1 - arg
    if major == _BYTES:
        if arg > MAX_METADATA_VALUE:
            raise _corrupt(f"{what}: bytes length {arg} exceeds {MAX_METADATA_VALUE}")
        return r.take(arg, what)
    if major == _TEXT:
        if arg > MAX_METADATA_VALUE:
            raise _corrupt(f"{what}: text length {arg} exceeds {MAX_METADATA_VALUE}")
        return r.text(arg, what)
    # Only major 5 is left: a map inside metadata is nesting too deep.
    raise _corrupt(f"{what}: maps are not allowed as metadata values (nesting too deep)")


def _decode_metadata(r: _Reader) -> dict[str, MetadataValue]:
    n = _expect(r, _MAP, "metadata", "a map")
    r.map_len(n, "metadata")
    if n > MAX_METADATA_ENTRIES:
        raise _corrupt(f"metadata: {n} entries, limit {MAX_METADATA_ENTRIES}")
    out: dict[str, MetadataValue] = {}
    previous: bytes | None = None
    for _ in range(n):
        start = r.pos
        klen = _expect(r, _TEXT, "metadata key", "text")
        if not 1 <= klen <= MAX_METADATA_KEY:
            raise _corrupt(f"metadata key: length {klen} outside 1..{MAX_METADATA_KEY}")
        raw = r.take(klen, "metadata key")
        if _METADATA_KEY_RE.fullmatch(raw) is None:
            raise _corrupt(f"metadata key {raw!r}: must match {_KEY_RULE}")
        encoded = r.data[start : r.pos]
        if previous is not None:
            if encoded == previous:
                raise _corrupt(f"metadata key {raw.decode()!r}: duplicate")
            if encoded < previous:
                raise _corrupt(f"metadata key {raw.decode()!r}: metadata keys not in canonical order")
        previous = encoded
        key = raw.decode("ascii")
        out[key] = _decode_metadata_value(r, f"metadata value for {key!r}")
    return out


def decode_extension(data: bytes) -> Extension:
    """Decode and fully validate stored extension bytes (the claim path).

    Any deviation from the canonical encoding raises
    ``CorruptObject(..., ENVELOPE_CORRUPT)``: the bytes are hashed, so two
    encodings of the same content must never both be accepted.
    """
    if type(data) is bytes and len(data) <= _MEMO_EXTENSION_BYTES:
        return _decode_extension_memo(data)
    return _decode_extension(data)


def _decode_extension(data: bytes) -> Extension:
    if len(data) > MAX_EXTENSION_LENGTH:
        raise _corrupt(f"{len(data)} bytes exceeds {MAX_EXTENSION_LENGTH}")
    r = _Reader(bytes(data))
    n = _expect(r, _MAP, "top level", "a map")
    r.map_len(n, "top level")

    initial_not_before: int | None = None
    content_type: str | None = None
    metadata: dict[str, MetadataValue] | None = None
    producer_id: str | None = None
    trace_context: bytes | None = None

    last_key = 0
    for _ in range(n):
        key = _expect(r, _UINT, "top-level key", "an unsigned integer")
        if not KEY_INITIAL_NOT_BEFORE <= key <= KEY_TRACE_CONTEXT:
            raise _corrupt(f"unknown top-level key {key}")
        if key == last_key:
            raise _corrupt(f"duplicate top-level key {key}")
        if key < last_key:
            raise _corrupt(f"top-level key {key} after {last_key}: keys not in canonical order")
        last_key = key
        if key == KEY_INITIAL_NOT_BEFORE:
            initial_not_before = _expect(r, _UINT, "initial_not_before", "an unsigned integer")
        elif key == KEY_CONTENT_TYPE:
            length = _expect(r, _TEXT, "content_type", "text")
            if length > MAX_CONTENT_TYPE:
                raise _corrupt(f"content_type: length {length} exceeds {MAX_CONTENT_TYPE}")
            content_type = r.text(length, "content_type")
        elif key == KEY_METADATA:
            metadata = _decode_metadata(r)
        elif key == KEY_PRODUCER_ID:
            length = _expect(r, _TEXT, "producer_id", "text")
            if length > MAX_PRODUCER_ID:
                raise _corrupt(f"producer_id: length {length} exceeds {MAX_PRODUCER_ID}")
            producer_id = r.text(length, "producer_id")
            if "\0" in producer_id:
                raise _corrupt("producer_id: contains NUL")
        else:
            length = _expect(r, _BYTES, "trace_context", "bytes")
            if length > MAX_TRACE_CONTEXT:
                raise _corrupt(f"trace_context: length {length} exceeds {MAX_TRACE_CONTEXT}")
            trace_context = r.take(length, "trace_context")

    if r.remaining:
        raise _corrupt(f"{r.remaining} trailing bytes after the top-level map")
    if content_type is None:
        raise _corrupt("content_type (key 2) is required")
    problem = _content_type_problem(content_type.encode("utf-8"))
    if problem is not None:
        raise _corrupt(f"content_type: {problem}")
    return Extension(
        content_type=content_type,
        initial_not_before=initial_not_before,
        metadata=metadata,
        producer_id=producer_id,
        trace_context=trace_context,
    )


# Most jobs of a queue carry the same few extensions (often just a content
# type): the decoded value is immutable (frozen, read-only metadata) and a
# pure function of the bytes, so small ones are memoised. A failed decode
# raises and is never cached.
_MEMO_EXTENSION_BYTES = 512
_decode_extension_memo = functools.lru_cache(maxsize=256)(_decode_extension)
