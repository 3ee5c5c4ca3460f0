"""The daemons under load and at rest: wake latency, spawner throughput, idle cost.

Each runs the real ``steadqd <role> <queue>`` console script with a private
config dir, exactly as systemd would start it (minus the unit's sandbox).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from steadqd import Queue

from . import floor
from .common import log, summary_ms

STAMP_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
/* Records CLOCK_MONOTONIC at the job command's first instruction in DIR/$STEADQ_JOB_ID. */
int main(int argc, char **argv) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    const char *id = getenv("STEADQ_JOB_ID");
    char path[4096], buf[32];
    if (argc < 2 || !id) return 2;
    snprintf(path, sizeof path, "%s/%s", argv[1], id);
    int n = snprintf(buf, sizeof buf, "%lld\n", (long long)t.tv_sec * 1000000000LL + t.tv_nsec);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, buf, n) != n) return 1;
    return close(fd) ? 1 : 0;
}
"""


def _steadqd() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "steadqd")
    return (
        [exe]
        if os.path.exists(exe)
        else [sys.executable, "-c", "import sys; from steadqd.daemon.main import daemon_main; sys.exit(daemon_main())"]
    )


def build_stamp(workdir: str) -> tuple[list[str], str]:
    """The job command that stamps its start: a C binary, or Python (slower start) without gcc."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc:
        src, binary = os.path.join(workdir, "stamp.c"), os.path.join(workdir, "stamp")
        with open(src, "w") as f:
            f.write(STAMP_C)
        if subprocess.run([cc, "-O2", "-o", binary, src], capture_output=True).returncode == 0:
            return [binary], "C binary (clock_gettime at main)"
    code = "import os,sys,time;t=time.monotonic_ns();open(os.path.join(sys.argv[1],os.environ['STEADQ_JOB_ID']),'w').write(str(t))"
    return [sys.executable, "-S", "-c", code], "python -S (includes interpreter start-up)"


def _yaml(queue: str, command: list[str], concurrency: int = 1) -> str:
    return (
        f"queue: {json.dumps(queue)}\n"
        "worker:\n"
        f"  command: {json.dumps(command)}\n"
        f"  concurrency: {concurrency}\n"
        "  lease: 60s\n"
        "  pass_environment: [PATH]\n"
        "sweeper:\n"
        "  interval: 30s\n"
        "promoter:\n"
        "  enabled: true\n"
    )


def daemon_env(workdir: str) -> dict[str, str]:
    """A daemon child's whole environment: a fixed PATH and locale, its jobs' TMPDIR under ``workdir``
    (made here), and this run's PYTHONPATH, so each side imports the tree it is meant to."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TMPDIR": os.path.join(workdir, "jobtmp"),
    }
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return env


def drain_result(qpath: str, jobs: int, concurrency: int, wall: float, left: dict[str, int]) -> dict[str, Any]:
    """One drain's row, the same for steadqd's spawner, its C floor and the reference's ``work``:
    the rate from the receipts' ctimes, first to last, and what was left ready or leased."""
    ctimes = sorted(receipt_ctimes(qpath))
    span = (ctimes[-1] - ctimes[0]) / 1e9 if len(ctimes) > 1 else 0.0
    return {
        "concurrency": concurrency,
        "jobs": jobs,
        "acked": len(ctimes),
        "jobs_per_s": round((len(ctimes) - 1) / span, 2) if span > 0 else None,
        "first_to_last_ack_s": round(span, 4),
        "wall_including_startup_s": round(wall, 3),
        "left_ready": left.get("ready", 0),
        "left_leased": left.get("leased", 0),
    }


def objects_left(qpath: str) -> dict[str, int]:
    """Objects per state, as the library counts them after a drain."""
    with Queue.open(qpath) as q:
        return {k: v.objects for k, v in q.stats().items()}


