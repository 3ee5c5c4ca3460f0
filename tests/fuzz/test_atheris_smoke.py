"""Run each atheris harness for a few seconds in CI (issue 10: coverage-guided fuzzing in CI).

A harness that crashes, hangs past libFuzzer's per-input timeout, or fails
to start (a broken import, a seed the contract rejects) makes libFuzzer exit
non-zero and write a ``crash-``/``timeout-`` artifact, which this test
reports with the reproducer's path. The committed corpus is copied to a
scratch directory first, because libFuzzer adds new inputs to the first
corpus directory it is given.

The bound is in libFuzzer's own units (-max_total_time), not a speed
assertion: the test passes however many executions fit.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris is not installed (pip install '.[test]' installs it)")

HERE = Path(__file__).resolve().parent
FAMILIES = ("names", "records", "cbor", "json", "config")
SECONDS = 5


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_harness_runs_clean(family: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(HERE / "corpus" / family, corpus)
    seeds = len(list(corpus.iterdir()))
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / f"atheris_{family}.py"),
            str(corpus),
            f"-max_total_time={SECONDS}",
            "-timeout=10",  # per input: a parser that hangs is a failure
            "-rss_limit_mb=1024",
            f"-artifact_prefix={artifacts}/",
        ],
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
    )
    found = sorted(p.name for p in artifacts.iterdir())
    tail = "\n".join(proc.stderr.splitlines()[-40:])
    assert proc.returncode == 0 and not found, f"{family}: rc={proc.returncode}, artifacts={found}\n{tail}"
    assert "Done " in proc.stderr, tail  # libFuzzer's summary line: it really ran
    assert "INITED" in proc.stderr and seeds > 0
