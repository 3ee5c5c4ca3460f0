"""Filename grammar, name tags, shards and buckets (the claim scan order is steadqd.fs.scan_order).

Spec: ``names.md``, ``reference/filenames.abnf``, ``clocks.md`` (bucket
arithmetic) and ``protocol.md`` ("Identity changes per transition").

Why this module is so strict: a job's whole identity (generation, attempt,
lease token, deadlines, reason) lives in its *filename*, and the reference
implementation authenticates that name with a tag over an exact ASCII
context. Two spellings of the same values (``A`` vs ``a``, ``0x1`` vs
``00000001``) would be two different names to the reference, so the parser
accepts exactly the canonical bytes and nothing else, and the formatter can
only produce canonical bytes. Nothing here touches the filesystem; every
function is pure so it can be tested against ``vectors.md`` byte for byte.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from steadqd.constants import (
    COMPACT_TMP_PREFIX,
    DEAD_DIR,
    DELAYED_DIR,
    DOMAIN_NAME,
    DOMAIN_SHARD,
    ID_BYTES,
    JOB_EXT,
    MAX_SHARDS,
    NAME_TAG_BYTES,
    QUARANTINE_EXT,
    READY_DIR,
    RECEIPT_EXT,
    RECEIPTS_DIR,
    TAG_STATE_WORD,
    TEMP_EXT,
    U16_MAX,
    U32_MAX,
    U64_MAX,
    QuarantineReason,
    State,
)
from steadqd.errors import CorruptObject, InvalidInput, StateExhausted

__all__ = [
    "JobName",
    "authenticate",
    "dead_job",
    "boot_dashed",
    "boot_raw",
    "bucket_dir",
    "bucket_end",
    "bucket_start",
    "compute_tag",
    "dead_name",
    "delayed_bucket",
    "delayed_name",
    "format_name",
    "is_compact_temp_name",
    "job_hex",
    "lease_bucket",
    "leased_name",
    "trusted_leased_name",
    "leased_identity",
    "make_compact_temp_name",
    "make_filename",
    "make_quarantine_name",
    "make_temp_name",
    "next_attempt",
    "next_generation",
    "parse_bucket_dir",
    "parse_job_id",
    "parse_name",
    "parse_quarantine_name",
    "parse_ready_dir_entry",
    "parse_shard_dir",
    "parse_temp_name",
    "ready_name",
    "receipt_name",
    "shard_dir",
    "shard_of",
    "shard_of_ids",
    "tag_context",
    "terminal_bucket",
    "watermark_bucket",
]

_HEX_RUN = re.compile("[0-9a-f]*")

# Per state: (extension, ordered (prefix, hex width) of the components after the
# job id and before ".k"). Component counts follow: 1 (job) + len(fields) + 1 (tag).
_COMMON = (("g", 16), ("a", 8), ("m", 8))
_GRAMMAR: dict[State, tuple[str, tuple[tuple[str, int], ...]]] = {
    State.READY: (JOB_EXT, _COMMON),
    State.LEASED: (JOB_EXT, _COMMON + (("o", 32), ("b", 16), ("w", 16), ("t", 32))),
    State.DELAYED: (JOB_EXT, _COMMON + (("d", 16),)),
    State.DEAD: (JOB_EXT, _COMMON + (("x", 4),)),
    State.RECEIPT: (RECEIPT_EXT, _COMMON + (("t", 32),)),
}
# Which optional JobName fields each state carries; everything else must be None.
_STATE_FIELDS: dict[State, frozenset[str]] = {
    State.READY: frozenset(),
    State.LEASED: frozenset({"boot_id", "boottime_deadline", "wall_deadline", "lease_token"}),
    State.DELAYED: frozenset({"not_before"}),
    State.DEAD: frozenset({"reason"}),
    State.RECEIPT: frozenset({"lease_token"}),
}


def _grammar_pattern(ext: str, fields: tuple[tuple[str, int], ...]) -> re.Pattern[str]:
    """The whole grammar of one state as one regex (used with ``fullmatch``).

    Exactly the rules :func:`_explain_mismatch` spells out one by one: hex runs
    cannot contain ``.``, so matching the whole name is the same as splitting
    on ``.`` and checking every component's prefix and width.
    """
    comps = ["([0-9a-f]{32})"] + [f"{p}([0-9a-f]{{{w}}})" for p, w in fields] + ["k([0-9a-f]{16})"]
    return re.compile(r"\.".join(comps) + re.escape(ext))


_GRAMMAR_RE = {state: _grammar_pattern(ext, fields) for state, (ext, fields) in _GRAMMAR.items()}
_OPTIONAL_FIELDS = ("boot_id", "boottime_deadline", "wall_deadline", "lease_token", "not_before", "reason")
_U64_FIELDS = ("boottime_deadline", "wall_deadline", "not_before")
_ID_FIELDS = ("boot_id", "lease_token")
_NO_OPTIONAL_FIELDS = dict.fromkeys(_OPTIONAL_FIELDS)


# --------------------------------------------------------------------------- helpers


def _is_hex(s: str, width: int) -> bool:
    """Exactly ``width`` lowercase hex digits (``int(s, 16)`` alone would accept ``_``, ``0x``, spaces, uppercase)."""
    return len(s) == width and _HEX_RUN.fullmatch(s) is not None


def _check_int(what: str, value: object, maximum: int) -> int:
    """Range-check an unsigned field so formatting can never widen a fixed-width component."""
    if type(value) is int and 0 <= value <= maximum:  # the common case first (a bool is not an int here)
        return value
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= maximum:
        raise InvalidInput(f"{what} must be an integer in 0..{maximum}, got {value!r}")
    return value


def _plain_int(value: int) -> int:
    """Turn an IntEnum reason into a plain int (so reprs/equality stay simple); leave anything else for validation."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _check_bytes(what: str, value: object, length: int = ID_BYTES) -> bytes:
    if type(value) is bytes and len(value) == length:  # the common case first
        return value
    if not isinstance(value, (bytes, bytearray)) or len(value) != length:
        raise InvalidInput(f"{what} must be {length} bytes, got {value!r}")
    return bytes(value)


