"""Shared pytest fixtures for the steadqd test suite.

Keep this file small and generic: fixtures that only one module needs belong
in that module. Queues live under pytest's ``tmp_path`` (ext4 on the dev and
CI machines) so every test gets a private tree that pytest cleans up.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd import Queue

pytest_plugins = ("tests.prereq",)  # missing prerequisites fail under STEADQ_SYSTEM_TESTS=require

SHARDS = 4  # >1 keeps shard placement meaningful, small keeps listings fast


@pytest.fixture
def queue_path(tmp_path: Path) -> str:
    """A fresh, not yet initialised queue root under the test's tmp_path."""
    return str(tmp_path / "queue")


@pytest.fixture
def queue(queue_path: str) -> Iterator[Queue]:
    """An initialised 4-shard queue at ``queue_path``, closed at teardown."""
    q = Queue.init(queue_path, shards=SHARDS)
    try:
        yield q
    finally:
        q.close()
