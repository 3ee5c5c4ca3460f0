"""What one job spawn costs the worker: the compiled spawn, ``steadq-exec`` (vfork) and ``preexec_fn`` (fork).

``python -m benchmarks.spawn_cost [--rounds N] [--per-round K] [--command PATH]``

Paired in one process with the daemon's imports loaded (so the fork copies a
worker-sized address space): each round spawns K commands through one path,
then K through the other, alternating which goes first, and reports per spawn
the wall time until the command has exited and been reaped, the worker's own
CPU and the children's CPU (``RUSAGE_CHILDREN``), as medians over rounds, and
the median of the per-round wall ratios. Both paths give the command the same
parent-death signal and session; only how the worker forks differs. The compiled spawn
(steadqd.daemon.worker.run.fastspawn: one vfork, one exec) is measured too when it is built.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import steadqd.daemon.worker.role  # noqa: F401 - the worker's imports make the fork's page tables worker-sized
from steadqd.daemon.worker.run import exec_helper, fastspawn
from steadqd.daemon.worker.run.guard import die_with_parent

Spawn = Callable[[list[str]], subprocess.Popen[bytes]]
_KW: dict[str, Any] = dict(
    stdin=subprocess.DEVNULL,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    env={"PATH": "/usr/bin:/bin"},
    start_new_session=True,
    close_fds=True,
)


def via_helper(argv: list[str]) -> subprocess.Popen[bytes]:
    return exec_helper.popen(argv, **_KW)


class _Communicating:
    """A fastspawn child with the ``communicate()`` :func:`block` uses (``true`` writes nothing)."""

    def __init__(self, p: fastspawn.Spawned) -> None:
        self.p = p

    def communicate(self) -> None:
        for pipe in (self.p.stdout, self.p.stderr):
            if pipe is not None:
                pipe.read()
                pipe.close()
        self.p.wait()


def via_compiled(argv: list[str]) -> Any:
    return _Communicating(fastspawn.spawn(argv, env=_KW["env"], cwd=None, stdin_fd=None, credentials={}))


def via_preexec(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, preexec_fn=die_with_parent(), **_KW)


def block(spawn: Spawn, argv: list[str], n: int) -> tuple[float, float, float]:
    """Seconds of wall, own CPU and children's CPU per spawn, over n spawn-and-reap cycles."""
    me0, ch0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    for _ in range(n):
        p = spawn(argv)
        p.communicate()
    wall = time.perf_counter() - t0
    me1, ch1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    own = me1.ru_utime + me1.ru_stime - me0.ru_utime - me0.ru_stime
    kids = ch1.ru_utime + ch1.ru_stime - ch0.ru_utime - ch0.ru_stime
    return wall / n, own / n, kids / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=50)
    ap.add_argument("--command", default="/bin/true")
    args = ap.parse_args(argv)
    if not exec_helper.available():
        print(f"spawn_cost: {exec_helper.HELPER} is not built (./dev.sh setup builds it)", file=sys.stderr)
        return 2
    paths: dict[str, Spawn] = {"preexec_fn (fork)": via_preexec, "steadq-exec (vfork)": via_helper}
    if fastspawn.available():
        paths["compiled (vfork, 1 exec)"] = via_compiled
    rows: dict[str, list[tuple[float, float, float]]] = {k: [] for k in paths}
    ratios = []
    for i in range(args.rounds):
        names = list(paths)
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            rows[name].append(block(paths[name], [args.command], args.per_round))
        ratios.append(rows["preexec_fn (fork)"][-1][0] / rows["steadq-exec (vfork)"][-1][0])
    load = os.getloadavg()[0]
    print(f"{args.rounds} rounds x {args.per_round} spawns of {args.command}, load average {load:.1f}")
    print(f"{'path':<26} {'spawns/s':>9} {'wall ms':>8} {'worker CPU ms':>14} {'child CPU ms':>13}")
    for name, got in rows.items():
        wall, own, kids = (statistics.median(x[j] for x in got) for j in range(3))
        print(f"{name:<26} {1 / wall:>9.0f} {wall * 1e3:>8.2f} {own * 1e3:>14.2f} {kids * 1e3:>13.2f}")
    print(f"median per-round speed-up (wall, fork / vfork): {statistics.median(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