def _check_width(what: str, width: object) -> int:
    """Bucket widths come from FORMAT and are never zero; a zero would divide by zero."""
    if not isinstance(width, int) or isinstance(width, bool) or not 0 < width <= U64_MAX:
        raise InvalidInput(f"{what} must be an integer in 1..{U64_MAX}, got {width!r}")
    return width


def _ascii_name(name: str | bytes) -> str | None:
    """Directory entries may arrive as bytes (bytewise listing); only ASCII without NUL can be a name."""
    if isinstance(name, (bytes, bytearray)):
        try:
            text = bytes(name).decode("ascii")
        except UnicodeDecodeError:
            return None
    elif isinstance(name, str):
        text = name
        if not text.isascii():
            return None
    else:
        return None
    if "\0" in text:
        return None
    return text


def _corrupt(state: State, name: object, why: str) -> CorruptObject:
    return CorruptObject(
        f"{state.value} name {name!r} does not match the grammar: {why}",
        QuarantineReason.FILENAME_PARSE_FAILED,
    )


# --------------------------------------------------------------------------- job ids, boot ids


def job_hex(job_id: bytes) -> str:
    """The 32-hex spelling used in names, tickets and CLI output."""
    return _check_bytes("job_id", job_id).hex()


def parse_job_id(hex32: str) -> bytes:
    """Parse a user-supplied job id; only the canonical lowercase form names a job on disk."""
    if not isinstance(hex32, str) or not _is_hex(hex32, 32):
        raise InvalidInput(f"invalid job id {hex32!r}: expected 32 lowercase hex digits")
    return bytes.fromhex(hex32)


def boot_dashed(raw16: bytes) -> str:
    """Dashed 8-4-4-4-12 form used in paths and tag contexts (the ``.o`` field has no dashes)."""
    if type(raw16) is bytes:  # a process sees one or two boot ids, in every leased name
        return _boot_dashed_memo(raw16)
    return _boot_dashed(raw16)


def _boot_dashed(raw16: bytes) -> str:
    h = _check_bytes("boot id", raw16).hex()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


_boot_dashed_memo = functools.lru_cache(maxsize=16)(_boot_dashed)


def boot_raw(dashed: str | bytes) -> bytes:
    """Parse a canonical dashed boot id (clocks.md): 36 chars, lowercase, dashes at 8/13/18/23.

    A non-canonical spelling would produce a different tag context and path, so
    it is rejected rather than normalised.
    """
    text = _ascii_name(dashed)
    if text is None or len(text) != 36 or any(text[i] != "-" for i in (8, 13, 18, 23)):
        raise InvalidInput(f"invalid boot id {dashed!r}: expected canonical 8-4-4-4-12 lowercase hex")
    digits = text[0:8] + text[9:13] + text[14:18] + text[19:23] + text[24:36]
    if not _is_hex(digits, 32):
        raise InvalidInput(f"invalid boot id {dashed!r}: expected canonical 8-4-4-4-12 lowercase hex")
    return bytes.fromhex(digits)


# Per state: the optional fields that must be None, and how to check the others
# (field, checker, limit), so constructing a name does not re-derive this each time.
_FieldCheck = tuple[str, Callable[[str, Any, int], object], int]


def _checks_for(state: State) -> tuple[tuple[str, ...], tuple[_FieldCheck, ...]]:
    wanted = _STATE_FIELDS[state]
    present: list[_FieldCheck] = []
    for field in _OPTIONAL_FIELDS:
        if field not in wanted:
            continue
        if field in _U64_FIELDS:
            present.append((field, _check_int, U64_MAX))
        elif field in _ID_FIELDS:
            present.append((field, _check_bytes, ID_BYTES))
        else:  # reason
            present.append((field, _check_int, U16_MAX))
    return tuple(f for f in _OPTIONAL_FIELDS if f not in wanted), tuple(present)


_FIELD_CHECKS = {state: _checks_for(state) for state in State}

# The states as module constants: on Python 3.11 an enum class's metaclass has a
# __getattr__, so every ``State.READY`` read pays a slow attribute hook (~900
# instructions; ~20 a strict lifecycle in this module). A global costs nothing.
_READY, _LEASED, _DELAYED, _DEAD, _RECEIPT = State.READY, State.LEASED, State.DELAYED, State.DEAD, State.RECEIPT


# Frozen dataclasses here get their fields as one new dict, set through object.__setattr__:
# a dict made from an instance's inline values (``self.__dict__`` then item stores) keeps
# them outside its entries, where CPython 3.11's cached attribute read cannot find them, so
# every later read of a field took the slow path (~350 instructions instead of ~100).
_SET_FIELDS = object.__setattr__


# --------------------------------------------------------------------------- JobName


