"""The claim scan's shard order: each handle's own permutation of the ready shards, per scan round.

Spec: ``names.md`` ("Claim scan order"). Not observable on disk; the values
are reproduced because the reference pins them (``vectors.md``). Kept apart
from :mod:`steadqd.fs.names` because it answers another question: not what a
name is, but in which order a handle looks for one. The argument checks are
names' own, so that each field has one rule.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import Any

from steadqd.constants import DOMAIN_SCAN, U64_MAX
from steadqd.fs.names import _SHARD_COUNTS, _check_bytes, _check_int, _check_shard_count

__all__ = ["next_scan_round", "scan_order", "scan_params"]


def next_scan_round(scan_round: int) -> int:
    """The per-handle scan round increments with u64 wrap-around."""
    if (
        type(scan_round) is int and 0 <= scan_round <= U64_MAX
    ):  # _check_int's common case, without its call (every lease)
        return (scan_round + 1) & U64_MAX
    return (_check_int("scan_round", scan_round, U64_MAX) + 1) & U64_MAX


def scan_params(
    queue_id: bytes, boot_id_raw16: bytes, worker_nonce16: bytes, scan_round: int, shard_count: int
) -> tuple[int, int]:
    """(start, stride) of this handle's shard permutation for ``scan_round`` (names.md).

    Not observable on disk; reproduced because the reference pins the values.
    A consumer that has not just enqueued asks this on every lease, with the
    same queue id, boot id and nonce each time: the hash of that prefix is
    kept (checked when it was made) and only the round is hashed per call.
    """
    # _check_shard_count's and _check_int's common cases without their calls (every lease with no hint)
    exact_count = type(shard_count) is int and shard_count in _SHARD_COUNTS
    mask = (shard_count if exact_count else _check_shard_count(shard_count)) - 1
    exact = type(queue_id) is bytes and type(boot_id_raw16) is bytes and type(worker_nonce16) is bytes
    prefix = _SCAN_HASHERS.get((queue_id, boot_id_raw16, worker_nonce16)) if exact else None
    if prefix is None:
        prefix = hashlib.sha256(
            DOMAIN_SCAN
            + _check_bytes("queue_id", queue_id)
            + _check_bytes("boot id", boot_id_raw16)
            + _check_bytes("worker nonce", worker_nonce16)
        )
        if exact:
            if len(_SCAN_HASHERS) >= _SCAN_HASHERS_MAX:
                _SCAN_HASHERS.clear()
            _SCAN_HASHERS[(queue_id, boot_id_raw16, worker_nonce16)] = prefix
    h = prefix.copy()
    exact_round = type(scan_round) is int and 0 <= scan_round <= U64_MAX
    h.update(_ROUND.pack(scan_round if exact_round else _check_int("scan_round", scan_round, U64_MAX)))
    start, stride = _START_STRIDE.unpack_from(h.digest())
    return start & mask, ((stride | 1) & mask) or 1


# (queue id, boot id, nonce) -> SHA-256 state fed with the scan domain and the three; only
# exact bytes are kept (a bytearray key could change after its check). A process has a few handles.
_SCAN_HASHERS: dict[tuple[bytes, bytes, bytes], Any] = {}
_SCAN_HASHERS_MAX = 64
_ROUND = struct.Struct(">Q")
_START_STRIDE = struct.Struct(">QQ")  # the digest's first two big-endian u64


def scan_order(
    queue_id: bytes,
    boot_id_raw16: bytes,
    worker_nonce16: bytes,
    scan_round: int,
    shard_count: int,
    start_hint: int | None = None,
) -> Iterator[int]:
    """Every shard exactly once, in this handle's order for ``scan_round``.

    ``start_hint`` (the shard the handle just enqueued into) replaces the start
    but keeps the stride; it is a latency hint only. Lazy: a claim usually
    stops at the first shard.
    """
    if start_hint is None:
        start, stride = scan_params(queue_id, boot_id_raw16, worker_nonce16, scan_round, shard_count)
        return _walk(start, stride, shard_count)
    if (
        type(shard_count) is int
        and shard_count in _SHARD_COUNTS
        and type(start_hint) is int
        and 0 <= start_hint < shard_count
    ):
        hint = start_hint  # the two checks below, passed in one test (the lease after an enqueue)
    else:
        hint = _check_int("start_hint", start_hint, _check_shard_count(shard_count) - 1)
    return _hinted_walk(hint, queue_id, boot_id_raw16, worker_nonce16, scan_round, shard_count)


def _walk(start: int, stride: int, shard_count: int) -> Iterator[int]:
    # (start + stride * i) mod 2^32 mod shard_count is one mask, shard_count - 1: shard_count is a
    # power of two <= 2^32. A strided range and map run in C, ~40% cheaper than a generator expression.
    mask = shard_count - 1
    return map(mask.__and__, range(start, start + stride * shard_count, stride))


def _hinted_walk(
    hint: int, queue_id: bytes, boot_id_raw16: bytes, worker_nonce16: bytes, scan_round: int, shard_count: int
) -> Iterator[int]:
    """The hinted shard first; the stride is hashed only if the scan goes on
    (a consumer that just enqueued finds its job there: no hash at all)."""
    yield hint
    _, stride = scan_params(queue_id, boot_id_raw16, worker_nonce16, scan_round, shard_count)
    walk = _walk(hint, stride, shard_count)
    next(walk)
    yield from walk
