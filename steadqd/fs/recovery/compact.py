"""Phase 4, receipt compaction (recovery.md): every verified full receipt is
rewritten in place as its 128-byte compact record.

There is no age condition; the receipt is locked (a busy one belongs to
another maintainer and is skipped) and re-verified, payload included, so
that only a receipt proved intact loses its payload. The compact record keeps
the receipt's name (same tag), so a duplicate ack still recognises it.
"""

from __future__ import annotations

import contextlib

from steadqd.constants import RECEIPT_EXT, RECEIPTS_DIR
from steadqd.errors import SteadQError
from steadqd.fs import linux
from steadqd.fs.names import bucket_start, is_compact_temp_name, make_compact_temp_name, parse_bucket_dir
from steadqd.fs.records import CompactReceipt
from steadqd.fs.recovery.objects import locked_receipt, verified_receipt, write_temp
from steadqd.fs.recovery.state import Pass
from steadqd.fs.recovery.temp import delete_temp
from steadqd.fs.recovery.walk import NOT_BUCKET, Level, leaf_name, shard_level, walk
from steadqd.fs.tree import Witness


def compact_receipts(p: Pass) -> None:
    levels = (Level(parse_bucket_dir, NOT_BUCKET), shard_level(p))
    for (bucket, shard), fd, rel, raw in walk(p, RECEIPTS_DIR, levels):
        if is_compact_temp_name(raw):
            delete_temp(p, fd, rel, raw.decode("ascii"))
            continue
        name = leaf_name(p, raw, rel, RECEIPT_EXT)
        if name is not None:
            _compact_one(p, fd, rel, name, bucket, shard)


def _compact_one(p: Pass, dir_fd: int, rel: str, name: str, bucket: int, shard: int) -> None:
    fmt = p.fmt
    with locked_receipt(p, dir_fd, rel, name, "receipt_compact_failed") as fd:
        if fd is None:
            return
        info = verified_receipt(p, fd, rel, name, bucket, shard, "receipt_compact")
        if info is None or info.compact:
            return
        assert info.name.lease_token is not None
        p.op()
        try:
            record = CompactReceipt(
                job_id=info.name.job_id,
                envelope_digest=info.envelope_digest,
                final_attempt=info.name.attempt,
                lease_token=info.name.lease_token,
                bucket_start_ns=bucket_start(bucket, fmt.terminal_width_ns),
                payload_length=info.payload_length,
            ).encode()
        except SteadQError as e:
            p.error("receipt_compact_failed", f"{rel}/{name}: {e}")
            return
        if _replace_receipt(p, dir_fd, rel, name, record, info.witness):
            p.report.receipts_compacted += 1


def _replace_receipt(p: Pass, dir_fd: int, rel: str, name: str, record: bytes, witness: Witness) -> bool:
    """temp + fsync, identity re-check, plain rename over the receipt
    (the linearization point), fsync of the shard directory."""
    tmp = write_temp(p, dir_fd, rel, make_compact_temp_name, record, ("receipt_compact_failed", f"{rel}/{name}"))
    if tmp is None:
        return False
    if not _rename_over(p, dir_fd, rel, name, tmp, witness):
        with contextlib.suppress(OSError):
            linux.unlink_at(dir_fd, tmp)
        return False
    try:
        linux.fsync(dir_fd)
    except OSError as e:
        # Either record is a valid receipt; only durability is in doubt.
        p.error("receipt_compact_outcome_unknown", f"{rel}/{name}: fsync directory: {e.strerror}")
        return False
    return True


def _rename_over(p: Pass, dir_fd: int, rel: str, name: str, tmp: str, witness: Witness) -> bool:
    """Rename the temp over the receipt if the path still names the verified inode."""
    try:
        try:
            st = linux.stat_at(dir_fd, name)
        except FileNotFoundError:
            return False  # deleted meanwhile: nothing to compact
        if not witness.names_single_file(st):
            p.error("receipt_compact_failed", f"{rel}/{name}: destination changed")
            return False
        linux.rename_replace(dir_fd, tmp, dir_fd, name)
    except OSError as e:
        p.error("receipt_compact_failed", f"{rel}/{name}: {e.strerror}")
        return False
    return True
