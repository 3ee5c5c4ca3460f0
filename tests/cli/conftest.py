"""Fixtures for the ``steadq`` command-line tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadqd import Queue


@pytest.fixture
def qpath(tmp_path: Path) -> str:
    """An initialised 4-shard queue (made by the library: faster than a subprocess)."""
    path = str(tmp_path / "q")
    Queue.init(path, shards=4).close()
    return path
