"""``stats``, ``fsck`` and ``inspect`` (steadqd.fs.views, steadqd.fs.fsck) against real trees.

What these tests pin down and why:

* the exact CLI output strings (cli.md) for stats in all three formats, since
  dashboards and scripts parse them;
* the reference's *raw* stats semantics (every non-directory entry counts,
  colocated leases are "ready") next to the by-name ``detailed_stats``;
* that stats streams: 100 000 jobs must not make it hold a list of names;
* every fsck finding type we can provoke on disk, its severity, the exit
  code, the quarantine reason ``--repair`` applies (recovery.md table), that
  the quarantined bytes are the original ones, and that a second run is clean;
* receipts (full and compact) are verified by fsck and by inspect.

Damaged objects are planted with plain ``os`` calls, never through the
library, so the library cannot hide its own mistakes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from steadqd import (
    CorruptObject,
    ErrorKind,
    InvalidInput,
    NotCommitted,
    Queue,
    State,
)
from steadqd.cli import maintenance_cmd, view_cmd
from steadqd.fs import names
from steadqd.fs import views as insp
from steadqd.fs.boot_id import read_boot_id
from steadqd.fs.fsck import FsckResult
from steadqd.fs.linux import ofd_lock
from steadqd.fs.records import Extension, build_header, encode_extension
from tests.fabricate import plant_in_dead, write_ready_jobs
from tests.invariants import check_tree

SEC = 1_000_000_000
OTHER_BOOT = bytes.fromhex("0123456789abcdef0123456789abcdef")
STATES6 = ("dead", "delayed", "leased", "quarantine", "ready", "receipts")


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def tmp_path(fast_tmp_path: Path) -> Path:
    """The session's RAM-backed ext4 (tests/conftest.py): writing and removing the stats test's
    100k job files there takes 39 s instead of 93 s, and every check here is about the tree, not the disk."""
    return fast_tmp_path


@pytest.fixture
def q(queue: Queue) -> Queue:
    """The root queue (tests/conftest.py), under this module's short name."""
    return queue


def job_bytes(job: bytes, payload: bytes, max_attempts: int = 3) -> bytes:
    """A valid job file (header + extension + payload) built independently of publish.py."""
    ext = encode_extension(Extension(content_type="application/octet-stream"))
    header = build_header(
        job_id=job,
        max_attempts=max_attempts,
        created_at_ns=time.time_ns(),
        extension=ext,
        payload_length=len(payload),
        payload_digest=hashlib.sha256(payload).digest(),
    )
    return header.encode() + ext + payload


def ready_filename(queue: Queue, job: bytes, *, shard: int | None = None, max_attempts: int = 3) -> tuple[str, str]:
    """(shard dir, tagged ready name) for ``job``; ``shard`` overrides the placement (tag follows it)."""
    fmt = queue.format
    s = names.shard_of(fmt.queue_id, job, fmt.shard_count) if shard is None else shard
    jn = names.ready_name(job, 0, 0, max_attempts)
    return names.shard_dir(s), names.make_filename(fmt.queue_id, jn, shard=s, lease_width_ns=fmt.lease_width_ns)


def rename_to(queue: Queue, rel: str, new_rel: str) -> str:
    os.makedirs(os.path.dirname(os.path.join(queue.path, new_rel)), exist_ok=True)
    os.rename(os.path.join(queue.path, rel), os.path.join(queue.path, new_rel))
    return new_rel


def flip(queue: Queue, rel: str, offset: int) -> None:
    p = Path(queue.path, rel)
    data = bytearray(p.read_bytes())
    data[offset] ^= 0xFF
    p.write_bytes(bytes(data))


def tagged_leased(queue: Queue, job: bytes, *, boot: bytes, deadline: int, shard: int) -> str:
    fmt = queue.format
    ln = names.leased_name(
        job,
        1,
        1,
        3,
        boot_id=boot,
        boottime_deadline=deadline,
        wall_deadline=time.time_ns() + 30 * SEC,
        lease_token=os.urandom(16),
    )
    return names.make_filename(fmt.queue_id, ln, shard=shard, lease_width_ns=fmt.lease_width_ns)


def kinds(r: FsckResult) -> list[tuple[str, str, str]]:
    return [(f.severity, f.path, f.finding_type) for f in r.findings]


def quarantine_of(r: FsckResult, rel: str) -> tuple[str, int]:
    """(quarantine file name, reason) from the ``WARN quarantined`` finding of ``rel``."""
    [f] = [f for f in r.findings if f.path == rel and f.finding_type == "quarantined"]
    assert f.severity == "WARN"
    m = re.fullmatch(r"moved to quarantine id=([0-9a-f]{32}) name=(q([0-9a-f]{32})\.x([0-9a-f]{4})\.raw)", f.details)
    assert m is not None, f.details
    assert m.group(1) == m.group(3)
    return m.group(2), int(m.group(4), 16)


# =========================================================================== stats


