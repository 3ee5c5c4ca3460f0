"""Filename grammar, tags, shards and scan order against spec/vectors.md, byte for byte."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadqd.constants import DOMAIN_NAME, QuarantineReason, State
from steadqd.errors import CorruptObject, InvalidInput, StateExhausted
from steadqd.fs import names, scan_order
from steadqd.fs.names import JobName

# --- vectors.md "Fixed inputs" -------------------------------------------------------------
QID = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
JOB = bytes.fromhex("f0e1d2c3b4a5968778695a4b3c2d1e0f")
SHARDS = 64
LEASE_W = 10_000_000_000
DELAYED_W = 10_000_000_000
TERMINAL_W = 3_600_000_000_000
MAX_ATT = 3
BOOT_DASHED = "12345678-1234-1234-1234-123456789abc"
BOOT = bytes.fromhex("12345678123412341234123456789abc")
TOKEN = bytes.fromhex("00112233445566778899aabbccddeeff")
JH = "f0e1d2c3b4a5968778695a4b3c2d1e0f"


def _path(name: JobName, *, bucket: int | None = None) -> str:
    """Relative path of the object as the reference would write it (tests only)."""
    shard = names.shard_of(QID, name.job_id, SHARDS)
    fn = names.make_filename(QID, name, shard=shard, bucket=bucket, lease_width_ns=LEASE_W)
    s = names.shard_dir(shard)
    if name.state in (State.READY, State.LEASED):
        return f"ready/{s}/{fn}"
    top = {State.DELAYED: "delayed", State.DEAD: "dead", State.RECEIPT: "receipts"}[name.state]
    return f"{top}/{names.bucket_dir(bucket)}/{s}/{fn}"  # type: ignore[arg-type]


def _context(name: JobName, *, bucket: int | None = None) -> str:
    return names.tag_context(
        name, shard=names.shard_of(QID, name.job_id, SHARDS), bucket=bucket, lease_width_ns=LEASE_W
    )


CLAIMED = names.leased_name(
    JOB,
    1,
    1,
    MAX_ATT,
    boot_id=BOOT,
    boottime_deadline=1_000_000_000_000 + 30 * 10**9,
    wall_deadline=1_700_000_005_000_000_000 + 30 * 10**9,
    lease_token=TOKEN,
)
TERMINAL_BUCKET = names.terminal_bucket(1_700_000_030_000_000_000, TERMINAL_W)
NOT_BEFORE = 1_700_000_100_000_000_001
DELAYED_BUCKET = names.delayed_bucket(NOT_BEFORE, DELAYED_W)


# --- "Names through a job's life" --------------------------------------------------------


def test_step1_enqueue_ready() -> None:
    n = names.ready_name(JOB, 0, 0, MAX_ATT)
    ctx = f"ready/-/-/000a/{JH}.g0000000000000000.a00000000.m00000003"
    assert _context(n) == ctx
    assert hashlib.sha256(DOMAIN_NAME + QID + ctx.encode()).hexdigest().startswith("02d0612ad4b6cfc9")
    assert _path(n) == f"ready/000a/{JH}.g0000000000000000.a00000000.m00000003.k02d0612ad4b6cfc9.sqj"


def test_step2_claim() -> None:
    assert CLAIMED.boottime_deadline == 1_030_000_000_000
    assert names.lease_bucket(CLAIMED.boottime_deadline, LEASE_W) == 103
    leased_base = (
        f"{JH}.g0000000000000001.a00000001.m00000003.o12345678123412341234123456789abc"
        ".b000000efd0c8bc00.w17979d065c539e00.t00112233445566778899aabbccddeeff"
    )
    assert _context(CLAIMED) == f"leased/{BOOT_DASHED}/0000000000000067/000a/{leased_base}"
    path = _path(CLAIMED)
    assert path == f"ready/000a/{leased_base}.keafd49285a49db42.sqj"
    assert len(path.rsplit("/", 1)[1]) == 196


def test_step3_renew() -> None:
    renewed = dataclasses.replace(
        CLAIMED,
        generation=names.next_generation(CLAIMED.generation),
        boottime_deadline=1_020_000_000_000 + 30 * 10**9,
        wall_deadline=1_700_000_025_000_000_000 + 30 * 10**9,
    )
    base = (
        f"{JH}.g0000000000000002.a00000001.m00000003.o12345678123412341234123456789abc"
        ".b000000f478e08400.w17979d0b046b6600.t00112233445566778899aabbccddeeff"
    )
    assert _context(renewed) == f"leased/{BOOT_DASHED}/0000000000000069/000a/{base}"
    assert _path(renewed) == f"ready/000a/{base}.ka7f95f8c5881c72b.sqj"
    # the bucket argument is ignored for leased names: it is derived from the deadline
    shard = names.shard_of(QID, JOB, SHARDS)
    assert names.tag_context(renewed, shard=shard, bucket=12345, lease_width_ns=LEASE_W) == _context(renewed)


def test_step4_acknowledge_receipt() -> None:
    assert TERMINAL_BUCKET == 472_222
    n = names.receipt_name(JOB, 3, 1, MAX_ATT, lease_token=TOKEN)
    base = f"{JH}.g0000000000000003.a00000001.m00000003.t00112233445566778899aabbccddeeff"
    assert _context(n, bucket=TERMINAL_BUCKET) == f"receipts/-/000000000007349e/000a/{base}"
    assert _path(n, bucket=TERMINAL_BUCKET) == f"receipts/000000000007349e/000a/{base}.kbc5a89da2b2fd450.rct"


def test_step5_retry_later_delayed() -> None:
    assert DELAYED_BUCKET == 170_000_011
    n = names.delayed_name(
        JOB, names.next_generation(CLAIMED.generation), CLAIMED.attempt, MAX_ATT, not_before=NOT_BEFORE
    )
    base = f"{JH}.g0000000000000002.a00000001.m00000003.d17979d157ea0e801"
    assert _context(n, bucket=DELAYED_BUCKET) == f"delayed/-/000000000a21fe8b/000a/{base}"
    assert _path(n, bucket=DELAYED_BUCKET) == f"delayed/000000000a21fe8b/000a/{base}.kb00be335756af11d.sqj"


def test_step6_promote() -> None:
    n = names.ready_name(JOB, 3, 1, MAX_ATT)
    assert _context(n) == f"ready/-/-/000a/{JH}.g0000000000000003.a00000001.m00000003"
    assert _path(n) == f"ready/000a/{JH}.g0000000000000003.a00000001.m00000003.k6474fc6701bc37c0.sqj"


def test_step7_delayed_enqueue() -> None:
    n = names.delayed_name(JOB, 0, 0, MAX_ATT, not_before=NOT_BEFORE)
    assert (
        _path(n, bucket=DELAYED_BUCKET)
        == f"delayed/000000000a21fe8b/000a/{JH}.g0000000000000000.a00000000.m00000003.d17979d157ea0e801"
        ".k3b1cd7a3194a2293.sqj"
    )


def test_step8_bury() -> None:
    n = names.dead_name(JOB, 2, 1, MAX_ATT, reason=0x0001)
    base = f"{JH}.g0000000000000002.a00000001.m00000003.x0001"
    assert _context(n, bucket=TERMINAL_BUCKET) == f"dead/-/000000000007349e/000a/{base}"
    assert _path(n, bucket=TERMINAL_BUCKET) == f"dead/000000000007349e/000a/{base}.k4ee0e206d543aa40.sqj"


def test_step9_exhausted_ready_cleanup() -> None:
    n = names.dead_name(JOB, 1, 0, MAX_ATT, reason=0x0004)
    assert (
        _path(n, bucket=TERMINAL_BUCKET)
        == f"dead/000000000007349e/000a/{JH}.g0000000000000001.a00000000.m00000003.x0004.k7ed4f0a25331ea1f.sqj"
    )


# --- shards, scan order ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "shard", "dirname"),
    [(1, 0, "0000"), (2, 0, "0000"), (16, 10, "000a"), (64, 10, "000a"), (4096, 4042, "0fca")],
)
def test_shard_table(count: int, shard: int, dirname: str) -> None:
    assert names.shard_of(QID, JOB, count) == shard
    assert names.shard_of_ids(QID, JOB, count) == shard  # publish's entry, for ids known to be bytes
    assert names.shard_dir(shard) == dirname
    assert names.parse_shard_dir(dirname, count) == shard


def test_shard_pinned() -> None:
    assert names.shard_of(b"\x42" * 16, b"\xab" * 16, 64) == 36


@pytest.mark.parametrize("count", [0, 3, 8192, -1, True])
def test_shard_count_invalid(count: int) -> None:
    with pytest.raises(InvalidInput):
        names.shard_of(QID, JOB, count)


def test_scan_params_pinned() -> None:
    assert scan_order.scan_params(b"\x42" * 16, bytes(16), bytes(16), 0, 64) == (46, 23)


@pytest.mark.parametrize(
    ("rnd", "start", "stride", "first"),
    [
        (0, 23, 29, [23, 52, 17, 46, 11, 40, 5, 34]),
        (1, 52, 63, [52, 51, 50, 49, 48, 47, 46, 45]),
        (2, 38, 9, [38, 47, 56, 1, 10, 19, 28, 37]),
    ],
)
def test_scan_order_vectors(rnd: int, start: int, stride: int, first: list[int]) -> None:
    nonce = bytes(range(16))
    assert scan_order.scan_params(QID, BOOT, nonce, rnd, SHARDS) == (start, stride)
    order = list(scan_order.scan_order(QID, BOOT, nonce, rnd, SHARDS))
    assert order[:8] == first
    assert sorted(order) == list(range(SHARDS))


def test_scan_order_start_hint_and_edges() -> None:
    nonce = bytes(range(16))
    order = list(scan_order.scan_order(QID, BOOT, nonce, 0, SHARDS, start_hint=10))
    assert order[:3] == [10, 39, 4]  # stride 29 kept
    assert sorted(order) == list(range(SHARDS))
    assert list(scan_order.scan_order(QID, BOOT, nonce, 0, 1)) == [0]
    assert scan_order.scan_params(QID, BOOT, nonce, 0, 1) == (0, 1)
    for count in (2, 4096):
        assert sorted(scan_order.scan_order(QID, BOOT, nonce, 7, count)) == list(range(count))
    with pytest.raises(InvalidInput):
        list(scan_order.scan_order(QID, BOOT, nonce, 0, SHARDS, start_hint=64))
    assert scan_order.next_scan_round(2**64 - 1) == 0


# --- temp, quarantine, compaction names -----------------------------------------------------


def test_temp_name_vector() -> None:
    t = names.make_temp_name(1_000_000_000_000, bytes(range(16)))
    assert f"tmp/{BOOT_DASHED}/000a/{t}" == (
        "tmp/12345678-1234-1234-1234-123456789abc/000a/000000e8d4a51000.000102030405060708090a0b0c0d0e0f.tmp"
    )
    assert len(t) == 53
    assert names.parse_temp_name(t) == (1_000_000_000_000, bytes(range(16)))
    assert names.parse_temp_name(t.encode()) == (1_000_000_000_000, bytes(range(16)))


@pytest.mark.parametrize(
    "bad",
    [
        "000000E8d4a51000.000102030405060708090a0b0c0d0e0f.tmp",
        "00000e8d4a51000.000102030405060708090a0b0c0d0e0f.tmp",
        "000000e8d4a51000.000102030405060708090a0b0c0d0e0f.raw",
        "000000e8d4a51000.000102030405060708090a0b0c0d0e0f.x.tmp",
        "000000e8d4a51000000102030405060708090a0b0c0d0e0f.tmp",
        ".compact-000102030405060708090a0b0c0d0e0f.tmp",
        "",
    ],
)
def test_temp_name_rejects(bad: str) -> None:
    assert names.parse_temp_name(bad) is None


def test_quarantine_name_vector() -> None:
    qid = bytes.fromhex("ffeeddccbbaa99887766554433221100")
    q = names.make_quarantine_name(qid, QuarantineReason.PAYLOAD_CORRUPT)
    assert f"quarantine/{q}" == "quarantine/qffeeddccbbaa99887766554433221100.x0002.raw"
    assert len(q) == 43
    assert names.parse_quarantine_name(q) == (qid, 2)
    for bad in (
        "Qffeeddccbbaa99887766554433221100.x0002.raw",
        "qffeeddccbbaa99887766554433221100.x0002.sqj",
        "qffeeddccbbaa99887766554433221100.X0002.raw",
        "qFFeeddccbbaa99887766554433221100.x0002.raw",
        "qffeeddccbbaa99887766554433221100.x002.raw",
        "qffeeddccbbaa99887766554433221100.x0002.x0002.raw",
        "x0002.qffeeddccbbaa99887766554433221100.raw",
    ):
        assert names.parse_quarantine_name(bad) is None, bad
    with pytest.raises(InvalidInput):
        names.make_quarantine_name(qid, 0x10000)


def test_compact_temp_name() -> None:
    n = names.make_compact_temp_name(bytes(range(16)))
    assert n == ".compact-000102030405060708090a0b0c0d0e0f.tmp"
    assert names.is_compact_temp_name(n) and names.is_compact_temp_name(n.encode())
    for bad in (
        ".compact-000102030405060708090A0b0c0d0e0f.tmp",
        ".compact-0001.tmp",
        "compact-000102030405060708090a0b0c0d0e0f.tmp",
        n + "x",
    ):
        assert not names.is_compact_temp_name(bad)


# --- lengths, round trips -------------------------------------------------------------------

ALL_NAMES: list[tuple[JobName, int | None, int]] = [
    (names.ready_name(JOB, 0, 0, MAX_ATT), None, 92),
    (CLAIMED, None, 196),
    (names.delayed_name(JOB, 0, 0, MAX_ATT, not_before=NOT_BEFORE), DELAYED_BUCKET, 110),
    (names.dead_name(JOB, 2, 1, MAX_ATT, reason=1), TERMINAL_BUCKET, 98),
    (names.receipt_name(JOB, 3, 1, MAX_ATT, lease_token=TOKEN), TERMINAL_BUCKET, 126),
]


@pytest.mark.parametrize(("name", "bucket", "length"), ALL_NAMES)
def test_lengths_and_round_trip(name: JobName, bucket: int | None, length: int) -> None:
    shard = names.shard_of(QID, JOB, SHARDS)
    fn = names.make_filename(QID, name, shard=shard, bucket=bucket, lease_width_ns=LEASE_W)
    assert len(fn) == length
    parsed = names.parse_name(name.state, fn)
    assert parsed.tag is not None
    assert parsed == dataclasses.replace(name, tag=parsed.tag)
    assert names.parse_name(name.state, fn.encode()) == parsed
    assert names.format_name(parsed, parsed.tag) == fn
    assert names.authenticate(QID, parsed, shard=shard, bucket=bucket, lease_width_ns=LEASE_W)
    # a different directory (shard, bucket) must not authenticate
    assert not names.authenticate(QID, parsed, shard=shard + 1, bucket=bucket, lease_width_ns=LEASE_W)
    if bucket is not None:
        assert not names.authenticate(QID, parsed, shard=shard, bucket=bucket + 1, lease_width_ns=LEASE_W)
    assert not names.authenticate(bytes(16), parsed, shard=shard, bucket=bucket, lease_width_ns=LEASE_W)
    assert not names.authenticate(QID, name, shard=shard, bucket=bucket, lease_width_ns=LEASE_W)  # untagged
    if name.state in (State.READY, State.LEASED):
        assert names.parse_ready_dir_entry(fn) == parsed
    else:
        with pytest.raises(CorruptObject):
            names.parse_ready_dir_entry(fn)


def test_leased_lease_width_matters() -> None:
    shard = names.shard_of(QID, JOB, SHARDS)
    fn = names.make_filename(QID, CLAIMED, shard=shard, lease_width_ns=LEASE_W)
    parsed = names.parse_ready_dir_entry(fn)
    assert parsed.state is State.LEASED
    assert not names.authenticate(QID, parsed, shard=shard, lease_width_ns=LEASE_W * 2)


# --- rejection of every non-canonical form ---------------------------------------------------

READY_FN = f"{JH}.g0000000000000000.a00000000.m00000003.k02d0612ad4b6cfc9.sqj"
LEASED_FN = (
    f"{JH}.g0000000000000001.a00000001.m00000003.o12345678123412341234123456789abc"
    ".b000000efd0c8bc00.w17979d065c539e00.t00112233445566778899aabbccddeeff.keafd49285a49db42.sqj"
)
DELAYED_FN = f"{JH}.g0000000000000000.a00000000.m00000003.d17979d157ea0e801.k3b1cd7a3194a2293.sqj"
DEAD_FN = f"{JH}.g0000000000000002.a00000001.m00000003.x0001.k4ee0e206d543aa40.sqj"
RECEIPT_FN = f"{JH}.g0000000000000003.a00000001.m00000003.t00112233445566778899aabbccddeeff.kbc5a89da2b2fd450.rct"

READY_BAD = [
    READY_FN.upper(),  # uppercase everything
    READY_FN.replace("f0e1d2c3", "F0e1d2c3"),  # uppercase job hex
    READY_FN.replace("k02d0612ad4b6cfc9", "k02D0612ad4b6cfc9"),  # uppercase tag hex
    READY_FN.replace(".g0000000000000000", ".g000000000000000"),  # short generation
    READY_FN.replace(".g0000000000000000", ".g00000000000000000"),  # long generation
    READY_FN.replace(".a00000000", ".a0000000"),
    READY_FN.replace(".m00000003", ".m3"),
    READY_FN.replace(".k02d0612ad4b6cfc9", ".k02d0612ad4b6cfc"),
    READY_FN[1:],  # short job id
    "0" + READY_FN,  # long job id
    READY_FN.replace(".g", ".G"),  # wrong prefix case
    READY_FN.replace(".g", ".h"),  # wrong prefix
    READY_FN.replace(".a00000000", ".x0000"),
    READY_FN.replace(".a00000000.m00000003", ".m00000003.a00000000"),  # reordered
    READY_FN.replace(".a00000000", ".a00000000.a00000000"),  # duplicated
    READY_FN.replace(".m00000003", ".m00000003.d17979d157ea0e801"),  # extra
    READY_FN.replace(".m00000003", ""),  # missing
    READY_FN.replace(".k02d0612ad4b6cfc9", ""),  # missing tag
    READY_FN.replace(".sqj", ".rct"),
    READY_FN.replace(".sqj", ".SQJ"),
    READY_FN.replace(".sqj", ""),
    READY_FN + ".tmp",
    READY_FN.replace(".sqj", ".sqj.sqj"),
    READY_FN.replace(".g", "..g"),  # empty component
    "." + READY_FN,
    READY_FN.replace(".g0", ".g\u0660"),  # non-ASCII digit (Arabic-Indic zero)
    READY_FN.replace("f0e1", "f0é1"[:4]),
    READY_FN.replace(".g0", ".g\x00"),  # NUL
    READY_FN.replace(".g0000000000000000", ".g0x00000000000000"),
    READY_FN.replace(".g0000000000000000", ".g_000000000000000"),
    READY_FN.replace(".g0000000000000000", ".g 000000000000000"),
    READY_FN.replace(".g0000000000000000", ".g+000000000000000"),
    READY_FN + "\n",
    " " + READY_FN[1:],
    LEASED_FN,  # leased name is not a ready name
    DELAYED_FN,
    DEAD_FN,
    RECEIPT_FN,
    "",
    ".sqj",
]


@pytest.mark.parametrize("bad", READY_BAD)
def test_parse_ready_rejects(bad: str) -> None:
    with pytest.raises(CorruptObject) as exc:
        names.parse_name(State.READY, bad)
    assert exc.value.reason == QuarantineReason.FILENAME_PARSE_FAILED


def test_parse_rejects_non_ascii_bytes() -> None:
    with pytest.raises(CorruptObject):
        names.parse_name(State.READY, READY_FN.encode().replace(b"f0e1", b"\xf0\xe1"))
    with pytest.raises(CorruptObject):
        names.parse_name(State.READY, READY_FN.encode().replace(b".g0", b".g\x00"))


@pytest.mark.parametrize(
    ("state", "bad"),
    [
        (State.LEASED, READY_FN),
        (State.LEASED, LEASED_FN.replace(".o12345678", ".o12345678-")),
        (State.LEASED, LEASED_FN.replace(".o12345678123412341234123456789abc", f".o{BOOT_DASHED}")),
        (
            State.LEASED,
            LEASED_FN.replace(".b000000efd0c8bc00.w17979d065c539e00", ".w17979d065c539e00.b000000efd0c8bc00"),
        ),
        (State.LEASED, LEASED_FN.replace(".t0011", ".T0011")),
        (State.LEASED, LEASED_FN.replace(".t00112233445566778899aabbccddeeff", ".t00112233445566778899AABBCCDDEEFF")),
        (State.LEASED, LEASED_FN.replace(".t00112233445566778899aabbccddeeff", "")),
        (State.DELAYED, DELAYED_FN.replace(".d17979d157ea0e801", ".d17979d157ea0e80")),
        (State.DELAYED, DELAYED_FN.replace(".d", ".b")),
        (State.DELAYED, READY_FN),
        (State.DELAYED, DEAD_FN),
        (State.DEAD, DEAD_FN.replace(".x0001", ".x001")),
        (State.DEAD, DEAD_FN.replace(".x0001", ".x00001")),
        (State.DEAD, DEAD_FN.replace(".x0001", ".x000A")),
        (State.DEAD, DEAD_FN.replace(".sqj", ".rct")),
        (State.DEAD, DELAYED_FN),
        (State.RECEIPT, RECEIPT_FN.replace(".rct", ".sqj")),
        (State.RECEIPT, RECEIPT_FN.replace(".t", ".o")),
        (State.RECEIPT, DEAD_FN.replace(".sqj", ".rct")),
    ],
)
def test_parse_other_states_reject(state: State, bad: str) -> None:
    with pytest.raises(CorruptObject):
        names.parse_name(state, bad)


def test_ready_dir_entry_rejects() -> None:
    for bad in (DELAYED_FN, DEAD_FN, RECEIPT_FN, READY_FN.upper(), LEASED_FN.replace(".sqj", ".rct")):
        with pytest.raises(CorruptObject) as exc:
            names.parse_ready_dir_entry(bad)
        assert exc.value.reason == QuarantineReason.FILENAME_PARSE_FAILED


# --- directories, ids, buckets, builders ------------------------------------------------------


def test_parse_dirs() -> None:
    assert names.parse_shard_dir("003f", 64) == 63
    assert names.parse_shard_dir(b"003f", 64) == 63
    for bad in ("0040", "003F", "03f", "0003f", "+03f", " 03f", "003f\n", "", "\u0660\u0660\u0660\u0661"):
        assert names.parse_shard_dir(bad, 64) is None, bad
    assert names.bucket_dir(472_222) == "000000000007349e"
    assert names.parse_bucket_dir("000000000007349e") == 472_222
    assert names.parse_bucket_dir(b"ffffffffffffffff") == 2**64 - 1
    for bad in ("000000000007349E", "00000000007349e", "0000000000007349e", "0x0000000007349e", "-"):
        assert names.parse_bucket_dir(bad) is None, bad
    with pytest.raises(InvalidInput):
        names.bucket_dir(2**64)
    with pytest.raises(InvalidInput):
        names.shard_dir(-1)


def test_boot_and_job_ids() -> None:
    assert names.boot_raw(BOOT_DASHED) == BOOT
    assert names.boot_dashed(BOOT) == BOOT_DASHED
    for bad in (
        BOOT_DASHED.upper(),
        BOOT_DASHED.replace("-", ""),
        BOOT_DASHED + "\n",
        "12345678-1234-1234-1234_123456789abc",
        "1234567-81234-1234-1234-123456789abc",
        "12345678-1234-1234-1234-123456789abg",
    ):
        with pytest.raises(InvalidInput):
            names.boot_raw(bad)
    assert names.parse_job_id(JH) == JOB
    assert names.job_hex(JOB) == JH
    for bad in (JH.upper(), JH[:-1], JH + "0", " " + JH[1:], "0x" + JH[2:]):
        with pytest.raises(InvalidInput, match="job id"):
            names.parse_job_id(bad)


def test_buckets() -> None:
    assert names.delayed_bucket(NOT_BEFORE, DELAYED_W) == 170_000_011
    assert names.delayed_bucket(1_700_000_100_000_000_000, DELAYED_W) == 170_000_010  # exact: no rounding up
    assert names.delayed_bucket(0, DELAYED_W) == 0
    assert names.lease_bucket(1_030_000_000_000, LEASE_W) == 103
    assert names.lease_bucket(1_020_000_000_000 + 30 * 10**9, LEASE_W) == 105
    assert names.terminal_bucket(1_700_000_030_000_000_000, TERMINAL_W) == 472_222
    assert names.watermark_bucket(1_700_000_000_000_000_000, DELAYED_W) == 170_000_000
    assert names.bucket_start(472_222, TERMINAL_W) == 1_699_999_200_000_000_000
    assert names.bucket_end(472_222, TERMINAL_W) == 1_699_999_200_000_000_000 + TERMINAL_W
    with pytest.raises(StateExhausted):
        names.bucket_start(2**64 - 1, 2)
    with pytest.raises(StateExhausted):
        names.bucket_end(2**64 - 1, 1)
    with pytest.raises(InvalidInput):
        names.delayed_bucket(5, 0)


def test_identity_overflow() -> None:
    assert names.next_generation(0) == 1
    assert names.next_attempt(2**32 - 2) == 2**32 - 1
    with pytest.raises(StateExhausted):
        names.next_generation(2**64 - 1)
    with pytest.raises(StateExhausted):
        names.next_attempt(2**32 - 1)


def test_builder_validation() -> None:
    with pytest.raises(InvalidInput):
        names.ready_name(JOB[:15], 0, 0, 3)
    with pytest.raises(InvalidInput):
        names.ready_name(JOB, 2**64, 0, 3)
    with pytest.raises(InvalidInput):
        names.ready_name(JOB, 0, 2**32, 3)
    with pytest.raises(InvalidInput):
        names.dead_name(JOB, 0, 0, 3, reason=0x10000)
    with pytest.raises(InvalidInput):
        names.delayed_name(JOB, 0, 0, 3, not_before=-1)
    with pytest.raises(InvalidInput):  # field of another grammar
        JobName(State.READY, JOB, 0, 0, 3, reason=1)
    with pytest.raises(InvalidInput):  # missing field of this grammar
        JobName(State.RECEIPT, JOB, 0, 0, 3)
    with pytest.raises(InvalidInput):
        names.format_name(names.ready_name(JOB, 0, 0, 3), b"\0" * 7)
    with pytest.raises(InvalidInput):  # delayed/dead/receipt contexts need the directory bucket
        names.tag_context(names.dead_name(JOB, 0, 0, 3, reason=0), shard=10, bucket=None, lease_width_ns=LEASE_W)
    assert names.dead_name(JOB, 0, 0, 3, reason=QuarantineReason(4)).reason == 4


# --- property tests --------------------------------------------------------------------------

_u64 = st.integers(0, 2**64 - 1)
_u32 = st.integers(0, 2**32 - 1)
_id = st.binary(min_size=16, max_size=16)


@st.composite
def _job_names(draw: st.DrawFn) -> tuple[JobName, int | None]:
    state = draw(st.sampled_from(list(State)))
    common = (draw(_id), draw(_u64), draw(_u32), draw(_u32))
    bucket: int | None = draw(_u64)
    if state is State.READY:
        n, bucket = names.ready_name(*common), None
    elif state is State.LEASED:
        n = names.leased_name(
            *common, boot_id=draw(_id), boottime_deadline=draw(_u64), wall_deadline=draw(_u64), lease_token=draw(_id)
        )
        bucket = None
    elif state is State.DELAYED:
        n = names.delayed_name(*common, not_before=draw(_u64))
    elif state is State.DEAD:
        n = names.dead_name(*common, reason=draw(st.integers(0, 0xFFFF)))
    else:
        n = names.receipt_name(*common, lease_token=draw(_id))
    return n, bucket


_FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FAST
@given(_job_names(), st.integers(0, 4095), st.integers(1, 2**64 - 1))
def test_round_trip_property(nb: tuple[JobName, int | None], shard: int, width: int) -> None:
    name, bucket = nb
    fn = names.make_filename(QID, name, shard=shard, bucket=bucket, lease_width_ns=width)
    parsed = names.parse_name(name.state, fn)
    assert parsed == dataclasses.replace(name, tag=parsed.tag)
    assert names.format_name(parsed, parsed.tag) == fn  # type: ignore[arg-type]
    assert names.authenticate(QID, parsed, shard=shard, bucket=bucket, lease_width_ns=width)


@_FAST
@given(_id, _u64, _u32, _u32, _id, _u64, _u64, _id)
def test_trusted_leased_name_is_the_checked_one(
    job: bytes, gen: int, att: int, mx: int, boot: bytes, bt: int, wall: int, token: bytes
) -> None:
    """The claim's unchecked builder makes the very name the checked builder makes, field for field
    (an unset or misnamed field would differ in ``__dict__``, and so in the name and its tag)."""
    trusted = names.trusted_leased_name(names.ready_name(job, 0, 0, mx), gen, att, boot, bt, wall, token)
    checked = names.leased_name(
        job, gen, att, mx, boot_id=boot, boottime_deadline=bt, wall_deadline=wall, lease_token=token
    )
    assert trusted.__dict__ == checked.__dict__
    assert names.make_filename(QID, trusted, shard=3, lease_width_ns=LEASE_W) == names.make_filename(
        QID, checked, shard=3, lease_width_ns=LEASE_W
    )


def test_written_out_constructors_keep_their_dataclass_behaviour() -> None:
    """JobName fills its frozen fields itself: keyword use, replace(), equality and frozenness still hold."""
    n = JobName(state=State.READY, job_id=JOB, generation=1, attempt=0, max_attempts=3)
    assert n == names.ready_name(JOB, 1, 0, 3)
    assert dataclasses.replace(n, generation=2) == names.ready_name(JOB, 2, 0, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.generation = 5  # type: ignore[misc]
    with pytest.raises(InvalidInput):
        dataclasses.replace(n, generation=2**64)


# Field values around the limits and of the wrong types: what the fast tests in front of the full checks see.
_ANY_FIELD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.integers(2**32 - 2, 2**32 + 1),
    st.integers(2**64 - 2, 2**64 + 1),
    st.binary(min_size=15, max_size=17),
    st.binary(min_size=8, max_size=8),
    st.just(bytearray(16)),
    st.just("00" * 16),
)


def _outcome(make: object) -> object:
    try:
        return ("ok", make())  # type: ignore[operator]
    except (InvalidInput, CorruptObject) as e:
        return (type(e), str(e))


_FIELD_NAMES = ("job_id", "generation", "attempt", "max_attempts", "boot_id", "boottime_deadline", "wall_deadline",
                "lease_token", "not_before", "reason", "tag")  # fmt: skip


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(
    st.one_of(_job_names().filter(lambda nb: nb[0].state in (State.READY, State.RECEIPT)), _job_names()),
    st.dictionaries(st.sampled_from(_FIELD_NAMES), _ANY_FIELD, min_size=1, max_size=3),
)
def test_jobname_fast_check_passes_only_what_check_passes(nb: tuple[JobName, int | None], changes: dict) -> None:
    """JobName's one-test path for the ready and receipt names of every enqueue and ack accepts a
    name only if the full _check does: a valid name of any state with up to three fields changed to
    values near the limits or of other types ends as the full check says (same error)."""
    name, _ = nb
    fields = {f: getattr(name, f) for f in _FIELD_NAMES} | changes

    def by_the_rule() -> dict[str, object]:
        n = object.__new__(JobName)
        n.__dict__.update(state=name.state, **fields)
        n._check()
        return n.__dict__

    built = _outcome(lambda: JobName(name.state, **fields).__dict__)
    assert built == _outcome(by_the_rule)


def _one_name_of(state: State) -> JobName:
    return {
        State.READY: names.ready_name(JOB, 1, 2, 3),
        State.LEASED: names.leased_name(
            JOB, 1, 2, 3, boot_id=JOB, boottime_deadline=4, wall_deadline=5, lease_token=JOB
        ),
        State.DELAYED: names.delayed_name(JOB, 1, 2, 3, not_before=4),
        State.DEAD: names.dead_name(JOB, 1, 2, 3, reason=4),
        State.RECEIPT: names.receipt_name(JOB, 1, 2, 3, lease_token=JOB),
    }[state]


_EDGE_VALUES = (None, True, False, -1, 0, 1, 2**32 - 1, 2**32, 2**64 - 1, 2**64, b"", bytes(8), bytes(15),
                bytes(16), bytes(17), bytearray(16), "00" * 16, 1.0)  # fmt: skip


@pytest.mark.parametrize("state", list(State))
def test_jobname_fast_check_on_every_field_at_its_edges(state: State) -> None:
    """Each field of a valid name of ``state``, set in turn to each edge value: JobName ends as the full
    _check says. (Exhaustive where the property test above samples: a conjunct missing from the fast
    test shows here whatever the seed.)"""
    base = _one_name_of(state)
    for field in _FIELD_NAMES:
        for value in _EDGE_VALUES:
            fields = {f: getattr(base, f) for f in _FIELD_NAMES} | {field: value}

            def by_the_rule(fields: dict[str, object] = fields) -> dict[str, object]:
                n = object.__new__(JobName)
                n.__dict__.update(state=state, **fields)
                n._check()
                return n.__dict__

            built = _outcome(lambda fields=fields: JobName(state, **fields).__dict__)
            assert built == _outcome(by_the_rule), (field, value)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.binary(min_size=15, max_size=17), st.just(QID)),
    st.one_of(st.binary(min_size=15, max_size=17), st.just(JOB)),
    st.one_of(st.integers(-1, 70000), st.sampled_from([1 << i for i in range(17)])),
)
def test_shard_of_fast_path_matches_the_full_function(queue_id: bytes, job_id: bytes, count: int) -> None:
    """shard_of_ids (shard_of's memoised path: one test of its checks) answers as _shard_of does, error included."""
    assert _outcome(lambda: names.shard_of_ids(queue_id, job_id, count)) == _outcome(
        lambda: names._shard_of(queue_id, job_id, count)
    )


_EDGE_INTS = st.one_of(
    st.integers(-2, 5),
    st.integers(4094, 4097),
    st.integers(65534, 65537),
    st.integers(2**64 - 2, 2**64 + 1),
    st.integers(0, 2**64 - 1),
    st.booleans(),
    st.none(),
    st.just(1.0),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_job_names(), _EDGE_INTS, _EDGE_INTS, st.integers(1, 2**64 - 1))
def test_make_filename_fast_contexts_are_tag_contexts(
    nb: tuple[JobName, int | None], shard: int, bucket: int | None, width: int
) -> None:
    """make_filename's written-out contexts (the ready name of every enqueue, the receipt of every ack)
    give the name the definition gives: tag_context, compute_tag, format (same error when refused)."""
    name, _ = nb

    def by_definition() -> str:
        ctx = names.tag_context(name, shard=shard, bucket=bucket, lease_width_ns=width)
        return names.format_name(name, names.compute_tag(QID, ctx))

    made = _outcome(lambda: names.make_filename(QID, name, shard=shard, bucket=bucket, lease_width_ns=width))
    assert made == _outcome(by_definition)


_EDGE_LIST = (None, True, -1, 0, 1, 4095, 4096, 65535, 65536, 2**64 - 1, 2**64, 1.0)


@pytest.mark.parametrize("state", list(State))
def test_make_filename_and_state_dir_at_every_edge(state: State) -> None:
    """The fast paths above, for every pair of edge values of shard and bucket (exhaustive, whatever the seed)."""
    name = _one_name_of(state)
    top = names._BUCKETED_DIRS.get(state)
    for shard in _EDGE_LIST:
        for bucket in _EDGE_LIST:

            def by_definition(shard: object = shard, bucket: object = bucket) -> str:
                ctx = names.tag_context(name, shard=shard, bucket=bucket, lease_width_ns=LEASE_W)  # type: ignore[arg-type]
                return names.format_name(name, names.compute_tag(QID, ctx))

            made = _outcome(
                lambda shard=shard, bucket=bucket: names.make_filename(
                    QID, name, shard=shard, bucket=bucket, lease_width_ns=LEASE_W
                )
            )
            assert made == _outcome(by_definition), (shard, bucket)
            if top is not None and bucket is not None:
                expected = _outcome(
                    lambda shard=shard, bucket=bucket: f"{top}/{names.bucket_dir(bucket)}/{names.shard_dir(shard)}"
                )
                assert _outcome(lambda shard=shard, bucket=bucket: names.state_dir(state, shard, bucket)) == expected


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(list(State)), _EDGE_INTS, _EDGE_INTS)
def test_state_dir_fast_path_is_the_checked_one(state: State, shard: int, bucket: int | None) -> None:
    def by_definition() -> str:
        top = names._BUCKETED_DIRS.get(state)
        if top is None:
            return f"ready/{names.shard_dir(shard)}"
        if bucket is None:
            raise InvalidInput(f"a {state.value} directory needs its bucket")
        return f"{top}/{names.bucket_dir(bucket)}/{names.shard_dir(shard)}"

    assert _outcome(lambda: names.state_dir(state, shard, bucket)) == _outcome(by_definition)


