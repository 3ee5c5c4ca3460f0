"""The reference's key-parser fuzz corpus (vectors/corpus.json, key_parse) replayed through steadqd.s3.keys.

Each input is raw bytes; an accepted one must decode to the recorded fields
and re-encode to exactly the input, a rejected one must be refused (the
reference's error class is advisory, but ours matches it, and the test holds
it to that so a change in the order of checks is seen).
"""

from __future__ import annotations

import pytest

from steadqd.errors import InvalidKey
from steadqd.s3 import keys
from steadqd.s3.keys import TermKind
from tests.stowq.vectors import cases, load


def _fields(parsed: keys.ParsedKey) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in ("shard", "generation", "bucket"):
        if getattr(parsed, name) is not None:
            out[name] = getattr(parsed, name)
    for name in ("job_id", "digest", "qid", "nonce"):
        value = getattr(parsed, name)
        if value is not None:
            out[name] = value.hex()
    if isinstance(parsed.term, TermKind):
        out["kind"] = parsed.term.value
    return out


def test_key_corpus_accepts_exactly_the_recorded_inputs() -> None:
    corpus = cases("corpus", "key_parse")
    accepted = [c for c in corpus if c["accepted"]]
    assert len(accepted) == load("corpus")["counts"]["key_parse_accepted"]
    bad = []
    for case in corpus:
        data = bytes.fromhex(case["input_hex"])
        try:
            parsed = keys.parse_key(data)
        except InvalidKey as err:
            if case["accepted"] or err.error_class != case["reference_error"]:
                bad.append((case["file"], data, err.error_class, case.get("reference_error")))
            continue
        if not case["accepted"]:
            bad.append((case["file"], data, "accepted"))
        elif (parsed.kind.label, _fields(parsed)) != (case["kind"], case["fields"]):
            bad.append((case["file"], data, parsed))
        elif str(parsed).encode() != data or keys.parse_key(str(parsed)) != parsed:
            bad.append((case["file"], data, "does not re-encode to its input", str(parsed)))
    assert not bad


def test_bytes_that_are_not_utf8_are_never_a_key() -> None:
    invalid_utf8 = [c for c in cases("corpus", "key_parse") if not c["valid_utf8"]]
    assert invalid_utf8 and not any(c["accepted"] for c in invalid_utf8)
    # A valid key with one byte made invalid UTF-8 is refused, and the message escapes it.
    with pytest.raises(InvalidKey) as info:
        keys.parse_key(b"jobs/0001/101112131415161718191a1b1c1d1e\xff")
    assert info.value.error_class == "field:job-id"
    assert info.value.key.endswith("1e\ufffd")