class Daemon:
    """One ``steadqd`` role process with its log in a file; stopped by PID."""

    def __init__(
        self, workdir: str, cfg_dir: str, role: str, name: str, env_extra: dict[str, str] | None = None
    ) -> None:
        self.log_path = os.path.join(workdir, f"{role}-{name}.log")
        env = daemon_env(workdir)
        env.update(env_extra or {})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*_steadqd(), "--config-dir", cfg_dir, role, name],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        self.role = role

    def wait_started(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, errors="replace") as f:
                if "started" in f.read():
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"{self.role} did not start: {self.log_text()[-2000:]}")

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


def _setup(workdir: str, name: str, command: list[str], concurrency: int = 1) -> tuple[str, str]:
    qpath = os.path.join(workdir, f"q-{name}")
    Queue.init(qpath, shards=64).close()
    cfg = os.path.join(workdir, "cfg")
    os.makedirs(cfg, exist_ok=True)
    with open(os.path.join(cfg, f"{name}.yaml"), "w") as f:
        f.write(_yaml(qpath, command, concurrency))
    return qpath, cfg


def wake_latency(workdir: str, jobs: int) -> dict[str, Any]:
    """Enqueue returns -> the job's command starts, one job at a time on an idle worker."""
    stamp, how = build_stamp(workdir)
    outdir = os.path.join(workdir, "stamps")
    os.makedirs(outdir, exist_ok=True)
    qpath, cfg = _setup(workdir, "wake", [*stamp, outdir])
    d = Daemon(workdir, cfg, "worker", "wake")
    samples: list[int] = []
    try:
        d.wait_started()
        with Queue.open(qpath) as q:
            for i in range(jobs):
                time.sleep(0.02 if i else 0.2)  # let the worker settle into its idle wait
                job = q.enqueue(b"wake %d" % i)
                t_ret = time.monotonic_ns()
                f = os.path.join(outdir, job)
                deadline = time.monotonic() + 15
                while not os.path.exists(f) or os.path.getsize(f) == 0:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"job {job} never started:\n{d.log_text()[-2000:]}")
                    time.sleep(0.0005)
                with open(f) as fh:
                    samples.append(int(fh.read()) - t_ret)
                _wait_state(q, job, "receipt", 15)
    finally:
        d.stop()
    out = summary_ms(samples)
    out["command"] = how
    out["min_ms"] = round(min(samples) / 1e6, 3) if samples else None
    return out


