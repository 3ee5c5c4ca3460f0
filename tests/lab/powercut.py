"""Crash lane 2 for the deployed processes: a power cut under ``steadqd run``.

Lane 3 kills the real daemons, but a SIGKILL loses nothing the kernel already
has. Here the same rig (:class:`tests.lab.killrig.Rig`: two producer
processes, ``steadqd run`` with its worker spawner, sweeper and promoter, a
shell job command) runs on a LazyFS mount, to completion. Afterwards the
journal of everything the kernel did on the queue's behalf — from five or more
processes, none of them instrumented — is cut at sampled points and turned
into crash states by :mod:`tests.lab.lazystates`, each recovered and checked
with the crash lab's gates:

* an enqueue is committed once its producer's mark is in the journal (the
  producer looks up ``.lazyfs-mark:enq:<job>`` on the mount after
  ``enqueue`` returned): from that point on the job must survive, unquarantined;
* a receipt or dead entry that is durable at a point (present in that point's
  strict state, where nothing undurable persisted) stays that at every later
  point: no acknowledged job is ever active again;
* at the end of the run (the daemon stopped cleanly), every job is terminal
  in the strict state: a power cut after a clean shutdown loses nothing;
* and everything else the gates check (no duplicate, no phantom, no corrupt
  delivery, fsck clean, the queue works).

Command line::

    .venv/bin/python -m tests.lab powercut [--jobs N] [--points P] [--seed S] [--concurrency C]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from steadqd.constants import State

from .gates import Expectation, JobState
from .killrig import Rig, make_payload
from .lab import Candidate, Result, check_candidates, format_report
from .lazyfs import mounted
from .lazystates import Entry, crash_states, dir_paths
from .oracle import journal_candidate

_JOB = re.compile(r"[0-9a-f]{32}")
_ANY: frozenset[JobState] = frozenset({State.READY, State.DELAYED, State.RECEIPT, State.DEAD})


@dataclass
class Powercut:
    """What one power-cut run checked."""

    jobs: int  # enqueued by the producers
    journal: int  # journal entries of the run
    marks: int
    result: Result

    def line(self) -> str:
        r = self.result
        return (
            f"lazyfs power cut: {self.jobs} jobs, journal {self.journal} ops, {self.marks} commit marks,"
            f" {r.crash_points} crash points sampled, {r.trees} trees, {r.states} states, {r.failed} failed,"
            f" {r.seconds:.1f}s"
        )


def _terminal(image: tuple[Entry, ...]) -> dict[str, State]:
    """Jobs that are receipts or dead entries in a crash image (paths under queue/)."""
    out: dict[str, State] = {}
    for e in image:
        parts = e.path.split("/")
        if e.is_dir or len(parts) < 3 or parts[0] != "queue":
            continue
        job = parts[-1][:32]
        if parts[1] == "receipts" and _JOB.fullmatch(job):
            out[job] = State.RECEIPT
        elif parts[1] == "dead" and _JOB.fullmatch(job):
            out[job] = State.DEAD
    return out


def powercut_lane(*, jobs: int, points: int, seed: int, concurrency: int = 4, samples: int = 4) -> Powercut:
    """Run the rig on LazyFS with 2 producers x ``jobs``; check ``points`` sampled crash points."""
    mnt = tempfile.mkdtemp(prefix="steadq-powercut-mnt-")
    work = tempfile.mkdtemp(prefix="steadq-powercut-", dir="/tmp")
    t0 = time.monotonic()
    try:
        with mounted(mnt) as fs:
            rig = Rig(mnt, work, fs="lazyfs", producers=2, concurrency=concurrency, seed=seed, lazyfs=True)
            try:
                base = fs.index()  # the queue's init counts as synced
                rig.run(str(jobs), rounds=0)
                rig.settle()
                end = fs.index()
                journal, marks = list(fs.journal[:end]), [(i, t) for i, t in fs.marks if i <= end]
                serials = {}
                for i in range(rig.nprod):
                    for line in rig.journal(i).read_text().splitlines():
                        if line.startswith("C "):
                            _, serial, job = line.split()
                            serials[job] = int(serial)
                rig.check()  # the live tree after the run (lane 3's gates), before any power cut
            finally:
                rig.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.rmdir(mnt)

    committed_at = {t[len("enq:") :]: i for i, t in marks if t.startswith("enq:")}
    if set(committed_at) != set(serials):
        raise AssertionError(f"marks and producer journals disagree: {set(committed_at) ^ set(serials)}")
    payloads = {job: make_payload(s) for job, s in serials.items()}
    rng = random.Random(seed)
    span = range(base, end + 1)
    chosen = set(rng.sample(span, min(points, len(span)))) | {end}
    # Terminal states made durable so far, from each point's strict state (the
    # first one crash_states yields per point), carried forward.
    durable_terminal: dict[str, State] = {}
    per_point: dict[int, dict[str, State]] = {}
    paths = dir_paths(journal)

    def candidates() -> Iterator[Candidate]:
        last = -1
        for st in crash_states(journal, base, samples=samples, seed=seed, points=chosen):
            if st.point != last:
                last = st.point
                for job, state in _terminal(st.image).items():
                    durable_terminal.setdefault(job, state)
                per_point[st.point] = dict(durable_terminal)
            yield journal_candidate(st, journal, paths)

    def expectation(k: int) -> Expectation:
        terminal = per_point[k]
        allowed: dict[str, frozenset[JobState]] = {}
        for job in serials:
            if job in terminal:
                allowed[job] = frozenset({terminal[job]})
            elif k == end:
                allowed[job] = frozenset({State.RECEIPT, State.DEAD})  # clean shutdown: all durable
            elif committed_at[job] <= k:
                allowed[job] = _ANY
            else:
                allowed[job] = _ANY | {None}
        committed = {job for job, i in committed_at.items() if i <= k}
        return Expectation(allowed, committed, payloads)

    res = Result("powercut", len(journal) - base, sum(fs.requests.values()), len(chosen), 0, 0, 0, 0.0)
    check_candidates(res, candidates(), expectation, keep=5)
    res.seconds = round(time.monotonic() - t0, 2)
    return Powercut(len(serials), len(journal) - base, len(committed_at), res)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.lab powercut", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=40, help="jobs per producer (2 producers)")
    ap.add_argument("--points", type=int, default=400, help="crash points sampled from the journal")
    ap.add_argument("--samples", type=int, default=4, help="random subsets of undurable changes per point")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seed", type=int, default=None)
    ns = ap.parse_args(argv)
    seed = ns.seed if ns.seed is not None else random.randrange(1 << 30)
    rep = powercut_lane(jobs=ns.jobs, points=ns.points, seed=seed, concurrency=ns.concurrency, samples=ns.samples)
    print(rep.line(), f"seed {seed}")
    if rep.result.failed:
        print(format_report(rep.result, syscalls="requests"))
    return 1 if rep.result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
