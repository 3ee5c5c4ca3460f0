"""What the suite needs to know about pytest-xdist workers (``./dev.sh test`` runs ``-n 2``).

Why: under xdist the tests run in worker processes whose terminal nobody reads, and two
of them run at once. So lines a test prints past pytest's capture for the CI log (the
crash-lab lanes, issue 8) travel to the controller, which prints them: a test's lines in
its report (:func:`hand_line`), a tier's end-of-run sections in the worker's output
(:func:`hand_sections`). ``tests/conftest.py`` prints what arrives. Scratch names that
must not collide between the two workers carry :func:`worker_tag`.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

# xdist groups (--dist loadgroup) that more than one file names; tests/conftest.py says who is in them.
SYSTEM_GROUP = "system"
LIVE_S3_GROUP = "s3-live"
LINE_PROPERTY = "steadq-log-line"  # a test report's user property: one line for the CI log
SECTIONS_KEY = "steadq_log_sections"  # the worker output's key: [(title, [line, ...]), ...]


def in_worker(config: pytest.Config) -> bool:
    """True in an xdist worker, whose own terminal output is lost."""
    return hasattr(config, "workerinput")


def worker_tag() -> str:
    """``gw0``, ``gw1``, ... in an xdist worker, ``main`` in a plain pytest run (or outside pytest)."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def hand_line(item: pytest.Item, text: str) -> None:
    """Carry one line of a running test to the controller's terminal."""
    item.user_properties.append((LINE_PROPERTY, text))


def hand_sections(config: pytest.Config, sections: list[tuple[str, list[str]]]) -> None:
    """Carry end-of-run sections (a title and its lines) to the controller's terminal summary."""
    output: dict[str, Any] = config.workeroutput  # type: ignore[attr-defined]
    output.setdefault(SECTIONS_KEY, []).extend([title, list(lines)] for title, lines in sections)