def test_empty_queue_stats_exact_outputs(q: Queue) -> None:
    s = q.entry_stats()
    assert list(s) == ["ready", "leased", "delayed", "receipts", "dead", "quarantine"]
    assert view_cmd.format_stats_text(s) == "".join(f"{k}: 0\n" for k in STATES6)
    expected_json = "{\n" + ",\n".join(
        f'  "{k}": {{\n    "objects": 0,\n    "oldest_age_seconds": null\n  }}' for k in STATES6
    )
    assert view_cmd.format_stats_json(s) == expected_json + "\n}\n"
    assert view_cmd.format_stats_prometheus(s) == "".join(
        f"# TYPE steadq_{k}_objects gauge\nsteadq_{k}_objects 0\n" for k in STATES6
    )
    detailed = q.stats()
    assert sorted(detailed) == sorted(STATES6 + ("tmp",))
    assert all(v == insp.StateStats(0, None) for v in detailed.values())


def test_nonempty_formats_exact() -> None:
    s = {
        "ready": insp.StateStats(2, 5),
        "dead": insp.StateStats(0, None),
        "leased": insp.StateStats(1, 0),
    }
    assert view_cmd.format_stats_text(s) == "dead: 0\nleased: 1 (oldest 0s)\nready: 2 (oldest 5s)\n"
    assert json.loads(view_cmd.format_stats_json(s)) == {
        "dead": {"objects": 0, "oldest_age_seconds": None},
        "leased": {"objects": 1, "oldest_age_seconds": 0},
        "ready": {"objects": 2, "oldest_age_seconds": 5},
    }
    assert view_cmd.format_stats_json(s).startswith('{\n  "dead": {\n    "objects": 0,\n')
    assert view_cmd.format_stats_prometheus(s) == (
        "# TYPE steadq_dead_objects gauge\nsteadq_dead_objects 0\n"
        "# TYPE steadq_leased_objects gauge\nsteadq_leased_objects 1\n"
        "# TYPE steadq_ready_objects gauge\nsteadq_ready_objects 2\n"
        "# TYPE steadq_leased_oldest_age_seconds gauge\nsteadq_leased_oldest_age_seconds 0\n"
        "# TYPE steadq_ready_oldest_age_seconds gauge\nsteadq_ready_oldest_age_seconds 5\n"
    )


def test_stats_reference_semantics_and_detailed_breakdown(q: Queue) -> None:
    root = q.path
    q.enqueue(b"a")
    q.enqueue(b"b")
    lease = q.lease()  # one of the two becomes a colocated lease in ready/<S>/
    assert lease is not None
    q.enqueue(b"later", delay=3600)
    q.enqueue(b"c")
    dead_lease = q.lease()
    assert dead_lease is not None
    q.bury(dead_lease)
    q.enqueue(b"d")
    acked = q.lease()
    assert acked is not None
    q.ack(acked)
    # A legacy lease, a stray in a shard directory, a quarantined object, temps.
    job = os.urandom(16)
    shard = names.shard_of(q.format.queue_id, job, q.shard_count)
    legacy_dir = f"leased/{names.boot_dashed(OTHER_BOOT)}/{0:016x}/{names.shard_dir(shard)}"
    os.makedirs(os.path.join(root, legacy_dir))
    legacy_name = tagged_leased(q, job, boot=OTHER_BOOT, deadline=1, shard=shard)
    Path(root, legacy_dir, legacy_name).write_bytes(job_bytes(job, b"legacy"))
    Path(root, "ready/0000/stray.txt").write_bytes(b"x")
    Path(root, "quarantine", names.make_quarantine_name(os.urandom(16), 1)).write_bytes(b"q")
    os.makedirs(os.path.join(root, "tmp/some-boot/0000"))
    Path(root, "tmp/some-boot/0000", names.make_temp_name(1, os.urandom(16))).write_bytes(b"t")

    s = q.entry_stats()
    counts = {k: v.objects for k, v in s.items()}
    # As the reference: the colocated lease counts as ready; leased = legacy tree only. The stray is no job.
    assert counts == {"ready": 2, "leased": 1, "delayed": 1, "receipts": 1, "dead": 1, "quarantine": 1, "stray": 1}
    assert all((v.oldest_age_seconds is None) == (v.objects == 0) for v in s.values())

    d = q.stats()
    assert {k: v.objects for k, v in d.items()} == {
        "ready": 1,  # 4 enqueued, 3 leased; the stray is not a job
        "leased": 2,  # colocated + legacy
        "delayed": 1,
        "dead": 1,
        "receipts": 1,
        "quarantine": 1,
        "tmp": 1,
        "stray": 1,  # ready/0000/stray.txt
    }