@dataclass(frozen=True, init=False)
class JobName:
    """The identity a job object's filename encodes (one of the five job grammars).

    Only the fields of ``state``'s grammar may be set; the rest must be None.
    Construction validates widths so that :meth:`base` can never produce a
    non-canonical (and therefore unauthenticatable) name. The constructor is
    written out (the fields set as one dict, ``_SET_FIELDS``) because the generated
    one of a frozen dataclass sets each field through ``object.__setattr__``, and
    every claim, ack and enqueue builds one.
    """

    state: State
    job_id: bytes
    generation: int
    attempt: int
    max_attempts: int
    boot_id: bytes | None = None
    boottime_deadline: int | None = None
    wall_deadline: int | None = None
    lease_token: bytes | None = None
    not_before: int | None = None
    reason: int | None = None
    tag: bytes | None = None

    def __init__(
        self,
        state: State,
        job_id: bytes,
        generation: int,
        attempt: int,
        max_attempts: int,
        boot_id: bytes | None = None,
        boottime_deadline: int | None = None,
        wall_deadline: int | None = None,
        lease_token: bytes | None = None,
        not_before: int | None = None,
        reason: int | None = None,
        tag: bytes | None = None,
    ) -> None:
        _SET_FIELDS(
            self,
            "__dict__",
            {
                "state": state,
                "job_id": job_id,
                "generation": generation,
                "attempt": attempt,
                "max_attempts": max_attempts,
                "boot_id": boot_id,
                "boottime_deadline": boottime_deadline,
                "wall_deadline": wall_deadline,
                "lease_token": lease_token,
                "not_before": not_before,
                "reason": reason,
                "tag": tag,
            },
        )
        if (  # the untagged ready or receipt name of every enqueue and ack, in one test _check would pass
            tag is None
            and boot_id is None
            and boottime_deadline is None
            and wall_deadline is None
            and not_before is None
            and reason is None
            and (
                lease_token is None
                if state is _READY
                else state is _RECEIPT and type(lease_token) is bytes and len(lease_token) == ID_BYTES
            )
            and type(job_id) is bytes
            and len(job_id) == ID_BYTES
            and type(generation) is int
            and 0 <= generation <= U64_MAX
            and type(attempt) is int
            and 0 <= attempt <= U32_MAX
            and type(max_attempts) is int
            and 0 <= max_attempts <= U32_MAX
        ):
            return
        self._check()

    def _check(self) -> None:
        if not isinstance(self.state, State):
            raise InvalidInput(f"state must be a State, got {self.state!r}")
        job_id, generation, attempt, max_attempts = self.job_id, self.generation, self.attempt, self.max_attempts
        if not (  # the common case in one test (every enqueue and ack builds a name); the checks name the fault
            type(job_id) is bytes
            and len(job_id) == ID_BYTES
            and type(generation) is int
            and 0 <= generation <= U64_MAX
            and type(attempt) is int
            and 0 <= attempt <= U32_MAX
            and type(max_attempts) is int
            and 0 <= max_attempts <= U32_MAX
        ):
            _check_bytes("job_id", job_id)
            _check_int("generation", generation, U64_MAX)
            _check_int("attempt", attempt, U32_MAX)
            _check_int("max_attempts", max_attempts, U32_MAX)
        absent, present = _FIELD_CHECKS[self.state]
        fields = self.__dict__
        for field in absent:
            value = fields[field]
            if value is not None:
                raise InvalidInput(f"{self.state.value} name has no {field} (got {value!r})")
        for field, check, limit in present:
            value = fields[field]
            if value is None:
                raise InvalidInput(f"{self.state.value} name requires {field}")
            check(field, value, limit)
        if self.tag is not None:
            _check_bytes("tag", self.tag, NAME_TAG_BYTES)

    @property
    def job_hex(self) -> str:
        return self.job_id.hex()

    def base(self) -> str:
        """Everything before ``.k``: the part of the name that the tag covers.

        Cached on the instance (the name is frozen): one claim or ack formats,
        tags and authenticates the same name several times.
        """
        cached = self.__dict__.get("_base")
        if cached is None:
            cached = self._format_base()
            self.__dict__["_base"] = cached  # frozen dataclass: bypass __setattr__; not a field
        return cached

    def _format_base(self) -> str:
        # printf-style: ~40% cheaper than f-string format specs for these ints (the same
        # digits for every value in range, which the constructor or the grammar checked).
        common = _COMMON_FORMAT % (self.job_id.hex(), self.generation, self.attempt, self.max_attempts)
        st = self.state
        if st is _READY:
            return common
        if st is _LEASED:
            assert self.boot_id is not None and self.lease_token is not None
            return _LEASED_FORMAT % (
                common,
                self.boot_id.hex(),
                self.boottime_deadline,
                self.wall_deadline,
                self.lease_token.hex(),
            )
        if st is _DELAYED:
            return _DELAYED_FORMAT % (common, self.not_before)
        if st is _DEAD:
            return _DEAD_FORMAT % (common, self.reason)
        assert st is _RECEIPT and self.lease_token is not None
        return f"{common}.t{self.lease_token.hex()}"


_COMMON_FORMAT = "%s.g%016x.a%08x.m%08x"
_LEASED_FORMAT = "%s.o%s.b%016x.w%016x.t%s"
_DELAYED_FORMAT = "%s.d%016x"
_DEAD_FORMAT = "%s.x%04x"
_U64_FORMAT = "%016x"


# --------------------------------------------------------------------------- builders / identity changes


def next_generation(generation: int) -> int:
    """Every transition bumps the generation; at u64 max the operation fails instead of wrapping."""
    if type(generation) is int and 0 <= generation < U64_MAX:  # the checks below, in one test (every ack)
        return generation + 1
    _check_int("generation", generation, U64_MAX)
    if generation == U64_MAX:
        raise StateExhausted(f"generation {generation} cannot be incremented (u64 overflow)")
    return generation + 1


