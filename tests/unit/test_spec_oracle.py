"""The test oracle (tests/spec_oracle.py, spec_cbor.py, invariants.py) against the spec itself.

The vectors are read from ../shared/spec at test time, not transcribed, so the
spec stays their one home. Then the audit's point: the checker imports nothing
from ``steadqd``, and with the library's payload digest check switched off it
still flags a payload altered on disk.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steadqd import Queue
from tests.invariants import check_tree
from tests.prereq import PROJECT_ROOT, spec_file
from tests.spec_cbor import decode_extension
from tests.spec_oracle import (
    COMPACT_TEMP_NAME,
    CONTROL_TEMP_NAME,
    DOMAIN_FORMAT,
    DOMAIN_RECEIPT,
    DOMAIN_SHARD,
    DOMAIN_WATERMARK,
    TEMP_NAME,
    SpecViolation,
    State,
    decode_compact_receipt,
    decode_format,
    decode_header,
    decode_watermark,
    envelope_digest,
    is_compact_receipt,
    name_tag,
    parse_bucket_dir,
    parse_name,
    parse_quarantine_name,
    parse_ready_entry,
    parse_shard_dir,
    sha256,
    shard_of,
    tag_context,
    verify_job,
)

# vectors.md "Fixed inputs" (the inputs; every output below is read from the spec).
QID = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
JOB = bytes.fromhex("f0e1d2c3b4a5968778695a4b3c2d1e0f")
TOKEN = bytes.fromhex("00112233445566778899aabbccddeeff")
BOOT = bytes.fromhex("12345678123412341234123456789abc")
CREATED = 1_700_000_000_000_000_000
LEASE_W = DELAYED_W = 10_000_000_000
TERMINAL_W = 3_600_000_000_000
MAX_PAYLOAD = (1 << 40) - 1
ORACLE_MODULES = ("tests/invariants.py", "tests/spec_oracle.py", "tests/spec_cbor.py")


# --------------------------------------------------------------------------- reading the spec


def vectors_section(title: str) -> str:
    """The text of the vectors.md section whose ``## `` heading starts with ``title``."""
    text = spec_file("vectors.md").read_text()
    m = re.search(rf"^## {re.escape(title)}.*?(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert m, f"vectors.md has no section {title!r}"
    return m.group(0)


def dumps(section: str) -> list[bytes]:
    """Every hex dump (``0000: hex   comment`` lines in a code block) of a section."""
    blocks = re.findall(r"^```\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    out = []
    for block in blocks:
        rows = re.findall(r"^[0-9a-f]{4}: ([0-9a-f]+)", block, re.MULTILINE)
        if rows:
            out.append(bytes.fromhex("".join(rows)))
    return out


def provenance(pattern: str) -> list[Any]:
    """Values pinned in vectors.md's provenance table, by a regex on the row (tuples for several groups)."""
    return re.findall(pattern, vectors_section("Provenance"))


def reader(data: bytes) -> Any:
    return lambda offset, n: data[offset : offset + n]


def job_vector() -> bytes:
    (job,) = dumps(vectors_section("Extension and job envelope"))
    return job


def flipped(data: bytes, i: int) -> bytes:
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


# --------------------------------------------------------------------------- records


def test_format_vector_decodes_to_the_fixed_inputs() -> None:
    (data,) = dumps(vectors_section("FORMAT record"))
    fmt = decode_format(data)
    assert (fmt.queue_id, fmt.created_at_ns, fmt.shard_count, fmt.minor) == (QID, CREATED, 64, 1)
    assert (fmt.lease_width_ns, fmt.delayed_width_ns, fmt.terminal_width_ns) == (LEASE_W, DELAYED_W, TERMINAL_W)
    assert fmt.max_payload_length == MAX_PAYLOAD


def test_every_format_byte_is_checked() -> None:
    (data,) = dumps(vectors_section("FORMAT record"))
    for i in range(len(data)):
        with pytest.raises(SpecViolation):
            decode_format(flipped(data, i))
    for wrong in (data[:-1], data + b"\0"):
        with pytest.raises(SpecViolation, match="160"):
            decode_format(wrong)


def _reformat(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    """The FORMAT vector with one field changed and its digest recomputed."""
    body = bytearray(data[:128])
    struct.pack_into(fmt, body, offset, value)
    return bytes(body) + sha256(DOMAIN_FORMAT + bytes(body))


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "error"),
    [
        (8, ">H", 2, "major version 2 is unsupported"),
        (40, ">I", 3, "power of two"),
        (40, ">I", 8192, "power of two"),
        (48, ">Q", 0, "width is 0"),
        (64, ">Q", 59 * 10**9, "terminal width"),
        (64, ">Q", 3_605_000_000_000, "multiple of the delayed width"),
        (72, ">Q", 1 << 40, "2\\^40"),
        (81, ">B", 32, "name tag bits"),
        (88, ">Q", 1, "feature bits"),
    ],
)
def test_format_rules_behind_a_valid_digest(offset: int, fmt: str, value: int, error: str) -> None:
    (data,) = dumps(vectors_section("FORMAT record"))
    with pytest.raises(SpecViolation, match=error):
        decode_format(_reformat(data, offset, fmt, value))


def test_format_minor_is_carried_not_checked() -> None:
    (data,) = dumps(vectors_section("FORMAT record"))
    assert decode_format(_reformat(data, 10, ">H", 0)).minor == 0


def test_job_envelope_vector_verifies() -> None:
    section = vectors_section("Extension and job envelope")
    data = job_vector()
    header, extension = verify_job(reader(data), len(data), MAX_PAYLOAD)
    assert (header.job_id, header.max_attempts, header.created_at_ns, header.minor) == (JOB, 3, CREATED, 1)
    assert (header.extension_length, header.payload_length) == (13, 11)
    assert data[128 + 13 :] == b"hello world" and header.payload_digest == hashlib.sha256(b"hello world").digest()
    (ext_hex,) = re.findall(r"Extension \(content_type only, 13 bytes\): `([0-9a-f]+)`", section)
    assert extension.hex() == ext_hex
    (digest_hex,) = re.findall(r"`([0-9a-f]{64})`\.", section)
    assert header.envelope_digest.hex() == digest_hex == envelope_digest(data[:128], extension).hex()
    assert decode_extension(extension) == {"content_type": "text/plain"}


def test_every_job_byte_is_checked_and_the_size_is_exact() -> None:
    data = job_vector()
    for i in range(len(data)):
        with pytest.raises(SpecViolation):
            verify_job(reader(flipped(data, i)), len(data), MAX_PAYLOAD)
    with pytest.raises(SpecViolation, match="payload digest mismatch"):
        verify_job(reader(flipped(data, len(data) - 1)), len(data), MAX_PAYLOAD)
    with pytest.raises(SpecViolation, match="envelope digest mismatch"):
        verify_job(reader(flipped(data, 130)), len(data), MAX_PAYLOAD)
    for size in (len(data) - 1, len(data) + 1):
        with pytest.raises(SpecViolation, match="header says 152"):
            verify_job(reader(data), size, MAX_PAYLOAD)
    with pytest.raises(SpecViolation, match="queue maximum"):
        verify_job(reader(data), len(data), 10)


def test_pinned_envelope_digests_over_both_minors() -> None:
    """vectors.md's provenance table: job 16×ab, max 3, created 0, payload ``hello``, no extension."""
    (minor1,) = provenance(r"envelope digest: job_id 16×`ab`.*?\| `([0-9a-f]{64})`")
    (minor0,) = provenance(r"same but header minor 0 \| `([0-9a-f]{64})`")
    for minor, expected in ((1, minor1), (0, minor0)):
        header = bytearray(job_vector()[:128])  # records.md "Fixed header" offsets
        struct.pack_into(">HIQ", header, 10, minor, 0, 5)
        struct.pack_into(">16sI4sQ32s", header, 32, b"\xab" * 16, 3, bytes(4), 0, sha256(b"hello"))
        assert envelope_digest(bytes(header), b"").hex() == expected
        assert decode_header(bytes(header)).minor == minor


def test_compact_receipt_vector() -> None:
    (data,) = dumps(vectors_section("Compact receipt"))
    assert is_compact_receipt(data, len(data)) and not is_compact_receipt(data, 129)
    rec = decode_compact_receipt(data)
    env = decode_header(job_vector()[:128]).envelope_digest
    assert (rec.job_id, rec.envelope_digest, rec.final_attempt, rec.lease_token) == (JOB, env, 1, TOKEN)
    assert (rec.bucket_start_ns, rec.payload_length) == (472_222 * TERMINAL_W, 11)
    for i in range(len(data)):
        with pytest.raises(SpecViolation):
            decode_compact_receipt(flipped(data, i))
    legacy = bytearray(data[:96])
    legacy[10:12] = b"\0\0"  # minor 0: the unverified legacy record, refused even with a valid digest
    with pytest.raises(SpecViolation, match="minor 0"):
        decode_compact_receipt(bytes(legacy) + sha256(DOMAIN_RECEIPT + bytes(legacy)))


def test_watermark_vectors() -> None:
    initial, advanced = dumps(vectors_section("Wall watermark records"))
    assert decode_watermark(initial) == type(decode_watermark(initial))(CREATED // DELAYED_W, 0)
    assert (decode_watermark(advanced).bucket, decode_watermark(advanced).sequence) == (170_000_003, 1)
    for data in (initial, advanced):
        for i in range(len(data)):
            with pytest.raises(SpecViolation):
                decode_watermark(flipped(data, i))
        with pytest.raises(SpecViolation, match="64"):
            decode_watermark(data + b"\0")


def test_pinned_domain_digests() -> None:
    """The domain strings the oracle states, against the digests of zero records the spec pins."""
    domains = {"format": DOMAIN_FORMAT, "receipt": DOMAIN_RECEIPT, "wall-watermark": DOMAIN_WATERMARK}
    rows = provenance(r'SHA256\("SteadQ-1-([a-z-]+)\\0" \\\|\\\| (\d+) zero bytes\)` \| `([0-9a-f]{64})`')
    assert sorted(word for word, _, _ in rows) == sorted(domains)
    for word, zeros, digest in rows:
        assert sha256(domains[word] + bytes(int(zeros))).hex() == digest
    (empty,) = provenance(r"SHA256\(empty\) \| `([0-9a-f]{64})`")
    text = spec_file("reference/test-vectors/format/digests.txt").read_text()
    assert re.findall(r"SHA-256: ([0-9a-f]{64})", text) == [empty] == [sha256(b"").hex()]


# --------------------------------------------------------------------------- shards, names, tags


def test_shard_vectors() -> None:
    section = vectors_section("Shard")
    (digest,) = re.findall(r"`([0-9a-f]{64})`", section)
    assert sha256(DOMAIN_SHARD + QID + JOB).hex() == digest
    rows = re.findall(r"^\| (\d+) \| (\d+) \| `([0-9a-f]{4})` \|", section, re.MULTILINE)
    assert len(rows) == 5
    for count, shard, dirname in rows:
        assert shard_of(QID, JOB, int(count)) == int(shard) == parse_shard_dir(dirname, int(count))
    (pinned,) = provenance(r"shard\(queue_id 16×`42`, job_id 16×`ab`, 64\) \| (\d+)")
    assert shard_of(b"\x42" * 16, b"\xab" * 16, 64) == int(pinned)


_TOP_STATE = {"delayed": State.DELAYED, "dead": State.DEAD, "receipts": State.RECEIPT}
# (generation, attempt) of each step of vectors.md "Names through a job's life".
_LIFE = [(0, 0), (1, 1), (2, 1), (3, 1), (2, 1), (3, 1), (0, 0), (2, 1), (1, 0)]


def life_names() -> list[tuple[str, str | None]]:
    """(path, hashed context or None) of each numbered step of vectors.md "Names through a job's life"."""
    section = vectors_section("Names through a job's life")
    steps = re.split(r"^\d+\. \*\*", section, flags=re.MULTILINE)[1:]
    out = []
    for step in steps:
        context = re.search(r"context `([^`]+)`", step)
        (path,) = re.findall(r"→ `([^`]+)`", step)
        out.append((path, context.group(1) if context else None))
    return out


def locate(path: str) -> tuple[State, int, int | None, str]:
    """(state, shard, bucket, file name) of a vector path, as a reader finds it (layout.md "Tree")."""
    parts = path.split("/")
    if parts[0] == "ready":
        name = parse_ready_entry(parts[2])
        assert name is not None, path
        return name.state, int(parts[1], 16), None, parts[2]
    bucket = parse_bucket_dir(parts[1])
    assert bucket is not None, path
    return _TOP_STATE[parts[0]], int(parts[2], 16), bucket, parts[3]


def test_names_through_a_jobs_life_parse_and_authenticate() -> None:
    steps = life_names()
    assert len(steps) == len(_LIFE)
    for (path, printed), (gen, att) in zip(steps, _LIFE, strict=True):
        state, shard, bucket, filename = locate(path)
        name = parse_name(state, filename)
        assert name is not None, path
        assert (name.job_id, name.max_attempts, name.generation, name.attempt) == (JOB, 3, gen, att), path
        assert shard == shard_of(QID, name.job_id, 64) == 10
        context = tag_context(name, shard=shard, bucket=bucket, lease_width_ns=LEASE_W)
        assert printed is None or context == printed, path
        assert name_tag(QID, context) == name.tag, path
        if state in (State.LEASED, State.RECEIPT):
            assert name.lease_token == TOKEN
        if state is State.LEASED:
            assert name.boot_id == BOOT


def test_leased_vector_fields() -> None:
    path, _ = life_names()[1]
    name = parse_ready_entry(path.split("/")[2])
    assert name is not None and name.state is State.LEASED
    assert (name.boottime_deadline, name.wall_deadline) == (1_030_000_000_000, 1_700_000_035_000_000_000)
    delayed = parse_name(State.DELAYED, life_names()[4][0].split("/")[3])
    assert delayed is not None and delayed.not_before == 1_700_000_100_000_000_001
    dead = parse_name(State.DEAD, life_names()[8][0].split("/")[3])
    assert dead is not None and dead.reason == 4


def temp_and_quarantine() -> tuple[str, str]:
    section = vectors_section("Temp and quarantine names")
    (temp,) = re.findall(r"`(tmp/[^`]+)`", section)
    (quarantine,) = re.findall(r"`(quarantine/[^`]+)`", section)
    return temp, quarantine


def test_temp_and_quarantine_names() -> None:
    temp, quarantine = temp_and_quarantine()
    assert TEMP_NAME.fullmatch(os.path.basename(temp))
    assert parse_quarantine_name(os.path.basename(quarantine)) == (
        bytes.fromhex("ffeeddccbbaa99887766554433221100"),
        2,
    )
    assert COMPACT_TEMP_NAME.fullmatch(".compact-" + "0" * 32 + ".tmp")
    assert CONTROL_TEMP_NAME.fullmatch(".wm.adv." + "a" * 32) and CONTROL_TEMP_NAME.fullmatch(".wm.tmp." + "a" * 32)
    assert CONTROL_TEMP_NAME.fullmatch(".recovery-cursor." + "a" * 32 + ".tmp")
    assert not CONTROL_TEMP_NAME.fullmatch(".wm.adv." + "a" * 31)


def test_filename_lengths() -> None:
    table = spec_file("reference/test-vectors/format/filename-lengths.txt").read_text()
    lengths = {word: int(n) for word, n in re.findall(r"^\| (\w+) +\| +(\d+) \|", table, re.MULTILINE)}
    steps = life_names()
    temp, quarantine = temp_and_quarantine()
    examples = {
        "ready": steps[0][0],
        "leased": steps[1][0],
        "receipt": steps[3][0],
        "delayed": steps[4][0],
        "dead": steps[7][0],
        "temporary": temp,
        "quarantine": quarantine,
    }
    assert set(lengths) == set(examples)
    for word, path in examples.items():
        assert len(os.path.basename(path)) == lengths[word], word


def _valid_names() -> Iterator[tuple[State, str]]:
    for path, _ in life_names():
        state, _, _, filename = locate(path)
        yield state, filename


def test_each_name_parses_under_its_own_grammar_only() -> None:
    for state, filename in _valid_names():
        for other in State:
            assert (parse_name(other, filename) is not None) == (other is state), (other, filename)


@pytest.mark.parametrize("state_name", [pytest.param(p, id=p[0].value) for p in list(_valid_names())[:5]])
def test_every_one_character_change_is_rejected(state_name: tuple[State, str]) -> None:
    """names.md "Parser rules": fixed widths, lowercase hex, exact prefixes, ASCII, no NUL."""
    state, name = state_name
    for i, original in enumerate(name):
        for c in "A.-\0 \u0663\uff10é":  # uppercase, separator, dash, NUL, space, non-ASCII digits
            if c != original:
                assert parse_name(state, name[:i] + c + name[i + 1 :]) is None, (i, c)
        assert parse_name(state, name[:i] + name[i + 1 :]) is None, f"deleting {i}"
        assert parse_name(state, name[:i] + "0" + name[i:]) is None, f"inserting at {i}"
    for wrapped in (name + "\n", " " + name, name + ".sqj", name.upper()):
        assert parse_name(state, wrapped) is None, wrapped


def test_reordered_duplicated_and_extra_components_are_rejected() -> None:
    (path, _), *_ = life_names()
    name = path.split("/")[2]
    comps = name.split(".")  # job, g, a, m, k, ext
    for bad in (
        [comps[0], comps[2], comps[1], *comps[3:]],  # a before g
        [comps[0], comps[1], comps[1], *comps[2:]],  # g twice
        [*comps[:4], "d" + "0" * 16, *comps[4:]],  # an extra (delayed) component
        [*comps[:4], comps[5]],  # no tag
    ):
        assert parse_name(State.READY, ".".join(bad)) is None, bad
        assert parse_ready_entry(".".join(bad)) is None, bad


def test_directory_names() -> None:
    assert parse_shard_dir("000a", 64) == 10 and parse_shard_dir("000a", 8) is None
    for bad in ("00a", "000A", "0000a", "00 a", "\u0663000"):
        assert parse_shard_dir(bad, 64) is None
    assert parse_bucket_dir("000000000007349e") == 472_222
    for bad in ("00000000007349e", "000000000007349E", "000000000007349e0"):
        assert parse_bucket_dir(bad) is None


# --------------------------------------------------------------------------- the extension's CBOR


def strict(value: object) -> object:
    """A value with its type, so that True never passes for 1 (== says they are equal)."""
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    return (type(value), value)


def cbor_vectors() -> list[str]:
    section = vectors_section("CBOR extension examples")
    return re.findall(r"^\| .*? \| `([0-9a-f]+)`", section, re.MULTILINE)


def test_cbor_vectors_md() -> None:
    expected: list[dict[str, object]] = [
        {"content_type": "application/json"},
        {"initial_not_before": 0x179A18A8E3E40000, "content_type": "x"},
        {"content_type": "x", "metadata": {"done": False, "active": True}},
        {
            "initial_not_before": 1_700_000_100_000_000_001,
            "content_type": "text/plain",
            "metadata": {"n": -5, "blob": b"\x01\x02", "count": 300, "owner": "team-a"},
            "producer_id": "p1",
            "trace_context": b"\xaa\xbb",
        },
    ]
    encodings = cbor_vectors()
    assert len(encodings) == len(expected)
    for encoding, value in zip(encodings, expected, strict=True):
        assert strict(decode_extension(bytes.fromhex(encoding))) == strict(value), encoding


def test_cbor_txt_vectors_and_its_wrong_line() -> None:
    """cbor.txt's boolean example sorts ``active`` first; vectors.md says that is wrong, and it is refused."""
    text = spec_file("reference/test-vectors/format/cbor.txt").read_text()
    outputs = re.findall(r"^Output: ([0-9a-f]+)$", text, re.MULTILINE)
    assert len(outputs) == 3 and outputs[:2] == cbor_vectors()[:2]
    assert "metadata keys not in canonical order" in " ".join(vectors_section("CBOR extension examples").split())
    with pytest.raises(SpecViolation, match="canonical order"):
        decode_extension(bytes.fromhex(outputs[2]))


def _with_value(item: str) -> bytes:
    """{content_type: "x", metadata: {"v": <item>}}."""
    return bytes.fromhex("a202617803a16176" + item)


@pytest.mark.parametrize(
    "item",
    ["f6", "f7", "f90000", "fa00000000", "fb0000000000000000", "f8ff", "1817", "190017", "c100", "5fff", "7fff", "80"]
    + ["a0", "bfff", "3b8000000000000000"],
    ids=lambda s: s[:6],
)
def test_cbor_rejected_metadata_values(item: str) -> None:
    """cbor.txt "Rejected encodings" and records.md's strictness: no null, undefined, floats,
    non-shortest arguments, tags, indefinite lengths, arrays, nested maps, or negatives beyond i64."""
    with pytest.raises(SpecViolation):
        decode_extension(_with_value(item))


@pytest.mark.parametrize(
    ("item", "value"),
    [("f4", False), ("f5", True), ("00", 0), ("01", 1), ("17", 23), ("1818", 24), ("24", -5)]
    + [("3b7fffffffffffffff", -(2**63)), ("6161", "a"), ("4101", b"\x01")],
)
def test_cbor_accepted_metadata_values(item: str, value: object) -> None:
    assert strict(decode_extension(_with_value(item))["metadata"]) == strict({"v": value})


@pytest.mark.parametrize(
    ("hexdata", "error"),
    [
        ("a1026178ff", "trailing"),
        ("a10100", "content_type is required"),
        ("a10261", "truncated"),
        ("a20261780261 78".replace(" ", ""), "duplicated or out of order"),
        ("a2026178 0100".replace(" ", ""), "duplicated or out of order"),
        ("a2026178 0600".replace(" ", ""), "1..5"),
        ("a10260", "empty or not printable"),
        ("a102610a", "empty or not printable"),
        ("a202617804 61ff".replace(" ", ""), "UTF-8"),
        ("a202617804 6100".replace(" ", ""), "NUL"),
        ("a202617803a1614100", "key rule"),
        ("a202617803a2617600617600", "canonical order"),
        ("a5026178", "map declares"),
        ("6178", "top level"),
        ("a2021817 6178".replace(" ", ""), "non-shortest"),
    ],
)
def test_cbor_decoder_strictness(hexdata: str, error: str) -> None:
    with pytest.raises(SpecViolation, match=error):
        decode_extension(bytes.fromhex(hexdata))


def test_cbor_accepts_an_empty_metadata_map_and_the_limits() -> None:
    assert decode_extension(bytes.fromhex("a202617803a0")) == {"content_type": "x", "metadata": {}}
    assert decode_extension(bytes.fromhex("a2011702 6178".replace(" ", ""))) == {
        "initial_not_before": 23,
        "content_type": "x",
    }
    long_type = b"\x78\xff" + b"t" * 255
    assert decode_extension(b"\xa1\x02" + long_type)["content_type"] == "t" * 255
    with pytest.raises(SpecViolation):
        decode_extension(b"\xa1\x02\x79\x01\x00" + b"t" * 256)


# --------------------------------------------------------------------------- independence


def test_the_checker_modules_import_nothing_from_steadqd() -> None:
    """By their source: only the standard library and each other."""
    own = {"tests.spec_oracle", "tests.spec_cbor"}
    for rel in ORACLE_MODULES:
        tree = ast.parse((PROJECT_ROOT / rel).read_text(), rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{rel}: relative import"
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert module in own or top in sys.stdlib_module_names, f"{rel} imports {module}"


def test_importing_the_checker_loads_no_steadqd_module() -> None:
    """And by what importing it actually loads, in a fresh interpreter."""
    probe = (
        "import sys, tests.invariants\n"
        "loaded = sorted(m for m in sys.modules if m == 'steadqd' or m.startswith('steadqd.'))\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


# --------------------------------------------------------------------------- the audit's mutation


@pytest.fixture
def blind_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every library function that checks a payload digest now accepts anything, in every module that imported one."""
    import steadqd.fs.verify as verify

    def lax_iter(fd: int, env: verify.Envelope) -> Iterator[bytes]:
        offset, remaining = env.payload_offset, env.header.payload_length
        while remaining:
            chunk = os.pread(fd, min(verify.CHUNK, remaining), offset)
            if not chunk:
                return
            offset, remaining = offset + len(chunk), remaining - len(chunk)
            yield chunk

    def lax_copy(fd: int, env: verify.Envelope, out: Any) -> int:
        return sum(out.write(chunk) for chunk in lax_iter(fd, env))

    lax = {
        "iter_payload": lax_iter,
        "verify_payload": lambda fd, env: None,
        "read_payload": lambda fd, env: b"".join(lax_iter(fd, env)),
        "copy_payload": lax_copy,
    }
    originals = {name: getattr(verify, name) for name in lax}
    for module in list(sys.modules.values()):  # wherever the function was imported, a checker too
        for name, replacement in lax.items():
            if module is not None and vars(module).get(name) is originals[name]:
                monkeypatch.setattr(module, name, replacement)


def _alter_payload(root: str, rel: str) -> None:
    path = os.path.join(root, rel)
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 0xFF
    os.chmod(path, 0o600)
    Path(path).write_bytes(bytes(data))


def test_a_payload_altered_on_disk_is_flagged_with_the_library_digest_check_disabled(
    queue: Queue, blind_library: None
) -> None:
    job = queue.enqueue(b"the payload as written")
    obj = check_tree(queue.path).get(job)
    assert obj is not None
    _alter_payload(queue.path, obj.path)

    # The library no longer notices: it leases the job and hands out the altered bytes,
    # and a deep fsck finds nothing wrong.
    assert not queue.fsck(deep=True).errors
    lease = queue.lease(duration=60)
    assert lease is not None and lease.job_id == job
    assert queue.read_payload(lease) == b"the payload as writte" + bytes([ord("n") ^ 0xFF])
    with pytest.raises(AssertionError, match="payload digest mismatch"):
        check_tree(queue.path)

    queue.ack(lease)  # settles (the library's own check is off) into a full receipt
    with pytest.raises(AssertionError, match=r"receipts/.*payload digest mismatch"):
        check_tree(queue.path)


def test_the_same_tree_without_damage_passes(queue: Queue, blind_library: None) -> None:
    job = queue.enqueue(b"intact")
    lease = queue.lease(duration=60)
    assert lease is not None
    queue.ack(lease)
    assert check_tree(queue.path).receipts == {job}


def _move_to_other_shard(root: str, rel: str) -> None:
    parts = rel.split("/")
    other = f"{(int(parts[1], 16) + 1) % 4:04x}"
    os.rename(os.path.join(root, rel), os.path.join(root, "ready", other, parts[2]))


def _flip_header(root: str, rel: str) -> None:
    path = os.path.join(root, rel)
    data = bytearray(Path(path).read_bytes())
    data[40] ^= 0x01  # inside the job id: only the envelope digest can tell
    Path(path).write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_alter_payload, "payload digest mismatch"),
        (_flip_header, "envelope digest mismatch"),
        (lambda root, rel: Path(root, rel).open("ab").write(b"\0"), "header says"),
        (_move_to_other_shard, "name tag does not authenticate"),
        (lambda root, rel: os.link(os.path.join(root, rel), os.path.join(root, "tmp", "x")), "singly linked"),
        (lambda root, rel: Path(root, "control", ".wm.adv.x").write_bytes(b""), "unexpected entry in control"),
    ],
    ids=["payload", "header", "trailing-byte", "wrong-shard", "hard-link", "control-entry"],
)
def test_tree_damage_is_flagged(queue: Queue, damage: Any, message: str) -> None:
    job = queue.enqueue(b"some payload")
    obj = check_tree(queue.path).get(job)
    assert obj is not None and obj.state == State.READY
    damage(queue.path, obj.path)
    with pytest.raises(AssertionError, match=message):
        check_tree(queue.path, allow_temps=True)
