"""The strict lifecycle's hot modules compiled by mypyc, against the same tree in Python (issue 35, prototype a).

``python -m benchmarks.compiled [--modules names,claim,...] [--sections instructions,cpu,loop] [--keep DIR]``

Nothing of the product's build changes: the ``steadqd`` package is copied
twice into a scratch directory, ``pure/`` as it is and ``compiled/`` with the
chosen ``steadqd/fs/`` modules compiled in place by mypyc (``mypyc`` ships
with mypy; the ``.so`` files sit beside the ``.py`` ones, and an extension
module is found before a source file). Both copies are then measured with
``benchmarks/lifecycle_cpu.py``'s machinery, ``PYTHONPATH`` at each copy:

- ``instructions``: user-space instructions per strict lifecycle under
  callgrind (``valgrind`` must be installed), ``--repeat`` runs per side,
  alternating, medians;
- ``cpu``: user CPU per strict lifecycle on ``--dir`` (``/dev/shm``), paired
  rounds in alternating order, median of the per-round ratios;
- ``loop``: jobs/s of the strict lifecycle (enqueue 100 B, lease,
  ``payload()``, ack; every step durable) on a fresh journaled ext4 on a loop
  device (``benchmarks/loopdisk.py``, root; image in ``--loop-base``, which
  must be on the disk to measure), interleaved rounds, median of the
  per-round ratios.

Every measuring child reports the file of every ``steadqd`` module it
imported: the run stops if a side imported ``steadqd`` from elsewhere, if a
module meant to be compiled was not loaded from a ``.so``, or if the pure
side loaded any ``.so``.

Two classes of source are not compiled as they are written:

- modules mypyc cannot compile or whose point is lost compiled, never in
  ``--modules`` (``NOT_COMPILED`` says why);
- classes whose constructors fill ``self.__dict__`` directly (the frozen
  records built on every operation: a written-out ``__init__`` is cheaper in
  Python than the dataclass's ``object.__setattr__`` per field) or whose
  ``__dict__`` is read: a mypyc native class has no ``__dict__``, so in the
  compiled copy only, each is marked ``@mypyc_attr(native_class=False)``
  (``PYTHON_CLASSES``): an ordinary Python class whose methods are still
  compiled. The copy's source is otherwise byte for byte the checkout's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import lifecycle_cpu, loopdisk
from .common import REPO, copy_tree, log, signals_unwind

# The modules of a strict lifecycle with most of its Python (cProfile own time, docs/performance.md
# "Where the time goes"), all in steadqd/fs/. ``linux`` is the syscall layer: compiled, its callers'
# calls into it become native calls (see docs/performance.md for what the syscall hook still sees).
DEFAULT_MODULES = (
    "names",
    "claim",
    "verify",
    "lease",
    "publish",
    "tree",
    "records",
    "settle",
    "watermark",
    "context",
    "guards",
    "scan_order",
    "clock",
)
NOT_COMPILED = {
    "libc": "cffi ABI mode: its work is the foreign calls, and its cdata objects are untyped for mypyc",
    "syscall_hook": "the tracing and fault-injection point: tests arm and trace through its module state",
    # mypyc 2.4's call of a native method with ``**kwargs`` into keyword-only parameters passes the dict as
    # the first of them: ``Queue.init`` -> ``cls.open(path, allow_unsupported_fs=..., **open_options)``
    # raises "bool object expected; got dict".
    "handle": "Queue.init forwards **open_options to Queue.open, which mypyc 2.4 compiles wrongly",
}
# Classes whose code uses their instance ``__dict__`` (module -> classes): Python classes in the compiled copy.
PYTHON_CLASSES: dict[str, tuple[str, ...]] = {
    "names": ("JobName",),
    "records": ("JobHeader",),
    "tree": ("Witness",),
    "verify": ("Envelope",),
}
_SETUP = """from setuptools import setup
from mypyc.build import mypycify
setup(name="steadqd_compiled_prototype", ext_modules=mypycify({args}, opt_level="3"))
"""
_MYPYC_ATTR_IMPORT = "from mypy_extensions import mypyc_attr  # benchmarks/compiled.py: Python classes below\n"

# A child for section ``hook``: what the crash lab's and the tests' ways of watching and changing the
# syscall layer still see. Each entry counts calls made by one warm lifecycle (or one step of it).
_HOOK_CHILD = r"""
import errno, json, sys, types
from steadqd import Queue
from steadqd.fs import linux, publish, tree
q = Queue.init(sys.argv[1], allow_unsupported_fs=True)
def life():
    q.enqueue(b"x" * 100)
    lease = q.lease(wait=0)
    lease.payload()
    q.ack(lease)
