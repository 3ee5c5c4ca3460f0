"""User CPU per strict lifecycle, this tree against another commit's, paired (issue 20, point 3).

``python -m benchmarks.lifecycle_cpu --code OLD_TREE [--rounds N] [--jobs K] [--dir DIR]``

Each round runs two fresh interpreters one after the other, in alternating
order: one with ``PYTHONPATH=OLD_TREE`` (``git worktree add /tmp/wt-old
COMMIT``), one with this checkout. Each opens a strict queue in ``DIR``,
warms up, then runs K lifecycles (enqueue 100 B, lease, ``payload()``, ack)
and reports its own ``getrusage`` user and system CPU per job. ``DIR``
defaults to ``/dev/shm``, where fsync costs nothing, so the figure is the
Python's CPU and not the disk's; the queue is opened with
``allow_unsupported_fs`` for that reason only. Reported: the medians per side
and the median of the per-round ratios new/old.

``--instructions`` counts instead what the load of a shared machine cannot
move: the user-space instructions per lifecycle under valgrind's callgrind
(``valgrind`` must be installed; about 25x slower), each side run at K/5
and K lifecycles so that start-up cancels out. The count still moves by a
few per cent between runs of one tree (random job ids and tokens, address
layout; ``PYTHONHASHSEED`` is fixed for it), so ``--repeat R`` runs each
side R times, alternating, and reports the medians.

``--ccore`` compares instead a scratch copy of this tree with the C
envelope check of issue 35's prototype (b) hooked in and built
(``benchmarks/ccore``: a C compiler, cffi and OpenSSL's headers) with
itself under ``STEADQ_PURE_PYTHON=1``; each child must have loaded (or not)
exactly that extension. Nothing of it is in the checkout's ``steadqd``;
the copy is removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path

# ``jobs`` strict lifecycles after ``warm`` ones, on a fresh queue at ``path`` (``allow_unsupported_fs``
# when ``unsupported`` is "1": /dev/shm, where fsync is free), with wall time, user and system CPU,
# and the file of every steadqd module imported.
_CHILD = r"""
import json, resource, sys, time
import steadqd
from steadqd import Queue
path, jobs, warm, unsupported = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
Queue.init(path, allow_unsupported_fs=unsupported).close()
q = Queue.open(path, allow_unsupported_fs=unsupported)
def life():
    q.enqueue(b"x" * 100)
    lease = q.lease(wait=0)
    lease.payload()
    q.ack(lease)
for _ in range(warm):
    life()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(jobs):
    life()
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"jobs_per_s": jobs / (t1 - t0), "user_us": (r1.ru_utime - r0.ru_utime) / jobs * 1e6,
                  "sys_us": (r1.ru_stime - r0.ru_stime) / jobs * 1e6, "code": steadqd.__file__,
                  "modules": {k: getattr(m, "__file__", None) for k, m in sys.modules.items() if k.startswith("steadqd")}}))
