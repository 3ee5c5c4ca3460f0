"""The mutation run: mutmut over the format modules and the exit policy.

    ./dev.sh mutate [MUTANT_PATTERN...]      # = nice -n 19 .venv/bin/python -m tests.mutation

What is mutated and which tests judge a mutant is ``[tool.mutmut]`` in
pyproject.toml; docs/testing.md ("Mutation testing") has the last score and
the triage of every survivor. The run works on a copy of the checkout (its
tracked and untracked, not ignored, files) under ``--workdir``, so mutmut's
``mutants/`` tree never lands in the working tree and a rerun only retests
what changed. The copy gets a ``shared`` link to the real spec because the
tests find it beside the project root, and mutmut runs them from
``<copy>/mutants``. Hypothesis runs with one fixed seed so two runs of the
same code give the same score. Patterns (``'steadqd.daemon.worker.policy.*'``) run
only the mutants they match, as ``mutmut run`` does.

The whole run takes about an hour on the 2-core machine, so ``--sample N``
(N = 2, 5 or 10) runs every N-th mutant of each function in mutmut's
numbering (``..__mutmut_5``, ``_10``, ...) and scores only those; mutants of
the sample that a previous run in the same workdir already judged keep
their result, the rest are run. With patterns as well, the patterns say what
runs (``$(cut -d' ' -f1 survivors.txt)`` retries the last survivors) and the
sample what is scored.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.prereq import PROJECT_ROOT, SHARED_DIR, SPEC_DIR

DEFAULT_WORKDIR = Path("/tmp/steadq-mutation")
DETECTED = ("killed", "timeout", "segfault", "caught by type check")
UNJUDGED = ("not checked", "skipped")
SAMPLE_DIGITS = {2: "02468", 5: "05", 10: "0"}  # mutant numbers divisible by N end in these


def copy_checkout(dest: Path) -> None:
    """Refresh ``dest`` from the working tree, keeping mutmut's ``mutants/`` (its cache)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    dest.mkdir(parents=True, exist_ok=True)
    for child in dest.iterdir():
        if child.name == "mutants":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    for raw in filter(None, files):
        rel = os.fsdecode(raw)
        src = PROJECT_ROOT / rel
        if not src.is_file():  # deleted in the working tree but still in the index
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)
    if not SPEC_DIR.is_dir():
        sys.exit(f"tests.mutation: no spec at {SPEC_DIR}: the tests need ../shared beside the checkout")
    (dest / "shared").symlink_to(SHARED_DIR.resolve())


def statuses(checkout: Path) -> dict[str, str]:
    """Every mutant's status, read from the ``.meta`` files mutmut keeps beside each mutated module."""
    from mutmut.stats import status_by_exit_code  # the tool's own reading of its exit codes

    out: dict[str, str] = {}
    for meta in sorted((checkout / "mutants").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        out.update({name: status_by_exit_code[code] for name, code in codes.items()})
    return out


def sampled(name: str, n: int) -> bool:
    return int(name.rpartition("__mutmut_")[2]) % n == 0


def sample_run(checkout: Path, n: int) -> list[str]:
    """What to pass ``mutmut run`` for a 1-in-``n`` sample: the unjudged members, or a glob on a fresh workdir."""
    known = statuses(checkout)
    if not known:
        return [f"*__mutmut_*[{SAMPLE_DIGITS[n]}]"]
    return sorted(name for name, status in known.items() if status == "not checked" and sampled(name, n))


def report(found: dict[str, str], patterns: list[str]) -> tuple[int, int]:
    """Print the score per module and overall; return (detected, judged)."""
    by_module: dict[str, Counter[str]] = {}
    for name, status in found.items():
        by_module.setdefault(name.split(".x", 1)[0], Counter())[status] += 1
    total: Counter[str] = Counter()
    for module, counts in sorted(by_module.items()):
        total += counts
        print(f"{module:32} {score_line(counts)}")
    print(f"{'all':32} {score_line(total)}")
    if patterns:
        print("(only the patterns given were run; the other mutants keep their last status)")
    judged = sum(n for status, n in total.items() if status not in UNJUDGED)
    return sum(total[s] for s in DETECTED), judged


def score_line(counts: Counter[str]) -> str:
    judged = sum(n for status, n in counts.items() if status not in UNJUDGED)
    detected = sum(counts[s] for s in DETECTED)
    score = f"{100 * detected / judged:5.1f}%" if judged else "    -"
    rest = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()) if status not in DETECTED)
    return f"{score}  {detected}/{judged} detected" + (f"; {rest}" if rest else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.splitlines()[0])
    parser.add_argument("patterns", nargs="*", help="run only the mutants matching these (mutmut names, * allowed)")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help=f"default {DEFAULT_WORKDIR}")
    parser.add_argument("--max-children", type=int, default=2, help="parallel mutant runs (default 2)")
    parser.add_argument("--seed", default="0", help="the Hypothesis seed for every mutant (default 0)")
    parser.add_argument("--sample", type=int, choices=sorted(SAMPLE_DIGITS), help="run and score every N-th mutant")
    args = parser.parse_args(argv)

    os.nice(max(0, 19 - os.nice(0)))  # other people share the machine
    checkout = args.workdir / "checkout"
    copy_checkout(checkout)
    mutmut = Path(sys.executable).parent / "mutmut"
    env = {**os.environ, "STEADQ_HYPOTHESIS_SEED": args.seed}
    selection = args.patterns or (sample_run(checkout, args.sample) if args.sample else [])
    returncode = 0
    if selection or not args.sample:
        command = [str(mutmut), "run", "--max-children", str(args.max_children), *selection]
        returncode = subprocess.run(command, cwd=checkout, env=env).returncode
    found = statuses(checkout)
    if args.sample:
        found = {name: status for name, status in found.items() if sampled(name, args.sample)}
        print(f"\nsample: every {args.sample}th mutant of each function, {len(found)} mutants")
    print()
    detected, judged = report(found, args.patterns)
    survivors = sorted(name for name, status in found.items() if status not in DETECTED + UNJUDGED)
    (args.workdir / "survivors.txt").write_text("".join(f"{n} {found[n]}\n" for n in survivors))
    print(f"\n{len(survivors)} not detected, listed in {args.workdir / 'survivors.txt'}; see one with")
    print(f"  cd {checkout} && {mutmut} show NAME")
    return returncode if returncode else (0 if judged else 1)


if __name__ == "__main__":
    sys.exit(main())
