"""The JSON side documents of SteadQ/1 (records.md): the recovery cursor and transition tickets.

Both are parsed strictly, as the reference does (serde with deny_unknown_fields):
duplicate keys, unknown fields, non-canonical numbers and out-of-range values
are refused, because a cursor decides where recovery resumes and a ticket decides
which objects ``resolve`` may touch. Pure: text in, values out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from steadqd.constants import ID_BYTES, U16_MAX, U32_MAX, U64_MAX
from steadqd.errors import ErrorKind, InvalidInput, QueueCorrupt, SteadQError
from steadqd.fs.records import BOOT_ID_RE, DIGEST_BYTES, is_uint, need_bytes

__all__ = [
    "CURSOR_PHASES",
    "DeadLocation",
    "DelayedLocation",
    "EnqueueTicket",
    "LeasedLocation",
    "Location",
    "ReadyLocation",
    "ReceiptLocation",
    "TICKET_OPERATIONS",
    "TICKET_PHASES",
    "TransitionTicket",
    "cursor_json",
    "reset_cursor_json",
    "validate_cursor",
]

# ==========================================================================
# Strict JSON helpers (serde_json with deny_unknown_fields semantics)
# ==========================================================================


class _JsonReject(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonReject(f"duplicate field {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise _JsonReject(f"{name} is not valid JSON")


def _strict_loads(text: str) -> Any:
    """json.loads without Python's extensions (NaN/Infinity) and without silent duplicate keys."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except _JsonReject:
        raise
    except (ValueError, RecursionError) as exc:
        raise _JsonReject(f"malformed JSON: {exc}") from None