"""

_HERE = str(Path(__file__).resolve().parent.parent)


def one(
    code: str,
    base: str,
    jobs: int,
    *,
    compiled: Collection[str] | None = None,
    warm: int = 200,
    unsupported: bool = True,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    """Jobs/s, user and system CPU per lifecycle of ``code``'s steadqd in a fresh queue under ``base``
    (see :func:`check_extensions` for ``compiled``); ``unsupported``: open it with
    ``allow_unsupported_fs`` (the default's /dev/shm), never on a real disk."""
    with tempfile.TemporaryDirectory(dir=base) as d:
        env = {**os.environ, **(env or {}), "PYTHONPATH": code}
        # cwd: ``python -c`` puts the current directory before PYTHONPATH, and run
        # from the checkout every side would import the checkout's steadqd.
        r = subprocess.run(
            [sys.executable, "-c", _CHILD, os.path.join(d, "q"), str(jobs), str(warm), "1" if unsupported else "0"],
            env=env,
            cwd=d,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
    if r.returncode != 0:
        raise SystemExit(f"the lifecycle child of {code} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    got = json.loads(r.stdout)
    check_imported(got.pop("code"), code)
    modules = got.pop("modules")
    if compiled is not None:
        check_extensions(modules, compiled)
    return {k: float(v) for k, v in got.items()}


def check_imported(imported: str, code: str) -> None:
    """A comparison of one tree with itself would report a ratio of 1 and look like a measurement."""
    if not os.path.realpath(imported).startswith(os.path.realpath(code) + os.sep):
        raise SystemExit(f"the side meant to run {code} imported steadqd from {imported}")


def check_extensions(modules: dict[str, str | None], compiled: Collection[str]) -> None:
    """Stop unless exactly the ``steadqd.fs`` modules named in ``compiled`` were loaded from ``.so`` files.

    ``modules``: name -> ``__file__`` of every steadqd module a child imported. A compiled side that
    fell back to a module's source, or a pure side that loaded an extension, would measure the wrong thing.
    """
    want = {f"steadqd.fs.{m}" for m in compiled}
    missing = sorted(want - set(modules))
    if missing:
        raise SystemExit(f"modules meant to be compiled were never imported: {', '.join(missing)}")
    # mypyc's support library of a one-module group, ``<module>__mypyc``, is part of that module.
    so = {k for k, f in modules.items() if f is not None and f.endswith(".so") and not k.endswith("__mypyc")}
    if so != want:
        raise SystemExit(f"extension modules loaded {sorted(so)}, expected {sorted(want)}")


_LIFE_ONLY = r"""
import json, sys
import steadqd
from steadqd import Queue
print("steadqd from", steadqd.__file__, file=sys.stderr)
path, jobs = sys.argv[1], int(sys.argv[2])
Queue.init(path, allow_unsupported_fs=True).close()
q = Queue.open(path, allow_unsupported_fs=True)
for _ in range(jobs):
    q.enqueue(b"x" * 100)
    lease = q.lease(wait=0)
    lease.payload()
    q.ack(lease)
print("steadqd modules", json.dumps({k: getattr(m, "__file__", None) for k, m in sys.modules.items()
                                     if k.startswith("steadqd")}), file=sys.stderr)
"""


def instructions(
    code: str, base: str, jobs: int, *, compiled: Collection[str] | None = None, env: dict[str, str] | None = None
) -> int:
    """User-space instructions of ``jobs`` lifecycles, less a run of a fifth as many (``env``: added to the child's)."""

    def run(n: int) -> int:
        with tempfile.TemporaryDirectory(dir=base) as d:
            err = subprocess.run(
                ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", _LIFE_ONLY,
                 os.path.join(d, "q"), str(n)],
                env={**os.environ, **(env or {}), "PYTHONPATH": code, "PYTHONHASHSEED": "0"}, cwd=d, capture_output=True, text=True,
                check=True, timeout=3600,
            ).stderr  # fmt: skip
        check_imported(err.split("steadqd from ", 1)[1].split("\n", 1)[0], code)
        if compiled is not None:
            check_extensions(json.loads(err.split("steadqd modules ", 1)[1].split("\n", 1)[0]), compiled)
        return int(err.rsplit("Collected : ", 1)[1].split()[0])

    few = max(1, jobs // 5)
    return (run(jobs) - run(few)) // (jobs - few)


@contextlib.contextmanager
def ccore_tree() -> Iterator[str]:
    """A scratch copy of this tree with prototype (b) hooked in and built (``benchmarks.ccore``), for the duration."""
    from benchmarks import ccore  # its build needs cffi, which the other comparisons do not

    with tempfile.TemporaryDirectory(prefix="steadq-ccore-") as d:
        yield ccore.make_tree(os.path.join(d, "tree"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", help="the other tree (a worktree of the commit to compare with)")
    ap.add_argument("--ccore", action="store_true", help="C envelope core against STEADQ_PURE_PYTHON=1, a scratch copy")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead")
    ap.add_argument("--repeat", type=int, default=1, help="with --instructions: runs per side (medians reported)")
    a = ap.parse_args(argv)
    if a.ccore == bool(a.code):
        ap.error("give --code OLD_TREE or --ccore")
    if not a.ccore:
        return _compare(a, {"old": a.code, "new": _HERE})
    with ccore_tree() as tree:
        return _compare(a, {"old": tree, "new": tree})


def _compare(a: argparse.Namespace, sides: dict[str, str]) -> int:
    # --ccore: which extensions each side must load, and its environment
    compiled: dict[str, Collection[str] | None] = {"old": None, "new": None}
    envs: dict[str, dict[str, str]] = {"old": {}, "new": {}}
    labels = dict(sides)
    if a.ccore:
        labels = {"old": "STEADQ_PURE_PYTHON=1", "new": "compiled core"}
        compiled = {"old": (), "new": ("_core",)}
        envs = {"old": {"STEADQ_PURE_PYTHON": "1"}, "new": {"STEADQ_PURE_PYTHON": "0"}}
    if a.instructions:
        runs: dict[str, list[int]] = {"old": [], "new": []}
        for _ in range(a.repeat):
            for side in ("old", "new"):
                runs[side].append(instructions(sides[side], a.dir, a.jobs, compiled=compiled[side], env=envs[side]))
        counts = {side: int(statistics.median(runs[side])) for side in ("old", "new")}
        for side in ("old", "new"):
            each = ", ".join(f"{c:,}" for c in runs[side])
            print(f"{side} ({labels[side]}): {counts[side]:,} user-space instructions per strict lifecycle ({each})")
        print(f"ratio new/old: {counts['new'] / counts['old']:.3f}")
        return 0
    got: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(a.rounds):
        for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
            got[side].append(one(sides[side], a.dir, a.jobs, compiled=compiled[side], env=envs[side]))
    ratios = [n["user_us"] / o["user_us"] for n, o in zip(got["new"], got["old"], strict=True)]
    print(f"{a.rounds} rounds x {a.jobs} strict lifecycles in {a.dir}, load average {os.getloadavg()[0]:.1f}")
    for side in ("old", "new"):
        user = statistics.median(x["user_us"] for x in got[side])
        sys_ = statistics.median(x["sys_us"] for x in got[side])
        print(f"{side} ({labels[side]}): user {user:.0f} us/job, system {sys_:.0f} us/job")
    print(f"median per-round ratio of user CPU new/old: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