def test_one_definition_of_a_dead_job_in_every_view(q: Queue) -> None:
    """Issue 30: stats counted a planted symlink, FIFO, garbage name or wrongly tagged name in dead/ as dead jobs,
    while ls, the dead listing and the admin commands (which select what they act on) saw none of them.
    Every view now counts only what the admin commands would select; the rest is "stray", never a job."""
    q.enqueue(b"doomed")
    lease = q.lease()
    assert lease is not None
    q.bury(lease)
    (real,) = q.list_dead()
    planted = plant_in_dead(q, real.path)

    assert [j.job_id for j in q.list_dead()] == [real.job_id]
    assert [e.job_id for e in q.list_jobs({"dead"})] == [real.job_id]
    for job_rel in (planted["symlink"], planted["fifo"]):
        job_hex = job_rel.rsplit("/", 1)[1][:32]
        assert q.find_dead(job_hex) is None
        with pytest.raises(NotCommitted) as e:
            q.requeue_dead(job_hex)
        assert e.value.kind is ErrorKind.NOT_FOUND
    s = q.entry_stats()
    assert s["dead"].objects == 1
    assert s["stray"].objects == len(planted)
    d = q.stats()
    assert d["dead"].objects == 1
    assert d["stray"].objects == len(planted)
    assert "stray: 4 (oldest 0s)" in view_cmd.format_stats_text(s).splitlines()
    assert "steadq_stray_objects 4" in view_cmd.format_stats_prometheus(s).splitlines()
    assert all(os.path.lexists(os.path.join(q.path, rel)) for rel in planted.values())  # looked at, never touched


def test_stats_counts_in_each_state_only_what_ls_lists(q: Queue) -> None:
    """ready, delayed and receipts: an entry ls skips (garbage name, symlink, FIFO) is a stray for stats too."""
    _, ready_rel = q.enqueue_detailed(b"r")
    q.enqueue(b"later", delay=3600)
    q.enqueue(b"done")
    lease = q.lease()
    assert lease is not None
    q.ack(lease)
    (rct,) = list(q.list_jobs({"receipt"}))
    (dly,) = list(q.list_jobs({"delayed"}))
    for rel in (ready_rel, dly.path, rct.path):
        Path(os.path.dirname(os.path.join(q.path, rel)), "garbage").write_bytes(b"x")
    ready_dir = os.path.dirname(os.path.join(q.path, ready_rel))
    shard = int(os.path.basename(ready_dir), 16)
    os.symlink("/etc/passwd", os.path.join(ready_dir, ready_filename(q, os.urandom(16), shard=shard)[1]))
    os.mkfifo(os.path.join(ready_dir, ready_filename(q, os.urandom(16), shard=shard)[1]))
    counts = {k: v.objects for k, v in q.entry_stats().items()}
    assert counts["ready"] == sum(1 for _ in q.list_jobs({"ready", "leased"})) == 1
    assert counts["delayed"] == sum(1 for _ in q.list_jobs({"delayed"})) == 1
    assert counts["receipts"] == sum(1 for _ in q.list_jobs({"receipt"})) == 1
    assert counts["stray"] == 5
    d = {k: v.objects for k, v in q.stats().items()}
    assert (d["ready"], d["delayed"], d["receipts"], d["stray"]) == (1, 1, 1, 5)


def test_stats_age_is_floor_of_oldest_mtime_and_zero_in_the_future(q: Queue) -> None:
    _, rel_a = q.enqueue_detailed(b"a")
    _, rel_b = q.enqueue_detailed(b"b")
    now = 1_000_000 * SEC
    os.utime(os.path.join(q.path, rel_a), ns=(now - 7 * SEC - 999_999_999, now - 7 * SEC - 999_999_999))
    os.utime(os.path.join(q.path, rel_b), ns=(now - 3 * SEC, now - 3 * SEC))
    s = insp.stats(q._ctx, now_ns=now)  # noqa: SLF001
    assert s["ready"] == insp.StateStats(2, 7)
    future = now - 50 * SEC  # both mtimes are after this "now"
    assert insp.stats(q._ctx, now_ns=future)["ready"] == insp.StateStats(2, 0)  # noqa: SLF001
    assert insp.detailed_stats(q._ctx, now_ns=now)["ready"] == insp.StateStats(2, 7)  # noqa: SLF001
    assert view_cmd.format_stats_text(s).splitlines()[4] == "ready: 2 (oldest 7s)"


def _sample_names(q: Queue) -> dict[State, str]:
    fmt = q.format
    job, tok = os.urandom(16), os.urandom(16)
    jns = {
        State.READY: names.ready_name(job, 1, 2, 3),
        State.LEASED: names.leased_name(
            job, 1, 2, 3, boot_id=OTHER_BOOT, boottime_deadline=5, wall_deadline=6, lease_token=tok
        ),
        State.DELAYED: names.delayed_name(job, 1, 2, 3, not_before=99),
        State.DEAD: names.dead_name(job, 1, 2, 3, reason=4),
        State.RECEIPT: names.receipt_name(job, 1, 2, 3, lease_token=tok),
    }
    return {
        st: names.make_filename(fmt.queue_id, jn, shard=0, bucket=7, lease_width_ns=fmt.lease_width_ns)
        for st, jn in jns.items()
    }


