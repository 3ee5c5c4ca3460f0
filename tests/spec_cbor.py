"""The job extension's deterministic CBOR, decoded as records.md "Extension header" states it.

Part of the test oracle (see tests/spec_oracle.py for why it shares no code
with ``steadqd``). Every job the library writes carries an extension that must
decode when a claim reports its content type, so a tree holding one that does
not is a tree the library should never have written.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tests.spec_oracle import MAX_EXTENSION_LENGTH, SpecViolation

_MAX_MAP_DECLARED = 2048
_METADATA_KEY = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_KEYS = {1: "initial_not_before", 2: "content_type", 3: "metadata", 4: "producer_id", 5: "trace_context"}
_UINT, _NEGINT, _BYTES, _TEXT, _MAP, _SIMPLE = 0, 1, 2, 3, 5, 7

Value = bool | int | str | bytes


def _need(ok: bool, why: str) -> None:
    if not ok:
        raise SpecViolation(f"extension: {why}")


class _Reader:
    """A cursor over the extension bytes that refuses every form the strict decoder refuses."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        _need(self.pos + n <= len(self.data), "truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def head(self) -> tuple[int, int]:
        """(major type, argument) of the next item.

        records.md "Encoding rules" and "Decoder strictness": shortest-form
        arguments only; no indefinite lengths, tags, arrays, floats, null,
        undefined or simple values other than false (0xf4) and true (0xf5).
        """
        initial = self.take(1)[0]
        major, info = initial >> 5, initial & 31
        if major == _SIMPLE:
            _need(initial in (0xF4, 0xF5), f"simple value or float 0x{initial:02x}")
            return major, info
        _need(major not in (4, 6), "arrays and tags are not allowed")
        _need(info < 28, "indefinite length or reserved additional information")
        if info < 24:
            return major, info
        size = 1 << (info - 24)
        value = int.from_bytes(self.take(size), "big")
        _need(value >= (24 if size == 1 else 1 << (4 * size)), "non-shortest argument")
        return major, value

    def text(self, length: int) -> str:
        try:
            return self.take(length).decode("utf-8")
        except UnicodeDecodeError:
            raise SpecViolation("extension: text is not valid UTF-8") from None

    def map_length(self, count: int) -> int:
        """records.md: a declared length may exceed neither half the remaining bytes nor 2048."""
        _need(count * 2 <= len(self.data) - self.pos and count <= _MAX_MAP_DECLARED, f"map declares {count} entries")
        return count


def _text(r: _Reader, limit: int) -> str:
    major, length = r.head()
    _need(major == _TEXT and length <= limit, f"expected text of at most {limit} bytes")
    return r.text(length)


def _bytes(r: _Reader, limit: int) -> bytes:
    major, length = r.head()
    _need(major == _BYTES and length <= limit, f"expected bytes of at most {limit}")
    return r.take(length)


def _uint(r: _Reader) -> int:
    major, value = r.head()
    _need(major == _UINT, "expected an unsigned integer")
    return value


def _content_type(r: _Reader) -> str:
    """Key 2: 1..255 bytes, each printable ASCII 0x20..0x7e."""
    text = _text(r, 255)
    _need(len(text) >= 1 and all(0x20 <= ord(c) <= 0x7E for c in text), "content_type is empty or not printable")
    return text


def _producer_id(r: _Reader) -> str:
    """Key 4: at most 255 bytes, no NUL."""
    text = _text(r, 255)
    _need("\0" not in text, "producer_id holds a NUL")
    return text


def _metadata_value(r: _Reader) -> Value:
    """false, true, an unsigned or (i64) negative int, text or bytes of at most 4096 bytes; never a map."""
    major, arg = r.head()
    if major == _SIMPLE:
        return arg == 21
    if major == _UINT:
        return arg
    if major == _NEGINT:
        _need(arg <= (1 << 63) - 1, "negative integer does not fit i64")
        return -1 - arg
    _need(major in (_TEXT, _BYTES), "a metadata value is a map (nesting deeper than the metadata map)")
    _need(arg <= 4096, f"metadata value of {arg} bytes exceeds 4096")
    return r.text(arg) if major == _TEXT else r.take(arg)


def _metadata(r: _Reader) -> dict[str, Value]:
    """Key 3: ≤ 256 entries, valid keys, strictly ascending by their encoded bytes."""
    major, count = r.head()
    _need(major == _MAP and r.map_length(count) <= 256, "metadata is not a map of at most 256 entries")
    out: dict[str, Value] = {}
    previous = b""
    for _ in range(count):
        start = r.pos
        key = _text(r, 64)
        encoded = r.data[start : r.pos]
        _need(_METADATA_KEY.fullmatch(key) is not None, f"metadata key {key!r} breaks the key rule")
        _need(encoded > previous, "metadata keys not unique and in canonical order")
        previous = encoded
        out[key] = _metadata_value(r)
    return out


_READERS: dict[int, Callable[[_Reader], object]] = {
    1: _uint,
    2: _content_type,
    3: _metadata,
    4: _producer_id,
    5: lambda r: _bytes(r, 1024),
}


def decode_extension(data: bytes) -> dict[str, object]:
    """records.md "Extension header": the fields by name; raises SpecViolation on any rule broken."""
    _need(len(data) <= MAX_EXTENSION_LENGTH, f"{len(data)} bytes exceeds {MAX_EXTENSION_LENGTH}")
    r = _Reader(data)
    major, count = r.head()
    _need(major == _MAP, "the top level is not a map")
    out: dict[str, object] = {}
    last = 0
    for _ in range(r.map_length(count)):
        major, key = r.head()
        _need(major == _UINT and 1 <= key <= 5, "a top-level key is not an unsigned integer in 1..5")
        _need(key > last, f"top-level key {key} duplicated or out of order")
        last = key
        out[_KEYS[key]] = _READERS[key](r)
    _need(r.pos == len(data), "trailing bytes")
    _need("content_type" in out, "content_type is required")
    return out
