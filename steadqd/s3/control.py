"""Pausing a bucket queue: the object ``meta/steadq-paused`` under the queue's prefix.

Where: every host that opens the queue reads the same object, so a pause
is seen by all of them and survives anything a host does. ``meta/`` is
where steadqd keeps its own objects (the repair cursor,
steadqd.s3.recovery.repair): the StowQ/1 reference reads only
``meta/FORMAT``, ``meta/watermark`` and ``meta/clock/`` and never lists
``meta/``, and the repair scan walks only the job, claim, receipt and dead
planes, so the object is never taken for a protocol key (a key under
``jobs/`` would be flagged as outside the grammar, 0x0003). A sibling key
beside the prefix was the other choice; it does not exist for a queue at
the bucket's root, and a credential scoped to the prefix could not reach it.

The body is the JSON pause record (steadqd.queue_control), read with a
size bound and treated as hostile like every object in a bucket: an
object present but unreadable still pauses, with its problem said.

Writes: the store offers no blind overwrite, so ``pause`` creates the
object (put-if-absent) or replaces the version it read (put-if-match),
trying again a few times when another writer got in between; ``resume``
deletes it. Workers read it before every claim pass, so a host's workers
stop claiming at their next pass once the write is answered.
"""

from __future__ import annotations

from steadqd.errors import AlreadyExists, NotCommitted, NotFound, PreconditionFailed
from steadqd.queue_control import PAUSE_RECORD_MAX, PauseState, decode_pause, encode_pause
from steadqd.s3.layout import QueueLayout

__all__ = ["PAUSE_KEY", "clear_pause", "read_pause", "write_pause"]

PAUSE_KEY = "meta/steadq-paused"
_WRITE_TRIES = 4


def read_pause(layout: QueueLayout) -> PauseState | None:
    """The queue's pause, or None when it is not paused (one bounded GET)."""
    try:
        obj = layout.store.get(layout.key(PAUSE_KEY), max_bytes=PAUSE_RECORD_MAX + 1)
    except NotFound:
        return None
    if obj.meta.size > PAUSE_RECORD_MAX:
        return PauseState("", 0, "", f"{obj.meta.size} bytes, more than {PAUSE_RECORD_MAX}")
    return decode_pause(obj.body)


def write_pause(layout: QueueLayout, state: PauseState) -> None:
    """Create or replace the pause object (NotCommitted when other writers kept getting in between)."""
    key = layout.key(PAUSE_KEY)
    body = encode_pause(state)
    for _ in range(_WRITE_TRIES):
        try:
            current = layout.store.head(key)
        except NotFound:
            try:
                layout.store.put_if_absent(key, body)
                return
            except AlreadyExists:
                continue
        try:
            layout.store.put_if_match(key, body, current.etag)
            return
        except PreconditionFailed:
            continue
    raise NotCommitted(f"pausing {layout.location}: {key} kept changing under us; try again")


def clear_pause(layout: QueueLayout) -> bool:
    """Delete the pause object; False when there was none."""
    key = layout.key(PAUSE_KEY)
    try:
        layout.store.head(key)
    except NotFound:
        return False
    layout.store.delete(key)
    return True