def test_stats_name_patterns_agree_with_the_parser(q: Queue) -> None:
    """detailed_stats classifies with regexes for speed; they must accept exactly what parse_name accepts."""
    samples = _sample_names(q)
    candidates = set(samples.values())
    for name in samples.values():
        for i in range(len(name)):
            for c in ("G", "A", ".", "0", ""):
                candidates.add(name[:i] + c + name[i + 1 :])
        candidates.update({name + "x", "x" + name, name.replace(".sqj", ".rct"), name.upper()})
    for state, pattern in insp.NAME_PATTERNS.items():
        for cand in candidates:
            try:
                names.parse_name(state, cand)
                parses = True
            except CorruptObject:
                parses = False
            assert bool(pattern.fullmatch(cand)) == parses, (state, cand)
        assert pattern.fullmatch(samples[state])


def test_stats_streams_100k_jobs_in_flat_memory(q: Queue) -> None:
    n = 100_000
    try:
        write_ready_jobs(q, n)
        tracemalloc.start()
        try:
            s = q.entry_stats()
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            d = q.stats()
            _, peak_detailed = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        # pytest keeps the last runs' tmp dirs: 100k 4-KiB files would pin ~400 MB each.
        for shard in range(q.shard_count):
            shutil.rmtree(os.path.join(q.path, "ready", names.shard_dir(shard)), ignore_errors=True)
    assert s["ready"].objects == n
    assert d["ready"].objects == n and d["leased"].objects == 0
    # A list of 100k names alone would be ~10 MB; streaming keeps a few directory buffers.
    assert peak < 2 * 1024 * 1024, peak
    assert peak_detailed < 2 * 1024 * 1024, peak_detailed


# =========================================================================== fsck: clean trees


def test_fsck_clean_queue_in_every_state(q: Queue) -> None:
    q.enqueue(b"ready")
    q.enqueue(b"delayed", delay=3600)
    q.enqueue(b"to lease")
    assert q.lease() is not None
    q.enqueue(b"to bury")
    lease = q.lease()
    assert lease is not None
    q.bury(lease)
    q.enqueue(b"to ack")
    lease = q.lease()
    assert lease is not None
    q.ack(lease)
    r = q.fsck()
    # Some of the leases above may have taken other jobs; the counts do not depend on which.
    assert r.findings == [] and r.exit_code == 0
    assert (r.total_objects, r.structurally_verified) == (5, 5)
    assert r.payloads_deep_verified == 1  # the full receipt is always hashed
    deep = q.fsck(deep=True)
    assert deep.findings == [] and deep.payloads_deep_verified == 5
    assert maintenance_cmd.format_fsck_summary(deep) == "objects: 5, structurally verified: 5, payload verified: 5"
    assert maintenance_cmd.format_fsck_lines(deep) == []


def test_fsck_verifies_compact_receipts_and_flags_corrupt_ones(q: Queue) -> None:
    q.enqueue(b"x" * 1000)
    lease = q.lease()
    assert lease is not None
    q.ack(lease)
    [rct] = [o.path for o in q.inspect_detailed(lease.job_id)]
    assert os.path.getsize(os.path.join(q.path, rct)) > 128
    q.recover()
    assert os.path.getsize(os.path.join(q.path, rct)) == 128  # compacted
    r = q.fsck(deep=True)
    assert r.findings == [] and (r.total_objects, r.structurally_verified, r.payloads_deep_verified) == (1, 1, 0)
    [obj] = q.inspect_detailed(lease.job_id)
    assert obj.details == {"token": lease.token.hex(), "compact": True}

    original = Path(q.path, rct).read_bytes()
    flip(q, rct, 60)
    r = q.fsck()
    assert kinds(r) == [("ERROR", rct, "receipt_verification_failed")] and r.exit_code == 3
    assert q.inspect_detailed(lease.job_id) == []  # an unverifiable receipt proves nothing
    fixed = q.fsck(repair=True)
    qname, reason = quarantine_of(fixed, rct)
    assert reason == 0x0001 and fixed.quarantined == 1 and fixed.exit_code == 3
    assert Path(q.path, "quarantine", qname).read_bytes()[:60] == original[:60]
    again = q.fsck()
    assert again.findings == [] and again.exit_code == 0


def test_full_receipt_payload_corruption_is_found_without_deep_and_quarantined_as_payload(q: Queue) -> None:
    q.enqueue(b"p" * 300)
    lease = q.lease()
    assert lease is not None
    q.ack(lease)
    [rct] = [o.path for o in q.inspect_detailed(lease.job_id)]
    flip(q, rct, os.path.getsize(os.path.join(q.path, rct)) - 1)
    r = q.fsck()
    assert kinds(r) == [("ERROR", rct, "receipt_verification_failed")]
    assert r.structurally_verified == 0 and r.payloads_deep_verified == 0
    fixed = q.fsck(repair=True)
    assert quarantine_of(fixed, rct)[1] == 0x0002


