"""lease_of_claimed passes the Lease's fields by position (a keyword class call costs a dict a claim):
each argument must land in its own field, whatever order the dataclass declares them in."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from steadqd.fs.lease import Lease, lease_of_claimed
from steadqd.fs.records import Extension


def test_each_argument_lands_in_its_field() -> None:
    ext = Extension(content_type="text/x-distinct", producer_id="p", metadata={"k": 1})
    reader = object()
    ctx: Any = SimpleNamespace(fmt=SimpleNamespace(queue_id=b"Q" * 16), boot_id="boot-id")
    lease = lease_of_claimed(
        ctx, "ready/0001/name", "ab" * 16, 7, 11, 13, b"E" * 32, 17, b"P" * 32, ext, 19, 23, b"T" * 16, 29, 31,
        reader,
    )  # fmt: skip
    expected = {
        "queue_id": b"Q" * 16,
        "job_id": "ab" * 16,
        "generation": 19,
        "attempt": 23,
        "max_attempts": 7,
        "token": b"T" * 16,
        "boot_id": "boot-id",
        "boottime_deadline_ns": 29,
        "wall_deadline_ns": 31,
        "dev": 11,
        "ino": 13,
        "path": "ready/0001/name",
        "envelope_digest": b"E" * 32,
        "payload_length": 17,
        "payload_digest": b"P" * 32,
        "content_type": "text/x-distinct",
        "extension": ext,
        "_reader": reader,
    }
    assert {f.name: getattr(lease, f.name) for f in dataclasses.fields(Lease)} == expected
    # The same Lease as the keyword call it replaces.
    by_keyword = Lease(**expected)
    assert all(
        getattr(lease, k) is getattr(by_keyword, k) or getattr(lease, k) == getattr(by_keyword, k) for k in expected
    )
    assert repr(lease) == repr(by_keyword)


def test_no_extension_has_an_empty_content_type() -> None:
    ctx: Any = SimpleNamespace(fmt=SimpleNamespace(queue_id=b"Q" * 16), boot_id="boot-id")
    lease = lease_of_claimed(
        ctx, "p", "cd" * 16, 1, 2, 3, b"E" * 32, 4, b"P" * 32, None, 5, 6, b"T" * 16, 8, 9, None,
    )  # fmt: skip
    assert lease.content_type == "" and lease.extension is None and lease._reader is None
