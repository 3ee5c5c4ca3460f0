"""The StowQ/1 test vectors (``../shared/spec-stowq/vectors/*.json``) as the tests read them.

A missing or unreadable vector file fails the test, never skips it: the
vectors are the format's definition, not an optional prerequisite. Every
case list is taken through :func:`cases`, which checks it against the file's
``counts``, so a truncated or silently filtered list fails instead of
passing with fewer cases.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import pytest

from tests.prereq import SHARED_DIR

VECTOR_DIR = SHARED_DIR / "spec-stowq" / "vectors"


@functools.cache
def _read(name: str) -> dict[str, Any]:
    path = VECTOR_DIR / f"{name}.json"
    if not path.is_file():
        pytest.fail(
            f"StowQ/1 vector file missing: {path} (the vectors live in ../shared/spec-stowq beside the checkout)"
        )
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict), f"{path}: not a JSON object"
    return doc


def load(name: str) -> dict[str, Any]:
    """The whole vector file ``name`` (e.g. ``"keys"``): what, provenance, conventions, counts, lists."""
    return _read(name)


def cases(name: str, key: str, *, expected: int | None = None) -> list[dict[str, Any]]:
    """The case list ``key`` of vector file ``name``, checked against its declared count.

    ``expected`` is for the lists the file's ``counts`` does not cover; one of
    the two must exist, so no list is ever taken without knowing its size.
    """
    doc = _read(name)
    declared = doc["counts"].get(key, expected)
    assert declared is not None, f"{name}.json: no count for {key!r}: pass expected= from the README's table"
    found = doc[key]
    assert isinstance(found, list), f"{name}.json: {key!r} is not a list"
    assert len(found) == declared, f"{name}.json: {key!r} has {len(found)} cases, expected {declared}"
    return found


def queue_id(name: str) -> bytes:
    """The default queue id of a vector file's conventions."""
    return bytes.fromhex(_read(name)["conventions"]["queue_id_default"])


def cbor_error_class(reference_error: str) -> str:
    """Our ``error_class`` for a reference CBOR error: ``UnsupportedMajorType(6)`` is ``cbor:unsupported_major_type``.

    The record vectors spell CBOR classes ``cbor:NonMinimalInteger``; both forms are accepted.
    """
    name = reference_error.removeprefix("cbor:").split("(")[0]
    return "cbor:" + re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def record_from_fields(record_type: int, fields: dict[str, Any]) -> Any:
    """The ``steadqd.s3.records`` record a vector's ``fields`` describe (hex strings become bytes)."""
    from steadqd.s3 import records  # here, so the key and math tests do not depend on the record code

    schema = records.SCHEMAS[records.RecordType(record_type)]
    values: dict[str, Any] = {}
    for field in schema.wire:
        if field.name not in fields:
            continue
        value = fields[field.name]
        if field.kind is records.Kind.BYTES:
            value = bytes.fromhex(value)
        elif field.kind is records.Kind.BASIS:
            value = records.ClaimBasis(**value)
        elif field.kind is records.Kind.DIGESTS:
            value = tuple(bytes.fromhex(d) for d in value)
        values[field.name] = value
    unknown = set(fields) - set(values)
    assert not unknown, f"vector fields {sorted(unknown)} are not {schema.record_type.label} fields"
    return schema.cls(**values)
