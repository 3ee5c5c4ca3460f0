"""Fixtures for the ``steadq`` command-line tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from steadqd import Queue


@pytest.fixture
def qpath(make_queue: Callable[..., Queue], queue_path: str) -> str:
    """An initialised 4-shard queue with no handle open (made by the library: faster than a subprocess)."""
    make_queue().close()
    return queue_path