def next_attempt(attempt: int) -> int:
    """Claim bumps the attempt; at u32 max the claim fails instead of wrapping."""
    _check_int("attempt", attempt, U32_MAX)
    if attempt == U32_MAX:
        raise StateExhausted(f"attempt {attempt} cannot be incremented (u32 overflow)")
    return attempt + 1


def _job_bytes(job_id: bytes) -> bytes:
    """A job id as bytes (a bytearray copied); its length is checked by the JobName."""
    return job_id if type(job_id) is bytes else _check_bytes("job_id", job_id)


def ready_name(job_id: bytes, generation: int, attempt: int, max_attempts: int) -> JobName:
    """Untagged ready identity."""
    return JobName(_READY, _job_bytes(job_id), generation, attempt, max_attempts)


def leased_name(
    job_id: bytes,
    generation: int,
    attempt: int,
    max_attempts: int,
    *,
    boot_id: bytes,
    boottime_deadline: int,
    wall_deadline: int,
    lease_token: bytes,
) -> JobName:
    """Untagged leased identity; ``boot_id`` is the raw 16 bytes (the name stores them undashed)."""
    return JobName(
        _LEASED,
        _job_bytes(job_id),
        generation,
        attempt,
        max_attempts,
        boot_id=boot_id,
        boottime_deadline=boottime_deadline,
        wall_deadline=wall_deadline,
        lease_token=lease_token,
    )


def delayed_name(job_id: bytes, generation: int, attempt: int, max_attempts: int, *, not_before: int) -> JobName:
    """Untagged delayed identity; ``not_before`` is the exact requested instant, not the bucket start."""
    return JobName(_DELAYED, _job_bytes(job_id), generation, attempt, max_attempts, not_before=not_before)


def dead_name(job_id: bytes, generation: int, attempt: int, max_attempts: int, *, reason: int) -> JobName:
    """Untagged dead identity with a u16 dead reason."""
    return JobName(_DEAD, _job_bytes(job_id), generation, attempt, max_attempts, reason=_plain_int(reason))


def receipt_name(job_id: bytes, generation: int, attempt: int, max_attempts: int, *, lease_token: bytes) -> JobName:
    """Untagged receipt identity; keeps the token that acknowledged the job."""
    return JobName(_RECEIPT, _job_bytes(job_id), generation, attempt, max_attempts, lease_token=lease_token)


# --------------------------------------------------------------------------- parsing


def parse_name(state: State, name: str | bytes) -> JobName:
    """Parse ``name`` strictly against ``state``'s grammar (names.md "Parser rules").

    Any deviation raises CorruptObject with reason filename_parse_failed, the
    code recovery/fsck quarantine such objects with.
    """
    try:
        if type(state) is not State:  # State(state) runs two Python frames of enum's, even for a State
            state = State(state)
    except ValueError:
        raise InvalidInput(f"no filename grammar for state {state!r}") from None
    text = _ascii_name(name)
    if text is None:
        raise _corrupt(state, name, "not ASCII, or contains NUL")
    m = _GRAMMAR_RE[state].fullmatch(text)
    if m is None:
        raise _explain_mismatch(state, name, text)
    g = m.groups()
    # The grammar fixes every width, so every value is in range: build the
    # JobName without re-running the checks its constructor makes on callers' values.
    values = dict(_NO_OPTIONAL_FIELDS)
    values["state"] = state
    values["job_id"] = bytes.fromhex(g[0])
    values["generation"] = int(g[1], 16)
    values["attempt"] = int(g[2], 16)
    values["max_attempts"] = int(g[3], 16)
    values["tag"] = bytes.fromhex(g[-1])
    # What base() would format: the grammar fixed every width and digit, so the
    # text before ".k<16 hex><ext>" is that very string.
    values["_base"] = text[: -_TAIL_LENGTH[state]]
    if state is _LEASED:
        values["boot_id"] = bytes.fromhex(g[4])
        values["boottime_deadline"] = int(g[5], 16)
        values["wall_deadline"] = int(g[6], 16)
        values["lease_token"] = bytes.fromhex(g[7])
    elif state is _DELAYED:
        values["not_before"] = int(g[4], 16)
    elif state is _DEAD:
        values["reason"] = int(g[4], 16)
    elif state is _RECEIPT:
        values["lease_token"] = bytes.fromhex(g[4])
    return _trusted_name(values)


def is_name(state: State, name: str) -> bool:
    """Would :func:`parse_name` accept ``name`` (a ``str``) for ``state``? Its checks, without the
    JobName it builds: the ready watch asks it of a name in each event it reads (fs/ready_watch.py)."""
    return name.isascii() and "\0" not in name and _GRAMMAR_RE[state].fullmatch(name) is not None


_TAIL_LENGTH = {state: len(".k") + 2 * NAME_TAG_BYTES + len(ext) for state, (ext, _) in _GRAMMAR.items()}


def _trusted_name(values: dict[str, Any]) -> JobName:
    """A JobName from values already known to fit its grammar (every field given).

    Skips the checks of the constructor: callers' values are checked there,
    but a name parsed by the grammar, or made by this package from checked
    parts, would only be checked again. (A frozen dataclass without slots keeps
    its fields in ``__dict__``; filling it is what the generated ``__init__`` does.)
    """
    name_obj = object.__new__(JobName)
    name_obj.__dict__.update(values)
    return name_obj


