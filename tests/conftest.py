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
from tests import loopfs, workers

pytest_plugins = ("tests.prereq",)  # missing prerequisites fail under STEADQ_SYSTEM_TESTS=require

SHARDS = 4  # >1 keeps shard placement meaningful, small keeps listings fast

# Under `--dist loadgroup` (./dev.sh test) the tests of one xdist_group run on one worker, in order.
# tests/system: one booted root per worker that runs any of it (system_root), and its fixed unit, queue
# and user names live in that root; grouped, it boots once. The session's SeaweedFS and Ceph cluster
# (tests/stowq/conftest.py): grouped, each starts once instead of once per worker. A module whose tests
# must share one process (a module-scoped fixture that is expensive, a last test that checks the whole
# module ran) carries its own `pytestmark = pytest.mark.xdist_group(...)`, which this rule leaves alone.
SYSTEM_TIER = Path(__file__).resolve().parent / "system"
LIVE_S3_FIXTURES = frozenset({"seaweed", "ceph"})
_SEED_KEY = "steadq_hypothesis_seed"


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own pytest_configure reads the option
def pytest_configure(config: pytest.Config) -> None:
    """Every run draws new Hypothesis examples from one seed, which the summary prints.

    Replay a run with ``STEADQ_HYPOTHESIS_SEED=<n>`` (or ``--hypothesis-seed=<n>``). An xdist
    worker takes the controller's seed, so the one printed replays every worker.
    """
    if config.getoption("hypothesis_seed", None) is None:
        handed = getattr(config, "workerinput", {}).get(_SEED_KEY)
        drawn = os.environ.get("STEADQ_HYPOTHESIS_SEED") or str(random.getrandbits(32))
        config.option.hypothesis_seed = handed or drawn


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[_SEED_KEY] = node.config.getoption("hypothesis_seed")


def _xdist_group(item: pytest.Item) -> str | None:
    if SYSTEM_TIER in item.path.parents:
        return workers.SYSTEM_GROUP
    if LIVE_S3_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return workers.LIVE_S3_GROUP
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = None if item.get_closest_marker("xdist_group") else _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)  # before xdist sends the node ids; its modifyitems hook has put the groups in
def pytest_collection_finish(session: pytest.Session) -> None:
    _check_groups_took(session.config, session.items)


def _check_groups_took(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a worker whose xdist ignored the groups: their tests would split between workers unnoticed."""
    if not (workers.in_worker(config) and config.getvalue("loadgroup")):
        return
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not apply the xdist_group of {lost[0]} (and {len(lost) - 1} more): this pytest "
            f"{pytest.__version__} and pytest-xdist do not work together; install the versions pyproject.toml's "
            "test extra names (pip install -e '.[test]')"
        )


_printed_lines: dict[str, int] = {}  # node id -> how many of its handed lines are printed
_worker_sections: list[tuple[str, list[str]]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the controller: print the lines a worker's test handed over (tests/workers.py)."""
    lines = [str(value) for name, value in report.user_properties if name == workers.LINE_PROPERTY]
    done = _printed_lines.get(report.nodeid, 0)
    if len(lines) <= done or not hasattr(report, "node"):  # `node`: the report came from a worker
        return
    _printed_lines[report.nodeid] = len(lines)
    reporter = report.node.config.pluginmanager.getplugin("terminalreporter")
    if reporter is None:
        return
    for line in lines[done:]:
        reporter.write_line("")
        reporter.write_line(line)


_workers_done: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    output = getattr(node, "workeroutput", None) or {}
    _workers_done.append(str(getattr(node, "workerinput", {}).get("workerid", "?")))
    _worker_sections.extend((title, lines) for title, lines in output.get(workers.SECTIONS_KEY, []))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for title, lines in _worker_sections:
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
    if "hypothesis" in sys.modules or _workers_done:  # the controller itself imports no test module
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
