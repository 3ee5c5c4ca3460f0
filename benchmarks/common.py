"""Shared pieces of the benchmark harness: profiles, bounded loops, machine facts.

Every measurement is bounded twice, by a job count and by a time budget, so a
slow disk makes a run shorter and less precise instead of longer: the whole
``--quick`` run must stay under 3 minutes and the full run under 20.
"""

from __future__ import annotations

import contextlib
import json
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
    spawner_floor_rounds: int  # steadqd's spawner against the spawner floor, `true` at 4, alternating rounds
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
    bench_cli_rounds: int = 5  # `steadq bench` vs the reference's (bench_cli.py): rounds per P+C
    bench_cli_seconds: int = 10  # --duration-seconds of each; whole seconds, as the reference takes them

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
        spawner_floor_rounds=1,
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
        bench_cli_rounds=1,
        bench_cli_seconds=1,
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
        spawner_floor_rounds=3,
        idle_seconds=5.0,
        scale_sizes=(1_000, 10_000),
        scale_leases=200,
        headline_rounds=5,
        headline_chunk=60,
        bench_cli_rounds=2,
        bench_cli_seconds=3,
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
        spawner_floor_rounds=5,
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


PROBE_FILES = 500


def _findmnt(path: str) -> dict[str, str]:
    """target, source, fstype, options of the mount holding ``path`` (``findmnt -T``)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError):
        r = subprocess.run(
            ["findmnt", "-J", "-T", path, "-o", "TARGET,SOURCE,FSTYPE,OPTIONS"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        fs = json.loads(r.stdout)["filesystems"][0]
        return {k: str(fs.get(k)) for k in ("target", "source", "fstype", "options")}
    return {}


def _block_name(path: str, source: str) -> str | None:
    """The kernel's name of the block device under ``path`` ("vda", "loop1", "dm-0").

    /sys/fs/ext4/<name> and /sys/block/<name> use this name, not the mount source
    (which may be a /dev/mapper or /dev/disk/by-* symlink, or /dev/root). st_dev finds
    it through /sys/dev/block; btrfs reports an anonymous st_dev, so the source's
    resolved name (without a [/subvolume] suffix) is the fallback.
    """
    with contextlib.suppress(OSError):
        st = os.stat(path)
        link = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        if os.path.exists(link):
            return os.path.basename(os.path.realpath(link))
    src = source.split("[", 1)[0]
    if src.startswith("/dev/"):
        return os.path.basename(os.path.realpath(src))
    return None


def _whole_disk(name: str) -> str:
    """``vda1`` -> ``vda``: queue/ and device/ live on the whole disk, not the partition."""
    sys_path = os.path.realpath(f"/sys/class/block/{name}")
    if os.path.exists(os.path.join(sys_path, "partition")):
        return os.path.basename(os.path.dirname(sys_path))
    return name


def ext4_journal(name: str | None) -> bool | None:
    """True/False if the ext4 filesystem on block device ``name`` has a journal, None if unknown.

    ``/sys/fs/ext4/<name>/journal_task`` holds the jbd2 thread's PID, or ``<none>``
    on a journal-less ext4 (where every inode allocation scans recently deleted inodes).
    """
    if name is None:
        return None
    task = _read(f"/sys/fs/ext4/{name}/journal_task")
    if task == "?":
        return None
    return task != "<none>"


def loop_facts(name: str) -> dict[str, Any] | None:
    """Backing file and options of loop device ``name``; None if it is not a loop device."""
    sysd = f"/sys/block/{name}/loop"
    if not os.path.isdir(sysd):
        return None
    out: dict[str, Any] = {
        "device": f"/dev/{name}",
        "backing_file": _read(f"{sysd}/backing_file"),
        "direct_io": _read(f"{sysd}/dio") == "1",
        "offset": _read(f"{sysd}/offset"),
        "sizelimit": _read(f"{sysd}/sizelimit"),
        "autoclear": _read(f"{sysd}/autoclear") == "1",
        "logical_block_size": _read(f"/sys/block/{name}/queue/logical_block_size"),
    }
    with contextlib.suppress(OSError):
        img = os.stat(out["backing_file"])
        out["image_size_bytes"] = img.st_size
        out["image_allocated_bytes_at_start"] = img.st_blocks * 512
    return out


def create_probe(path: str, files: int = PROBE_FILES) -> dict[str, Any]:
    """Cost of creating one empty file (create + close) in a fresh directory under ``path``.

    This is the inode allocation every enqueue pays: tens of µs on a journaled ext4,
    XFS or btrfs, but up to hundreds of µs of *system* CPU on a journal-less ext4, which
    skips every inode freed in the last minutes (``recently_deleted()``). A queue frees
    inodes all the time, so the files are created twice: in the fresh directory, and
    again right after deleting the first batch (the steady state of a queue). The files
    are deleted afterwards (not timed).
    """
    import resource
    import tempfile

    try:
        d = tempfile.mkdtemp(prefix=".create-probe-", dir=path)
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}

    def batch(tag: str) -> dict[str, float]:
        samples: list[float] = []
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        for i in range(files):
            p = os.path.join(d, f"{tag}{i:05d}")
            t = time.perf_counter_ns()
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            samples.append((time.perf_counter_ns() - t) / 1000)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "us_per_create_mean": round(sum(samples) / len(samples), 1),
            "us_per_create_p50": round(percentile(samples, 50), 1),
            "us_per_create_p99": round(percentile(samples, 99), 1),
            "sys_cpu_us_per_create": round((ru1.ru_stime - ru0.ru_stime) * 1e6 / files, 1),
        }

    try:
        fresh = batch("a")
        for i in range(files):
            os.unlink(os.path.join(d, f"a{i:05d}"))
        again = batch("b")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {"files": files, "fresh_dir": fresh, "after_deleting_them": again}


def disk_facts(path: str, *, probe: bool = True, follow_loop: bool = True) -> dict[str, Any]:
    """What the measured directory really sits on.

    Filesystem, mount source and options, the block device, whether an ext4 has a
    journal, the create-probe cost; for a loop device also its options and the same
    facts for the filesystem holding its image (the disk that finally takes the fsyncs).
    """
    m = _findmnt(path)
    name = _block_name(path, m.get("source", ""))
    out: dict[str, Any] = {
        "path": path,
        "fstype": m.get("fstype", "?"),
        "mount_source": m.get("source", "?"),
        "mount_target": m.get("target", "?"),
        "mount_options": m.get("options", "?"),
        "block_device": name,
        "ext4_journal": ext4_journal(name) if m.get("fstype") == "ext4" else None,
    }
    if name:
        disk = _whole_disk(name)
        out["rotational"] = _read(f"/sys/block/{disk}/queue/rotational")
        driver = os.path.realpath(f"/sys/block/{disk}/device/driver")
        out["disk_driver"] = os.path.basename(driver) if os.path.exists(driver) else None
    if probe:
        out["create_probe"] = create_probe(path)
    loop = loop_facts(name) if name else None
    if loop is not None:
        out["loop"] = loop
        backing = loop["backing_file"].removesuffix(" (deleted)")
        if follow_loop and os.path.exists(backing):
            out["backing"] = disk_facts(os.path.dirname(backing), probe=probe, follow_loop=False)
    return out


def machine_info(base: str) -> dict[str, Any]:
    """What a reader needs to compare numbers across machines."""
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    disk = disk_facts(base)
    physical = disk.get("backing") or disk  # a loop device's driver and rotational say nothing about the disk
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
        "disk_driver": physical.get("disk_driver"),
        "rotational": physical.get("rotational", "?"),
        "memory_mb": _meminfo_mb(),
        "base_dir": base,
        "disk": disk,
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


_STOP_SIGNALS: list[int] = []  # signals received by the run's process (see signals_unwind)


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt in this process, so ``finally`` teardown runs.

    Unhandled, SIGTERM kills without unwinding and leaks the loop device, the mount and
    redis-server. A KeyboardInterrupt raised from a handler is swallowed when it lands in
    an at-fork hook or a ``__del__``, so the signal is also remembered and
    :func:`check_stop` raises it again at the next measurement boundary. Forked children
    (multiprocessing) get the default action back: they die and never unwind into our frames.
    """
    import signal

    owner = os.getpid()

    def handler(signum: int, _frame: Any) -> None:
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        _STOP_SIGNALS.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _STOP_SIGNALS.clear()


def check_stop() -> None:
    """Raise KeyboardInterrupt if a stop signal arrived whose exception was swallowed."""
    if _STOP_SIGNALS:
        raise KeyboardInterrupt(f"signal {_STOP_SIGNALS[0]}")


def log(msg: str) -> None:
    """Progress on stderr, so stdout stays free for the final summary."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def skipped(reason: str) -> dict[str, Any]:
    return {"skipped": reason}


def copy_tree(dest: str) -> str:
    """Copy the checkout's ``steadqd`` package (sources only) to ``dest/steadqd``; return ``dest``.

    The scratch tree both compiled-path prototypes build on (benchmarks/compiled.py, benchmarks/ccore/).
    """
    os.makedirs(dest)
    shutil.copytree(
        os.path.join(REPO, "steadqd"),
        os.path.join(dest, "steadqd"),
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"),
    )
    return dest
