"""Runs every section in one process on one disk and collects one JSON document.

Sections run in a fixed order (floor, steadqd, peers, daemons, scaling,
profile) and each one is isolated: a section that fails is recorded with its
error and the run goes on, so one broken peer never costs the whole table.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import backends as bk
from . import bench_cli, bucket_idle, bucket_queue, daemons, drivers, floor, steadq_extra
from .common import PAYLOAD_SIZES, Profile, check_stop, log, machine_info, payload_of, scratch, skipped

SECTIONS = ("headline", "floor", "steadqd", "bench", "peers", "daemons", "scaling", "profile", "bucket", "bucket_idle")
PEERS = ("persist-queue", "litequeue", "huey", "redis", "rq")


class Runner:
    def __init__(self, profile: Profile, base: str, *, full_scale: bool = False, sections: tuple[str, ...] = SECTIONS,
                 peers: tuple[str, ...] = PEERS, fs: str = "host", loop_setup: dict[str, Any] | None = None,
                 reference: str | None = None) -> None:  # fmt: skip
        """``base`` is the scratch directory every section and every peer's data lives under;
        ``fs``/``loop_setup`` say how it was made (``--fs``) and end up in the results."""
        self.p = profile
        self.base = base
        self.fs = fs
        self.loop_setup = loop_setup
        self.full_scale = full_scale
        self.sections = sections
        self.peers = peers
        self.reference = reference  # the reference implementation's steadq binary, for section_bench
        self.results: dict[str, Any] = {}
        self.timings: dict[str, float] = {}

    def guarded(self, label: str, fn: Callable[[], Any]) -> Any:
        """Run one measurement; an exception becomes {"error": ...} in the results."""
        check_stop()
        t = time.monotonic()
        try:
            result = fn()
            check_stop()
            return result
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            log(f"{label}: FAILED: {type(e).__name__}: {e}")
            return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6)}
        finally:
            self.timings[label] = round(time.monotonic() - t, 2)

    def run(self) -> dict[str, Any]:
        started = time.time()
        t0 = time.monotonic()
        self.results["meta"] = {
            "profile": self.p.to_json(),
            "full_scale": self.full_scale,
            "started_unix": int(started),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
            "argv": sys.argv,
            "fs": self.fs,
            "loop_setup": self.loop_setup,
            "machine": machine_info(self.base),
            "sections": list(self.sections),
        }
        for section in self.sections:
            log(f"section {section}")
            t = time.monotonic()
            self.results[section] = self.guarded(section, getattr(self, f"section_{section}"))
            log(f"section {section} done in {time.monotonic() - t:.1f}s")
        self.results["meta"]["duration_s"] = round(time.monotonic() - t0, 1)
        self.results["meta"]["timings_s"] = self.timings
        return self.results

    # -- sections -------------------------------------------------------------

    def _jobs_for(self, size: int) -> int:
        return self.p.sweep_jobs.get(size, self.p.lifecycle_jobs) if size != 100 else self.p.lifecycle_jobs

    def section_headline(self) -> dict[str, Any]:
        """The main comparison, interleaved: every system runs a short chunk per round, in
        rotating order, so a burst of disk contention (other tenants, writeback) hits all
        of them alike. Medians of per-round rates, and medians of per-round ratios."""
        import statistics

        rounds, chunk = self.p.headline_rounds, self.p.headline_chunk
        seconds = self.p.phase_seconds / 2
        systems: dict[str, Callable[[int], float]] = {}
        closers: list[Callable[[], None]] = []
        server: bk.RedisServer | None = None
        cc_dir = floor.c_floor_tmpdir()
        work = os.path.join(self.base, "headline")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        try:
            pyf = floor.PyFloor(os.path.join(work, "floor-py"))
            closers.append(pyf.close)
            payload = payload_of(100)
            systems["floor, Python"] = lambda r: (
                drivers.bounded(chunk, seconds, lambda _i: pyf.ack(pyf.lease(pyf.enqueue(payload)))).per_second
            )
            if self.p.c_floor:
                binary, _why = floor.build_c_floor(cc_dir)
                if binary is not None:

                    def c_round(r: int, binary: str = binary) -> float:
                        return float(
                            floor.run_c_floor(binary, os.path.join(work, f"floor-c-{r}"), 100, chunk, seconds)[
                                "lifecycle"
                            ]["jobs_per_s"]
                        )

                    systems["floor, C"] = c_round
            q = bk.open_backend(bk.setup_steadq(os.path.join(work, "sq")))
            closers.append(q.close)
            systems["steadqd strict"] = lambda r, q=q: drivers.single_lifecycle(q, 100, chunk, seconds).per_second
            bpath = bk.setup_steadq(os.path.join(work, "sqb")).params["path"]
            batch = self.p.batch_size
            systems[f"steadqd batched, enqueue_many ({batch}/barrier)"] = lambda r: steadq_extra.batched(
                bpath, 100, batch, max(1, chunk // batch), seconds, many=True
            )["lifecycle"]["jobs_per_s"]
            systems[f"steadqd batched, {batch} enqueue() calls ({batch}/barrier)"] = lambda r: steadq_extra.batched(
                bpath, 100, batch, max(1, chunk // batch), seconds, many=False
            )["lifecycle"]["jobs_per_s"]
            for name in self.peers:
                if name == "rq" or bk.available(name) is not None:
                    continue
                if name == "redis":
                    if not self.p.redis or bk.RedisServer.binary() is None:
                        continue
                    server = bk.RedisServer(os.path.join(work, "redis"))
                    server.start()
                    b = bk.open_backend(bk.Spec("redis", {"port": server.port}))
                else:
                    b = bk.open_backend(bk.setup_sqlite_peer(name, os.path.join(work, name)))
                closers.append(b.close)
                systems[name] = lambda r, b=b: drivers.single_lifecycle(b, 100, chunk, seconds).per_second
            for fn in systems.values():  # warm-up: caches, first directories, WAL files
                fn(-1)
            per: dict[str, list[float]] = {k: [] for k in systems}
            names_ = list(systems)
            for r in range(rounds):
                k = r % len(names_)
                for name in names_[k:] + names_[:k]:
                    per[name].append(systems[name](r))
        finally:
            for c in closers:
                with contextlib.suppress(Exception):
                    c()
            if server is not None:
                server.stop()
            shutil.rmtree(cc_dir, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
        floor_rates = per["floor, Python"]
        out: dict[str, Any] = {"rounds": rounds, "chunk_jobs": chunk, "systems": {}}
        for name, rates in per.items():
            out["systems"][name] = {
                "median_jobs_per_s": round(statistics.median(rates), 1),
                "min": round(min(rates), 1),
                "max": round(max(rates), 1),
                "median_ratio_to_python_floor": round(
                    statistics.median(a / b for a, b in zip(rates, floor_rates, strict=True) if b), 3
                ),
                "rounds": [round(x, 1) for x in rates],
            }
        strict = per["steadqd strict"]
        out["steadqd_strict_over"] = {
            name: round(statistics.median(a / b for a, b in zip(strict, rates, strict=True) if b), 3)
            for name, rates in per.items()
        }
        return out

    def section_floor(self) -> dict[str, Any]:
        out: dict[str, Any] = {"python": {}, "c": {}}
        for size in PAYLOAD_SIZES:
            with scratch(self.base, f"floor-py-{size}") as d:
                out["python"][str(size)] = self.guarded(
                    f"floor.py.{size}",
                    lambda d=d, size=size: floor.run_python_floor(d, size, self._jobs_for(size), self.p.phase_seconds),
                )
        # What the file-per-job design allows with P + C processes, whatever the language.
        out["mp"] = self._mp_suite("floor", bk.setup_floor, self.p.mp_jobs)
        if not self.p.c_floor:
            out["c"] = skipped("not in this profile")
            return out
        cc_dir = floor.c_floor_tmpdir()
        try:
            binary, why = floor.build_c_floor(cc_dir)
            if binary is None:
                out["c"] = skipped(why)
                return out
            for size in PAYLOAD_SIZES:
                with scratch(self.base, f"floor-c-{size}") as d:
                    out["c"][str(size)] = self.guarded(
                        f"floor.c.{size}",
                        lambda d=d, size=size: floor.run_c_floor(
                            binary, d, size, self._jobs_for(size), self.p.phase_seconds
                        ),
                    )
        finally:
            shutil.rmtree(cc_dir, ignore_errors=True)
        return out

    def _single_suite(self, name: str, make: Callable[[str], bk.Spec]) -> dict[str, Any]:
        """Lifecycle at every payload size, then enqueue-only and lease+ack-only at 100 B."""
        out: dict[str, Any] = {}
        for size in PAYLOAD_SIZES:
            if name == "rq" and size == 1 << 20:
                out[str(size)] = skipped("rq pickles the payload into the job hash; 1 MiB not measured")
                continue

            def one(size: int = size) -> dict[str, Any]:
                with scratch(self.base, f"{name}-single-{size}") as d:
                    b = bk.open_backend(make(d))
                    try:
                        r = {
                            "lifecycle": drivers.single_lifecycle(
                                b, size, self._jobs_for(size), self.p.phase_seconds
                            ).to_json()
                        }
                        if size == 100:
                            r.update(drivers.split_phases(b, size, self.p.lifecycle_jobs, self.p.phase_seconds))
                        return r
                    finally:
                        b.close()

            out[str(size)] = self.guarded(f"{name}.single.{size}", one)
        return out

    def _mp_suite(self, name: str, make: Callable[[str], bk.Spec], jobs: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for prod, cons in self.p.mp_configs:

            def one(prod: int = prod, cons: int = cons) -> dict[str, Any]:
                with scratch(self.base, f"{name}-mp-{prod}-{cons}") as d:
                    return drivers.run_mp(make(d), prod, cons, jobs, 100, self.p.mp_seconds)

            out[f"{prod}+{cons}"] = self.guarded(f"{name}.mp.{prod}+{cons}", one)
        return out

    def section_steadqd(self) -> dict[str, Any]:
        make = bk.setup_steadq
        out: dict[str, Any] = {"config": bk.Steadq.DESCRIPTION}
        out["single"] = self._single_suite("steadqd", make)
        out["mp"] = self._mp_suite("steadqd", make, self.p.mp_jobs)

        def batched(many: bool) -> dict[str, Any]:
            with scratch(self.base, "steadqd-batched") as d:
                spec = make(d)
                return steadq_extra.batched(
                    spec.params["path"], 100, self.p.batch_size, self.p.batches, self.p.phase_seconds, many=many
                )

        out["batched"] = self.guarded("steadqd.batched", lambda: batched(True))
        out["batched_calls"] = self.guarded("steadqd.batched_calls", lambda: batched(False))

        def syscalls() -> dict[str, Any]:
            with scratch(self.base, "steadqd-syscalls") as d:
                return steadq_extra.syscalls_per_job(make(d).params["path"], 100)

        out["syscalls_per_job"] = self.guarded("steadqd.syscalls", syscalls)
        return out

    def section_peers(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        redis_server: bk.RedisServer | None = None
        redis_dir = os.path.join(self.base, "redis")
        try:
            for name in self.peers:
                why = bk.available(name)
                if why is not None:
                    out[name] = skipped(why)
                    continue
                cls = bk.KINDS[name]
                entry: dict[str, Any] = {"config": cls.DESCRIPTION, "at_least_once": cls.at_least_once}
                if name in ("redis", "rq"):
                    if not self.p.redis:
                        out[name] = skipped("redis-server not started in this profile")
                        continue
                    if redis_server is None:
                        if bk.RedisServer.binary() is None:
                            out["redis"] = out["rq"] = skipped(
                                "redis-server not installed (apt-get install -y redis-server)"
                            )
                            break
                        redis_server = bk.RedisServer(redis_dir)
                        try:
                            redis_server.start()
                        except RuntimeError as e:
                            out["redis"] = out["rq"] = skipped(str(e))
                            redis_server = None
                            break
                    server = redis_server
                    entry["server_config"] = self.guarded("redis.config", server.config)

                    def make(_d: str, name: str = name, server: bk.RedisServer = server) -> bk.Spec:
                        server.flush()
                        return bk.Spec(name, {"port": server.port})
                else:

                    def make(d: str, name: str = name) -> bk.Spec:
                        return bk.setup_sqlite_peer(name, d)

                if name in ("persist-queue", "litequeue", "huey"):
                    entry["synchronous"] = self.guarded(f"{name}.pragma", lambda make=make: _pragma(make, self.base))
                entry["single"] = self._single_suite(name, make)
                entry["mp"] = self._mp_suite(name, make, self.p.rq_jobs * 2 if name == "rq" else self.p.peer_mp_jobs)
                out[name] = entry
        finally:
            if redis_server is not None:
                redis_server.stop()
            shutil.rmtree(redis_dir, ignore_errors=True)
        return out

    def section_daemons(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with scratch(self.base, "daemons-wake") as d:
            out["wake_latency"] = self.guarded("daemons.wake", lambda: daemons.wake_latency(d, self.p.wake_jobs))
        out["spawner"] = []
        for c in self.p.spawner_concurrency:
            with scratch(self.base, f"daemons-spawn-{c}") as d:
                out["spawner"].append(
                    self.guarded(
                        f"daemons.spawner.{c}", lambda d=d, c=c: daemons.spawner_throughput(d, self.p.spawner_jobs, c)
                    )
                )
        with scratch(self.base, "daemons-spawn-floor") as d:
            out["spawner_floor"] = self.guarded(
                "daemons.spawner_floor",
                lambda: daemons.spawner_vs_floor(d, self.p.spawner_jobs, 4, self.p.spawner_floor_rounds),
            )
        with scratch(self.base, "daemons-idle") as d:
            out["idle"] = self.guarded("daemons.idle", lambda: daemons.idle_cost(d, self.p.idle_seconds))
        return out

    def section_scaling(self) -> list[dict[str, Any]]:
        sizes = list(self.p.scale_sizes) + ([1_000_000] if self.full_scale else [])
        out = []
        for n in sizes:
            log(f"scaling: {n} ready jobs")
            out.append(
                self.guarded(f"scaling.{n}", lambda n=n: steadq_extra.scaling_point(self.base, n, self.p.scale_leases))
            )
        return out

    def section_bench(self) -> dict[str, Any]:
        return bench_cli.compare(self.base, self.p, self.reference)

    def section_bucket(self) -> dict[str, Any]:
        """Bucket queues against a same-host SeaweedFS whose data lives under the scratch directory."""
        return bucket_queue.section(self.p.name, self.base)

    def section_bucket_idle(self) -> dict[str, Any]:
        """An idle bucket worker's LISTs per minute and its wake latency, with and without the doorbell."""
        return bucket_idle.section(self.p.name, self.base)

    def section_profile(self) -> dict[str, Any]:
        with scratch(self.base, "profile") as d:
            return steadq_extra.profile_lifecycle(bk.setup_steadq(d).params["path"], 100, self.p.profile_jobs)


def _pragma(make: Callable[[str], bk.Spec], base: str) -> Any:
    """The PRAGMA synchronous a peer's connection actually runs with (2 = FULL)."""
    with scratch(base, "pragma") as d:
        b = bk.open_backend(make(d))
        try:
            return getattr(b, "synchronous", None)
        finally:
            b.close()
