"""Drive the crash lab: record a workload, enumerate its crash states, check each.

Command line (docs/crash-lab.md)::

    .venv/bin/python -m tests.lab run [--workload NAME ...] [--max-states N]
        [--exhaustive-bits B] [--samples S] [--repeat N] [--json PATH]

prints one line per workload (ops recorded, crash points, distinct states
checked, failures, seconds), the first failures in detail, and exits 1 if
any state failed a gate.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field

from .gates import Expectation, JobView, check_state, remove_tree
from .model import Model, materialise
from .recorder import Op, record
from .workloads import WORKLOADS, Call, Workload, expectation_at, prepared


@dataclass
class Recorded:
    """A recorded workload: the op log plus what the expectations need."""

    workload: str
    model: Model
    calls: list[Call]
    initial: dict[str, JobView]
    payloads: dict[str, bytes]
    raw_events: int

    @property
    def ops(self) -> list[Op]:
        return self.model.ops

    def expectation(self, k: int) -> Expectation:
        """What recovery must produce after a crash at point ``k``."""
        return expectation_at(self.calls, self.initial, self.payloads, k)


def record_workload(
    wl: Workload, workdir: str, *, mutate: Callable[[], AbstractContextManager[object]] | None = None
) -> Recorded:
    """Set the workload up on a fresh queue in ``workdir`` and record its run."""
    root = os.path.join(workdir, "queue")
    with prepared(wl, root) as (d, ctx):
        initial: dict[str, JobView] = dict(d.states)
        with record(root) as (session, rec):
            d.session = session
            with mutate() if mutate is not None else contextlib.nullcontext():
                wl.run(d, ctx)
            d.session = None
    return Recorded(wl.name, Model(rec.pre, rec.ops), d.calls, initial, d.payloads, rec.raw_events)


@dataclass
class Result:
    workload: str
    ops: int
    syscalls: int
    crash_points: int
    trees: int  # distinct trees
    states: int  # distinct (tree, expectation) pairs checked
    failed: int
    seconds: float
    failures: list[dict[str, object]] = field(default_factory=list)  # the first few, in detail


def state_dir() -> str:
    """Crash states are materialised on tmpfs when there is one: thousands of
    small trees, each recovered with many fsyncs, would dominate the run on ext4."""
    for base in ("/dev/shm", None):
        if base is None or (os.path.isdir(base) and os.access(base, os.W_OK)):
            return tempfile.mkdtemp(prefix="steadq-crash-", dir=base)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Candidate:
    """One crash state either lane produced, as the checker needs it."""

    point: int  # crash point, in the lane's own log
    fingerprint: str  # equal trees, equal fingerprints
    describe: Callable[[], str]  # for failure reports
    write: Callable[[str], str]  # materialise under a fresh path; returns the queue root


def check_candidates(
    res: Result,
    candidates: Iterable[Candidate],
    expectation: Callable[[int], Expectation],
    *,
    max_states: int | None = None,
    keep: int = 5,
) -> Result:
    """Recover and gate every distinct (tree, expectation) pair; fill in ``res``."""
    t0 = time.monotonic()
    base = state_dir()
    seen: set[tuple[object, ...]] = set()
    trees: set[str] = set()
    expectations: dict[int, Expectation] = {}
    try:
        for st in candidates:
            if max_states is not None and res.states >= max_states:
                break
            expect = expectations.get(st.point)
            if expect is None:
                expect = expectations[st.point] = expectation(st.point)
            key = (st.fingerprint, expect.key())
            if key in seen:
                continue
            seen.add(key)
            trees.add(st.fingerprint)
            dest = os.path.join(base, f"s{res.states}")
            try:
                fails = check_state(st.write(dest), expect)
            except Exception as e:  # a crash of the checker is a failed state, not a lab crash
                fails = [f"checker raised {type(e).__name__}: {e}"]
            finally:
                if os.path.lexists(dest):
                    remove_tree(dest)
            res.states += 1
            if fails:
                res.failed += 1
                if len(res.failures) < keep:
                    res.failures.append({"state": st.describe(), "failures": fails[:10]})
    finally:
        remove_tree(base)
    res.trees = len(trees)
    res.seconds = round(time.monotonic() - t0, 2)
    return res


def check_recorded(rec: Recorded, *, max_states: int | None = None, keep: int = 5) -> Result:
    """Check every distinct crash state of a recording (up to ``max_states``)."""

    def write(image: object) -> Callable[[str], str]:
        def go(dest: str) -> str:
            materialise(image, dest)  # type: ignore[arg-type]
            return dest

        return go

    candidates = (
        Candidate(st.point, st.fingerprint, functools.partial(st.describe, rec.ops), write(st.image))
        for st in rec.model.all_states()
    )
    res = Result(rec.workload, len(rec.ops), rec.raw_events, len(rec.ops) + 1, 0, 0, 0, 0.0)
    return check_candidates(res, candidates, rec.expectation, max_states=max_states, keep=keep)


def run_workload(
    wl: Workload,
    *,
    max_states: int | None = None,
    mutate: Callable[[], AbstractContextManager[object]] | None = None,
    exhaustive_bits: int | None = None,
    samples: int | None = None,
) -> Result:
    """Record ``wl`` in a private directory and check its crash states."""
    with tempfile.TemporaryDirectory(prefix=f"steadq-crash-{wl.name}-") as workdir:
        rec = record_workload(wl, workdir, mutate=mutate)
    if exhaustive_bits is not None:
        rec.model.exhaustive_bits = exhaustive_bits
    if samples is not None:
        rec.model.samples = samples
    return check_recorded(rec, max_states=max_states)


def format_table(results: list[Result], *, syscalls: str = "syscalls") -> str:
    head = (
        f"{'workload':<16} {'ops':>5} {syscalls:>8} {'points':>6} {'trees':>6} {'states':>7} {'failed':>6} {'secs':>7}"
    )
    lines = [head]
    for r in results:
        lines.append(
            f"{r.workload:<16} {r.ops:>5} {r.syscalls:>8} {r.crash_points:>6} {r.trees:>6} {r.states:>7}"
            f" {r.failed:>6} {r.seconds:>7}"
        )
    lines.append(
        f"{'total':<16} {sum(r.ops for r in results):>5} {sum(r.syscalls for r in results):>8}"
        f" {sum(r.crash_points for r in results):>6} {sum(r.trees for r in results):>6}"
        f" {sum(r.states for r in results):>7} {sum(r.failed for r in results):>6}"
        f" {round(sum(r.seconds for r in results), 2):>7}"
    )
    return "\n".join(lines)


def format_report(r: Result, *, syscalls: str = "syscalls") -> str:
    """One workload's table row and its kept failures in full (for assertion messages)."""
    lines = [format_table([r], syscalls=syscalls)]
    for f in r.failures:
        lines.append(str(f["state"]))
        lines.extend(f"    {m}" for m in f["failures"])  # type: ignore[attr-defined]
    return "\n".join(lines)


