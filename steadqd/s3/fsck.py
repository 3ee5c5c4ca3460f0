"""``steadq fsck`` of a bucket queue: every object checked, the repair scan run over every shard.

Why beside the repair scan and not inside it: ``fsck`` answers the
operator's question (is this queue sound, what is wrong), as
``steadqd.fs.fsck`` does for a filesystem queue, while the scan it runs
whole (``steadqd.s3.recovery.repair``) is also the recovery pass's bounded
step. What only ``fsck`` checks is the rest of the prefix: keys outside the
shard planes, the watermark, the fail, quarantine and FORMAT records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from steadqd.errors import InvalidKey, NotCommitted, OutcomeUnknown
from steadqd.fsck_report import Finding, FsckResult
from steadqd.s3 import keys
from steadqd.s3.clock import rebuild_watermark
from steadqd.s3.keys import KeyKind
from steadqd.s3.layout import QueueLayout
from steadqd.s3.records import QuarantineReason
from steadqd.s3.recovery.repair import REPAIR_CURSOR_KEY, Scan, read_listed, scan_shard
from steadqd.s3.store.base import ObjectMeta

__all__ = ["FsckReport", "fsck"]


@dataclass
class FsckReport(FsckResult):
    """``steadq fsck`` of a bucket queue: the filesystem's counts, and the indexes it regenerated."""

    indexes_regenerated: int = 0


# Keys the whole-queue listing checks itself; the shard planes are the scan's.
_SCANNED_PLANES = frozenset(("jobs", "claims", "receipts", "dead"))
_APPLICATION = keys.OUTPUTS_PREFIX


def _watermark(scan: Scan, rel: str, meta: ObjectMeta) -> None:
    """Check ``meta/watermark``; an unreadable one stops delayed jobs and takeovers, so a repair rebuilds it."""
    if read_listed(scan, rel, meta, None) is not None:
        return
    if not scan.write:
        scan.findings.append(Finding("ERROR", rel, "watermark_unreadable", "run fsck --repair to rebuild it"))
        return
    try:
        rebuilt = rebuild_watermark(scan.layout)
    except (NotCommitted, OutcomeUnknown) as exc:
        scan.findings.append(Finding("ERROR", rel, "watermark_unreadable", f"not rebuilt: {exc}"))
        return
    if rebuilt is not None:
        scan.findings.append(
            Finding(
                "WARN",
                rel,
                "watermark_rebuilt",
                f"rebuilt at bucket {rebuilt.highest_observed_wall_bucket}, the bucket of a floor proven now",
            )
        )


def fsck(layout: QueueLayout, floor_ns: int, *, deep: bool = False, repair: bool = False) -> FsckReport:
    """Check every object of the queue: one listing of the whole prefix, then the repair scan of every shard.

    Without ``repair`` nothing is written; with it, missing index entries are
    regenerated and (feature bit 1) findings recorded, as the repair scan
    does. Not bounded: it is the operator's full check, not the sweeper's.
    The repair cursor is neither read nor moved.
    """
    scan = Scan(layout, floor_ns, write=repair, deep=deep)
    total = 0
    for rel, meta in scan.pages("", None):
        total += 1
        if rel.startswith(_APPLICATION) or rel == REPAIR_CURSOR_KEY:
            continue
        try:
            parsed = keys.parse_key(rel)
        except InvalidKey as exc:
            scan.finding(rel, QuarantineReason.KEY_PARSE_FAILED, "key_grammar", exc.error_class, meta.store_time_ns)
            continue
        if rel.split("/", 1)[0] in _SCANNED_PLANES:
            if cast(int, parsed.shard) >= layout.format.shard_count:
                scan.finding(
                    rel, QuarantineReason.KEY_PARSE_FAILED, "key_grammar", "shard out of range", meta.store_time_ns
                )
            continue
        if parsed.kind is KeyKind.WATERMARK:
            _watermark(scan, rel, meta)
        elif parsed.kind in (KeyKind.FAIL, KeyKind.QUARANTINE, KeyKind.FORMAT):
            read_listed(scan, rel, meta, parsed.job_id)
    for shard in range(layout.format.shard_count):
        for _ in scan_shard(scan, shard):
            pass
    return FsckReport(
        total_objects=total,
        structurally_verified=scan.verified,
        payloads_deep_verified=scan.payloads_verified,
        findings=scan.findings,
        quarantined=scan.quarantined,
        indexes_regenerated=scan.regenerated,
    )