def _wait_state(q: Queue, job: str, state: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(i.state.name.lower().startswith(state[:6]) for i in q.inspect(job)):
            return
        time.sleep(0.002)
    raise RuntimeError(f"job {job} did not reach {state}: {q.inspect(job)}")


def receipt_ctimes(qpath: str) -> list[int]:
    out = []
    for dirpath, _dirs, files in os.walk(os.path.join(qpath, "receipts")):
        for fn in files:
            with contextlib.suppress(OSError):
                out.append(os.stat(os.path.join(dirpath, fn)).st_ctime_ns)
    return out


def _enqueue_jobs(qpath: str, jobs: int) -> None:
    with Queue.open(qpath, deferred=True) as q, q.batch():
        for i in range(jobs):
            q.enqueue(b"spawn %d" % i)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and every live descendant, each with its reaped children's (stat's utime, stime,
    cutime, cstime): a worker's own threads, its process guard and every job command it has reaped."""
    ticks = os.sysconf("SC_CLK_TCK")
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
    return total / ticks


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of each of ``pid``'s threads, summed by name (``comm``): a worker's ``steadqd`` (its loop,
    and the spawn pool's C threads, which spend ~0.01 ms a job), ``steadqd-prepare`` (claims, payload copies)
    and ``steadqd-settle``."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    raw = f.read()
            except OSError:  # a thread that ended since the listing
                continue
            name = raw[raw.index("(") + 1 : raw.rindex(")")]
            fields = raw.rsplit(")", 1)[1].split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


def spawner_throughput(
    workdir: str, jobs: int, concurrency: int, name: str = "", env_extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """``true`` as the command: jobs enqueued first, then the worker drains them.

    CPU per job is the worker's process tree (its threads, its guard, the reaped commands) between the
    first receipt seen and the last, over the jobs settled in between: start-up and shutdown left out.
    """
    true = shutil.which("true") or "/bin/true"
    name = name or f"spawn{concurrency}"
    qpath, cfg = _setup(workdir, name, [true], concurrency)
    _enqueue_jobs(qpath, jobs)
    d = Daemon(workdir, cfg, "worker", name, env_extra)
    t_start = time.monotonic()
    first: tuple[int, float, dict[str, float]] | None = None
    last: tuple[int, float, dict[str, float]] | None = None
    try:
        d.wait_started()
        deadline = time.monotonic() + max(60.0, jobs / 20)
        while (acked := len(receipt_ctimes(qpath))) < jobs:
            if first is None and acked > 0:
                first = (acked, tree_cpu_s(d.proc.pid), thread_cpu_s(d.proc.pid))
            if time.monotonic() > deadline or d.proc.poll() is not None:
                break
            time.sleep(0.05)
        t_seen = time.monotonic()
        last = (len(receipt_ctimes(qpath)), tree_cpu_s(d.proc.pid), thread_cpu_s(d.proc.pid))
    finally:
        rc = d.stop()
    row = {**drain_result(qpath, jobs, concurrency, t_seen - t_start, objects_left(qpath)), "worker_exit": rc}
    if first is not None and last is not None and last[0] > first[0]:
        n = last[0] - first[0]
        row["cpu_ms_per_job"] = round((last[1] - first[1]) * 1000 / n, 3)
        row["thread_cpu_ms_per_job"] = {k: round((v - first[2].get(k, 0.0)) * 1000 / n, 3) for k, v in last[2].items()}
    return row


def spawn_floor_throughput(workdir: str, binary: str, jobs: int, concurrency: int, name: str = "") -> dict[str, Any]:
    """The spawner floor (``floor.SPAWN_C_SOURCE``) on the same tree: steadqd's queue, ``true`` and jobs alike.

    The rate is taken as :func:`spawner_throughput` takes it, from the receipts' ctimes, first to last;
    the floor's own clock (first to last settle) is kept beside it as a check. Its CPU per job is the
    whole run's (the floor process and its commands, from RUSAGE_CHILDREN): a C program starts in no time.
    """
    import resource

    true = shutil.which("true") or "/bin/true"
    qpath, _cfg = _setup(workdir, name or f"floor{concurrency}", [true], concurrency)
    _enqueue_jobs(qpath, jobs)
    t_start = time.monotonic()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = floor.run_spawn_floor(binary, qpath, concurrency, true, timeout=max(60.0, jobs / 20))
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.monotonic() - t_start
    left = {"ready": 0, "leased": 0}
    for _dirpath, _dirs, files in os.walk(os.path.join(qpath, "ready")):
        for fn in files:
            left["leased" if fn.endswith(".lsd") else "ready"] += 1
    row = {**drain_result(qpath, jobs, concurrency, wall, left), "floor_own": own}
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    if row["acked"]:
        row["cpu_ms_per_job"] = round(cpu * 1000 / row["acked"], 3)
    return row


# The spawner's sides: steadqd as installed, steadqd on its spawn fallback (Popen and steadq-exec), the C floor.
SPAWN_SIDES = {"steadqd": {}, "steadqd-popen": {"STEADQ_SPAWN": "popen"}}


def spawner_vs_floor(
    workdir: str,
    jobs: int,
    concurrency: int,
    rounds: int,
    sides: tuple[str, ...] = ("steadqd", "floor"),
    side_env: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """steadqd's spawner and the spawner floor, ``true`` at ``concurrency``, in alternating rounds.

    Each round drains ``jobs`` enqueued jobs once with each side, in a fresh queue, the order rotating
    by one each round; medians of the rates, of the CPU per job and of the per-round ratios to the floor
    (the headline). ``sides`` may add ``steadqd-popen``: the same tree with its spawn fallback, or any
    name ``side_env`` gives the worker's extra environment for (``PYTHONPATH`` of another tree).
    """
    envs = {**SPAWN_SIDES, **(side_env or {})}
    cc_dir = floor.c_floor_tmpdir()
    try:
        binary, why = floor.build_spawn_floor(cc_dir)
        if binary is None:
            return {"skipped": why}
        per: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for r in range(rounds):
            order = sides[r % len(sides) :] + sides[: r % len(sides)]
            for side in order:
                d = os.path.join(workdir, f"r{r}-{side}")
                os.makedirs(d)
                if side == "floor":
                    per[side].append(spawn_floor_throughput(d, binary, jobs, concurrency, name=f"fl{r}"))
                else:
                    per[side].append(spawner_throughput(d, jobs, concurrency, f"sp{r}", envs[side]))
                shutil.rmtree(d, ignore_errors=True)
            log(
                f"spawner vs floor, round {r}: "
                + ", ".join(
                    f"{k} {v[-1]['jobs_per_s']} jobs/s {v[-1].get('cpu_ms_per_job')} ms/job" for k, v in per.items()
                )
            )
    finally:
        shutil.rmtree(cc_dir, ignore_errors=True)
    rates = {k: [x["jobs_per_s"] for x in v] for k, v in per.items()}
    out: dict[str, Any] = {"concurrency": concurrency, "jobs": jobs, "rounds": rounds, "command": "true"}
    for side, runs in per.items():
        ok = [x for x in rates[side] if x]
        cpu = [x["cpu_ms_per_job"] for x in runs if x.get("cpu_ms_per_job")]
        threads: dict[str, list[float]] = {}
        for x in runs:
            for name, ms in x.get("thread_cpu_ms_per_job", {}).items():
                threads.setdefault(name, []).append(ms)
        out[side] = {
            "median_jobs_per_s": round(statistics.median(ok), 1) if ok else None,
            "rounds_jobs_per_s": rates[side],
            "median_cpu_ms_per_job": round(statistics.median(cpu), 3) if cpu else None,
            "rounds_cpu_ms_per_job": [x.get("cpu_ms_per_job") for x in runs],
            # by thread name (the worker's; a tree before its threads were named shows one name)
            "median_thread_cpu_ms_per_job": {k: round(statistics.median(v), 3) for k, v in sorted(threads.items())},
            "acked": [x["acked"] for x in runs],
            "stranded": [x["left_ready"] + x["left_leased"] for x in runs],
            "runs": runs,
        }
    for side in sides:
        if side == "floor" or "floor" not in sides:
            continue
        ratios = [a / b for a, b in zip(rates[side], rates["floor"], strict=True) if a and b]
        key = "" if side == "steadqd" else f"_{side}"
        out[f"median_ratio{key}"] = round(statistics.median(ratios), 3) if ratios else None
        out[f"round_ratios{key}"] = [round(x, 3) for x in ratios]
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.daemons spawner [--dir D] [--rounds N] [--jobs N] [--fallback]``: the spawner
    against its floor on a fresh journaled ext4 loop disk whose image lives in ``--dir`` (``/dev/shm``: held
    in RAM, loop direct I/O off); ``--fallback`` adds steadqd on its spawn fallback as a third side. Root."""
    import argparse

    from . import loopdisk

    ap = argparse.ArgumentParser(prog="python -m benchmarks.daemons")
    ap.add_argument("what", choices=["spawner"])
    ap.add_argument("--dir", default="/var/tmp", help="where the loop image lives (default /var/tmp)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--fallback", action="store_true", help="also steadqd with STEADQ_SPAWN=popen")
    ap.add_argument("--against", help="also the worker of this source tree (its PYTHONPATH), side 'against'")
    a = ap.parse_args(argv)
    sides: tuple[str, ...] = ("steadqd", "steadqd-popen") if a.fallback else ("steadqd",)
    sides += ("against", "floor") if a.against else ("floor",)
    side_env = {"against": {"PYTHONPATH": os.path.abspath(a.against)}} if a.against else None
    direct = "off" if a.dir.startswith("/dev/shm") else loopdisk.DEFAULT_DIRECT_IO
    with loopdisk.loop_filesystem("ext4", a.dir, direct_io=direct) as (mnt, _setup_info):
        out = spawner_vs_floor(mnt, a.jobs, 4, a.rounds, sides, side_env)
    for side in sides:  # the per-run rows stay out of the printout: the medians and rounds say it
        if isinstance(out.get(side), dict):
            out[side].pop("runs", None)
    out["load_average"] = os.getloadavg()
    print(json.dumps(out, indent=1, default=str))
    return 0


# ------------------------------------------------------------------ idle cost


def _proc_sample(pid: int) -> dict[str, float]:
    """CPU time, context switches (summed over every thread) and RSS of one process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    # utime + stime (stat fields 14 and 15) cover the whole thread group.
    out: dict[str, float] = {"cpu_s_ticks": (int(fields[11]) + int(fields[12])) / ticks, "threads": 0}
    sched = 0
    out["voluntary_ctxt_switches"] = out["nonvoluntary_ctxt_switches"] = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        out["threads"] += 1
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                sched += int(f.read().split()[0])  # ns on CPU: finer than clock ticks
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                        out[k] += int(v)
    if sched:
        out["cpu_s_sched"] = sched / 1e9
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
    return out


def idle_cost(workdir: str, seconds: float) -> dict[str, Any]:
    """Each role on an empty queue with the unit's watchdog (WatchdogSec=30s): CPU, wake-ups, RSS."""
    true = shutil.which("true") or "/bin/true"
    _qpath, cfg = _setup(workdir, "idle", [true], 2)
    sock_path = os.path.join(workdir, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.setblocking(False)
    env = {"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "30000000"}
    daemons = {role: Daemon(workdir, cfg, role, "idle", env) for role in ("worker", "sweeper", "promoter")}
    out: dict[str, Any] = {"seconds": seconds, "watchdog_usec": 30_000_000}
    try:
        for d in daemons.values():
            d.wait_started()
        time.sleep(1.0)  # past start-up work (first sweep, first promoter scan)
        before = {r: _proc_sample(d.proc.pid) for r, d in daemons.items()}
        t0 = time.monotonic()
        time.sleep(seconds)
        dt = time.monotonic() - t0
        after = {r: _proc_sample(d.proc.pid) for r, d in daemons.items()}
        for role in daemons:
            b, a = before[role], after[role]
            cpu = a.get("cpu_s_sched", a["cpu_s_ticks"]) - b.get("cpu_s_sched", b["cpu_s_ticks"])
            vol = a["voluntary_ctxt_switches"] - b["voluntary_ctxt_switches"]
            invol = a["nonvoluntary_ctxt_switches"] - b["nonvoluntary_ctxt_switches"]
            out[role] = {
                "cpu_ms_per_min": round(cpu * 1000 * 60 / dt, 3),
                "cpu_percent_of_core": round(cpu / dt * 100, 4),
                "cpu_ticks_s": round(a["cpu_s_ticks"] - b["cpu_s_ticks"], 3),
                "wakeups_per_min": round((vol + invol) * 60 / dt, 2),
                "voluntary_per_min": round(vol * 60 / dt, 2),
                "rss_mb": round(a.get("VmRSS", 0), 1),
                "peak_rss_mb": round(a.get("VmHWM", 0), 1),
                "threads": int(a["threads"]),
            }
    finally:
        for d in daemons.values():
            d.stop()
        n = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                sock.recv(4096)
                n += 1
        sock.close()
        out["notify_messages"] = n
    log(f"idle: {json.dumps({k: v for k, v in out.items() if isinstance(v, dict)})}")
    return out


if __name__ == "__main__":
    sys.exit(main())