def progress(r: Result) -> None:
    print(f"{r.workload}: {r.states} states, {r.failed} failed, {r.seconds}s", file=sys.stderr, flush=True)


def finish(results: list[Result], json_path: str | None, *, syscalls: str = "syscalls") -> int:
    """Print the table and the first failures, write the JSON; the exit status."""
    print(format_table(results, syscalls=syscalls))
    for line in list(iter_failures(results))[:60]:
        print(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=2)
    return 1 if any(r.failed for r in results) else 0


def iter_failures(results: list[Result]) -> Iterator[str]:
    for r in results:
        for f in r.failures:
            yield f"[{r.workload}] {f['state']}"
            for msg in f["failures"]:  # type: ignore[attr-defined]
                yield f"    {msg}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="record workloads and check their crash states")
    run.add_argument("--workload", action="append", choices=sorted(WORKLOADS), help="repeatable; default: all")
    run.add_argument("--max-states", type=int, default=None, help="per workload")
    run.add_argument("--exhaustive-bits", type=int, default=None, help="enumerate all subsets up to 2^B (default 6)")
    run.add_argument("--samples", type=int, default=None, help="random subsets beyond that (default 24)")
    run.add_argument("--repeat", type=int, default=1, help="record each workload N times (new job ids, new shards)")
    run.add_argument("--json", default=None, help="write the results here")
    sub.add_parser("oracle", help="lane 2: the same workloads on a journaling FUSE file system", add_help=False)
    sub.add_parser("powercut", help="lane 2: power cuts under steadqd run on that file system", add_help=False)
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["oracle"]:
        from .oracle import main as oracle_main

        return oracle_main(argv[1:])
    if argv[:1] == ["powercut"]:
        from .powercut import main as powercut_main

        return powercut_main(argv[1:])
    args = ap.parse_args(argv)
    results = []
    for rep in range(args.repeat):
        for name in args.workload or list(WORKLOADS):
            r = run_workload(
                WORKLOADS[name], max_states=args.max_states, exhaustive_bits=args.exhaustive_bits, samples=args.samples
            )
            if args.repeat > 1:
                r.workload = f"{name}#{rep + 1}"
            results.append(r)
            progress(r)
    return finish(results, args.json)
