"""Regression tests for the parser crashes and acceptance bugs the fuzzers found.

Each test names the input class and fails on the code before its fix.
"""

from __future__ import annotations

import json

import pytest

from steadqd.daemon.config import parse_config
from steadqd.errors import ConfigError, InvalidInput
from steadqd.fs.lease import Lease
from steadqd.yaml_doc import MAX_CONFIG_DEPTH
from tests.fuzz import targets


def test_handle_with_deeply_nested_json_is_invalid_input_not_recursion_error() -> None:
    """json.loads raises RecursionError (not ValueError) on ~100k nested arrays; from_handle leaked it."""
    with pytest.raises(InvalidInput, match="not JSON"):
        Lease.from_handle("[" * 100_000)


@pytest.mark.parametrize("field", ["token", "queue_id", "envelope_digest", "payload_digest"])
def test_handle_hex_field_with_whitespace_is_refused(field: str) -> None:
    """bytes.fromhex skips spaces: a 32-char "00 11…" decoded to a 15-byte token and was accepted."""
    doc = json.loads(targets._HANDLE_SEED)
    good = doc[field]
    doc[field] = good[:2] + " " + good[3:-1] + " "  # same length, two spaces, fewer bytes
    assert len(doc[field]) == len(good)
    with pytest.raises(InvalidInput, match=field):
        Lease.from_handle(json.dumps(doc))
    doc[field] = good
    Lease.from_handle(json.dumps(doc))  # the untouched handle still parses


@pytest.mark.parametrize("doc", ["queue: " + "[" * 5000 + "]" * 5000, "worker: " + "{a: " * 3000 + "}" * 3000])
def test_config_deep_nesting_is_config_error_not_recursion_error(doc: str) -> None:
    """yaml.compose recurses per level: a 10 kB config of nested flow collections raised RecursionError."""
    with pytest.raises(ConfigError, match="nesting deeper"):
        parse_config(doc, path="deep.yaml", name="deep")


def test_config_nesting_limit_does_not_refuse_the_schema() -> None:
    """The limit is far above what the schema uses: the shipped example and a 30-level value still parse."""
    parse_config(targets._CONFIG_SEED, path="ok.yaml", name="ok")
    depth = MAX_CONFIG_DEPTH - 2
    with pytest.raises(ConfigError) as info:
        parse_config("queue: " + "[" * depth + "]" * depth, path="x.yaml", name="x")
    assert "nesting" not in str(info.value)  # refused by the schema (not a path), not by the depth limit


def test_an_empty_metadata_map_is_the_one_second_encoding_of_an_extension() -> None:
    """atheris found ``a2 02 61 79 03 a0`` (content type "y", metadata {}): accepted, as records.md says the
    reference accepts it, and re-encoded without key 3; the harness's one-encoding check now allows exactly
    that difference and still fails any other (an extra entry that is not the empty metadata map)."""
    targets.check_extension(bytes.fromhex("a202617903a0"))
    targets.check_extension(bytes.fromhex("a1026179"))
    assert targets._without_empty_metadata(bytes.fromhex("a202617903a0"), bytes.fromhex("a1026179")) == bytes.fromhex(
        "a1026179"
    )
    assert targets._without_empty_metadata(bytes.fromhex("a202617903a1"), bytes.fromhex("a1026179")) is None
    assert targets._without_empty_metadata(bytes.fromhex("a1026179"), bytes.fromhex("a1026178")) is None
