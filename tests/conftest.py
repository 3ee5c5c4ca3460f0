"""Shared pytest fixtures for the steadqd test suite.

Keep this file small and generic: fixtures that only one module needs belong
in that module. Queues live under pytest's ``tmp_path`` (ext4 on the dev and
CI machines) so every test gets a private tree that pytest cleans up. A tier
whose test queue differs overrides ``queue`` or builds its fixture on
``make_queue`` rather than making its own.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from steadqd import Queue
from tests import loopfs

pytest_plugins = ("tests.prereq",)  # missing prerequisites fail under STEADQ_SYSTEM_TESTS=require

SHARDS = 4  # >1 keeps shard placement meaningful, small keeps listings fast


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own pytest_configure reads the option
def pytest_configure(config: pytest.Config) -> None:
    """Every run draws new Hypothesis examples from one seed, which the summary prints.

    Replay a run with ``STEADQ_HYPOTHESIS_SEED=<n>`` (or ``--hypothesis-seed=<n>``).
    """
    if config.getoption("hypothesis_seed", None) is None:
        config.option.hypothesis_seed = os.environ.get("STEADQ_HYPOTHESIS_SEED") or str(random.getrandbits(32))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if "hypothesis" in sys.modules:
        seed = config.getoption("hypothesis_seed")
        terminalreporter.write_line(f"hypothesis seed {seed}: replay with STEADQ_HYPOTHESIS_SEED={seed}")


@pytest.fixture(scope="session")
def ram_ext4_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One RAM-backed ext4 per session (tests/loopfs.py), or pytest's base temp where none can be made."""
    with loopfs.ram_ext4() as mnt:
        yield Path(mnt) if mnt is not None else tmp_path_factory.mktemp("ram-ext4-fallback")


@pytest.fixture
def fast_tmp_path(ram_ext4_base: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """tmp_path for tests whose time goes to fsync: a private directory on ``ram_ext4_base``.

    A module opts in with a fixture named ``tmp_path`` that returns it. Removed at teardown: the
    memory is the machine's, shared with every other test run.
    """
    prefix = re.sub(r"[^\w.-]", "_", request.node.name)[:40]
    path = Path(tempfile.mkdtemp(prefix=prefix + "-", dir=ram_ext4_base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


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
