"""Canonical CBOR (RFC 8949 §4.2.1, core deterministic encoding): the one home of its rules.

Both formats hash CBOR bytes (SteadQ/1 the job extension inside the envelope
digest, StowQ/1 a whole record inside its record digest), so a value must
have exactly one encoding, and a reader must refuse every other one: an
encoding one implementation accepts and the other refuses is a job that one
of them can never settle. The rules both formats share are here:

* every argument (integer value, length, count) in its shortest form
  (:func:`encode_head`, :func:`shortest`);
* definite lengths only (additional information 31 is refused, and so are the
  reserved values 28-30);
* map keys strictly increasing by their encoded bytes, which for text keys
  means shorter keys first, then bytewise.

The two formats accept different value sets, and each keeps its own schema:

* SteadQ/1's extension (``steadqd.fs.cbor``) is a map with integer keys 1-5,
  whose metadata values may be negative integers (major type 1, within i64);
  it refuses arrays anywhere, maps nested deeper than the metadata map, and
  anything longer than its stated limits.
* StowQ/1 (this module's :func:`decode` and :func:`encode`, and the record
  decoder in ``steadqd.s3.records`` built on :class:`Reader`) takes unsigned
  integers, booleans, byte and text strings, arrays and maps, nested up to
  :data:`MAX_DEPTH` levels, with no length limit beyond the input; it refuses
  negative integers, tags, floats, null, undefined and other simple values.

Errors are :class:`steadqd.errors.CorruptRecord` whose ``error_class`` is
``cbor:<check>``, one value per check of the StowQ/1 reference decoder, and
whose reason is envelope_corrupt (0x0001 in both formats' registries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias, Union

from steadqd.constants import U64_MAX, QuarantineReason
from steadqd.errors import CorruptRecord, InvalidInput

__all__ = [
    "ARRAY",
    "BYTES",
    "MAP",
    "MAX_DEPTH",
    "SIMPLE",
    "TEXT",
    "UINT",
    "CborMap",
    "Reader",
    "Value",
    "corrupt",
    "decode",
    "encode",
    "encode_head",
    "shortest",
]

# Major types.
UINT = 0
NEGINT = 1
BYTES = 2
TEXT = 3
ARRAY = 4
MAP = 5
TAG = 6
SIMPLE = 7

FALSE = 0xF4
TRUE = 0xF5
SIMPLE_FALSE = 20  # the simple values of false and true (0xf4, 0xf5)
SIMPLE_TRUE = 21

# A record nests three levels (envelope, fields, claim basis); the bound keeps
# hostile nesting from reaching Python's recursion limit.
MAX_DEPTH = 64

# Smallest argument each additional-information width may carry (24..27).
_MINIMUM = {24: 24, 25: 0x100, 26: 0x1_0000, 27: 0x1_0000_0000}

# error_class values, one per check.
UNEXPECTED_EOF = "cbor:unexpected_eof"
NON_MINIMAL_INTEGER = "cbor:non_minimal_integer"
INDEFINITE_LENGTH = "cbor:indefinite_length"
UNSUPPORTED_MAJOR_TYPE = "cbor:unsupported_major_type"
UNSUPPORTED_SIMPLE = "cbor:unsupported_simple"
INVALID_UTF8 = "cbor:invalid_utf8"
UNSORTED_MAP_KEYS = "cbor:unsorted_map_keys"
DUPLICATE_MAP_KEY = "cbor:duplicate_map_key"
TRAILING_BYTES = "cbor:trailing_bytes"
MAX_DEPTH_EXCEEDED = "cbor:max_depth"


@dataclass(frozen=True)
class CborMap:
    """A decoded map, its pairs in wire order.

    Not a dict: a key may itself be an array or a map (the decoder accepts any
    canonical value as a key), and the order on the wire is what the
    canonical-order check and the re-encoding test look at.
    """

    pairs: tuple[tuple[Value, Value], ...]


Value: TypeAlias = Union[int, bool, bytes, str, tuple["Value", ...], CborMap]  # noqa: UP007


def corrupt(error_class: str, message: str) -> CorruptRecord:
    return CorruptRecord(f"CBOR: {message}", QuarantineReason.ENVELOPE_CORRUPT, error_class=error_class)


# --------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------


def encode_head(major: int, arg: int) -> bytes:
    """Initial byte plus argument in the shortest form, the only one a reader accepts."""
    top = major << 5
    if arg < 24:
        return bytes((top | arg,))
    if arg < 0x100:
        return bytes((top | 24, arg))
    if arg < 0x1_0000:
        return bytes((top | 25,)) + arg.to_bytes(2, "big")
    if arg < 0x1_0000_0000:
        return bytes((top | 26,)) + arg.to_bytes(4, "big")
    return bytes((top | 27,)) + arg.to_bytes(8, "big")


def shortest(info: int, arg: int) -> bool:
    """True when ``arg``, read with additional information 24..27, could not have been shorter."""
    return arg >= _MINIMUM[info]


def _encode_into(value: Value, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise InvalidInput(f"CBOR value nests deeper than {MAX_DEPTH} levels, which no reader accepts")
    # bool before int: True is an int in Python but must encode as 0xf5.
    if isinstance(value, bool):
        out.append(TRUE if value else FALSE)
    elif isinstance(value, int):
        if not 0 <= value <= U64_MAX:
            raise InvalidInput(f"CBOR integer {value} is outside 0..2^64-1 (negative integers are not allowed)")
        out += encode_head(UINT, value)
    elif isinstance(value, bytes):
        out += encode_head(BYTES, len(value))
        out += value
    elif isinstance(value, str):
        raw = value.encode("utf-8", errors="strict")
        out += encode_head(TEXT, len(raw))
        out += raw
    elif isinstance(value, tuple):
        out += encode_head(ARRAY, len(value))
        for item in value:
            _encode_into(item, out, depth + 1)
    elif isinstance(value, CborMap):
        entries: list[tuple[bytes, Value]] = []
        for key, item in value.pairs:
            encoded = bytearray()
            _encode_into(key, encoded, depth + 1)
            entries.append((bytes(encoded), item))
        entries.sort(key=lambda e: e[0])
        for (a, _), (b, _) in zip(entries, entries[1:], strict=False):
            if a == b:
                raise InvalidInput(f"CBOR map has the key {a.hex()} twice; a reader refuses duplicate keys")
        out += encode_head(MAP, len(entries))
        for key_bytes, item in entries:
            out += key_bytes
            _encode_into(item, out, depth + 1)
    else:
        raise InvalidInput(f"CBOR cannot encode a {type(value).__name__} (uint, bool, bytes, str, tuple, CborMap)")


def encode(value: Value) -> bytes:
    """The canonical encoding of ``value``; map keys are sorted here, whatever their order in ``pairs``."""
    out = bytearray()
    _encode_into(value, out, 1)
    return bytes(out)


# --------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------


class Reader:
    """A cursor over canonical CBOR; every read is bounds-checked before it slices.

    The record decoder drives it item by item, so it can check fields in the
    order the reference decoder does; :func:`decode` uses it for whole values.
    """

    __slots__ = ("data", "depth", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.depth = 0

    @property
    def done(self) -> bool:
        return self.pos == len(self.data)

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise corrupt(UNEXPECTED_EOF, f"an item declares {n} bytes at offset {self.pos}, {self.remaining} remain")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def head(self) -> tuple[int, int]:
        """(major type, argument) of the next item; for major 7 the argument is the simple value.

        A float's bits are its argument here, so a float is refused by whoever
        looks at it: as a non-shortest head when its bits are small, as an
        unsupported simple value otherwise.
        """
        start = self.pos
        if start >= len(self.data):
            self.take(1)  # raises: the input ends where an item should start
        initial = self.data[start]
        self.pos = start + 1
        major, info = initial >> 5, initial & 0x1F
        if info < 24:
            return major, info
        if info >= 28:
            raise corrupt(INDEFINITE_LENGTH, f"additional information {info} at offset {start} (definite lengths only)")
        arg = int.from_bytes(self.take(1 << (info - 24)), "big")
        if not shortest(info, arg):
            raise corrupt(NON_MINIMAL_INTEGER, f"the argument {arg} at offset {start} is not in its shortest form")
        return major, arg

    def text(self, n: int) -> str:
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise corrupt(INVALID_UTF8, f"the text ending at offset {self.pos} is not valid UTF-8") from None

    def value(self) -> Value:
        """The next whole item, with every canonical rule checked."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise corrupt(MAX_DEPTH_EXCEEDED, f"items nest deeper than {MAX_DEPTH} levels")
        start = self.pos
        major, arg = self.head()
        result: Value
        if major == UINT:
            result = arg
        elif major == BYTES:
            result = self.take(arg)
        elif major == TEXT:
            result = self.text(arg)
        elif major == ARRAY:
            # The declared count is untrusted: items are read until the input runs out.
            items: list[Value] = []
            for _ in range(arg):
                items.append(self.value())
            result = tuple(items)
        elif major == MAP:
            result = self._map(arg)
        elif major == SIMPLE:
            if arg == SIMPLE_FALSE:
                result = False
            elif arg == SIMPLE_TRUE:
                result = True
            else:
                raise corrupt(UNSUPPORTED_SIMPLE, f"simple value or float 0x{self.data[start]:02x} at offset {start}")
        else:
            what = "negative integer" if major == NEGINT else "tag"
            raise corrupt(UNSUPPORTED_MAJOR_TYPE, f"a {what} (major type {major}) at offset {start}")
        self.depth -= 1
        return result

    def _map(self, count: int) -> CborMap:
        pairs: list[tuple[Value, Value]] = []
        keys: list[bytes] = []
        for _ in range(count):
            key_start = self.pos
            key = self.value()
            keys.append(self.data[key_start : self.pos])
            pairs.append((key, self.value()))
        # The order is checked once the whole map is read, as the reference
        # does: a map with an out-of-order key and a bad value later on fails
        # on the value. The raw key bytes are compared, never re-encoded.
        for previous, current in zip(keys, keys[1:], strict=False):
            if current == previous:
                raise corrupt(DUPLICATE_MAP_KEY, f"the map key {current.hex()} appears twice")
            if current < previous:
                raise corrupt(UNSORTED_MAP_KEYS, f"the map key {current.hex()} comes after {previous.hex()}")
        return CborMap(tuple(pairs))


def decode(data: bytes) -> Value:
    """Decode exactly one canonical value that covers all of ``data``."""
    reader = Reader(bytes(data))
    value = reader.value()
    if not reader.done:
        raise corrupt(TRAILING_BYTES, f"{reader.remaining} bytes follow the value")
    return value