life()
out = {}
with linux.trace() as events:  # syscall_hook's list, the crash lab's recorder's way in
    life()
out["trace"] = [e.op for e in events]
q.enqueue(b"y")
try:
    with linux.inject(nth=1, errno=errno.EIO, op="rename_noreplace") as fault:
        q.lease(wait=0)
    out["inject"] = "no error"
except Exception as e:
    out["inject"] = f"{type(e).__name__}, fired={fault.fired}"
def counting(owner, attr, seen):
    real = getattr(owner, attr)
    def wrapper(*args, **kwargs):
        seen.append(attr)
        return real(*args, **kwargs)
    try:
        setattr(owner, attr, wrapper)
    except (TypeError, AttributeError) as e:
        return f"refused: {e}"
    return real
# A test's monkeypatch of the syscall layer's function (tests/integration: linux.boottime_ns & co).
seen = []
real = counting(linux, "rename_noreplace", seen)
life()
linux.rename_noreplace = real
out["linux.rename_noreplace swapped: calls seen in a lifecycle"] = len(seen)
# tests/lab/bugs.py: the Linux layer as seen by publish.py only, replaced by a proxy.
seen = []
proxy = types.SimpleNamespace(**{k: getattr(linux, k) for k in dir(linux) if not k.startswith("__")})
counting(proxy, "fsync", seen)
publish.linux = proxy
q.enqueue(b"z")
publish.linux = linux
out["publish.linux swapped for a proxy (tests/lab/bugs.py): fsyncs seen in an enqueue"] = len(seen)
# tests/lab/bugs.py: a method of Tree replaced (the barrier of an ack).
seen = []
real = counting(tree.Tree, "_barrier_pair", seen)
life()
if not isinstance(real, str):
    tree.Tree._barrier_pair = real
out["Tree._barrier_pair swapped (tests/lab/bugs.py): calls seen in a lifecycle"] = real if isinstance(real, str) else len(seen)
print(json.dumps(out))
"""


def hook(tree: str) -> dict[str, Any]:
    """What tracing, fault injection and the tests' swaps of the syscall layer see in ``tree`` (``_HOOK_CHILD``)."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        r = subprocess.run(
            [sys.executable, "-c", _HOOK_CHILD, os.path.join(d, "q")],
            env={**os.environ, "PYTHONPATH": tree}, cwd=d, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"the hook child of {tree} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    got: dict[str, Any] = json.loads(r.stdout)
    return got


def mark_python_classes(source: str, classes: Sequence[str]) -> str:
    """``source`` with ``@mypyc_attr(native_class=False)`` on top of each named class's decorators."""
    for cls in classes:
        m = re.search(rf"^((?:@.*\n)*)class {cls}\b", source, re.MULTILINE)
        if m is None:
            raise SystemExit(f"class {cls} not found: update PYTHON_CLASSES in benchmarks/compiled.py")
        source = source[: m.start()] + "@mypyc_attr(native_class=False)\n" + source[m.start() :]
    future = "from __future__ import annotations\n"
    if future in source:
        return source.replace(future, future + _MYPYC_ATTR_IMPORT, 1)
    return _MYPYC_ATTR_IMPORT + source