def trusted_leased_name(
    ready: JobName,
    generation: int,
    attempt: int,
    boot_id: bytes,
    boottime_deadline: int,
    wall_deadline: int,
    token: bytes,
) -> JobName:
    """The leased identity a claim of the parsed name ``ready`` writes, built unchecked.

    Only for values already known to fit: the job id and attempt limit of a
    name the grammar parsed, a generation and attempt from next_generation
    and next_attempt, the handle's boot id, deadlines checked against u64, a
    fresh 16-byte token. Anything from a caller goes through :func:`leased_name`.
    """
    return leased_identity(
        ready.job_id, generation, attempt, ready.max_attempts, boot_id, boottime_deadline, wall_deadline, token
    )


def leased_identity(
    job_id: bytes,
    generation: int,
    attempt: int,
    max_attempts: int,
    boot_id: bytes,
    boottime_deadline: int,
    wall_deadline: int,
    token: bytes,
) -> JobName:
    """:func:`trusted_leased_name` from the fields themselves (the C claim core's caller has no parsed
    ready name): the same unchecked construction, for the same values known to fit."""
    name = object.__new__(JobName)
    name.__dict__.update({
        "state": _LEASED, "job_id": job_id, "generation": generation, "attempt": attempt,
        "max_attempts": max_attempts, "boot_id": boot_id, "boottime_deadline": boottime_deadline,
        "wall_deadline": wall_deadline, "lease_token": token, "not_before": None, "reason": None, "tag": None,
    })  # fmt: skip
    return name


def _explain_mismatch(state: State, name: object, text: str) -> CorruptObject:
    """Which grammar rule ``text`` breaks (only called once the whole-name match failed)."""
    ext, fields = _GRAMMAR[state]
    if not text.endswith(ext):
        return _corrupt(state, name, f"extension is not {ext}")
    comps = text[: -len(ext)].split(".")
    want = len(fields) + 2
    if len(comps) != want:
        return _corrupt(state, name, f"{len(comps)} components, expected {want}")
    if not _is_hex(comps[0], 32):
        return _corrupt(state, name, "job id is not 32 lowercase hex digits")
    for comp, (prefix, width) in zip(comps[1:-1], fields, strict=True):
        if comp[:1] != prefix or not _is_hex(comp[1:], width):
            return _corrupt(state, name, f"component {comp!r} is not {prefix!r} + {width} lowercase hex digits")
    tag = comps[-1]
    if tag[:1] != "k" or not _is_hex(tag[1:], 2 * NAME_TAG_BYTES):
        return _corrupt(state, name, f"component {tag!r} is not 'k' + 16 lowercase hex digits")
    return _corrupt(state, name, "does not match the grammar")


# A ready name has a dot between each of its components (job id, fields, tag) and one
# before the extension: its fields plus two. (The C claim core's scan takes it, and JOB_EXT, from
# here: bridge.Core.)
READY_DOTS = len(_GRAMMAR[State.READY][1]) + 2


def looks_ready(name: str) -> bool:
    """The shape of a ready name (extension and component count), tested without parsing:
    lets a scan of ``ready/<shard>/`` skip the leased names that share it, and strays.
    Only :func:`parse_name` decides whether it *is* one."""
    return name.endswith(JOB_EXT) and name.count(".") == READY_DOTS


def parse_ready_dir_entry(name: str | bytes) -> JobName:
    """Parse an entry of ``ready/<S>/``: ready grammar first, then leased (colocated leases).

    The component counts differ (5 vs 9) so at most one grammar can match.
    """
    try:
        return parse_name(_READY, name)
    except CorruptObject:
        pass
    try:
        return parse_name(_LEASED, name)
    except CorruptObject:
        raise CorruptObject(
            f"ready-directory entry {name!r} matches neither the ready nor the leased grammar",
            QuarantineReason.FILENAME_PARSE_FAILED,
        ) from None


# --------------------------------------------------------------------------- tags


def format_name(name: JobName, tag: bytes) -> str:
    """Full filename: ``<base>.k<tag hex><ext>``."""
    tag = _check_bytes("tag", tag, NAME_TAG_BYTES)
    return f"{name.base()}.k{tag.hex()}{_GRAMMAR[name.state][0]}"


def tag_context(name: JobName, *, shard: int, bucket: int | None, lease_width_ns: int) -> str:
    """The exact ASCII string hashed into the tag (names.md "Context per state").

    The context binds the name to the directory it lives in (state word,
    bucket, shard), so a file moved to another directory stops authenticating.
    For leased names the bucket is derived from the name itself (so the same
    name authenticates in ``ready/S/`` and the legacy ``leased/BOOT/B/S/``);
    the ``bucket`` argument is ignored for ready and leased names.
    """
    s = shard_dir(shard)
    word = TAG_STATE_WORD[name.state]
    if name.state is _READY:
        return f"{word}/-/-/{s}/{name.base()}"
    if name.state is _LEASED:
        assert name.boot_id is not None and name.boottime_deadline is not None
        b = lease_bucket(name.boottime_deadline, lease_width_ns)
        return _LEASED_CONTEXT_FORMAT % (word, boot_dashed(name.boot_id), b, s, name.base())
    if bucket is None:
        raise InvalidInput(f"a {name.state.value} tag context needs the directory bucket")
    return f"{word}/-/{bucket_dir(bucket)}/{s}/{name.base()}"


_LEASED_CONTEXT_FORMAT = "%s/%s/%016x/%s/%s"  # printf-style, as in JobName._format_base


