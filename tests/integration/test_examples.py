"""The runnable examples under examples/ run and check their own result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_agent_pipeline_publishes_every_readable_document_and_buries_the_rest(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "agent_pipeline.py"), "--dir", str(tmp_path), "--docs", "15"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "published 13, buried 2, of 15 documents" in p.stdout
    assert len(list((tmp_path / "out").glob("*.json"))) == 13