def compile_tree(tree: str, modules: Sequence[str], *, jobs: int = 2) -> list[str]:
    """Compile ``steadqd/fs/<module>.py`` for each module in ``tree`` with mypyc, in place.

    Returns the built extension files; raises SystemExit with mypyc's output if it fails.
    """
    for m in modules:
        if m in NOT_COMPILED:
            raise SystemExit(f"steadqd.fs.{m} is not compiled here: {NOT_COMPILED[m]}")
        if not os.path.isfile(os.path.join(tree, "steadqd", "fs", f"{m}.py")):
            raise SystemExit(f"no module steadqd/fs/{m}.py")
    for m in modules:
        if m in PYTHON_CLASSES:
            p = Path(tree, "steadqd", "fs", f"{m}.py")
            p.write_text(mark_python_classes(p.read_text(), PYTHON_CLASSES[m]))
    files = [os.path.join("steadqd", "fs", f"{m}.py") for m in modules]
    # mypyc's own command line, with the checkout's mypy settings (pyproject.toml: the untyped
    # imports it ignores) and parallel C compilers. cwd=tree: the build directory is tree/build, and
    # build_ext --inplace puts each extension beside its source and the group's shared library in
    # tree/ itself, which is the measured side's PYTHONPATH.
    os.makedirs(os.path.join(tree, "build"))
    setup = os.path.join(tree, "build", "setup.py")
    args = ["--config-file", os.path.join(REPO, "pyproject.toml"), *files]
    Path(setup).write_text(_SETUP.format(args=json.dumps(args)))
    cmd = [sys.executable, setup, "build_ext", "--inplace", "--parallel", str(jobs)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800, check=False)
    if r.returncode != 0:
        raise SystemExit(f"mypyc failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    built = sorted(str(p) for p in Path(tree, "steadqd").rglob("*.so"))
    log(f"mypyc: {len(modules)} modules compiled in {time.monotonic() - t0:.0f} s")
    return built


def lifecycles(tree: str, compiled: Sequence[str], base: str, jobs: int) -> dict[str, float]:
    """``jobs`` strict lifecycles of ``tree``'s steadqd on a fresh queue in ``base`` (after 20 to warm up).

    Returns jobs/s and CPU per job; stops the run if the child imported the wrong code (see
    ``lifecycle_cpu.check_extensions``) or failed.
    """
    unsupported = base.startswith("/dev/shm")  # allow_unsupported_fs only where fsync is free
    return lifecycle_cpu.one(tree, base, jobs, compiled=compiled, warm=20, unsupported=unsupported, timeout=1800)


def _instructions(sides: dict[str, tuple[str, tuple[str, ...]]], base: str, jobs: int, repeat: int) -> dict[str, Any]:
    runs: dict[str, list[int]] = {s: [] for s in sides}
    for r in range(repeat):
        for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            tree, compiled = sides[side]
            runs[side].append(lifecycle_cpu.instructions(tree, base, jobs, compiled=compiled))
            log(f"instructions {side}: {runs[side][-1]:,} per lifecycle")
    med = {s: int(statistics.median(v)) for s, v in runs.items()}
    return {"runs": runs, "median": med, "ratio": med["compiled"] / med["pure"]}


def _paired(rounds: list[dict[str, dict[str, float]]], key: str) -> dict[str, Any]:
    return {
        "median": {s: statistics.median(r[s][key] for r in rounds) for s in ("pure", "compiled")},
        "range": {s: (min(r[s][key] for r in rounds), max(r[s][key] for r in rounds)) for s in ("pure", "compiled")},
        "ratio": statistics.median(r["compiled"][key] / r["pure"][key] for r in rounds),
    }


def _cpu(sides: dict[str, tuple[str, tuple[str, ...]]], base: str, jobs: int, nrounds: int) -> dict[str, Any]:
    rounds = []
    for r in range(nrounds):
        got = {}
        for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            tree, compiled = sides[side]
            got[side] = lifecycle_cpu.one(tree, base, jobs, compiled=compiled)
        log(f"cpu round {r + 1}: user {got['pure']['user_us']:.0f} vs {got['compiled']['user_us']:.0f} us/job")
        rounds.append(got)
    return {"rounds": rounds, "user_us": _paired(rounds, "user_us"), "sys_us": _paired(rounds, "sys_us")}


def _loop(sides: dict[str, tuple[str, tuple[str, ...]]], base: str, jobs: int, nrounds: int) -> dict[str, Any]:
    rounds = []
    with loopdisk.loop_filesystem("ext4", base) as (scratch, setup):
        for r in range(nrounds):
            got = {}
            for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:
                tree, compiled = sides[side]
                got[side] = lifecycles(tree, compiled, scratch, jobs)
            log(f"loop round {r + 1}: {got['pure']['jobs_per_s']:.0f} vs {got['compiled']['jobs_per_s']:.0f} jobs/s")
            rounds.append(got)
        loop = setup.to_json()
    return {
        "loop": loop,
        "rounds": rounds,
        "jobs_per_s": _paired(rounds, "jobs_per_s"),
        "user_us": _paired(rounds, "user_us"),
    }


def run(a: argparse.Namespace) -> dict[str, Any]:
    modules = tuple(m for m in a.modules.split(",") if m)
    sections = set(a.sections.split(","))
    out: dict[str, Any] = {"modules": list(modules), "load_before": os.getloadavg()[0]}
    work = a.keep or tempfile.mkdtemp(prefix="steadqd-compiled-", dir=a.scratch)
    try:
        pure = copy_tree(os.path.join(work, "pure"))
        comp = copy_tree(os.path.join(work, "compiled"))
        out["extensions"] = [os.path.relpath(p, comp) for p in compile_tree(comp, modules, jobs=a.build_jobs)]
        sides: dict[str, tuple[str, tuple[str, ...]]] = {"pure": (pure, ()), "compiled": (comp, modules)}
        for tree, compiled in sides.values():
            lifecycles(tree, compiled, "/dev/shm", 1)  # imports the right modules, and works
        if "hook" in sections:
            out["hook"] = {side: hook(tree) for side, (tree, _) in sides.items()}
        if "instructions" in sections:
            out["instructions"] = _instructions(sides, a.dir, a.instruction_jobs, a.repeat)
        if "cpu" in sections:
            out["cpu"] = _cpu(sides, a.dir, a.jobs, a.rounds)
        if "loop" in sections:
            out["loop"] = _loop(sides, a.loop_base, a.loop_jobs, a.loop_rounds)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    out["load_after"] = os.getloadavg()[0]
    return out


def report(out: dict[str, Any]) -> None:
    print(f"compiled: steadqd.fs.{{{','.join(out['modules'])}}}; load average {out['load_before']:.1f} -> "
          f"{out['load_after']:.1f}")  # fmt: skip
    if "hook" in out:
        h = out["hook"]
        t = h["pure"].pop("trace"), h["compiled"].pop("trace")
        print(f"syscalls traced in one strict lifecycle: pure {len(t[0])}, compiled {len(t[1])}, "
              f"{'the same sequence' if t[0] == t[1] else 'DIFFERENT sequences'}")  # fmt: skip
        for k in h["pure"]:
            print(f"  {k}: pure {h['pure'][k]}, compiled {h['compiled'][k]}")
    if "instructions" in out:
        i = out["instructions"]
        print(f"instructions per strict lifecycle (callgrind, medians of {len(i['runs']['pure'])}): "
              f"pure {i['median']['pure']:,} {i['runs']['pure']}, compiled {i['median']['compiled']:,} "
              f"{i['runs']['compiled']}: {i['ratio']:.3f}x")  # fmt: skip
    if "cpu" in out:
        c = out["cpu"]["user_us"]
        print(f"user CPU per strict lifecycle ({len(out['cpu']['rounds'])} paired rounds): pure "
              f"{c['median']['pure']:.0f} us, compiled {c['median']['compiled']:.0f} us; "
              f"median per-round ratio {c['ratio']:.3f}")  # fmt: skip
    if "loop" in out:
        j, u = out["loop"]["jobs_per_s"], out["loop"]["user_us"]
        print(f"strict lifecycle on a loop ext4 ({len(out['loop']['rounds'])} interleaved rounds): pure "
              f"{j['median']['pure']:.0f} jobs/s ({j['range']['pure'][0]:.0f}-{j['range']['pure'][1]:.0f}), "
              f"compiled {j['median']['compiled']:.0f} ({j['range']['compiled'][0]:.0f}-"
              f"{j['range']['compiled'][1]:.0f}); median per-round ratio {j['ratio']:.3f}; user CPU per job "
              f"{u['median']['pure']:.0f} vs {u['median']['compiled']:.0f} us, ratio {u['ratio']:.3f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--modules", default=",".join(DEFAULT_MODULES), help="steadqd/fs/ modules to compile")
    ap.add_argument("--sections", default="hook,instructions,cpu,loop")
    ap.add_argument("--dir", default="/dev/shm", help="where the instructions and cpu sections run")
    ap.add_argument("--jobs", type=int, default=2000, help="cpu: lifecycles per side and round")
    ap.add_argument("--rounds", type=int, default=10, help="cpu: paired rounds")
    ap.add_argument("--instruction-jobs", type=int, default=500, help="instructions: lifecycles per run")
    ap.add_argument("--repeat", type=int, default=3, help="instructions: runs per side")
    ap.add_argument("--loop-jobs", type=int, default=200, help="loop: lifecycles per side and round")
    ap.add_argument("--loop-rounds", type=int, default=9)
    ap.add_argument("--loop-base", default="/var/tmp", help="loop: where the ext4 image lives (the disk measured)")
    ap.add_argument("--scratch", default=None, help="where the two copies are built (default: the temp dir)")
    ap.add_argument("--keep", default=None, help="build in this new directory and keep it")
    ap.add_argument("--build-jobs", type=int, default=2, help="C compilers in parallel")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)
    with signals_unwind():
        out = run(a)
    report(out)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