def compute_tag(queue_id: bytes, context: str) -> bytes:
    """First 8 bytes of SHA256("SteadQ-1-name\\0" || queue_id || context)."""
    # A queue id found among the hashers was checked when its hasher was made.
    prefix = _NAME_HASHERS.get(queue_id) if type(queue_id) is bytes else None
    qid = queue_id if prefix is not None else _check_bytes("queue_id", queue_id)
    try:
        ctx = context.encode("ascii")
    except UnicodeEncodeError:
        raise InvalidInput(f"tag context {context!r} is not ASCII") from None
    if prefix is None:
        if len(_NAME_HASHERS) >= _NAME_HASHERS_MAX:
            _NAME_HASHERS.clear()
        prefix = _NAME_HASHERS[qid] = hashlib.sha256(DOMAIN_NAME + qid)
    h = prefix.copy()  # every name of a queue starts with the same bytes: hash them once
    h.update(ctx)
    return h.digest()[:NAME_TAG_BYTES]


_NAME_HASHERS: dict[bytes, Any] = {}  # queue id -> SHA-256 state fed with the domain and the queue id
_NAME_HASHERS_MAX = 64  # a process opens a few queues; a full cache just starts over


def make_filename(queue_id: bytes, name: JobName, *, shard: int, bucket: int | None = None, lease_width_ns: int) -> str:
    """Tag and format ``name`` for the directory identified by ``shard``/``bucket``."""
    st = name.state
    base = name.base()
    plain_shard = type(shard) is int and 0 <= shard < MAX_SHARDS  # shard_dir's fast case
    if plain_shard and st is _READY:  # every enqueue: tag_context's string
        ctx = _READY_CONTEXT % (_SHARD_DIRS[shard], base)
    elif plain_shard and st is _RECEIPT and type(bucket) is int and 0 <= bucket <= U64_MAX:
        ctx = _RECEIPT_CONTEXT % (bucket, _SHARD_DIRS[shard], base)  # every ack
    else:
        ctx = tag_context(name, shard=shard, bucket=bucket, lease_width_ns=lease_width_ns)
    # format_name without its check of the tag, which compute_tag has just made 8 bytes long
    return f"{base}.k{compute_tag(queue_id, ctx).hex()}{_GRAMMAR[st][0]}"


def ready_filename(
    queue_id: bytes, job_id: bytes, generation: int, attempt: int, max_attempts: int, *, shard: int, lease_width_ns: int
) -> str:
    """``make_filename(queue_id, ready_name(...), shard=shard, lease_width_ns=...)``: the name every
    enqueue publishes, formatted without building its JobName when the checks of the two pass in
    one test; anything else goes through them (the same name, the same error)."""
    if job_fields_plain(job_id, generation, attempt, max_attempts) and type(shard) is int and 0 <= shard < MAX_SHARDS:
        base = _COMMON_FORMAT % (job_id.hex(), generation, attempt, max_attempts)
        return f"{base}.k{compute_tag(queue_id, _READY_CONTEXT % (_SHARD_DIRS[shard], base)).hex()}{JOB_EXT}"
    name = ready_name(job_id, generation, attempt, max_attempts)
    return make_filename(queue_id, name, shard=shard, lease_width_ns=lease_width_ns)


def job_fields_plain(job_id: object, generation: object, attempt: object, max_attempts: object) -> bool:
    """The fields every job name has (``<job>.g<generation>.a<attempt>.m<maximum>``) pass the name's
    checks, in one test: the fast case of ready_filename and of receipt_fields_plain."""
    return (
        type(job_id) is bytes
        and len(job_id) == ID_BYTES
        and type(generation) is int
        and 0 <= generation <= U64_MAX
        and type(attempt) is int
        and 0 <= attempt <= U32_MAX
        and type(max_attempts) is int
        and 0 <= max_attempts <= U32_MAX
    )


def receipt_fields_plain(
    job_id: object, generation: object, attempt: object, max_attempts: object, lease_token: object
) -> bool:
    """The receipt name's own fields pass receipt_name's checks, in one test: receipt_filename's fast
    case, and what settle.ack asks before it lets the C core make the receipt's name (which raises
    nothing): one test, so the two cannot drift apart."""
    return (
        job_fields_plain(job_id, generation, attempt, max_attempts)
        and type(lease_token) is bytes
        and len(lease_token) == ID_BYTES
    )


def receipt_filename(
    queue_id: bytes,
    job_id: bytes,
    generation: int,
    attempt: int,
    max_attempts: int,
    *,
    lease_token: bytes,
    shard: int,
    bucket: int,
    lease_width_ns: int,
) -> str:
    """``make_filename(queue_id, receipt_name(...), shard=..., bucket=..., lease_width_ns=...)``: the
    name every ack writes, formatted without building its JobName when the checks of the two pass in
    one test; anything else goes through them (the same name, the same error)."""
    if (
        receipt_fields_plain(job_id, generation, attempt, max_attempts, lease_token)
        and type(shard) is int
        and 0 <= shard < MAX_SHARDS
        and type(bucket) is int
        and 0 <= bucket <= U64_MAX
    ):
        base = _RECEIPT_BASE_FORMAT % (job_id.hex(), generation, attempt, max_attempts, lease_token.hex())
        ctx = _RECEIPT_CONTEXT % (bucket, _SHARD_DIRS[shard], base)
        return f"{base}.k{compute_tag(queue_id, ctx).hex()}{RECEIPT_EXT}"
    name = receipt_name(job_id, generation, attempt, max_attempts, lease_token=lease_token)
    return make_filename(queue_id, name, shard=shard, bucket=bucket, lease_width_ns=lease_width_ns)


_RECEIPT_BASE_FORMAT = _COMMON_FORMAT + ".t%s"  # JobName._format_base of a receipt


# tag_context's strings for a ready and a receipt name, for make_filename's checked arguments
_READY_CONTEXT = TAG_STATE_WORD[_READY] + "/-/-/%s/%s"
_RECEIPT_CONTEXT = TAG_STATE_WORD[_RECEIPT] + "/-/%016x/%s/%s"