@settings(max_examples=300, deadline=None)
@given(_EDGE_INTS, st.one_of(_EDGE_INTS, st.integers(1, 2**64 - 1)))
def test_generation_and_terminal_bucket_fast_paths_are_the_checked_ones(value: int, width: int) -> None:
    def next_by_definition() -> int:
        names._check_int("generation", value, names.U64_MAX)
        if value == names.U64_MAX:
            raise StateExhausted(f"generation {value} cannot be incremented (u64 overflow)")
        return value + 1

    def bucket_by_definition() -> int:
        return names._check_int("wall_ns", value, names.U64_MAX) // names._check_width("terminal width", width)

    def outcome(make: object) -> object:
        try:
            return ("ok", make())  # type: ignore[operator]
        except (InvalidInput, StateExhausted) as e:
            return (type(e), str(e))

    assert outcome(lambda: names.next_generation(value)) == outcome(next_by_definition)
    assert outcome(lambda: names.terminal_bucket(value, width)) == outcome(bucket_by_definition)


_FILENAME_ARGS = ("job_id", "generation", "attempt", "max_attempts", "lease_token", "shard", "bucket")


def _filenames_both_ways(args: dict[str, object]) -> tuple[object, object, object, object]:
    """(ready_filename, its definition, receipt_filename, its definition) of ``args``, each a value or its error."""
    a = args
    common = (a["job_id"], a["generation"], a["attempt"], a["max_attempts"])
    ready = _outcome(lambda: names.ready_filename(QID, *common, shard=a["shard"], lease_width_ns=LEASE_W))  # type: ignore[arg-type]
    ready_def = _outcome(
        lambda: names.make_filename(QID, names.ready_name(*common), shard=a["shard"], lease_width_ns=LEASE_W)  # type: ignore[arg-type]
    )
    receipt = _outcome(
        lambda: names.receipt_filename(
            QID,
            *common,
            lease_token=a["lease_token"],
            shard=a["shard"],
            bucket=a["bucket"],
            lease_width_ns=LEASE_W,  # type: ignore[arg-type]
        )
    )
    receipt_def = _outcome(
        lambda: names.make_filename(
            QID,
            names.receipt_name(*common, lease_token=a["lease_token"]),  # type: ignore[arg-type]
            shard=a["shard"],  # type: ignore[arg-type]
            bucket=a["bucket"],  # type: ignore[arg-type]
            lease_width_ns=LEASE_W,
        )
    )
    return ready, ready_def, receipt, receipt_def


