"""Crash lane 2, the oracle: crash states produced below the VFS, not by steadqd.

Each workload of lane 1 runs on a :class:`tests.lab.lazyfs.LazyFS` mount.
The file system journals every change the kernel made (named and ``O_TMPFILE``
creates, links, renames, unlinks, writes, chmods, fsyncs), whatever code made
it; :mod:`tests.lab.lazystates` turns the journal into crash states under its
own persistence model; each state is materialised and checked with the same
gates as lane 1 (:mod:`tests.lab.gates`). Commit marks index the journal: a
call is committed at every crash point at or after the journal length when
it returned.

Command line (docs/crash-lab.md)::

    .venv/bin/python -m tests.lab oracle [--workload NAME ...] [--max-states N] [--samples S] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from .gates import Expectation, JobView
from .lab import Candidate, Result, check_candidates, finish, progress
from .lazyfs import JournalOp, mounted
from .lazystates import CrashState, crash_states, dir_paths, materialise
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


def journal_candidate(st: CrashState, journal: list[JournalOp], paths: dict[int, str]) -> Candidate:
    """A LazyFS crash state as the shared checker takes it (the queue lives at <mount>/queue)."""

    def write(dest: str) -> str:
        os.mkdir(dest)
        materialise(st.image, dest)
        return os.path.join(dest, "queue")

    return Candidate(st.point, st.fingerprint, lambda: st.describe(journal, paths), write)


def check_journaled(rec: Journaled, *, max_states: int | None = None, samples: int = 8, keep: int = 5) -> Result:
    """Check every distinct crash state of a journaled run (up to ``max_states``)."""
    paths = dir_paths(rec.journal)

    def expectation(k: int) -> Expectation:
        return expectation_at(rec.calls, rec.initial, rec.payloads, k)

    ops = len(rec.journal) - rec.base
    res = Result(rec.workload, ops, rec.requests, ops + 1, 0, 0, 0, 0.0)
    states = (journal_candidate(st, rec.journal, paths) for st in crash_states(rec.journal, rec.base, samples=samples))
    return check_candidates(res, states, expectation, max_states=max_states, keep=keep)


def run_oracle(
    wl: Workload,
    *,
    max_states: int | None = None,
    samples: int = 8,
    mutate: Callable[[], AbstractContextManager[object]] | None = None,
    keep: int = 5,
) -> Result:
    """Run ``wl`` on a private LazyFS mount and check its crash states."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"steadq-oracle-{wl.name}-") as mnt:
        rec = record_on_lazyfs(wl, mnt, mutate=mutate)
    res = check_journaled(rec, max_states=max_states, samples=samples, keep=keep)
    res.seconds = round(time.monotonic() - t0, 2)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.lab oracle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS), help="repeatable; default: all")
    ap.add_argument("--max-states", type=int, default=None, help="per workload")
    ap.add_argument("--samples", type=int, default=8, help="random subsets of undurable changes per crash point")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    results = []
    for name in args.workload or list(WORKLOADS):
        r = run_oracle(WORKLOADS[name], max_states=args.max_states, samples=args.samples)
        results.append(r)
        progress(r)
    return finish(results, args.json, syscalls="requests")