def _exact_keys(obj: object, required: tuple[str, ...], optional: tuple[str, ...], what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _JsonReject(f"{what}: expected an object")
    for key in obj:
        if key not in required and key not in optional:
            raise _JsonReject(f"{what}: unknown field {key!r}")
    for key in required:
        if key not in obj:
            raise _JsonReject(f"{what}: missing field {key!r}")
    return obj


def _hex_field(value: object, nbytes: int, what: str) -> bytes:
    if not isinstance(value, str) or len(value) != 2 * nbytes or re.fullmatch(r"[0-9a-f]*", value) is None:
        raise _JsonReject(f"{what}: expected {2 * nbytes} lowercase hex digits")
    return bytes.fromhex(value)


def _uint_field(value: object, maximum: int, what: str) -> int:
    if not is_uint(value, maximum):
        raise _JsonReject(f"{what}: expected an integer in 0..{maximum}")
    assert isinstance(value, int)
    return value


# ==========================================================================
# Recovery cursor
# ==========================================================================

CURSOR_SCHEMA = "steadq-recovery-cursor"
CURSOR_VERSION = 1
CURSOR_MAX_BYTES = 16_384
# Also the enum's sort order, which the ordering checks below rely on.
CURSOR_PHASES = ("reap_leases", "promote_delayed", "cleanup_temp", "compact_receipts", "delete_receipts")
_RETRY_KINDS = ("open", "enumerate")  # declaration order assumed open < enumerate
_MAX_HIERARCHY_RETRIES = 64
_MAX_HIERARCHY_FRONTIERS = len(CURSOR_PHASES)
_MAX_COMPONENT = 255

_HEX16_RE = re.compile(r"[0-9a-f]{16}")
_HEX4_RE = re.compile(r"[0-9a-f]{4}")


def reset_cursor_json(queue_id: bytes, phase: str = "reap_leases") -> bytes:
    """The shape records.md recommends a port write: all positions null, lists empty."""
    return cursor_json(queue_id, phase)


def cursor_json(queue_id: bytes, phase: str = "reap_leases", position: tuple[bytes, ...] | None = None) -> bytes:
    """A cursor naming ``phase`` and, optionally, that phase's position (its
    last fully processed entry); every other position null, lists empty.

    Produced as a literal rather than through json.dumps so the bytes match
    the reference's compact serde output exactly (single line, no newline,
    fields in declaration order).
    """
    need_bytes(queue_id, ID_BYTES, "queue_id")
    if phase not in CURSOR_PHASES:
        raise InvalidInput(f"phase: must be one of {', '.join(CURSOR_PHASES)}, got {phase!r}")
    slots = dict.fromkeys(CURSOR_PHASES, "null")
    if position is not None:
        slots[phase] = _position_text(phase, position)
    return (
        f'{{"schema":"{CURSOR_SCHEMA}","version":{CURSOR_VERSION},"queue_id":"{queue_id.hex()}",'
        f'"cursor":{{"phase":"{phase}",'
        + "".join(f'"{name}":{slots[name]},' for name in CURSOR_PHASES)
        + '"hierarchy_retries":[],"hierarchy_retry_frontiers":[],"hierarchy_retry_overflow":[]}}'
    ).encode("ascii")


def _position_fields(phase: str) -> tuple[str, ...]:
    # (boot, bucket, shard, entry) for legacy reaping; (bucket or boot, shard, entry) for the others.
    return (
        ("first", "second", "third", "resume_after") if phase == "reap_leases" else ("first", "second", "resume_after")
    )


def _position_text(phase: str, position: tuple[bytes, ...]) -> str:
    fields = _position_fields(phase)
    if len(position) != len(fields):
        raise InvalidInput(f"position of {phase}: {len(position)} components, expected {len(fields)}")
    for i, raw in enumerate(position):
        try:
            _byte_component(list(raw), f"position of {phase}[{i}]")
        except _JsonReject as exc:
            raise InvalidInput(str(exc)) from None
    parts = (f'"{name}":[{",".join(str(b) for b in raw)}]' for name, raw in zip(fields, position, strict=True))
    return "{" + ",".join(parts) + "}"


def _cursor_phase(value: object, what: str) -> str:
    if not isinstance(value, str) or value not in CURSOR_PHASES:
        raise _JsonReject(f"{what}: unknown phase {value!r}")
    return value


def _byte_component(value: object, what: str) -> bytes:
    if not isinstance(value, list) or not 1 <= len(value) <= _MAX_COMPONENT:
        raise _JsonReject(f"{what}: expected an array of 1..{_MAX_COMPONENT} byte values")
    for b in value:
        if not is_uint(b, 0xFF):
            raise _JsonReject(f"{what}: {b!r} is not a byte value")
    raw = bytes(value)
    if raw in (b".", b"..") or b"/" in raw or b"\0" in raw:
        raise _JsonReject(f"{what}: {raw!r} is not a valid directory entry name")
    return raw


def _phase_position(value: object, phase: str) -> dict[str, bytes] | None:
    if value is None:
        return None
    names = _position_fields(phase)
    obj = _exact_keys(value, names, (), f"cursor.{phase}")
    return {name: _byte_component(obj[name], f"cursor.{phase}.{name}") for name in names}


def _hierarchy_component_ok(phase: str, index: int, component: str) -> bool:
    # (boot, bucket, shard) for reaping, (boot, shard) for temp cleanup,
    # (bucket, shard) for the others -- the directories each phase walks.
    kinds: tuple[str, ...]
    if phase == "reap_leases":
        kinds = ("boot", "bucket", "shard")
    elif phase == "cleanup_temp":
        kinds = ("boot", "shard")
    else:
        kinds = ("bucket", "shard")
    kind = kinds[index]
    pattern = {"boot": BOOT_ID_RE, "bucket": _HEX16_RE, "shard": _HEX4_RE}[kind]
    return pattern.fullmatch(component) is not None


def _hierarchy_entry(value: object, what: str) -> dict[str, Any]:
    obj = _exact_keys(value, ("phase", "components"), ("kind",), what)
    phase = _cursor_phase(obj["phase"], f"{what}.phase")
    kind = obj.get("kind", "open")
    if kind not in _RETRY_KINDS:
        raise _JsonReject(f"{what}.kind: expected 'open' or 'enumerate', got {kind!r}")
    components = obj["components"]
    limit = 3 if phase == "reap_leases" else 2
    if not isinstance(components, list) or not 1 <= len(components) <= limit:
        raise _JsonReject(f"{what}.components: expected 1..{limit} names for phase {phase}")
    for i, comp in enumerate(components):
        if not isinstance(comp, str) or not _hierarchy_component_ok(phase, i, comp):
            raise _JsonReject(f"{what}.components[{i}]: {comp!r} is not a valid directory name for {phase}")
    return {"phase": phase, "kind": kind, "components": list(components)}


def _hierarchy_key(entry: dict[str, Any]) -> tuple[int, int, tuple[bytes, ...]]:
    return (
        CURSOR_PHASES.index(entry["phase"]),
        _RETRY_KINDS.index(entry["kind"]),
        tuple(c.encode("ascii") for c in entry["components"]),
    )


def _list_field(obj: dict[str, Any], name: str, limit: int) -> list[Any]:
    value = obj.get(name, [])
    if not isinstance(value, list):
        raise _JsonReject(f"cursor.{name}: expected an array")
    if len(value) > limit:
        raise _JsonReject(f"cursor.{name}: {len(value)} entries, limit {limit}")
    return value


def _validate_cursor_doc(doc: object, queue_id: bytes) -> dict[str, Any]:
    top = _exact_keys(doc, ("schema", "version", "queue_id", "cursor"), (), "cursor file")
    if top["schema"] != CURSOR_SCHEMA:
        raise _JsonReject(f"schema: expected {CURSOR_SCHEMA!r}")
    if type(top["version"]) is not int or top["version"] != CURSOR_VERSION:
        raise _JsonReject(f"version: expected {CURSOR_VERSION}")
    if _hex_field(top["queue_id"], ID_BYTES, "queue_id") != queue_id:
        raise _JsonReject("queue_id does not match the queue")

    lists = ("hierarchy_retries", "hierarchy_retry_frontiers", "hierarchy_retry_overflow")
    cur = _exact_keys(top["cursor"], ("phase",), CURSOR_PHASES + lists, "cursor")
    out: dict[str, Any] = {"phase": _cursor_phase(cur["phase"], "cursor.phase")}
    for phase in CURSOR_PHASES:
        out[phase] = _phase_position(cur.get(phase), phase)

    retries = [
        _hierarchy_entry(v, f"cursor.hierarchy_retries[{i}]")
        for i, v in enumerate(_list_field(cur, "hierarchy_retries", _MAX_HIERARCHY_RETRIES))
    ]
    for a, b in zip(retries, retries[1:], strict=False):
        if _hierarchy_key(a) >= _hierarchy_key(b):
            raise _JsonReject("cursor.hierarchy_retries: not strictly ascending")
    frontiers = [
        _hierarchy_entry(v, f"cursor.hierarchy_retry_frontiers[{i}]")
        for i, v in enumerate(_list_field(cur, "hierarchy_retry_frontiers", _MAX_HIERARCHY_FRONTIERS))
    ]
    for a, b in zip(frontiers, frontiers[1:], strict=False):
        if CURSOR_PHASES.index(a["phase"]) >= CURSOR_PHASES.index(b["phase"]):
            raise _JsonReject("cursor.hierarchy_retry_frontiers: phases not strictly ascending")
    overflow = [
        _cursor_phase(v, f"cursor.hierarchy_retry_overflow[{i}]")
        for i, v in enumerate(_list_field(cur, "hierarchy_retry_overflow", len(CURSOR_PHASES)))
    ]
    for p, q in zip(overflow, overflow[1:], strict=False):
        if CURSOR_PHASES.index(p) >= CURSOR_PHASES.index(q):
            raise _JsonReject("cursor.hierarchy_retry_overflow: phases not strictly ascending")
    out["hierarchy_retries"] = retries
    out["hierarchy_retry_frontiers"] = frontiers
    out["hierarchy_retry_overflow"] = overflow
    return {"schema": CURSOR_SCHEMA, "version": CURSOR_VERSION, "queue_id": queue_id.hex(), "cursor": out}


def validate_cursor(data: bytes, queue_id: bytes) -> dict[str, Any]:
    """Validate a recovery cursor as strictly as the reference's open does.

    Returns the document with defaults filled in (absent phase positions as
    None, absent lists empty) and phase-position components as ``bytes``.
    Any problem raises QueueCorrupt, since the reference refuses to open a
    queue with a malformed cursor (open-questions.md B22).
    """
    if not 1 <= len(data) <= CURSOR_MAX_BYTES:
        raise QueueCorrupt(f"recovery cursor: size {len(data)} outside 1..{CURSOR_MAX_BYTES} bytes")
    try:
        text = bytes(data).decode("utf-8")
        return _validate_cursor_doc(_strict_loads(text), queue_id)
    except UnicodeDecodeError:
        raise QueueCorrupt("recovery cursor: not valid UTF-8") from None
    except _JsonReject as exc:
        raise QueueCorrupt(f"recovery cursor: {exc}") from None


# ==========================================================================
# Transition tickets
# ==========================================================================

TICKET_SCHEMA = "steadq-transition-ticket"
TICKET_VERSION = 2
TICKET_OPERATIONS = ("claim", "renew", "acknowledge", "retry_now", "retry_later", "bury")
TICKET_PHASES = ("linearized", "destination_directory_durable", "source_directory_durable")


def _bad_ticket(message: str) -> SteadQError:
    return SteadQError(f"invalid transition ticket: {message}", ErrorKind.INVALID_TICKET)


@dataclass(frozen=True)
class ReadyLocation:
    """Source or destination in ``ready/<S>/`` without a lease."""

    state: ClassVar[str] = "ready"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state}