def test_ready_and_receipt_filenames_at_every_edge() -> None:
    """ready_filename and receipt_filename (the names of every enqueue and ack, formatted without a
    JobName) give make_filename's name of the checked JobName, or its error, with any one argument at
    any edge value (exhaustive)."""
    valid: dict[str, object] = dict(
        job_id=JOB, generation=1, attempt=2, max_attempts=3, lease_token=bytes(range(16, 32)), shard=7, bucket=9
    )
    for arg in _FILENAME_ARGS:
        for value in (*_EDGE_VALUES, 4095, 4096, 65535):
            ready, ready_def, receipt, receipt_def = _filenames_both_ways(valid | {arg: value})
            assert ready == ready_def, (arg, value)
            assert receipt == receipt_def, (arg, value)


@settings(max_examples=300, deadline=None)
@given(_id, _u64, _u32, _u32, _id, st.integers(0, 4095), _u64)
def test_ready_and_receipt_filenames_are_make_filenames(
    job: bytes, gen: int, att: int, mx: int, token: bytes, shard: int, bucket: int
) -> None:
    ready, ready_def, receipt, receipt_def = _filenames_both_ways(
        dict(job_id=job, generation=gen, attempt=att, max_attempts=mx, lease_token=token, shard=shard, bucket=bucket)
    )
    assert ready == ready_def and ready[0] == "ok"
    assert receipt == receipt_def and receipt[0] == "ok"


