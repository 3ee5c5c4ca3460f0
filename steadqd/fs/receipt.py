"""Receipt verification (records.md "Receipt verification").

A receipt proves one exact lease was acknowledged. It is either the full job
file renamed at ack, or the 128-byte compact record recovery later puts at
the same path. Both are verified the same strict way wherever a receipt is
trusted: duplicate-ack detection, resolve, compaction, retention, fsck.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from operator import attrgetter

from steadqd.constants import HEADER_SIZE, QuarantineReason, State
from steadqd.errors import CorruptObject
from steadqd.fs import linux
from steadqd.fs.names import JobName, authenticate, bucket_start, parse_name, shard_of
from steadqd.fs.records import CompactReceipt, FormatRecord, is_compact_receipt
from steadqd.fs.tree import Witness
from steadqd.fs.verify import check_name_matches, check_object_stat, read_envelope, verify_payload


@dataclass(frozen=True)
class ExpectedReceipt:
    """The identity a specific acknowledgment must have produced."""

    generation: int
    attempt: int
    max_attempts: int
    lease_token: bytes
    envelope_digest: bytes
    payload_length: int


@dataclass(frozen=True)
class ReceiptInfo:
    name: JobName
    compact: bool
    envelope_digest: bytes
    payload_length: int
    witness: Witness


def _corrupt(why: str, reason: int = QuarantineReason.ENVELOPE_CORRUPT) -> CorruptObject:
    return CorruptObject(f"receipt {why}", reason)


def verify_receipt(
    fmt: FormatRecord,
    fd: int,
    filename: str,
    bucket: int,
    shard: int,
    expected: ExpectedReceipt | None = None,
    st: os.stat_result | None = None,
) -> ReceiptInfo:
    """Verify an open receipt file found at ``receipts/<bucket>/<shard>/<filename>``.

    Full receipts have their payload re-hashed: a receipt is evidence, and
    evidence that does not verify proves nothing.
    """
    if st is None:
        st = linux.fstat(fd)
    check_object_stat(st)
    name = parse_name(State.RECEIPT, filename)
    if not 1 <= name.attempt <= name.max_attempts:
        raise _corrupt("attempt outside 1..maximum_attempts", QuarantineReason.FILENAME_PARSE_FAILED)
    if not authenticate(fmt.queue_id, name, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns):
        raise _corrupt("name tag does not authenticate", QuarantineReason.FILENAME_TAG_FAILED)
    if shard_of(fmt.queue_id, name.job_id, fmt.shard_count) != shard:
        raise _corrupt("is in the wrong shard directory", QuarantineReason.FILENAME_TAG_FAILED)
    prefix = linux.pread(fd, HEADER_SIZE, 0)
    if len(prefix) < HEADER_SIZE:
        raise _corrupt("is shorter than 128 bytes")
    if is_compact_receipt(prefix, st.st_size):
        record = CompactReceipt.decode(prefix)
        if (
            record.job_id != name.job_id
            or record.lease_token != name.lease_token
            or record.final_attempt != name.attempt
        ):
            raise _corrupt("compact record does not match its name", QuarantineReason.FILENAME_HEADER_MISMATCH)
        if record.bucket_start_ns != bucket_start(bucket, fmt.terminal_width_ns):
            raise _corrupt("compact record bucket start does not match its directory")
        if record.payload_length > fmt.max_payload_length:
            raise _corrupt("payload length exceeds the queue maximum")
        info = ReceiptInfo(name, True, record.envelope_digest, record.payload_length, Witness.of(st))
    else:
        env = read_envelope(fd, fmt.max_payload_length, st)
        check_name_matches(env.header, name)
        verify_payload(fd, env)
        info = ReceiptInfo(name, False, env.header.envelope_digest, env.header.payload_length, env.witness)
    if expected is not None:
        _check_expected(info, expected)
    return info


# What makes a receipt the acknowledgment of one particular lease (its name and the expectation share the names).
_SETTLED_IDENTITY = attrgetter("generation", "attempt", "max_attempts", "lease_token")


def _check_expected(info: ReceiptInfo, exp: ExpectedReceipt) -> None:
    if _SETTLED_IDENTITY(info.name) != _SETTLED_IDENTITY(exp):
        raise _corrupt("identity differs from the expected acknowledgment", QuarantineReason.FILENAME_HEADER_MISMATCH)
    if info.envelope_digest != exp.envelope_digest or info.payload_length != exp.payload_length:
        raise _corrupt("envelope differs from the acknowledged lease", QuarantineReason.FILENAME_HEADER_MISMATCH)