def test_locked_receipt_is_not_quarantined(q: Queue) -> None:
    q.enqueue(b"x")
    lease = q.lease()
    assert lease is not None
    q.ack(lease)
    [rct] = [o.path for o in q.inspect_detailed(lease.job_id)]
    flip(q, rct, 40)
    holder = os.open(os.path.join(q.path, rct), os.O_RDWR)
    try:
        assert ofd_lock(holder, exclusive=True)
        r = q.fsck(repair=True)
    finally:
        os.close(holder)
    assert kinds(r) == [("ERROR", rct, "receipt_verification_failed"), ("ERROR", rct, "quarantine_failed")]
    assert r.quarantined == 0 and os.path.exists(os.path.join(q.path, rct))
    assert quarantine_of(q.fsck(repair=True), rct)[1] == 0x0001  # unlocked now


# =========================================================================== fsck: damage, one kind at a time


@dataclass
class Damage:
    rel: str  # the path fsck must report
    finding: str
    reason: int | None  # quarantine reason under --repair; None: reported, never moved
    severity: str = "ERROR"
    counted: bool = True  # counts as an object (total_objects)
    original: bytes | None = None  # bytes quarantine must preserve (regular files)


def _ready(q: Queue, payload: bytes = b"P" * 64) -> tuple[str, bytes]:
    _, rel = q.enqueue_detailed(payload)
    return rel, Path(q.path, rel).read_bytes()


