"""Quarantine findings: a corrupt or impossible object is recorded and never delivered.

Why a finding is written rather than the object moved: nothing in a bucket
queue is renamed or overwritten, so isolating an object means recording a
deterministic finding (``quarantine/<bucket>/<qid>``, records.md) that every
reader's delivery path already excludes, because it refuses the object for
the same reason the finding names. Two auditors that find the same problem
write the same bytes, so the create is idempotent. A queue whose FORMAT
lacks feature bit 1 gets no finding (a v1 reader would take it for a
foreign writer's); the refusal is then only logged.
"""

from __future__ import annotations

import logging

from steadqd.errors import AlreadyExists, NotCommitted, OutcomeUnknown
from steadqd.s3 import keys
from steadqd.s3.layout import QueueLayout
from steadqd.s3.records import FeatureBit, new_quarantine
from steadqd.text import printable

__all__ = ["flag"]

log = logging.getLogger("steadqd.s3")


def flag(
    layout: QueueLayout,
    source_rel: str,
    reason: int,
    observed_store_ns: int,
    *,
    detail: int | None = None,
    job_id: bytes | None = None,
    why: str = "",
) -> str | None:
    """Record a finding about ``source_rel``; returns its key, or None when none could be written."""
    fields = {"STEADQ_QUEUE": layout.queue_id.hex()}
    if job_id is not None:
        fields["STEADQ_JOB_ID"] = job_id.hex()
    log.warning(
        "Quarantined %s in %s (reason 0x%04x): %s",
        printable(source_rel),
        printable(layout.location),
        reason,
        printable(why),
        extra=fields,
    )
    if not layout.feature(FeatureBit.QUARANTINE):
        return None
    record = new_quarantine(layout.queue_id, source_rel, reason, observed_store_ns, detail)
    rel = keys.quarantine_key_for(
        layout.queue_id, source_rel, reason, observed_store_ns, layout.format.terminal_bucket_width_ns
    )
    try:
        layout.store.put_if_absent(layout.key(rel), layout.encode(rel, record))
    except AlreadyExists:
        pass  # the same finding, by determinism
    except (NotCommitted, OutcomeUnknown):
        return None  # the object stays refused by every reader; the repair scan records it later
    return rel