def authenticate(queue_id: bytes, name: JobName, *, shard: int, bucket: int | None = None, lease_width_ns: int) -> bool:
    """True iff ``name.tag`` matches the tag recomputed for the directory it was found in.

    An untagged name never authenticates. For legacy leased paths the caller
    must separately check that the directory bucket equals the lease bucket
    derived from the deadline (the tag cannot, since it ignores the path bucket).
    """
    if name.tag is None:
        return False
    ctx = tag_context(name, shard=shard, bucket=bucket, lease_width_ns=lease_width_ns)
    return hmac.compare_digest(compute_tag(queue_id, ctx), name.tag)


def dead_job(
    queue_id: bytes, shard_count: int, lease_width_ns: int, bucket: int, shard: int, name: str | bytes, mode: int
) -> JobName | None:
    """The one definition of a dead job: the parsed name if the entry ``name`` of ``dead/<bucket>/<shard>/``
    (``mode`` its lstat st_mode) is one, else None.

    A dead job is a regular file whose name parses as a dead name, whose job id
    maps to ``shard`` and whose tag authenticates for this bucket and shard.
    Why one function: stats, ``ls``, the dead listing, requeue and purge once
    each had their own test, and stats counted a planted symlink, FIFO or
    garbage name as dead jobs that no admin command would select (issue 30).
    Anything else in ``dead/`` is a stray that fsck names; every view counts
    it as such, never as a job.
    """
    if not stat.S_ISREG(mode):
        return None
    try:
        jn = parse_name(_DEAD, name)
    except CorruptObject:
        return None
    if shard_of(queue_id, jn.job_id, shard_count) != shard:
        return None
    if not authenticate(queue_id, jn, shard=shard, bucket=bucket, lease_width_ns=lease_width_ns):
        return None
    return jn


# --------------------------------------------------------------------------- shards and buckets


def _check_shard_count(shard_count: int) -> int:
    if (
        not isinstance(shard_count, int)
        or isinstance(shard_count, bool)
        or not 1 <= shard_count <= MAX_SHARDS
        or shard_count & (shard_count - 1)
    ):
        raise InvalidInput(f"shard_count must be a power of two in 1..{MAX_SHARDS}, got {shard_count!r}")
    return shard_count


def shard_of(queue_id: bytes, job_id: bytes, shard_count: int) -> int:
    """Low log2(shard_count) bits of the first big-endian u32 of SHA256(shard domain || qid || job)."""
    if type(queue_id) is bytes and type(job_id) is bytes and type(shard_count) is int:
        return shard_of_ids(queue_id, job_id, shard_count)
    return _shard_of(queue_id, job_id, shard_count)


def _shard_of(queue_id: bytes, job_id: bytes, shard_count: int) -> int:
    _check_shard_count(shard_count)
    h = hashlib.sha256(DOMAIN_SHARD + _check_bytes("queue_id", queue_id) + _check_bytes("job_id", job_id)).digest()
    return int.from_bytes(h[:4], "big") & (shard_count - 1)


# Every step of a job's life (enqueue, claim, payload(), ack) asks for its
# shard; a pure function of hashable immutable arguments, so memoised.
@functools.lru_cache(maxsize=4096)
def shard_of_ids(queue_id: bytes, job_id: bytes, shard_count: int) -> int:
    """:func:`shard_of` for a caller whose ids are ``bytes`` and count an ``int`` (its type test passed,
    or the values are the queue format's): memoised, no Python frame on a hit (every enqueue asks).

    A miss runs :func:`_shard_of`'s checks in one test first, the full function for anything they would refuse."""
    if len(queue_id) == ID_BYTES and len(job_id) == ID_BYTES and shard_count in _SHARD_COUNTS:
        h = hashlib.sha256(DOMAIN_SHARD + queue_id + job_id).digest()
        return int.from_bytes(h[:4], "big") & (shard_count - 1)
    return _shard_of(queue_id, job_id, shard_count)


# The counts _check_shard_count accepts (looked up with an int only: True == 1).
_SHARD_COUNTS = frozenset(1 << i for i in range(MAX_SHARDS.bit_length()) if 1 << i <= MAX_SHARDS)


def shard_dir(shard: int) -> str:
    """Shard directory name: always 4 lowercase hex digits, even for small shard counts."""
    if type(shard) is int and 0 <= shard < MAX_SHARDS:  # every step of a job names its shard
        return _SHARD_DIRS[shard]
    return f"{_check_int('shard', shard, 0xFFFF):04x}"


_SHARD_DIRS = tuple(f"{s:04x}" for s in range(MAX_SHARDS))


def bucket_dir(bucket: int) -> str:
    """Bucket directory name: always 16 lowercase hex digits of the u64."""
    return _U64_FORMAT % _check_int("bucket", bucket, U64_MAX)


_BUCKETED_DIRS = {State.DELAYED: DELAYED_DIR, State.RECEIPT: RECEIPTS_DIR, State.DEAD: DEAD_DIR}


def state_dir(state: State, shard: int, bucket: int | None = None) -> str:
    """The directory, relative to the queue root, that holds names of ``state`` in ``shard`` (and ``bucket``).

    Ready and (colocated) leased names live in ``ready/<shard>/``; delayed,
    receipt and dead names in ``<state dir>/<bucket>/<shard>/`` (layout.md).
    """
    top = _BUCKETED_DIRS.get(state)
    if top is None:
        return f"{READY_DIR}/{shard_dir(shard)}"
    if type(bucket) is int and 0 <= bucket <= U64_MAX and type(shard) is int and 0 <= shard < MAX_SHARDS:
        return _BUCKETED_DIR_FORMAT % (
            top,
            bucket,
            _SHARD_DIRS[shard],
        )  # every ack: bucket_dir's and shard_dir's checks
    if bucket is None:
        raise InvalidInput(f"a {state.value} directory needs its bucket")
    return f"{top}/{bucket_dir(bucket)}/{shard_dir(shard)}"


