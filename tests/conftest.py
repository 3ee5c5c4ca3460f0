"""Shared pytest fixtures for the steadqd test suite.

Keep this file small and generic: fixtures that only one module needs belong
in that module. Queues live under pytest's ``tmp_path`` (ext4 on the dev and
CI machines) so every test gets a private tree that pytest cleans up. A tier
whose test queue differs overrides ``queue`` or builds its fixture on
``make_queue`` rather than making its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from steadqd import Queue

pytest_plugins = ("tests.prereq",)  # missing prerequisites fail under STEADQ_SYSTEM_TESTS=require

SHARDS = 4  # >1 keeps shard placement meaningful, small keeps listings fast


@pytest.fixture
def queue_path(tmp_path: Path) -> str:
    """A fresh, not yet initialised queue root under the test's tmp_path."""
    return str(tmp_path / "queue")


@pytest.fixture
def make_queue(queue_path: str) -> Iterator[Callable[..., Queue]]:
    """``Queue.init`` at ``queue_path`` with a tier's own options (``shards`` defaults to 4).

    A tier whose queue differs (one shard, 1 s delayed buckets, ...) builds its
    fixture on this one, so where the queue lives and that every handle is closed
    at teardown stay defined here only. Call ``.close()`` on the result for an
    initialised tree with no handle open; teardown closes it again harmlessly.
    """
    with contextlib.ExitStack() as handles:

        def make(**init_options: Any) -> Queue:
            init_options.setdefault("shards", SHARDS)
            return handles.enter_context(Queue.init(queue_path, **init_options))

        yield make


@pytest.fixture
def queue(make_queue: Callable[..., Queue]) -> Queue:
    """An initialised 4-shard queue at ``queue_path``, closed at teardown."""
    return make_queue()
