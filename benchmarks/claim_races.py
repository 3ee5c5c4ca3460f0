"""What a lost claim race costs: several consumer handles on one queue, this tree against another (issue 35).

``python -m benchmarks.claim_races --code OTHER_TREE [--handles 4] [--backlog 400] [--rounds 150]
[--instructions]``

One interpreter per side opens a fresh queue on ``/dev/shm`` (scratch:
``allow_unsupported_fs``), enqueues a backlog, then per round enqueues one job
per consumer handle and lets each handle lease once, then acks. The handles
keep candidate names from their last chunk of a shard, so they race for the
same names the way ``steadq bench`` 4+4's consumers do, but deterministically
enough to count. Reported per acked job: the ``openat`` calls that failed with
ENOENT (lost races) and the job names the claim parsed (1.0 when a lost race
costs no parse). ``--instructions`` instead counts user-space instructions per
acked job under callgrind: the run with consumers less the same run without
them, so start-up and enqueues cancel out.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from benchmarks.lifecycle_cpu import _HERE, check_imported

_CHILD = r"""
import errno, json, sys
import steadqd
from steadqd import Queue
from steadqd.fs import claim, linux
path, handles, backlog, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mode = sys.argv[5]  # "trace": count; "consume"/"fill": for callgrind
print("steadqd from", steadqd.__file__, file=sys.stderr)
Queue.init(path, allow_unsupported_fs=True).close()
prod = Queue.open(path, allow_unsupported_fs=True)
cons = [Queue.open(path, allow_unsupported_fs=True) for _ in range(handles)]
for _ in range(backlog):
    prod.enqueue(b"x" * 100)
parses, real_parse = [0], claim.parse_name
def counting_parse(state, name):
    parses[0] += 1
    return real_parse(state, name)
acked = 0
def step():
    global acked
    for _ in range(handles):
        prod.enqueue(b"x" * 100)
    if mode == "fill":
        return
    leases = [(q, lease) for q in cons if (lease := q.lease(wait=0)) is not None]
    for q, lease in leases:
        lease.payload()
        q.ack(lease)
        acked += 1
if mode == "trace":
    claim.parse_name = counting_parse
    with linux.trace() as events:
        for _ in range(rounds):
            step()
    lost = sum(1 for e in events if e.op == "open" and e.failed == errno.ENOENT)
    print(json.dumps({"acked": acked, "lost_races": lost / acked, "parses": parses[0] / acked}))
else:
    for _ in range(rounds):
        step()
"""


def child(code: str, a: argparse.Namespace, mode: str, *, callgrind: bool) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        cmd = [sys.executable, "-c", _CHILD, os.path.join(d, "q"), str(a.handles), str(a.backlog), str(a.rounds), mode]
        if callgrind:
            cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
        env = {**os.environ, "PYTHONPATH": code, "PYTHONHASHSEED": "0"}
        done = subprocess.run(cmd, env=env, cwd=d, capture_output=True, text=True, check=True, timeout=3600)
    check_imported(done.stderr.split("steadqd from ", 1)[1].split("\n", 1)[0], code)
    return done


def instructions(code: str, a: argparse.Namespace) -> int:
    """User-space instructions per acked job: the run with consumers less the run without."""

    def count(mode: str) -> int:
        return int(child(code, a, mode, callgrind=True).stderr.rsplit("Collected : ", 1)[1].split()[0])

    return (count("consume") - count("fill")) // (a.handles * a.rounds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", required=True, help="the other tree (a worktree of the commit to compare with)")
    ap.add_argument("--handles", type=int, default=4)
    ap.add_argument("--backlog", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--repeat", type=int, default=2, help="runs per side, alternating")
    ap.add_argument("--instructions", action="store_true", help="callgrind instructions per acked job")
    a = ap.parse_args(argv)
    for _ in range(a.repeat):
        for side, code in (("old", a.code), ("new", _HERE)):
            if a.instructions:
                print(f"{side} ({code}): {instructions(code, a):,} instructions per acked job", flush=True)
            else:
                print(f"{side} ({code}): {child(code, a, 'trace', callgrind=False).stdout.strip()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
