"""``steadq bench`` side by side with the reference implementation's ``bench``.

Each implementation runs its *own* ``bench`` command with the same flags, on a
queue its own ``init`` made, on the same disk; rounds interleave the two (and
rotate which goes first), so a burst of contention from other tenants hits
both alike, and the verdict is the median of the per-round ratios of
acknowledged jobs per second. Without a reference binary only steadqd's side
runs, which is what the CI smoke needs: proof that the process-based bench
runs and counts consistently, never a speed.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

from steadqd import Queue

from . import daemons
from .common import REPO, Profile, check_stop, log, scratch

PAYLOAD_SIZE = 1024  # the comparison: 1 KiB jobs
WORK_CONCURRENCY = 4  # the spawner comparison: `true` at concurrency 4
COUNT_LINE = re.compile(r"(enqueued|leased|acked): (\d+) \(([^)]*)/s\)")  # the reference prints NaN/s for 0 s


def steadq_command() -> list[str]:
    return [sys.executable, "-m", "steadqd.cli.main"]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_one(command: list[str], queue: str, producers: int, consumers: int, seconds: int) -> dict[str, Any]:
    """Init a fresh queue with this implementation, run its bench once, parse its four lines.

    CPU is of the whole process tree (a waited-for child's children are added to
    its own rusage), so thread- and process-based benches are charged alike.
    ``seconds=0`` measures only start-up and teardown (see compare).
    """
    init = subprocess.run([*command, "init", queue], capture_output=True, text=True, env=_env(), timeout=60)
    if init.returncode != 0:
        raise RuntimeError(f"{command[-1]} init {queue}: exit {init.returncode}: {init.stderr.strip()[-300:]}")
    flags = [f"--producers={producers}", f"--consumers={consumers}", f"--duration-seconds={seconds}"]
    flags.append(f"--payload-size={PAYLOAD_SIZE}")
    cpu0, t0 = _child_cpu(), time.monotonic()
    r = subprocess.run(
        [*command, "bench", queue, *flags], capture_output=True, text=True, env=_env(), timeout=seconds + 120
    )
    wall, cpu = time.monotonic() - t0, _child_cpu() - cpu0
    if r.returncode != 0:
        raise RuntimeError(f"bench exit {r.returncode}: {r.stderr.strip()[-500:]}")
    counts = {m.group(1): int(m.group(2)) for m in map(COUNT_LINE.fullmatch, r.stderr.splitlines()) if m}
    if set(counts) != {"enqueued", "leased", "acked"}:
        raise RuntimeError(f"bench printed no count lines: {r.stderr.strip()[-500:]}")
    return {
        **counts,
        "acked_per_s": counts["acked"] / seconds if seconds else 0.0,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 3),
        "first_line": r.stderr.splitlines()[0],
    }


def reference_version(binary: str) -> str:
    """Its ``--version`` where it has one (the reference's CLI has none), always its SHA-256, which names the build."""
    with open(binary, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()[:16]
    r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    version = r.stdout.strip() if r.returncode == 0 else "no --version"
    return f"{version}, sha256 {digest}"


def reference_work(binary: str, workdir: str, jobs: int, concurrency: int) -> dict[str, Any]:
    """The reference's ``work`` running ``true``: the drain daemons.spawner_throughput measures for steadqd.

    The jobs are enqueued by steadqd's library into the queue the reference's
    ``init`` made (one format, so this also shows the two interoperate); the
    reference's ``work`` never exits on its own, so it is stopped once every
    job has a receipt. Rates are first-to-last receipt, as for the spawner.
    """
    true = shutil.which("true") or "/bin/true"
    q = os.path.join(workdir, "q")
    init = subprocess.run([binary, "init", q], capture_output=True, text=True, timeout=60)
    if init.returncode != 0:
        raise RuntimeError(f"reference init {q}: exit {init.returncode}: {init.stderr.strip()[-300:]}")
    with Queue.open(q, deferred=True) as h, h.batch():
        for i in range(jobs):
            h.enqueue(b"spawn %d" % i)
    t0 = time.monotonic()
    with open(os.path.join(workdir, "work.log"), "wb") as out:
        p = subprocess.Popen(
            [binary, "work", q, f"--concurrency={concurrency}", "--", true],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
        try:
            deadline = time.monotonic() + max(60.0, jobs / 20)
            while len(daemons.receipt_ctimes(q)) < jobs and time.monotonic() < deadline and p.poll() is None:
                check_stop()
                time.sleep(0.1)
            seen = time.monotonic()
        finally:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    return daemons.drain_result(q, jobs, concurrency, seen - t0, daemons.objects_left(q))


def compare_spawner(base: str, profile: Profile, reference: str) -> dict[str, Any]:
    """steadqd's worker against the reference's ``work``, ``true`` at concurrency 4, interleaved rounds."""
    runs: dict[str, list[dict[str, Any]]] = {"steadqd": [], "reference": []}
    for rnd in range(profile.bench_cli_rounds):
        order = ["steadqd", "reference"] if rnd % 2 == 0 else ["reference", "steadqd"]
        for name in order:
            check_stop()
            with scratch(base, f"bench-work-{name}") as d:
                if name == "steadqd":
                    one = daemons.spawner_throughput(d, profile.spawner_jobs, WORK_CONCURRENCY)
                else:
                    one = reference_work(reference, d, profile.spawner_jobs, WORK_CONCURRENCY)
            log(f"spawner round {rnd} {name}: {one['acked']}/{one['jobs']} acked, {one['jobs_per_s']} jobs/s")
            runs[name].append(one)
    ratios = [
        s["jobs_per_s"] / r["jobs_per_s"]
        for s, r in zip(runs["steadqd"], runs["reference"], strict=True)
        if s["jobs_per_s"] and r["jobs_per_s"]
    ]
    return {
        "concurrency": WORK_CONCURRENCY,
        "jobs": profile.spawner_jobs,
        "runs": runs,
        "ratios": ratios,
        "ratio_median": statistics.median(ratios) if ratios else None,
    }


def compare(base: str, profile: Profile, reference: str | None) -> dict[str, Any]:
    """Interleaved rounds of each ``bench`` at every producer+consumer configuration of the profile."""
    seconds = profile.bench_cli_seconds
    systems: dict[str, list[str]] = {"steadqd": steadq_command()}
    out: dict[str, Any] = {
        "payload_size": PAYLOAD_SIZE,
        "duration_s": seconds,
        "rounds": profile.bench_cli_rounds,
        "steadqd_command": " ".join(steadq_command()),
        "reference": None,
        "configs": {},
    }
    if reference is not None:
        systems["reference"] = [os.path.abspath(reference)]
        out["reference"] = {"path": systems["reference"][0], "version": reference_version(reference)}
    names = list(systems)
    for prod, cons in profile.mp_configs:
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        # A zero-second run of each: the CPU of starting P+C workers (a Python
        # interpreter each for steadqd) is not spent in the measured window, so it
        # is subtracted from every run's CPU before dividing by the jobs acked.
        startup: dict[str, float] = {}
        for name in names:
            with scratch(base, f"bench-cli-{name}") as d:
                startup[name] = run_one(systems[name], os.path.join(d, "q"), prod, cons, 0)["cpu_s"]
        for rnd in range(profile.bench_cli_rounds):
            k = rnd % len(names)
            for name in names[k:] + names[:k]:
                check_stop()
                with scratch(base, f"bench-cli-{name}") as d:
                    one = run_one(systems[name], os.path.join(d, "q"), prod, cons, seconds)
                window_cpu = max(one["cpu_s"] - startup[name], 0.0)
                one["cpu_us_per_acked"] = round(window_cpu / one["acked"] * 1e6) if one["acked"] else None
                log(f"bench {prod}+{cons} round {rnd} {name}: {one['acked']} acked ({one['acked_per_s']:.0f}/s)")
                runs[name].append(one)
        entry: dict[str, Any] = {"runs": runs, "startup_cpu_s": startup}
        for name in names:
            entry[f"{name}_acked_per_s_median"] = statistics.median(x["acked_per_s"] for x in runs[name])
        if reference is not None:
            ratios = [
                s["acked_per_s"] / r["acked_per_s"] if r["acked_per_s"] else None
                for s, r in zip(runs["steadqd"], runs["reference"], strict=True)
            ]
            valid = [x for x in ratios if x is not None]
            entry["ratios"] = ratios
            entry["ratio_median"] = statistics.median(valid) if valid else None
        out["configs"][f"{prod}+{cons}"] = entry
    if reference is not None:
        out["spawner"] = compare_spawner(base, profile, systems["reference"][0])
    return out


def markdown(d: dict[str, Any]) -> list[str]:
    """The section of results.md: one row per configuration."""
    ref = d.get("reference")
    L = [f"## `steadq bench` (processes) vs the reference's `bench`, {d['payload_size']} B, {d['duration_s']} s runs\n"]
    if ref is None:
        L.append("No `--reference PATH` given: steadqd's side only.\n")
    else:
        L.append(f"Reference: `{ref['path']}` ({ref['version']}); {d['rounds']} interleaved rounds.\n")
    L.append(
        "CPU: user + system time of the whole process tree per acknowledged job, less that of a zero-second run "
        "(start-up and teardown).\n"
    )
    L.append(
        "| P+C | steadqd acked/s (median) | CPU µs/acked | reference acked/s | CPU µs/acked | ratio (median of rounds) |"
    )
    L.append("|---|---:|---:|---:|---:|---:|")
    for cfg, e in d["configs"].items():

        def cpu(name: str, e: dict[str, Any] = e) -> str:
            vals = [x["cpu_us_per_acked"] for x in e["runs"].get(name, []) if x["cpu_us_per_acked"] is not None]
            return f"{statistics.median(vals):.0f}" if vals else "–"

        sq = f"{e['steadqd_acked_per_s_median']:.0f}"
        rf = f"{e['reference_acked_per_s_median']:.0f}" if ref else "–"
        ratio = f"{e['ratio_median']:.2f}×" if ref and e.get("ratio_median") is not None else "–"
        L.append(f"| {cfg} | {sq} | {cpu('steadqd')} | {rf} | {cpu('reference') if ref else '–'} | {ratio} |")
    L.append("")
    sp = d.get("spawner")
    if sp is not None:
        L.append(f"Spawner, `true` at concurrency {sp['concurrency']}, {sp['jobs']} jobs, first to last receipt:\n")
        L.append("| | jobs/s per round | acked, left ready/leased |\n|---|---|---|")
        for name, label in (("steadqd", "steadqd worker"), ("reference", "reference `work`")):
            rates = ", ".join(f"{x['jobs_per_s']}" for x in sp["runs"][name])
            counts = ", ".join(
                f"{x['acked']}/{x['jobs']} {x['left_ready']}/{x['left_leased']}" for x in sp["runs"][name]
            )
            L.append(f"| {label} | {rates} | {counts} |")
        ratio = f"{sp['ratio_median']:.1f}×" if sp["ratio_median"] is not None else "–"
        L.append(f"\nsteadqd / reference, median of rounds: **{ratio}**\n")
    return L


def spawner_only(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.bench_cli --reference PATH``: only the spawner comparison, on a fresh loop disk.

    The whole ``bench`` section takes about nine minutes; this part alone is
    what a change to the worker needs re-measured, in the same interleaved rounds.
    """
    import argparse
    import dataclasses
    import json
    import tempfile

    from . import loopdisk
    from .common import PROFILES

    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_cli", description=spawner_only.__doc__)
    p.add_argument("--reference", required=True, help="the reference's built `steadq` binary")
    p.add_argument("--fs", default="ext4", choices=loopdisk.FS_CHOICES, help="the loop filesystem (default ext4)")
    p.add_argument("--rounds", type=int, default=PROFILES["full"].bench_cli_rounds, help="interleaved rounds")
    p.add_argument("--jobs", type=int, default=PROFILES["full"].spawner_jobs, help="`true` jobs per run")
    args = p.parse_args(argv)
    profile = dataclasses.replace(PROFILES["full"], bench_cli_rounds=args.rounds, spawner_jobs=args.jobs)
    base = tempfile.mkdtemp(prefix="steadqd-spawner-", dir="/var/tmp")
    with loopdisk.loop_filesystem(args.fs, base) as (mnt, _):
        result = compare_spawner(mnt, profile, os.path.abspath(args.reference))
    print(json.dumps(result, indent=1))
    ratio = result["ratio_median"]
    print(f"spawner, steadqd / reference, median of {len(result['ratios'])} rounds: {ratio:.2f}x" if ratio else "-")
    return 0


if __name__ == "__main__":
    sys.exit(spawner_only())
