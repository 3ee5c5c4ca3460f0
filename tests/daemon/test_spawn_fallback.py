"""The spawner's end-to-end tests again on the spawn fallback (issue 35: the core runs on both paths).

Every other worker test runs on the compiled one-exec spawn (``run/spawn.c``), which CI builds; an
installation without a compiler, or with ``STEADQ_SPAWN=popen`` in the worker's environment, starts
jobs through Popen and ``steadq-exec`` instead (``run/fastspawn.py``). This runs the files that drive
the worker through its jobs (start, output, start failures, ``steadqd run``) once more, in a child
pytest whose environment has the switch, so every daemon the fixtures start takes the fallback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = ("test_spawner.py", "test_job_output.py", "test_start_failures.py", "test_run.py")


def _env() -> dict[str, str]:
    # Without the parent's xdist/pytest variables: the child is a plain pytest run of its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONBREAKPOINT"))}
    return {**env, "STEADQ_SPAWN": "popen"}


def test_the_spawners_end_to_end_tests_pass_on_the_popen_fallback() -> None:
    probe = "from steadqd.daemon.worker.run import fastspawn; print(fastspawn.path())"
    which = subprocess.run([sys.executable, "-c", probe], env=_env(), capture_output=True, text=True, check=True)
    assert which.stdout.startswith("Popen and steadq-exec"), which.stdout  # the switch reaches the programs
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         *(str(REPO / "tests" / "daemon" / f) for f in FILES)],
        env=_env(), cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed is not None and int(passed.group(1)) >= 40, tail  # the files' tests ran, not a collection of none