@dataclass(frozen=True)
class LeasedLocation:
    """A lease; the boot id is the dashed canonical form used in tag contexts."""

    boot_id: str
    boottime_deadline_ns: int
    wall_deadline_ns: int
    state: ClassVar[str] = "leased"

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "boot_id": self.boot_id,
            "boottime_deadline_ns": self.boottime_deadline_ns,
            "wall_deadline_ns": self.wall_deadline_ns,
        }


@dataclass(frozen=True)
class DelayedLocation:
    not_before_ns: int
    state: ClassVar[str] = "delayed"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "not_before_ns": self.not_before_ns}


@dataclass(frozen=True)
class ReceiptLocation:
    terminal_bucket: int
    state: ClassVar[str] = "receipt"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "terminal_bucket": self.terminal_bucket}


@dataclass(frozen=True)
class DeadLocation:
    terminal_bucket: int
    reason: int
    state: ClassVar[str] = "dead"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "terminal_bucket": self.terminal_bucket, "reason": self.reason}


Location = ReadyLocation | LeasedLocation | DelayedLocation | ReceiptLocation | DeadLocation

# operation -> (source state, destination state); the reference refuses anything else.
_OPERATION_STATES = {
    "claim": ("ready", "leased"),
    "renew": ("leased", "leased"),
    "acknowledge": ("leased", "receipt"),
    "retry_now": ("leased", "ready"),
    "retry_later": ("leased", "delayed"),
    "bury": ("leased", "dead"),
}


