"""Crash lane 2, the oracle: crash states produced below the VFS, not by steadqd.

Each workload of lane 1 runs on a :class:`tests.crash.lazyfs.LazyFS` mount.
The file system journals every change the kernel made (named and ``O_TMPFILE``
creates, links, renames, unlinks, writes, chmods, fsyncs), whatever code made
it; :mod:`tests.crash.lazystates` turns the journal into crash states under its
own persistence model; each state is materialised and checked with the same
gates as lane 1 (:mod:`tests.crash.gates`). Commit marks index the journal: a
call is committed at every crash point at or after the journal length when
it returned.

Command line (docs/crash-lab.md)::

    .venv/bin/python -m tests.crash.lab oracle [--workload NAME ...] [--max-states N] [--samples S] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass

from .gates import JobView, check_state, remove_tree
from .lab import Result, format_table, iter_failures, state_dir
from .lazyfs import JournalOp, mounted
from .lazystates import crash_states, dir_paths, materialise
from .workloads import WORKLOADS, Call, Workload, expectation_at, prepared


@dataclass
class Journaled:
    """A workload run on LazyFS: the journal, where the recorded run began, and the commit marks."""

    workload: str
    journal: list[JournalOp]
    base: int
    calls: list[Call]
    initial: dict[str, JobView]
    payloads: dict[str, bytes]
    requests: int  # FUSE requests served during the whole run


def record_on_lazyfs(
    wl: Workload, mountpoint: str, *, mutate: Callable[[], AbstractContextManager[object]] | None = None
) -> Journaled:
    """Set ``wl`` up and run it on a fresh LazyFS mounted at ``mountpoint``."""
    with mounted(mountpoint) as fs:
        root = os.path.join(mountpoint, "queue")
        with prepared(wl, root) as (d, ctx):
            initial = dict(d.states)
            base = fs.index()
            d.session = fs
            with mutate() if mutate is not None else contextlib.nullcontext():
                wl.run(d, ctx)
            d.session = None
        journal = list(fs.journal)
        requests = sum(fs.requests.values())
    return Journaled(wl.name, journal, base, d.calls, initial, d.payloads, requests)


def check_journaled(rec: Journaled, *, max_states: int | None = None, samples: int = 8, keep: int = 5) -> Result:
    """Check every distinct crash state of a journaled run (up to ``max_states``)."""
    t0 = time.monotonic()
    base = state_dir()
    points = len(rec.journal) - rec.base + 1
    res = Result(rec.workload, len(rec.journal) - rec.base, rec.requests, points, 0, 0, 0, 0.0)
    paths = dir_paths(rec.journal)
    trees: set[str] = set()
    seen: set[tuple[object, ...]] = set()
    try:
        for st in crash_states(rec.journal, rec.base, samples=samples):
            if max_states is not None and res.states >= max_states:
                break
            expect = expectation_at(rec.calls, rec.initial, rec.payloads, st.point)
            key = (st.fingerprint, expect.key())
            if key in seen:
                continue
            seen.add(key)
            trees.add(st.fingerprint)
            dest = os.path.join(base, f"s{res.states}")
            os.mkdir(dest)
            materialise(st.image, dest)
            try:
                fails = check_state(os.path.join(dest, "queue"), expect)
            except Exception as e:  # a crash of the checker is a failed state, not a lab crash
                fails = [f"checker raised {type(e).__name__}: {e}"]
            finally:
                remove_tree(dest)
            res.states += 1
            if fails:
                res.failed += 1
                if len(res.failures) < keep:
                    res.failures.append({"state": st.describe(rec.journal, paths), "failures": fails[:10]})
    finally:
        remove_tree(base)
    res.trees = len(trees)
    res.seconds = round(time.monotonic() - t0, 2)
    return res


def run_oracle(
    wl: Workload,
    *,
    max_states: int | None = None,
    samples: int = 8,
    mutate: Callable[[], AbstractContextManager[object]] | None = None,
) -> Result:
    """Run ``wl`` on a private LazyFS mount and check its crash states."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"steadq-oracle-{wl.name}-") as mnt:
        rec = record_on_lazyfs(wl, mnt, mutate=mutate)
    res = check_journaled(rec, max_states=max_states, samples=samples)
    res.seconds = round(time.monotonic() - t0, 2)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.crash.lab oracle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS), help="repeatable; default: all")
    ap.add_argument("--max-states", type=int, default=None, help="per workload")
    ap.add_argument("--samples", type=int, default=8, help="random subsets of undurable changes per crash point")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    results = []
    for name in args.workload or list(WORKLOADS):
        r = run_oracle(WORKLOADS[name], max_states=args.max_states, samples=args.samples)
        results.append(r)
        print(f"{r.workload}: {r.states} states, {r.failed} failed, {r.seconds}s", file=sys.stderr, flush=True)
    print(format_table(results, syscalls="requests"))
    for line in list(iter_failures(results))[:60]:
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=2)
    return 1 if any(r.failed for r in results) else 0
