"""Creating a record, and resolving a create whose outcome the store did not tell.

Why every authoritative write goes through :func:`create`: a conditional
create has three answers (committed, lost to another writer, or unknown)
and the third must never reach the protocol unresolved (contract.md,
Outcome unknown). Resolution reads the key: absent means nothing happened
and the create is sent again; present means a record holds the key, and
because every record is immutable and self-verifying, whose it is follows
from its content. Records that carry a ``worker_token`` (claims, receipts)
are ours iff the token is; every other record is ours iff its bytes are the
ones we sent (for deterministic encodings that is the record digest).

Only when even the reading fails does the caller get ``OutcomeUnknown``,
naming the key to read later; a failure before transmit is ``NotCommitted``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from steadqd.errors import AlreadyExists, NotCommitted, OutcomeUnknown
from steadqd.s3.layout import QueueLayout
from steadqd.s3.records import ClaimRecord, ReceiptRecord, Record
from steadqd.s3.store.base import ObjectMeta, PendingWrite, sha256_of
from steadqd.s3.verify import read_record

__all__ = ["Created", "WRITE_TRIES", "Won", "best_effort", "create", "ours"]

# Sends of one create before its NotCommitted is passed on; each resend is
# safe because the previous one provably did nothing (or was found absent).
WRITE_TRIES = 3


class Won(enum.Enum):
    OURS = "ours"  # we wrote it (now, or in an earlier attempt whose answer was lost)
    THEIRS = "theirs"  # another writer's record holds the key


@dataclass(frozen=True)
class Created:
    """What a create came to; ``existing`` is the record found at the key when the store refused the create.

    ``already`` is True when the key held our own record before this call
    (an earlier call committed it): an idempotent repeat, nothing written now.
    """

    won: Won
    existing: Record | None = None
    existing_meta: ObjectMeta | None = None
    already: bool = False


def ours(mine: Record, found: Record, mine_bytes: bytes, found_bytes: bytes) -> bool:
    """Whether the record found at the key is the one we tried to write (contract.md's resolution rule)."""
    if isinstance(mine, (ClaimRecord, ReceiptRecord)):
        return type(found) is type(mine) and bytes(found.worker_token) == bytes(mine.worker_token)
    return found_bytes == mine_bytes


def _judge(layout: QueueLayout, rel: str, record: Record, body: bytes, already: bool) -> Created | None:
    """Read ``rel`` after a lost or unknown create: None if it is absent (send again)."""
    found = layout.get(rel)
    if found is None:
        return None
    data, meta = found
    existing = read_record(data, layout.queue_id, rel, required_feature_bits=layout.format.required_feature_bits)
    if ours(record, existing, body, data):
        return Created(Won.OURS, existing, meta, already)
    return Created(Won.THEIRS, existing, meta)


def create(layout: QueueLayout, rel: str, record: Record) -> Created:
    """Put ``record`` at ``rel`` if nothing is there, and say whose record the key now holds."""
    body = layout.encode(rel, record)
    key = layout.key(rel)
    last: NotCommitted | None = None
    for _ in range(WRITE_TRIES):
        try:
            layout.store.put_if_absent(key, body)
            return Created(Won.OURS)
        except AlreadyExists:
            judged = _resolve_read(layout, rel, record, body, already=True)
            if judged is not None:
                return judged
            continue  # deleted in between (GC of a finished graph): the create may be sent again
        except OutcomeUnknown:
            judged = _resolve_read(layout, rel, record, body, already=False)
            if judged is not None:
                return judged
            continue
        except NotCommitted as exc:
            last = exc
            continue
    raise NotCommitted(
        f"creating {key} on {layout.store.location} failed {WRITE_TRIES} times before the store took it "
        f"({last}); nothing was written, try again"
    )


def _resolve_read(layout: QueueLayout, rel: str, record: Record, body: bytes, *, already: bool) -> Created | None:
    try:
        return _judge(layout, rel, record, body, already)
    except NotCommitted as exc:
        raise OutcomeUnknown(
            f"creating {layout.key(rel)}: the store gave no verdict and reading the key back failed too ({exc}); "
            f"read {layout.key(rel)} to learn whether the write happened",
            PendingWrite("put_if_absent", layout.key(rel), sha256_of(body)),
        ) from exc


def best_effort(layout: QueueLayout, rel: str, body: bytes = b"") -> bool:
    """Create an advisory object (an index entry, a hint): True if it is there now, False if unsure.

    An index entry proves nothing and a missing one is found by the repair
    scan, so a failure here never fails the transition that wanted it.
    """
    try:
        layout.store.put_if_absent(layout.key(rel), body)
    except AlreadyExists:
        return True
    except (NotCommitted, OutcomeUnknown):
        return False
    return True