def _location_from_dict(obj: object, allowed: tuple[str, ...], what: str) -> Location:
    if not isinstance(obj, Mapping):
        raise _JsonReject(f"{what}: expected an object")
    state = obj.get("state")
    if state not in allowed:
        raise _JsonReject(f"{what}: unknown state {state!r}")
    d = dict(obj)
    if state == "ready":
        _exact_keys(d, ("state",), (), what)
        return ReadyLocation()
    if state == "leased":
        _exact_keys(d, ("state", "boot_id", "boottime_deadline_ns", "wall_deadline_ns"), (), what)
        boot = d["boot_id"]
        if not isinstance(boot, str) or BOOT_ID_RE.fullmatch(boot) is None:
            raise _JsonReject(f"{what}.boot_id: not a canonical lowercase dashed boot id")
        return LeasedLocation(
            boot,
            _uint_field(d["boottime_deadline_ns"], U64_MAX, f"{what}.boottime_deadline_ns"),
            _uint_field(d["wall_deadline_ns"], U64_MAX, f"{what}.wall_deadline_ns"),
        )
    if state == "delayed":
        _exact_keys(d, ("state", "not_before_ns"), (), what)
        return DelayedLocation(_uint_field(d["not_before_ns"], U64_MAX, f"{what}.not_before_ns"))
    if state == "receipt":
        _exact_keys(d, ("state", "terminal_bucket"), (), what)
        return ReceiptLocation(_uint_field(d["terminal_bucket"], U64_MAX, f"{what}.terminal_bucket"))
    _exact_keys(d, ("state", "terminal_bucket", "reason"), (), what)
    return DeadLocation(
        _uint_field(d["terminal_bucket"], U64_MAX, f"{what}.terminal_bucket"),
        _uint_field(d["reason"], U16_MAX, f"{what}.reason"),
    )


