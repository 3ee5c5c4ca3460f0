"""The rule that CI never drops a tier quietly (tests/prereq.py), tried on a throwaway suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.prereq import PROJECT_ROOT, SPEC_DIR

INNER = """
import pytest
from tests.prereq import opted_out, partial_run

def test_missing_tool():
    pytest.skip("mkfs.xfs is not installed")

@pytest.mark.skipif(True, reason="needs root")
def test_marked():
    pass

def test_partial():
    partial_run("only meaningful when the whole matrix ran")

def test_opted_out():
    opted_out("STEADQ_PACKAGING_TESTS=0")

def test_passes():
    pass
"""


def _run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(INNER)
    # Only the plugin under test: autoloading the installed ones (Hypothesis above all) took ~4 of
    # the ~5 s each inner run cost, for nothing this suite uses.
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), STEADQ_SYSTEM_TESTS=mode, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "tests.prereq", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_require_a_missing_prerequisite_skips(tmp_path: Path) -> None:
    proc = _run(tmp_path, "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 4 skipped" in proc.stdout


def test_under_require_every_prerequisite_skip_fails_and_names_it(tmp_path: Path) -> None:
    proc = _run(tmp_path, "require")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # A skip in the call fails the test; a skip mark (raised in setup) errors it: both fail the run.
    assert "1 failed, 1 passed, 2 skipped, 1 error" in proc.stdout
    assert "would have been skipped (mkfs.xfs is not installed)" in proc.stdout
    assert "would have been skipped (needs root)" in proc.stdout
    assert "partial run: only meaningful" in proc.stdout  # kept as a skip
    assert "opted out: STEADQ_PACKAGING_TESTS=0" in proc.stdout  # kept as a skip


def test_the_shared_spec_is_found_beside_the_checkout() -> None:
    assert SPEC_DIR == PROJECT_ROOT.parent / "shared" / "spec"
    assert (SPEC_DIR / "reference" / "test-vectors" / "format" / "cbor.txt").is_file()


def test_a_missing_spec_file_fails_instead_of_skipping() -> None:
    from tests.prereq import spec_file

    with pytest.raises(pytest.fail.Exception, match="shared spec file missing"):
        spec_file("no/such/file.txt")