_BUCKETED_DIR_FORMAT = "%s/" + _U64_FORMAT + "/%s"


def parse_shard_dir(name: str | bytes, shard_count: int) -> int | None:
    """Shard number of a directory entry, or None if it is not a canonical shard < shard_count."""
    text = _ascii_name(name)
    if text is None or not _is_hex(text, 4):
        return None
    value = int(text, 16)
    return value if value < shard_count else None


def parse_bucket_dir(name: str | bytes) -> int | None:
    """Bucket number of a directory entry, or None if it is not exactly 16 lowercase hex digits."""
    text = _ascii_name(name)
    if text is None or not _is_hex(text, 16):
        return None
    return int(text, 16)


def lease_bucket(boottime_deadline: int, width: int) -> int:
    """floor(boottime_deadline / lease width): tag context and legacy leased directory."""
    return _check_int("boottime_deadline", boottime_deadline, U64_MAX) // _check_width("lease width", width)


def delayed_bucket(not_before: int, width: int) -> int:
    """ceil(not_before / delayed width): rounding up means promotion is never early."""
    nb = _check_int("not_before", not_before, U64_MAX)
    return -(-nb // _check_width("delayed width", width))


def terminal_bucket(wall_ns: int, width: int) -> int:
    """floor(wall floor / terminal width): dead and receipt directories."""
    if type(wall_ns) is int and 0 <= wall_ns <= U64_MAX and type(width) is int and 0 < width <= U64_MAX:
        return wall_ns // width  # the checks below, in one test (every ack)
    return _check_int("wall_ns", wall_ns, U64_MAX) // _check_width("terminal width", width)


def watermark_bucket(wall_ns: int, delayed_width: int) -> int:
    """floor(wall floor / delayed width): the wall watermark and promotion eligibility."""
    return _check_int("wall_ns", wall_ns, U64_MAX) // _check_width("delayed width", delayed_width)


def bucket_start(bucket: int, width: int) -> int:
    """bucket × width, checked against u64 (clocks.md: a bucket that does not fit cannot be used)."""
    start = _check_int("bucket", bucket, U64_MAX) * _check_width("width", width)
    if start > U64_MAX:
        raise StateExhausted(f"bucket {bucket} × width {width} overflows u64")
    return start


def bucket_end(bucket: int, width: int) -> int:
    """bucket_start + width, checked against u64."""
    end = bucket_start(bucket, width) + width
    if end > U64_MAX:
        raise StateExhausted(f"end of bucket {bucket} (width {width}) overflows u64")
    return end


# --------------------------------------------------------------------------- temp, quarantine, compaction names


def make_temp_name(created_boottime_ns: int, rand16: bytes) -> str:
    """``<16 hex boottime>.<32 hex random>.tmp``: the age is in the name so cleanup needs no stat."""
    bt = _check_int("created_boottime_ns", created_boottime_ns, U64_MAX)
    return f"{bt:016x}.{_check_bytes('temp random', rand16).hex()}{TEMP_EXT}"


def parse_temp_name(name: str | bytes) -> tuple[int, bytes] | None:
    """(created boottime, random bytes), or None: unparseable current-boot temps are kept, not errors."""
    text = _ascii_name(name)
    if text is None or not text.endswith(TEMP_EXT):
        return None
    comps = text[: -len(TEMP_EXT)].split(".")
    if len(comps) != 2 or not _is_hex(comps[0], 16) or not _is_hex(comps[1], 32):
        return None
    return int(comps[0], 16), bytes.fromhex(comps[1])


def make_quarantine_name(qid16: bytes, reason: int) -> str:
    """``q<32 hex id>.x<4 hex reason>.raw``; the id is what admin commands address."""
    r = _check_int("quarantine reason", _plain_int(reason), U16_MAX)
    return f"q{_check_bytes('quarantine id', qid16).hex()}.x{r:04x}{QUARANTINE_EXT}"


def parse_quarantine_name(name: str | bytes) -> tuple[bytes, int] | None:
    """(quarantine id, reason), or None if ``name`` is not a canonical quarantine name."""
    text = _ascii_name(name)
    if text is None or not text.endswith(QUARANTINE_EXT):
        return None
    comps = text[: -len(QUARANTINE_EXT)].split(".")
    if len(comps) != 2:
        return None
    qid, reason = comps
    if qid[:1] != "q" or not _is_hex(qid[1:], 32) or reason[:1] != "x" or not _is_hex(reason[1:], 4):
        return None
    return bytes.fromhex(qid[1:]), int(reason[1:], 16)


def make_compact_temp_name(rand16: bytes) -> str:
    """``.compact-<32 hex>.tmp`` in a receipt shard directory (receipt compaction)."""
    return f"{COMPACT_TMP_PREFIX}{_check_bytes('compact random', rand16).hex()}{TEMP_EXT}"


def is_compact_temp_name(name: str | bytes) -> bool:
    """True for a stale compaction temp, which the next compaction pass may unlink."""
    text = _ascii_name(name)
    if text is None or not text.startswith(COMPACT_TMP_PREFIX) or not text.endswith(TEMP_EXT):
        return False
    return _is_hex(text[len(COMPACT_TMP_PREFIX) : -len(TEMP_EXT)], 32)