_NAME_CHARS = "0123456789abcdefABCDEFgkmotwbdx.-_ qrsj\x00\u00e9"


@_FAST
@given(_job_names(), st.integers(0, 4095), st.data())
def test_single_char_mutation_never_authenticates(
    nb: tuple[JobName, int | None], shard: int, data: st.DataObject
) -> None:
    name, bucket = nb
    fn = names.make_filename(QID, name, shard=shard, bucket=bucket, lease_width_ns=LEASE_W)
    pos = data.draw(st.integers(0, len(fn) - 1))
    ch = data.draw(st.sampled_from(_NAME_CHARS).filter(lambda c: c != fn[pos]))
    op = data.draw(st.sampled_from(["replace", "insert", "delete"]))
    if op == "replace":
        mutated = fn[:pos] + ch + fn[pos + 1 :]
    elif op == "insert":
        mutated = fn[:pos] + ch + fn[pos:]
    else:
        mutated = fn[:pos] + fn[pos + 1 :]
    parse = (
        names.parse_ready_dir_entry
        if name.state in (State.READY, State.LEASED)
        else (lambda m: names.parse_name(name.state, m))
    )
    try:
        parsed = parse(mutated)
    except CorruptObject:
        return
    assert not names.authenticate(QID, parsed, shard=shard, bucket=bucket, lease_width_ns=LEASE_W)
