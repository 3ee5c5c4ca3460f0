"""Print the crash lab's per-workload report at the end of the pytest run.

The crash-state tests append their :class:`tests.lab.lab.Result` to
:data:`RESULTS`; the terminal summary shows how many states each workload
checked, so every CI log carries the numbers issue 8 asks for (nothing is
written to the repository).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests import workers
from tests.lab.lab import Result, format_table
from tests.lab.lazyfs import available

RESULTS: list[Result] = []  # lane 1
ORACLE_RESULTS: list[Result] = []  # lane 2


def _sections() -> list[tuple[str, list[str]]]:
    sections = []
    if RESULTS:
        sections.append(
            ("crash lab lane 1 (recorded syscalls): states checked per workload", format_table(RESULTS).splitlines())
        )
    if ORACLE_RESULTS:
        table = format_table(ORACLE_RESULTS, syscalls="requests")
        sections.append(("crash lab lane 2 (LazyFS oracle): states checked per workload", table.splitlines()))
    return sections


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker: hand the tables to the controller, which prints them (tests/workers.py)."""
    if workers.in_worker(session.config):
        workers.hand_sections(session.config, _sections())


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    if workers.in_worker(config):
        return
    for title, lines in _sections():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def need_lazyfs() -> None:
    """Lane 2 needs root and /dev/fuse: skip without them, or fail when CI requires every tier."""
    why = available()
    if why is not None:
        if os.environ.get("STEADQ_SYSTEM_TESTS") == "require":
            pytest.fail(f"crash lane 2 required but impossible here: {why}")
        pytest.skip(why)
