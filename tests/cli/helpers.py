"""Helpers for the ``steadq`` command-line tests (imported by test modules).

Why subprocesses: the command line is a compatibility contract (cli.md) that
scripts see only through argv, stdout, stderr and the exit status, so the
tests run the *installed console script* exactly as a shell would and check
those four things. A few fault-injection cases that cannot be provoked from
outside call :func:`steadqd.cli.main.main` in-process instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import prereq

STEADQ = shutil.which("steadq", path=os.path.dirname(sys.executable))


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()

    @property
    def out_lines(self) -> list[str]:
        return self.out.splitlines()


def steadq(
    *args: str | os.PathLike[str],
    stdin: bytes | None = None,
    cwd: str | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> Result:
    """Run the console script; stdin is empty unless given (never the test runner's); ``env`` is added
    to the runner's environment."""
    assert STEADQ is not None, "steadq console script not installed: run .venv/bin/pip install -e ."
    p = subprocess.run(
        [STEADQ, *map(str, args)],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        cwd=cwd,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
    return Result(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))


def payload_dir(tmp_path: Path, n: int) -> Path:
    """A directory of ``n`` payload files for ``put --dir``: ``p00000`` ... holding ``payload <i>``,
    so name order is input order."""
    d = tmp_path / "payloads"
    d.mkdir()
    for i in range(n):
        (d / f"p{i:05d}").write_bytes(b"payload %d" % i)
    return d


def installed(name: str, package: str) -> str:
    """The path of program ``name``: a developer without it skips, CI (``require``) fails naming the package."""
    path = shutil.which(name)
    if path is None:
        if prereq.required():
            pytest.fail(f"{name} is not installed (apt-get install {package})")
        pytest.skip(f"{name} is not installed")
    return path