def d_bad_magic(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    flip(q, rel, 0)
    return Damage(rel, "header_decode_failed", 0x0001, original=Path(q.path, rel).read_bytes())


def d_flipped_created_at(q: Queue, tmp: Path) -> Damage:
    rel, _ = _ready(q)
    flip(q, rel, 60)
    return Damage(rel, "envelope_digest_mismatch", 0x0001, original=Path(q.path, rel).read_bytes())


def d_flipped_extension(q: Queue, tmp: Path) -> Damage:
    rel, _ = _ready(q)
    flip(q, rel, 130)
    return Damage(rel, "envelope_digest_mismatch", 0x0001, original=Path(q.path, rel).read_bytes())


def d_header_job_id(q: Queue, tmp: Path) -> Damage:
    rel, _ = _ready(q)
    flip(q, rel, 32)  # header job_id no longer the name's
    return Damage(rel, "header_job_id_mismatch", 0x0005, original=Path(q.path, rel).read_bytes())


def d_header_max_attempts(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    job = bytes.fromhex(os.path.basename(rel)[:32])
    s, name = ready_filename(q, job, max_attempts=7)  # authentic name, but the header says 3
    new = rename_to(q, rel, f"ready/{s}/{name}")
    return Damage(new, "header_max_attempts_mismatch", 0x0005, original=data)


def d_truncated(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    os.truncate(os.path.join(q.path, rel), len(data) - 10)
    return Damage(rel, "file_size_mismatch", 0x0001, original=data[:-10])


def d_grown(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    with open(os.path.join(q.path, rel), "ab") as f:
        f.write(b"extra")
    return Damage(rel, "file_size_mismatch", 0x0001, original=data + b"extra")


def d_truncated_header(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    os.truncate(os.path.join(q.path, rel), 100)
    return Damage(rel, "header_read_failed", 0x0001, original=data[:100])


def d_truncated_extension(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    os.truncate(os.path.join(q.path, rel), 130)
    return Damage(rel, "extension_read_failed", 0x0001, original=data[:130])


def d_extension_too_large(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    bad = data[:12] + (70_000).to_bytes(4, "big") + data[16:]
    Path(q.path, rel).write_bytes(bad)
    return Damage(rel, "extension_too_large", 0x0001, original=bad)


def d_zero_length(q: Queue, tmp: Path) -> Damage:
    s, name = ready_filename(q, os.urandom(16))
    rel = f"ready/{s}/{name}"
    Path(q.path, rel).write_bytes(b"")
    return Damage(rel, "zero_length_publication_residue", 0x0001, severity="WARN", original=b"")


def d_hard_link(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    os.link(os.path.join(q.path, rel), tmp / "outside-link")
    return Damage(rel, "unexpected_hard_link", 0x0009, original=data)


def d_symlink(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    target = tmp / "outside-target"
    target.write_bytes(data)
    os.unlink(os.path.join(q.path, rel))
    os.symlink(target, os.path.join(q.path, rel))
    return Damage(rel, "non_regular_file", 0x0008)


def d_fifo(q: Queue, tmp: Path) -> Damage:
    s, name = ready_filename(q, os.urandom(16))
    rel = f"ready/{s}/{name}"
    os.mkfifo(os.path.join(q.path, rel))
    return Damage(rel, "non_regular_file", 0x0008)


def d_wrong_tag(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    base = os.path.basename(rel)
    i = base.rindex(".k") + 2
    forged = base[:i] + ("0" if base[i] != "0" else "1") + base[i + 1 :]
    new = rename_to(q, rel, f"{os.path.dirname(rel)}/{forged}")
    return Damage(new, "name_tag_mismatch", 0x0004, original=data)


def d_wrong_shard(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    job = bytes.fromhex(os.path.basename(rel)[:32])
    right = int(rel.split("/")[1], 16)
    s, name = ready_filename(q, job, shard=(right + 1) % q.shard_count)  # tag valid for the wrong shard
    new = rename_to(q, rel, f"ready/{s}/{name}")
    return Damage(new, "shard_placement_mismatch", 0x0004, original=data)


def d_wrong_directory_tag(q: Queue, tmp: Path) -> Damage:
    """Moved to another shard without re-tagging: the tag check comes first."""
    rel, data = _ready(q)
    right = int(rel.split("/")[1], 16)
    new = rename_to(q, rel, f"ready/{names.shard_dir((right + 1) % q.shard_count)}/{os.path.basename(rel)}")
    return Damage(new, "name_tag_mismatch", 0x0004, original=data)


def d_unparseable_name(q: Queue, tmp: Path) -> Damage:
    rel, data = _ready(q)
    new = rename_to(q, rel, f"{os.path.dirname(rel)}/not-a-job.sqj")
    return Damage(new, "filename_parse_failed", 0x0003, original=data)


def d_non_ascii_name(q: Queue, tmp: Path) -> Damage:
    raw = b"ready/0001/caf\xe9.sqj"
    fd = os.open(os.path.join(os.fsencode(q.path), raw), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"junk")
    os.close(fd)
    return Damage(
        "ready/0001/<bytes:" + b"caf\xe9.sqj".hex() + ">",
        "invalid_name_encoding",
        0x0003,
        counted=False,
        original=b"junk",
    )


def d_unexpected_file(q: Queue, tmp: Path) -> Damage:
    Path(q.path, "ready/0002/notes.txt").write_bytes(b"hello")
    return Damage("ready/0002/notes.txt", "unexpected_entry", None, severity="WARN", counted=False)


def d_unexpected_top_level_file(q: Queue, tmp: Path) -> Damage:
    Path(q.path, "delayed/README").write_bytes(b"hello")
    return Damage("delayed/README", "unexpected_entry", None, severity="WARN", counted=False)


def d_noncanonical_shard_dir(q: Queue, tmp: Path) -> Damage:
    os.mkdir(os.path.join(q.path, "ready", "00zz"))
    return Damage("ready/00zz", "unexpected_entry", None, severity="WARN", counted=False)


def d_job_in_a_bogus_bucket_dir(q: Queue, tmp: Path) -> Damage:
    """Walked anyway: the directory is a WARN, the job in it an ERROR (its tag names a real bucket)."""
    _, rel = q.enqueue_detailed(b"later", delay=3600)
    data = Path(q.path, rel).read_bytes()
    _, b, s, name = rel.split("/")
    new = rename_to(q, rel, f"delayed/{b.upper()}/{s}/{name}")
    return Damage(new, "name_tag_mismatch", 0x0004, original=data)


def d_delayed_wrong_bucket(q: Queue, tmp: Path) -> Damage:
    _, rel = q.enqueue_detailed(b"later", delay=3600)
    data = Path(q.path, rel).read_bytes()
    fmt = q.format
    _, b, s, name = rel.split("/")
    jn = names.parse_name(State.DELAYED, name)
    other = int(b, 16) + 7
    forged = names.make_filename(
        fmt.queue_id, jn, shard=int(s, 16), bucket=other, lease_width_ns=fmt.lease_width_ns
    )  # authentic for the wrong bucket: only the placement check can tell
    new = rename_to(q, rel, f"delayed/{other:016x}/{s}/{forged}")
    return Damage(new, "bucket_placement_mismatch", 0x0004, original=data)


def d_legacy_lease_in_wrong_boot_dir(q: Queue, tmp: Path) -> Damage:
    job = os.urandom(16)
    shard = names.shard_of(q.format.queue_id, job, q.shard_count)
    name = tagged_leased(q, job, boot=OTHER_BOOT, deadline=5, shard=shard)
    wrong_boot = names.boot_dashed(bytes(16))
    rel = f"leased/{wrong_boot}/{0:016x}/{names.shard_dir(shard)}/{name}"
    os.makedirs(os.path.join(q.path, os.path.dirname(rel)))
    data = job_bytes(job, b"legacy")
    Path(q.path, rel).write_bytes(data)
    return Damage(rel, "name_tag_mismatch", 0x0004, original=data)


def d_dead_header_mismatch(q: Queue, tmp: Path) -> Damage:
    """Someone else's job bytes under an authentic dead name."""
    fmt = q.format
    job = os.urandom(16)
    shard = names.shard_of(fmt.queue_id, job, fmt.shard_count)
    bucket = names.terminal_bucket(time.time_ns(), fmt.terminal_width_ns)
    dn = names.dead_name(job, 2, 1, 3, reason=1)
    name = names.make_filename(fmt.queue_id, dn, shard=shard, bucket=bucket, lease_width_ns=fmt.lease_width_ns)
    rel = f"dead/{names.bucket_dir(bucket)}/{names.shard_dir(shard)}/{name}"
    os.makedirs(os.path.join(q.path, os.path.dirname(rel)), exist_ok=True)
    other = job_bytes(os.urandom(16), b"doomed")
    Path(q.path, rel).write_bytes(other)
    return Damage(rel, "header_job_id_mismatch", 0x0005, original=other)


DAMAGES: dict[str, Callable[[Queue, Path], Damage]] = {
    f.__name__[2:]: f
    for f in (
        d_bad_magic,
        d_flipped_created_at,
        d_flipped_extension,
        d_header_job_id,
        d_header_max_attempts,
        d_truncated,
        d_grown,
        d_truncated_header,
        d_truncated_extension,
        d_extension_too_large,
        d_zero_length,
        d_hard_link,
        d_symlink,
        d_fifo,
        d_wrong_tag,
        d_wrong_shard,
        d_wrong_directory_tag,
        d_unparseable_name,
        d_non_ascii_name,
        d_unexpected_file,
        d_unexpected_top_level_file,
        d_delayed_wrong_bucket,
        d_noncanonical_shard_dir,
        d_job_in_a_bogus_bucket_dir,
        d_legacy_lease_in_wrong_boot_dir,
        d_dead_header_mismatch,
    )
}


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_fsck_reports_and_repairs_each_damage(kind: str, q: Queue, tmp_path: Path) -> None:
    good_job, good_rel = q.enqueue_detailed(b"the good job")
    good_bytes = Path(q.path, good_rel).read_bytes()
    dmg = DAMAGES[kind](q, tmp_path)
    before = q.fsck(deep=True)
    expected_total = 1 + dmg.counted
    extra = [("WARN", os.path.dirname(os.path.dirname(dmg.rel)), "unexpected_entry")] if "bogus" in kind else []
    assert kinds(before) == extra + [(dmg.severity, dmg.rel, dmg.finding)], maintenance_cmd.format_fsck_lines(before)
    assert before.total_objects == expected_total
    assert before.structurally_verified == 1 and before.payloads_deep_verified == 1  # only the good job
    assert before.exit_code == (3 if dmg.severity == "ERROR" else 0)
    assert before.quarantined == 0 and os.listdir(os.path.join(q.path, "quarantine")) == []
    line = maintenance_cmd.format_fsck_lines(before)[-1]
    assert line.startswith(f"{dmg.severity} {dmg.rel}: {dmg.finding} (") and line.endswith(")")

    repaired = q.fsck(repair=True)
    assert repaired.findings[: len(before.findings)] == before.findings  # the ERROR stays, so exit 3 stays
    assert repaired.exit_code == before.exit_code
    if dmg.reason is None:
        assert repaired.quarantined == 0 and repaired.findings == before.findings
        assert os.listdir(os.path.join(q.path, "quarantine")) == []
    else:
        qname, reason = quarantine_of(repaired, dmg.rel)
        assert reason == dmg.reason
        assert repaired.quarantined == 1 and os.listdir(os.path.join(q.path, "quarantine")) == [qname]
        qfile = os.path.join(q.path, "quarantine", qname)
        if dmg.original is not None:
            assert Path(qfile).read_bytes() == dmg.original  # evidence unchanged
        after = q.fsck(deep=True)
        assert kinds(after) == extra and after.exit_code == 0
        assert after.total_objects == 1
        if dmg.original is not None and not extra:  # the independent checker wants regular files in quarantine
            check_tree(q.path, allow_quarantine=True)
    assert Path(q.path, good_rel).read_bytes() == good_bytes  # the good job was never touched
    [obj] = q.inspect_detailed(good_job)
    assert obj.path == good_rel


def test_deep_finds_payload_corruption_and_repair_uses_reason_payload(q: Queue) -> None:
    rel, data = _ready(q, b"Z" * 5000)
    flip(q, rel, len(data) - 100)
    shallow = q.fsck()
    assert shallow.findings == [] and shallow.exit_code == 0 and shallow.structurally_verified == 1
    deep = q.fsck(deep=True)
    assert kinds(deep) == [("ERROR", rel, "payload_digest_mismatch")] and deep.exit_code == 3
    assert deep.structurally_verified == 1 and deep.payloads_deep_verified == 0
    assert q.fsck(repair=True).quarantined == 0  # without --deep the payload is not examined
    fixed = q.fsck(deep=True, repair=True)
    assert quarantine_of(fixed, rel)[1] == 0x0002
    assert q.fsck(deep=True).findings == []


def test_payload_exceeding_the_queue_limit(tmp_path: Path) -> None:
    with Queue.init(str(tmp_path / "small"), shards=2, max_payload_length=16) as small:
        job = os.urandom(16)
        s, name = ready_filename(small, job)
        rel = f"ready/{s}/{name}"
        Path(small.path, rel).write_bytes(job_bytes(job, b"x" * 17))
        r = small.fsck()
        assert kinds(r) == [("ERROR", rel, "payload_exceeds_limit")]
        assert quarantine_of(small.fsck(repair=True), rel)[1] == 0x0001


def test_repair_of_many_kinds_at_once_then_clean(q: Queue, tmp_path: Path) -> None:
    planted = [
        f(q, tmp_path)
        for f in (d_bad_magic, d_hard_link, d_fifo, d_wrong_shard, d_unparseable_name, d_zero_length, d_unexpected_file)
    ]
    r = q.fsck(repair=True)
    assert r.exit_code == 3
    moved = {d.rel: quarantine_of(r, d.rel)[1] for d in planted if d.reason is not None}
    assert moved == {d.rel: d.reason for d in planted if d.reason is not None}
    assert r.quarantined == len(moved)
    again = q.fsck()
    assert [f.finding_type for f in again.findings] == ["unexpected_entry"] and again.exit_code == 0


def test_repair_refused_on_a_poisoned_handle(q: Queue) -> None:
    d_bad_magic(q, Path(q.path))
    q._ctx.poison("test")  # noqa: SLF001
    with pytest.raises(Exception, match="poisoned"):
        q.fsck(repair=True)
    assert q.fsck().exit_code == 3  # read-only checking still works


# =========================================================================== inspect


def test_inspect_every_state_and_exact_lines(q: Queue) -> None:
    job, rel = q.enqueue_detailed(b"x", max_attempts=4)
    [obj] = q.inspect_detailed(job)
    assert view_cmd.format_inspect_line(obj) == f"ready gen=0 attempt=0/4 {rel}"
    assert obj.details == {}

    lease = q.lease()
    assert lease is not None and lease.job_id == job
    [obj] = q.inspect_detailed(job)
    assert view_cmd.format_inspect_line(obj) == f"leased gen=1 attempt=1/4 {lease.path}"
    assert obj.details == {
        "layout": "colocated",
        "boot_id": read_boot_id(),
        "boottime_deadline_ns": lease.boottime_deadline_ns,
        "wall_deadline_ns": lease.wall_deadline_ns,
        "token": lease.token.hex(),
    }
    assert q.retry(lease, delay=3600) == "delayed"
    [obj] = q.inspect_detailed(job)
    assert obj.state == "delayed" and obj.path.startswith("delayed/") and (obj.generation, obj.attempt) == (2, 1)
    assert isinstance(obj.details["not_before_ns"], int)

    dead_job = q.enqueue(b"y")
    dl = q.lease()
    assert dl is not None and dl.job_id == dead_job
    q.bury(dl, reason=3)
    [obj] = q.inspect_detailed(dead_job)
    assert obj.state == "dead" and obj.details == {"reason": 3}
    assert view_cmd.format_inspect_line(obj) == f"dead gen=2 attempt=1/3 {obj.path}"

    ack_job = q.enqueue(b"z")
    al = q.lease()
    assert al is not None and al.job_id == ack_job
    q.ack(al)
    [obj] = q.inspect_detailed(ack_job)
    assert obj.state == "receipt" and obj.details == {"token": al.token.hex(), "compact": False}
    assert view_cmd.format_inspect_line(obj).startswith("receipt gen=2 attempt=1/3 receipts/")

    assert q.inspect_detailed(os.urandom(16).hex()) == []
    with pytest.raises(InvalidInput):
        q.inspect_detailed(job.upper())


def test_inspect_legacy_leases_only_where_they_authenticate(q: Queue) -> None:
    job = os.urandom(16)
    shard = names.shard_of(q.format.queue_id, job, q.shard_count)
    s = names.shard_dir(shard)
    name = tagged_leased(q, job, boot=OTHER_BOOT, deadline=5, shard=shard)
    good = f"leased/{names.boot_dashed(OTHER_BOOT)}/{0:016x}/{s}/{name}"
    misplaced = f"leased/{names.boot_dashed(OTHER_BOOT)}/{1:016x}/{s}/{name}"
    for rel in (good, misplaced):
        os.makedirs(os.path.join(q.path, os.path.dirname(rel)))
        Path(q.path, rel).write_bytes(job_bytes(job, b"legacy"))
    objs = q.inspect_detailed(job.hex())
    assert [(o.state, o.path, o.details["layout"]) for o in objs] == [("leased", good, "legacy")]
    r = q.fsck(deep=True)  # the context comes from the path: only the misplaced copy fails
    assert kinds(r) == [("ERROR", misplaced, "name_tag_mismatch")]
    assert (r.total_objects, r.structurally_verified, r.payloads_deep_verified) == (2, 1, 1)
