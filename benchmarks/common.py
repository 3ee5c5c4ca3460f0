"""Shared pieces of the benchmark harness: profiles, bounded loops, machine facts.

Every measurement is bounded twice, by a job count and by a time budget, so a
slow disk makes a run shorter and less precise instead of longer: the whole
``--quick`` run must stay under 3 minutes and the full run under 20.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAYLOAD_SIZES = (100, 4096, 1 << 20)


@dataclass(frozen=True)
class Profile:
    """How much of each measurement a run does (counts are upper bounds, seconds are budgets)."""

    name: str
    lifecycle_jobs: int  # single-process lifecycle / enqueue-only / lease+ack-only
    phase_seconds: float  # time budget of one single-process phase
    mp_jobs: int  # jobs per multi-process configuration (split across producers)
    mp_seconds: float
    batch_size: int
    batches: int
    sweep_jobs: dict[int, int]  # payload size -> jobs
    wake_jobs: int
    spawner_jobs: int
    spawner_concurrency: tuple[int, ...]
    idle_seconds: float
    scale_sizes: tuple[int, ...]
    scale_leases: int
    peer_jobs: int
    peer_mp_jobs: int
    rq_jobs: int
    profile_jobs: int
    headline_rounds: int = 7
    headline_chunk: int = 100
    redis: bool = True
    c_floor: bool = True
    mp_configs: tuple[tuple[int, int], ...] = ((1, 1), (4, 4))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["sweep_jobs"] = {str(k): v for k, v in self.sweep_jobs.items()}
        return d


PROFILES: dict[str, Profile] = {
    # CI smoke: proves every code path of the harness runs; the numbers mean nothing.
    "smoke": Profile(
        name="smoke",
        lifecycle_jobs=20,
        phase_seconds=1.0,
        mp_jobs=16,
        mp_seconds=5.0,
        batch_size=8,
        batches=2,
        sweep_jobs={100: 5, 4096: 5, 1 << 20: 2},
        wake_jobs=3,
        spawner_jobs=8,
        spawner_concurrency=(2,),
        idle_seconds=0.5,
        scale_sizes=(100,),
        scale_leases=3,
        peer_jobs=10,
        peer_mp_jobs=8,
        rq_jobs=4,
        profile_jobs=5,
        redis=False,
        c_floor=False,
        headline_rounds=2,
        headline_chunk=5,
        mp_configs=((1, 1),),
    ),
    "quick": Profile(
        name="quick",
        lifecycle_jobs=300,
        phase_seconds=1.5,
        mp_jobs=600,
        mp_seconds=4.0,
        batch_size=64,
        batches=6,
        sweep_jobs={100: 150, 4096: 150, 1 << 20: 20},
        wake_jobs=30,
        spawner_jobs=200,
        spawner_concurrency=(1, 4),
        idle_seconds=5.0,
        scale_sizes=(1_000, 10_000),
        scale_leases=200,
        headline_rounds=5,
        headline_chunk=60,
        peer_jobs=300,
        peer_mp_jobs=600,
        rq_jobs=60,
        profile_jobs=100,
    ),
    "full": Profile(
        name="full",
        lifecycle_jobs=3000,
        phase_seconds=8.0,
        mp_jobs=4000,
        mp_seconds=20.0,
        batch_size=64,
        batches=40,
        sweep_jobs={100: 1000, 4096: 1000, 1 << 20: 100},
        wake_jobs=100,
        spawner_jobs=1000,
        spawner_concurrency=(1, 4, 8),
        idle_seconds=30.0,
        scale_sizes=(1_000, 100_000),
        scale_leases=1000,
        headline_rounds=9,
        headline_chunk=200,
        peer_jobs=2000,
        peer_mp_jobs=4000,
        rq_jobs=300,
        profile_jobs=500,
    ),
}


@dataclass
class Rate:
    """One throughput measurement: ``jobs`` completed in ``seconds``."""

    jobs: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "seconds": round(self.seconds, 6),
            "jobs_per_s": round(self.per_second, 2),
            **self.extra,
        }


def bounded(max_n: int, max_seconds: float, step: Callable[[int], None]) -> Rate:
    """Run ``step(i)`` up to ``max_n`` times or until ``max_seconds`` passed (at least once)."""
    start = time.perf_counter()
    deadline = start + max_seconds
    n = 0
    while n < max_n:
        step(n)
        n += 1
        if time.perf_counter() > deadline:
            break
    return Rate(n, time.perf_counter() - start)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (no interpolation: p99 of 100 samples is the 99th value)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[k]


def summary_ms(samples_ns: list[int]) -> dict[str, float]:
    ms = [v / 1e6 for v in samples_ns]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p90_ms": round(percentile(ms, 90), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3) if ms else float("nan"),
        "mean_ms": round(sum(ms) / len(ms), 3) if ms else float("nan"),
    }


def payload_of(size: int, i: int = 0) -> bytes:
    """A payload of exactly ``size`` bytes that starts with a unique job number (for dedup)."""
    head = b"%010d:" % i
    return (head + b"x" * max(0, size - len(head)))[:size] if size >= len(head) else head[:size]


def fs_type(path: str) -> str:
    """The mount's filesystem type and device, from /proc/self/mounts (longest prefix wins)."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, typ = line.split()[:3]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                best = (mnt, typ, dev)
    return f"{best[1]} on {best[2]} (mounted at {best[0]})"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def machine_info(base: str) -> dict[str, Any]:
    """What a reader needs to compare numbers across machines."""
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    dev = fs_type(base).split(" on ")[1].split(" ")[0] if " on " in fs_type(base) else "?"
    disk = os.path.basename(dev)
    driver = "?"
    with contextlib.suppress(OSError):
        driver = os.path.basename(os.path.realpath(f"/sys/block/{disk}/device/driver"))
    redis_version = None
    if shutil.which("redis-server"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            redis_version = subprocess.run(
                ["redis-server", "--version"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
    from importlib import metadata

    try:
        version = metadata.version("steadqd")
    except metadata.PackageNotFoundError:
        version = "?"
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "redis_server": redis_version,
        "steadqd": version,
        "filesystem": fs_type(base),
        "disk_driver": driver,
        "rotational": _read(f"/sys/block/{disk}/queue/rotational"),
        "memory_mb": _meminfo_mb(),
        "base_dir": base,
    }


def _meminfo_mb() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


@contextlib.contextmanager
def scratch(base: str, name: str) -> Iterator[str]:
    """A fresh directory under the benchmark base, removed afterwards (big trees must not pile up)."""
    path = os.path.join(base, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def log(msg: str) -> None:
    """Progress on stderr, so stdout stays free for the final summary."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def skipped(reason: str) -> dict[str, Any]:
    return {"skipped": reason}
