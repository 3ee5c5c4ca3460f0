"""results.json -> results.md (tables, ratios, targets) and PNG plots.

Ratios are only ever computed between numbers of the same run. Plots need
matplotlib, which is not a project dependency: without it they are skipped
and the Markdown says so.
"""

from __future__ import annotations

import math
import os
from typing import Any

from . import bench_cli, bucket_idle, bucket_queue
from .common import PAYLOAD_SIZES

SIZE_LABEL = {100: "100 B", 4096: "4 KiB", 1 << 20: "1 MiB"}
PEER_ORDER = ("persist-queue", "litequeue", "huey", "redis", "rq")


def _get(d: Any, *path: Any) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _rate(d: Any, *path: Any) -> float | None:
    v = _get(d, *path, "jobs_per_s")
    return float(v) if isinstance(v, int | float) else None


def _fmt(v: float | None, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "–"
    return f"{a / b:.2f}x"


def _why(d: Any) -> str:
    if isinstance(d, dict):
        if "skipped" in d:
            return f"skipped: {d['skipped']}"
        if "error" in d:
            return f"error: {d['error']}"
    return ""


def rows_single(r: dict[str, Any], size: int) -> list[tuple[str, float | None, str]]:
    """(label, lifecycle jobs/s, note) for every system at one payload size."""
    s = str(size)
    out: list[tuple[str, float | None, str]] = [
        (
            "floor, C",
            _rate(r, "floor", "c", s, "lifecycle"),
            _why(_get(r, "floor", "c", s)) or _why(_get(r, "floor", "c")),
        ),
        (
            "floor, Python (steadqd.fs.linux)",
            _rate(r, "floor", "python", s, "lifecycle"),
            _why(_get(r, "floor", "python", s)),
        ),
        ("**steadqd strict**", _rate(r, "steadqd", "single", s, "lifecycle"), _why(_get(r, "steadqd", "single", s))),
    ]
    if size == 100:
        for key, how in (("batched", "enqueue_many"), ("batched_calls", "enqueue() calls")):
            if _get(r, "steadqd", key) is None:
                continue
            out.append(
                (
                    f"steadqd batched, {how} ({_get(r, 'steadqd', key, 'batch_size')}/barrier)",
                    _rate(r, "steadqd", key, "lifecycle"),
                    _why(_get(r, "steadqd", key)),
                )
            )
    for peer in PEER_ORDER:
        p = _get(r, "peers", peer)
        if p is None:
            continue
        note = _why(p) or _why(_get(p, "single", s))
        if isinstance(p, dict) and p.get("at_least_once") is False:
            note = (note + "; " if note else "") + "at-most-once (no ack)"
        out.append((peer, _rate(p, "single", s, "lifecycle"), note))
    return out


def targets(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(target, measured, verdict, note) for every target of issue 9."""
    out: list[tuple[str, str, str, str]] = []

    def verdict(ok: bool | None) -> str:
        return "–" if ok is None else ("met" if ok else "**not met**")

    floor = _rate(r, "floor", "python", "100", "lifecycle")
    strict = _rate(r, "steadqd", "single", "100", "lifecycle")
    over = _get(r, "headline", "steadqd_strict_over")
    if isinstance(over, dict) and "floor, Python" in over:
        ratio = over["floor, Python"]
        c = f", {over['floor, C']:.2f}x of the C floor" if "floor, C" in over else ""
        out.append(
            (
                "strict 1-process lifecycle >= 70% of the floor",
                f"{ratio:.2f}x of the Python floor{c} (interleaved medians)",
                verdict(ratio >= 0.7),
                "",
            )
        )
    else:
        ok = None if not (floor and strict) else strict >= 0.7 * floor
        out.append(
            (
                "strict 1-process lifecycle >= 70% of the floor",
                f"{_ratio(strict, floor)} of the Python floor",
                verdict(ok),
                "",
            )
        )

    s44 = _rate(r, "steadqd", "mp", "4+4")
    f44 = _rate(r, "floor", "mp", "4+4")
    peers44 = {p: _rate(r, "peers", p, "mp", "4+4") for p in PEER_ORDER}
    best = max(((v, p) for p, v in peers44.items() if v), default=None)
    ok = None if not (s44 and best) else all(s44 > v for v in peers44.values() if v)
    out.append(
        (
            "4+4 processes: ahead of every peer",
            f"{_fmt(s44)} jobs/s vs best peer {best[1]} {_fmt(best[0])}" if best else _fmt(s44),
            verdict(ok),
            f"the floor's own syscalls at 4+4: {_fmt(f44)} jobs/s" if f44 else "",
        )
    )
    hs = _get(r, "headline", "systems") or {}
    # The batching API for enqueue is enqueue_many; the per-call batch is listed beside it.
    bkey = next((k for k in hs if k.startswith("steadqd batched, enqueue_many")), None)
    bkey = bkey or next((k for k in hs if k.startswith("steadqd batched")), None)
    if bkey and "steadqd strict" in hs and isinstance(over, dict):
        x = 1 / over[bkey] if over.get(bkey) else None
        out.append(
            (
                f"{bkey} >= 3x strict",
                f"{x:.2f}x (interleaved medians)" if x else "–",
                verdict(None if x is None else x >= 3),
                "",
            )
        )
    else:
        batched = _rate(r, "steadqd", "batched", "lifecycle")
        ok = None if not (batched and strict) else batched >= 3 * strict
        out.append(("batched (64/barrier) >= 3x strict", _ratio(batched, strict), verdict(ok), ""))
    wake = _get(r, "daemons", "wake_latency")
    if isinstance(wake, dict) and "p50_ms" in wake:
        out.append(("wake latency p50 < 5 ms", f"{wake['p50_ms']:.2f} ms", verdict(wake["p50_ms"] < 5), ""))
        out.append(("wake latency p99 < 50 ms", f"{wake['p99_ms']:.2f} ms", verdict(wake["p99_ms"] < 50), ""))
    for sp in _get(r, "daemons", "spawner") or []:
        if isinstance(sp, dict) and sp.get("concurrency") == 4:
            rate = sp.get("jobs_per_s")
            stranded = sp.get("left_leased", 0) + sp.get("left_ready", 0)
            ok = None if rate is None else (rate >= 250 and stranded == 0 and sp.get("acked") == sp.get("jobs"))
            out.append(
                (
                    "spawner `true` at concurrency 4 >= 250 jobs/s, none stranded",
                    f"{_fmt(rate)} jobs/s, {stranded} left",
                    verdict(ok),
                    "",
                )
            )
    sf = _get(r, "daemons", "spawner_floor")
    if isinstance(sf, dict) and "median_ratio" in sf:
        x = sf["median_ratio"]
        stranded = sum(sf["steadqd"]["stranded"])
        out.append(
            (
                f"spawner `true` at concurrency {sf['concurrency']} >= 0.8x the spawner floor (C)",
                f"{x:.2f}x ({_fmt(sf['steadqd']['median_jobs_per_s'])} vs {_fmt(sf['floor']['median_jobs_per_s'])} "
                f"jobs/s, medians of {sf['rounds']} alternating rounds)"
                if x
                else "–",
                verdict(None if not x else x >= 0.8 and stranded == 0),
                f"steadqd left {stranded} stranded" if stranded else "",
            )
        )
    elif isinstance(sf, dict):
        out.append(("spawner `true` at concurrency 4 >= 0.8x the spawner floor (C)", _why(sf), "–", ""))
    idle = _get(r, "daemons", "idle")
    if isinstance(idle, dict):
        for role in ("worker", "sweeper", "promoter"):
            d = idle.get(role)
            if not isinstance(d, dict):
                continue
            out.append(
                (
                    f"idle {role}: <= 60 wake-ups/min",
                    f"{d['wakeups_per_min']:.1f}/min",
                    verdict(d["wakeups_per_min"] <= 60),
                    "",
                )
            )
            out.append(
                (
                    f"idle {role}: < 0.1% of a core",
                    f"{d['cpu_percent_of_core']:.4f}%",
                    verdict(d["cpu_percent_of_core"] < 0.1),
                    "",
                )
            )
            out.append((f"idle {role}: RSS < 40 MB", f"{d['rss_mb']:.1f} MB", verdict(d["rss_mb"] < 40), ""))
    scale = [s for s in (r.get("scaling") or []) if isinstance(s, dict) and "lease" in s]
    by_n = {s["ready_jobs"]: s["lease"]["p50_ms"] for s in scale}
    scan_n = {s["ready_jobs"]: s["lease_without_fsync"]["p50_ms"] for s in scale if "lease_without_fsync" in s}
    if 1000 in by_n:
        top = max(by_n)
        ok = by_n[top] <= 2 * by_n[1000] if top > 1000 else None
        note = "" if top == 1_000_000 else f"measured up to {top:,} (1,000,000 needs --full-scale)"
        out.append(
            (
                f"lease latency at {top:,} <= 2x at 1,000",
                f"{by_n[top]:.2f} ms vs {by_n[1000]:.2f} ms (p50)",
                verdict(ok),
                note,
            )
        )
        mean_n = {s["ready_jobs"]: s["lease"].get("mean_ms") for s in scale}
        if mean_n.get(1000) and mean_n.get(top):
            ok = mean_n[top] <= 2 * mean_n[1000] if top > 1000 else None
            out.append(
                (
                    "same, mean (includes the leases that list a shard)",
                    f"{mean_n[top]:.2f} ms vs {mean_n[1000]:.2f} ms (mean)",
                    verdict(ok),
                    note,
                )
            )
        if 1000 in scan_n and top in scan_n:
            ok = scan_n[top] <= 2 * scan_n[1000] if top > 1000 else None
            out.append(
                (
                    "same, claim fsync deferred (scan cost only)",
                    f"{scan_n[top]:.3f} ms vs {scan_n[1000]:.3f} ms (p50)",
                    verdict(ok),
                    note,
                )
            )
    return out


def _probe_cell(d: Any, key: str) -> str:
    x = _get(d, "create_probe", key)
    if not isinstance(x, dict) or "us_per_create_mean" not in x:
        return _why(_get(d, "create_probe")) or "–"
    return f"{x['us_per_create_mean']:.1f} µs (p50 {x['us_per_create_p50']:.1f}, system CPU {x['sys_cpu_us_per_create']:.1f})"


def _journal_cell(d: dict[str, Any]) -> str:
    if d.get("fstype") != "ext4":
        return "n/a (not ext4)"
    return {True: "yes", False: "**no**"}.get(d.get("ext4_journal"), "?")  # type: ignore[arg-type]


def disk_lines(r: dict[str, Any]) -> list[str]:
    """The "what was measured" table: filesystem, journal, mount, loop and create-probe facts."""
    m = r.get("meta", {})
    disk = _get(m, "machine", "disk")
    if not isinstance(disk, dict):
        return []
    cols = [("measured directory", disk)]
    backing = disk.get("backing")
    if isinstance(backing, dict):
        cols.append(("disk under the loop image", backing))
    L = [f"## Disk: `--fs {m.get('fs', 'host')}`\n"]
    L.append("| | " + " | ".join(c for c, _ in cols) + " |")
    L.append("|---|" + "---|" * len(cols))
    rows: list[tuple[str, Any]] = [
        ("path", lambda d: f"`{d.get('path')}`"),
        ("filesystem", lambda d: d.get("fstype", "?")),
        ("ext4 journal", _journal_cell),
        ("mount source", lambda d: d.get("mount_source", "?")),
        ("mount options", lambda d: f"`{d.get('mount_options', '?')}`"),
        ("block device (rotational, driver)", lambda d: f"{d.get('block_device')} ({d.get('rotational', '?')}, "
                                                        f"{d.get('disk_driver') or '–'})"),
        (f"create+close one file, fresh dir ({_get(disk, 'create_probe', 'files') or '?'} files)",
         lambda d: _probe_cell(d, "fresh_dir")),
        ("same, right after deleting them", lambda d: _probe_cell(d, "after_deleting_them")),
    ]  # fmt: skip
    for label, cell in rows:
        L.append(f"| {label} | " + " | ".join(str(cell(d)) for _, d in cols) + " |")
    pad = " |" * (len(cols) - 1)  # facts of the loop setup span the measured column only
    loop = disk.get("loop")
    if isinstance(loop, dict):
        size = loop.get("image_size_bytes")
        size_s = f"{size / (1 << 30):.0f} GiB sparse" if isinstance(size, int) else "?"
        L.append(
            f"| loop device | {loop.get('device')}: image `{loop.get('backing_file')}` ({size_s}), direct I/O "
            f"{'on' if loop.get('direct_io') else 'off'}, {loop.get('logical_block_size')} B sectors |{pad}"
        )
    setup = m.get("loop_setup")
    if isinstance(setup, dict):
        L.append(
            f"| built with | `{setup.get('mkfs')}`, `{setup.get('losetup')}`, mount {setup.get('mount_options')} |{pad}"
        )
    L.append("")
    if disk.get("ext4_journal") is False:
        L.append(
            "> **The measured filesystem is ext4 without a journal.** There every inode allocation skips the "
            "inodes freed in the last minutes (`recently_deleted()`), so each file created costs the system CPU "
            "shown above, which users' filesystems (ext4 with a journal, XFS, btrfs) do not pay. Re-run with "
            "`--fs ext4` (see benchmarks/README.md) for numbers that represent them.\n"
        )
    return L


def markdown(r: dict[str, Any], plots: list[str], plot_note: str = "") -> str:
    m = r.get("meta", {})
    mach = m.get("machine", {})
    L: list[str] = []
    L.append(f"# steadqd benchmark results ({m.get('profile', {}).get('name', '?')} profile)\n")
    L.append(f"Run {m.get('started', '?')}, {m.get('duration_s', '?')} s, one process tree, one disk.\n")
    L.extend(disk_lines(r))
    L.append("| machine | |\n|---|---|")
    for k in (
        "cpu_model",
        "cpus",
        "memory_mb",
        "kernel",
        "filesystem",
        "disk_driver",
        "rotational",
        "python",
        "sqlite",
        "redis_server",
        "steadqd",
    ):
        L.append(f"| {k} | {mach.get(k, '?')} |")
    L.append("")

    L.append("## Targets\n")
    L.append("| target | measured | verdict | note |\n|---|---|---|---|")
    for t, meas, v, note in targets(r):
        L.append(f"| {t} | {meas} | {v} | {note} |")
    L.append("")

    h = r.get("headline")
    if isinstance(h, dict) and "systems" in h:
        L.append("## Headline: one process, 100 B, full lifecycle, interleaved rounds\n")
        L.append(
            f"{h['rounds']} rounds; in each round every system runs {h['chunk_jobs']} jobs (rotating order), so disk "
            "contention hits all alike. Medians of per-round rates and of per-round ratios.\n"
        )
        L.append(
            "| system | median jobs/s | min – max | vs Python floor | steadqd strict vs it |\n|---|---:|---:|---:|---:|"
        )
        for name, x in h["systems"].items():
            label = f"**{name}**" if name == "steadqd strict" else name
            L.append(
                f"| {label} | {_fmt(x['median_jobs_per_s'])} | {_fmt(x['min'])} – {_fmt(x['max'])} | "
                f"{x['median_ratio_to_python_floor']:.2f}x | {h['steadqd_strict_over'][name]:.2f}x |"
            )
        L.append("")
    elif h:
        L.append(f"Headline: {_why(h)}\n")

    floor = _rate(r, "floor", "python", "100", "lifecycle")
    strict = _rate(r, "steadqd", "single", "100", "lifecycle")
    L.append("## One process, 100-byte jobs, full lifecycle (enqueue, lease, read+verify, ack), one block each\n")
    L.append("| system | jobs/s | vs Python floor | steadqd strict vs it | note |\n|---|---:|---:|---:|---|")
    for label, rate, note in rows_single(r, 100):
        L.append(f"| {label} | {_fmt(rate)} | {_ratio(rate, floor)} | {_ratio(strict, rate)} | {note} |")
    L.append("")

    L.append("## Enqueue-only and lease+ack-only (one process, 100 B)\n")
    L.append("| system | enqueue jobs/s | lease+ack jobs/s |\n|---|---:|---:|")
    L.append(
        f"| floor, Python | {_fmt(_rate(r, 'floor', 'python', '100', 'enqueue_only'))} | {_fmt(_rate(r, 'floor', 'python', '100', 'lease_ack_only'))} |"
    )
    L.append(
        f"| **steadqd strict** | {_fmt(_rate(r, 'steadqd', 'single', '100', 'enqueue_only'))} | {_fmt(_rate(r, 'steadqd', 'single', '100', 'lease_ack_only'))} |"
    )
    L.append(f"| steadqd batched, enqueue_many | {_fmt(_rate(r, 'steadqd', 'batched', 'enqueue_only'))} | – |")
    L.append(f"| steadqd batched, enqueue() calls | {_fmt(_rate(r, 'steadqd', 'batched_calls', 'enqueue_only'))} | – |")
    for peer in PEER_ORDER:
        p = _get(r, "peers", peer)
        if isinstance(p, dict) and "single" in p:
            L.append(
                f"| {peer} | {_fmt(_rate(p, 'single', '100', 'enqueue_only'))} | {_fmt(_rate(p, 'single', '100', 'lease_ack_only'))} |"
            )
    L.append("")

    L.append("## Concurrency: P producer + C consumer processes, 100 B, same durability\n")
    configs = sorted({k for k in (_get(r, "steadqd", "mp") or {})} | {k for k in (_get(r, "floor", "mp") or {})})
    L.append("| system | " + " | ".join(f"{c} jobs/s" for c in configs) + " | duplicates / lost | note |")
    L.append("|---|" + "---:|" * len(configs) + "---|---|")

    def mp_row(label: str, mp: Any) -> None:
        cells = [_fmt(_rate(mp, c)) for c in configs]
        dl = ", ".join(
            f"{c}: {_get(mp, c, 'duplicates')}/{_get(mp, c, 'lost')}"
            for c in configs
            if _get(mp, c, "duplicates") is not None
        )
        notes = "; ".join(filter(None, (_why(_get(mp, c)) for c in configs)))
        errs = "; ".join(str(_get(mp, c, "errors")) for c in configs if _get(mp, c, "errors"))
        L.append(f"| {label} | " + " | ".join(cells) + f" | {dl} | {notes}{errs} |")

    if _get(r, "floor", "mp") is not None:
        mp_row("floor, Python (sharded, the syscalls only)", _get(r, "floor", "mp"))
    mp_row("**steadqd strict**", _get(r, "steadqd", "mp"))
    for peer in PEER_ORDER:
        p = _get(r, "peers", peer)
        if isinstance(p, dict) and "mp" in p:
            mp_row(peer, p["mp"])
        elif isinstance(p, dict):
            L.append(f"| {peer} | " + " | ".join("–" for _ in configs) + f" | | {_why(p)} |")
    L.append("")

    bench = r.get("bench")
    if isinstance(bench, dict) and "configs" in bench:
        L.extend(bench_cli.markdown(bench))
    elif bench:
        L.append(f"`steadq bench`: {_why(bench)}\n")

    if r.get("bucket"):
        L.extend(bucket_queue.markdown(r["bucket"]))
    if r.get("bucket_idle"):
        L.extend(bucket_idle.markdown(r["bucket_idle"]))

    L.append("## Payload size sweep (one process, full lifecycle, jobs/s)\n")
    L.append("| system | " + " | ".join(SIZE_LABEL[s] for s in PAYLOAD_SIZES) + " |")
    L.append("|---|" + "---:|" * len(PAYLOAD_SIZES))
    labels: dict[str, list[str]] = {}
    for size in PAYLOAD_SIZES:
        for label, rate, _note in rows_single(r, size):
            if label.startswith("steadqd batched"):
                continue
            labels.setdefault(label, []).append(_fmt(rate))
    for label, cells in labels.items():
        L.append(f"| {label} | " + " | ".join(cells) + " |")
    L.append("")

    d = r.get("daemons") or {}
    L.append("## Daemons\n")
    w = d.get("wake_latency")
    if isinstance(w, dict) and "p50_ms" in w:
        L.append(
            f"Wake latency (enqueue returned -> job command started, {w['n']} jobs, idle worker, command: {w.get('command')}): "
            f"p50 {w['p50_ms']:.2f} ms, p90 {w['p90_ms']:.2f} ms, p99 {w['p99_ms']:.2f} ms, max {w['max_ms']:.2f} ms.\n"
        )
    elif w:
        L.append(f"Wake latency: {_why(w)}\n")
    sp = [s for s in d.get("spawner") or [] if isinstance(s, dict)]
    if sp:
        L.append(
            "| spawner, command `true` | jobs | acked | jobs/s (first to last ack) | wall incl. start-up | left ready / leased |"
        )
        L.append("|---|---:|---:|---:|---:|---|")
        for s in sp:
            if "error" in s:
                L.append(f"| ? | | | | | {_why(s)} |")
                continue
            L.append(
                f"| concurrency {s['concurrency']} | {s['jobs']} | {s['acked']} | {_fmt(s['jobs_per_s'])} | {s['wall_including_startup_s']} s | {s['left_ready']} / {s['left_leased']} |"
            )
        L.append("")
    sf = d.get("spawner_floor")
    if isinstance(sf, dict) and "median_ratio" in sf:
        L.append(
            f"Spawner against the spawner floor (C: the same claim and settle syscalls on the same tree, "
            f"one posix_spawn + wait per job, {sf['concurrency']} threads), `true` at concurrency {sf['concurrency']}, "
            f"{sf['jobs']} jobs per round, {sf['rounds']} alternating rounds, first to last receipt:\n"
        )
        L.append("| | median jobs/s | rounds | acked | stranded |")
        L.append("|---|---:|---|---|---|")
        for side, label in (("steadqd", "steadqd worker"), ("floor", "spawner floor (C)")):
            x = sf[side]
            L.append(
                f"| {label} | {_fmt(x['median_jobs_per_s'])} | {', '.join(_fmt(v) for v in x['rounds_jobs_per_s'])} "
                f"| {', '.join(str(a) for a in x['acked'])} | {', '.join(str(v) for v in x['stranded'])} |"
            )
        ratios = ", ".join(f"{v:.2f}" for v in sf["round_ratios"])
        mr = sf["median_ratio"]
        L.append(f"| **steadqd / floor** | **{_fmt(mr, 2)}x** (median of rounds) | {ratios} | | |")
        L.append("")
    elif isinstance(sf, dict):
        L.append(f"Spawner against the spawner floor: {_why(sf)}\n")
    idle = d.get("idle")
    if isinstance(idle, dict) and "worker" in idle:
        L.append(
            f"Idle cost on an empty queue over {idle['seconds']} s, with WATCHDOG_USEC={idle['watchdog_usec']} (the units' WatchdogSec=30s):\n"
        )
        L.append(
            "| role | CPU ms/min | % of a core | wake-ups/min (all ctx switches) | voluntary/min | RSS MB | threads |"
        )
        L.append("|---|---:|---:|---:|---:|---:|---:|")
        for role in ("worker", "sweeper", "promoter"):
            x = idle.get(role)
            if isinstance(x, dict):
                L.append(
                    f"| {role} | {x['cpu_ms_per_min']:.2f} | {x['cpu_percent_of_core']:.4f} | {x['wakeups_per_min']:.1f} | {x['voluntary_per_min']:.1f} | {x['rss_mb']:.1f} | {x.get('threads', '?')} |"
                )
        L.append("")
    elif idle:
        L.append(f"Idle cost: {_why(idle)}\n")

    sc = r.get("scaling")
    if sc:
        L.append("## Scaling with queue depth (64 shards)\n")
        L.append(
            "| ready jobs | leases | lease p50 ms | lease mean ms | lease p99 ms | w/o fsync p50 ms | w/o fsync mean ms "
            "| leases that listed a whole shard: n, p50 ms | fresh handle, first lease p50 ms "
            "| stats in-process s | `steadq stats` CLI s | generate s |"
        )
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for s in sc:
            if not isinstance(s, dict) or "lease" not in s:
                L.append(f"| ? | | | | | {_why(s)} |")
                continue
            listing = s.get("lease_listing") or {}
            listed = f"{listing.get('n', 0)}, {listing['p50_ms']:.2f}" if listing.get("n") else "0"
            fresh = _get(s, "lease_fresh_handle", "p50_ms")
            L.append(
                f"| {s['ready_jobs']:,} | {s['lease']['n']} | {s['lease']['p50_ms']:.2f} | {s['lease']['mean_ms']:.2f} "
                f"| {s['lease']['p99_ms']:.2f} | {_get(s, 'lease_without_fsync', 'p50_ms') or 0:.3f} "
                f"| {_get(s, 'lease_without_fsync', 'mean_ms') or 0:.3f} | {listed} "
                f"| {fresh if fresh is not None else '?'} | {s['stats_inprocess_s']:.3f} | {s['stats_cli_s']:.3f} "
                f"| {s.get('generate_s', '?')} |"
            )
        L.append("")

    sysc = _get(r, "steadqd", "syscalls_per_job")
    if isinstance(sysc, dict) and "enqueue" in sysc:
        L.append("## Syscalls of one warm strict lifecycle (steadqd.fs.linux.trace)\n")
        ops = sorted({op for phase in sysc.values() for op in phase})
        L.append("| phase | " + " | ".join(ops) + " | total |")
        L.append("|---|" + "---:|" * (len(ops) + 1))
        for phase, c in sysc.items():
            L.append(f"| {phase} | " + " | ".join(str(c.get(op, "")) for op in ops) + f" | {sum(c.values())} |")
        L.append("")

    prof = r.get("profile")
    if isinstance(prof, dict) and "top_own" in prof:
        L.append(
            f"## Profile (cProfile, {prof['jobs']} strict lifecycles, {prof['profiled_us_per_job']} µs/job under the profiler)\n"
        )
        L.append("| function | calls/job | own µs/job | cumulative µs/job |\n|---|---:|---:|---:|")
        for row in prof["top_own"][:15]:
            L.append(
                f"| `{row['function']}` | {row['calls_per_job']} | {row['own_us_per_job']} | {row['cum_us_per_job']} |"
            )
        L.append("")

    L.append("## Configurations\n")
    L.append(f"- **steadqd**: {_get(r, 'steadqd', 'config')}")
    for peer in PEER_ORDER:
        p = _get(r, "peers", peer)
        if isinstance(p, dict) and "config" in p:
            extra = ""
            if p.get("synchronous") is not None:
                extra = f" (PRAGMA synchronous read back: {p['synchronous']})"
            if p.get("server_config"):
                extra = f" (server CONFIG GET: {p['server_config']})"
            L.append(f"- **{peer}**: {p['config']}{extra}")
        elif isinstance(p, dict):
            L.append(f"- **{peer}**: {_why(p)}")
    L.append("")
    if plots:
        L.append("## Plots\n")
        for p in plots:
            L.append(f"![{os.path.basename(p)}]({os.path.basename(p)})")
        L.append("")
    elif plot_note:
        L.append(f"Plots: {plot_note}\n")
    errors = [k for k, v in _walk_errors(r)]
    if errors:
        L.append("## Failed measurements\n")
        for k in errors:
            L.append(f"- `{k}`")
        L.append("")
    return "\n".join(L)


def _walk_errors(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if isinstance(d, dict):
        if "error" in d and isinstance(d["error"], str):
            out.append((f"{prefix}: {d['error']}", d))
        for k, v in d.items():
            if k != "traceback":
                out.extend(_walk_errors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out.extend(_walk_errors(v, f"{prefix}[{i}]"))
    return out


def plots(r: dict[str, Any], out_dir: str) -> tuple[list[str], str]:
    """PNG plots; ([], reason) when matplotlib is unavailable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - optional
        return [], f"skipped (matplotlib not importable: {e}; `pip install matplotlib` into the venv)"
    files: list[str] = []

    def bar(fname: str, title: str, items: list[tuple[str, float | None]], ylabel: str = "jobs/s") -> None:
        items = [(k, v) for k, v in items if v]
        if not items:
            return
        fig, ax = plt.subplots(figsize=(9, 4.5))
        colors = ["#c0392b" if "steadqd" in k else ("#7f8c8d" if "floor" in k else "#2980b9") for k, _ in items]
        ax.bar([k.replace("**", "") for k, _ in items], [v for _, v in items], color=colors)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
        for lab in ax.get_xticklabels():
            lab.set_horizontalalignment("right")
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)

    bar(
        "lifecycle_1proc.png",
        "One process, 100 B, full lifecycle (every commit fsynced)",
        [(k, v) for k, v, _ in rows_single(r, 100)],
    )
    mp_items: list[tuple[str, float | None]] = [("steadqd strict", _rate(r, "steadqd", "mp", "4+4"))]
    mp_items += [(p, _rate(r, "peers", p, "mp", "4+4")) for p in PEER_ORDER]
    bar("lifecycle_4x4.png", "4 producers + 4 consumers, 100 B", mp_items)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    sizes = list(PAYLOAD_SIZES)
    series: dict[str, list[float | None]] = {}
    for size in sizes:
        for label, rate, _ in rows_single(r, size):
            if not label.startswith("steadqd batched"):
                series.setdefault(label.replace("**", ""), []).append(rate)
    for label, vals in series.items():
        pts = [(s, v) for s, v in zip(sizes, vals, strict=False) if v]
        if pts:
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                label=label,
                linewidth=2.5 if "steadqd" in label else 1.2,
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(sizes, [SIZE_LABEL[s] for s in sizes])
    ax.set_xlabel("payload")
    ax.set_ylabel("jobs/s (log)")
    ax.set_title("Payload size sweep, one process, full lifecycle")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "payload_sweep.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)
    return files, ""