_ALL_STATES = ("ready", "leased", "delayed", "receipt", "dead")
_SOURCE_STATES = ("ready", "leased")
_IDENTITY_FIELDS = (
    "job_id", "generation", "attempt", "maximum_attempts", "lease_token", "envelope_digest", "payload_length",
)  # fmt: skip
_TOP_FIELDS = (
    "schema", "version", "queue_id", "operation", "phase", "source_identity", "source", "destination_derivation",
)  # fmt: skip


@dataclass(frozen=True)
class TransitionTicket:
    """Everything needed to find both candidate objects of an indeterminate transition.

    ``source``/``destination`` may be given as location dataclasses or as
    plain dicts in the JSON shape; dicts are converted on construction so
    the rest of the code sees one representation.
    """

    queue_id: bytes
    operation: str
    phase: str
    job_id: bytes
    generation: int
    attempt: int
    maximum_attempts: int
    lease_token: bytes
    envelope_digest: bytes
    payload_length: int
    source: Location
    destination: Location

    def __post_init__(self) -> None:
        for name, allowed in (("source", _SOURCE_STATES), ("destination", _ALL_STATES)):
            value = getattr(self, name)
            if isinstance(value, Mapping):
                try:
                    object.__setattr__(self, name, _location_from_dict(value, allowed, name))
                except _JsonReject as exc:
                    raise _bad_ticket(str(exc)) from None

    def destination_identity(self) -> tuple[int, int]:
        """(generation, attempt) of the destination object: every operation bumps
        the generation, only claim bumps the attempt (protocol.md)."""
        attempt = self.attempt + 1 if self.operation == "claim" else self.attempt
        return self.generation + 1, attempt

    def validate(self) -> None:
        """The reference's checks on a ticket read back from disk."""
        sized = [
            (self.queue_id, ID_BYTES, "queue_id"),
            (self.job_id, ID_BYTES, "job_id"),
            (self.lease_token, ID_BYTES, "lease_token"),
            (self.envelope_digest, DIGEST_BYTES, "envelope_digest"),
        ]
        for value, size, name in sized:
            if not isinstance(value, bytes) or len(value) != size:
                raise _bad_ticket(f"{name}: must be {size} bytes")
        if self.operation not in _OPERATION_STATES:
            raise _bad_ticket(f"unknown operation {self.operation!r}")
        if self.phase not in TICKET_PHASES:
            raise _bad_ticket(f"unknown phase {self.phase!r}")
        for name, maximum in (
            ("generation", U64_MAX),
            ("attempt", U32_MAX),
            ("maximum_attempts", U32_MAX),
            ("payload_length", U64_MAX),
        ):
            if not is_uint(getattr(self, name), maximum):
                raise _bad_ticket(f"{name}: must be an integer in 0..{maximum}")
        for name in ("source", "destination"):
            loc = getattr(self, name)
            if not isinstance(loc, ReadyLocation | LeasedLocation | DelayedLocation | ReceiptLocation | DeadLocation):
                raise _bad_ticket(f"{name}: not a location")
            try:  # re-validate field values (also catches hand-built dataclasses)
                _location_from_dict(loc.to_dict(), _ALL_STATES, name)
            except _JsonReject as exc:
                raise _bad_ticket(str(exc)) from None
        if (self.source.state, self.destination.state) != _OPERATION_STATES[self.operation]:
            raise _bad_ticket("operation does not permit the ticket source and destination")
        if self.maximum_attempts == 0:
            raise _bad_ticket("maximum_attempts is 0")
        if self.attempt > self.maximum_attempts:
            raise _bad_ticket(f"attempt {self.attempt} exceeds maximum_attempts {self.maximum_attempts}")
        generation, attempt = self.destination_identity()
        if generation > U64_MAX or attempt > U32_MAX:
            raise _bad_ticket("destination identity overflows")
        if attempt > self.maximum_attempts:
            raise _bad_ticket(f"destination attempt {attempt} exceeds maximum_attempts {self.maximum_attempts}")

    def to_json(self) -> str:
        """Byte-identical to ``serde_json::to_string_pretty`` (2-space indent, no trailing newline)."""
        doc = {
            "schema": TICKET_SCHEMA,
            "version": TICKET_VERSION,
            "queue_id": self.queue_id.hex(),
            "operation": self.operation,
            "phase": self.phase,
            "source_identity": {
                "job_id": self.job_id.hex(),
                "generation": self.generation,
                "attempt": self.attempt,
                "maximum_attempts": self.maximum_attempts,
                "lease_token": self.lease_token.hex(),
                "envelope_digest": self.envelope_digest.hex(),
                "payload_length": self.payload_length,
            },
            "source": self.source.to_dict(),
            "destination_derivation": self.destination.to_dict(),
        }
        return json.dumps(doc, indent=2, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> TransitionTicket:
        """Parse and fully validate; every failure is SteadQError(INVALID_TICKET)."""
        try:
            if isinstance(text, bytes | bytearray):
                text = bytes(text).decode("utf-8")
            top = _exact_keys(_strict_loads(text), _TOP_FIELDS, (), "ticket")
            if top["schema"] != TICKET_SCHEMA:
                raise _JsonReject(f"schema: expected {TICKET_SCHEMA!r}")
            if type(top["version"]) is not int or top["version"] != TICKET_VERSION:
                raise _JsonReject(f"version: expected {TICKET_VERSION}")
            operation, phase = top["operation"], top["phase"]
            if operation not in TICKET_OPERATIONS:
                raise _JsonReject(f"operation: unknown value {operation!r}")
            if phase not in TICKET_PHASES:
                raise _JsonReject(f"phase: unknown value {phase!r}")
            ident = _exact_keys(top["source_identity"], _IDENTITY_FIELDS, (), "source_identity")
            ticket = cls(
                queue_id=_hex_field(top["queue_id"], ID_BYTES, "queue_id"),
                operation=operation,
                phase=phase,
                job_id=_hex_field(ident["job_id"], ID_BYTES, "source_identity.job_id"),
                generation=_uint_field(ident["generation"], U64_MAX, "source_identity.generation"),
                attempt=_uint_field(ident["attempt"], U32_MAX, "source_identity.attempt"),
                maximum_attempts=_uint_field(ident["maximum_attempts"], U32_MAX, "source_identity.maximum_attempts"),
                lease_token=_hex_field(ident["lease_token"], ID_BYTES, "source_identity.lease_token"),
                envelope_digest=_hex_field(ident["envelope_digest"], DIGEST_BYTES, "source_identity.envelope_digest"),
                payload_length=_uint_field(ident["payload_length"], U64_MAX, "source_identity.payload_length"),
                source=_location_from_dict(top["source"], _SOURCE_STATES, "source"),
                destination=_location_from_dict(top["destination_derivation"], _ALL_STATES, "destination_derivation"),
            )
        except UnicodeDecodeError:
            raise _bad_ticket("not valid UTF-8") from None
        except _JsonReject as exc:
            raise _bad_ticket(str(exc)) from None
        ticket.validate()
        return ticket


@dataclass(frozen=True)
class EnqueueTicket:
    """What an indeterminate enqueue reports; in-process only (no JSON form in the reference)."""

    job_id: bytes
    envelope_digest: bytes
    state: str  # "ready" | "delayed"
    path: str  # relative to the queue root

    def outcome_lines(self) -> list[str]:
        """What a command prints about it (``steadqd.backend.OutcomeTicket``)."""
        return [f"job_id: {self.job_id.hex()}", f"path: {self.path}"]
