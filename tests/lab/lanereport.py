"""Print what a crash-lab lane checked to the terminal, even under pytest's output capture.

Why: issue 8 asks every lane to print what it checked (filesystems, kills,
jobs) in every CI log, not only when a test fails. Lane 1 does it from the
crash conftest's terminal summary; lanes 3-5 print one line per test as it
finishes, with capture suspended for that line.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import workers


def emit(request: pytest.FixtureRequest, lane: str, line: str) -> None:
    """Write ``crash lab <lane>: <line>`` straight to the terminal."""
    text = f"crash lab {lane}: {line}"
    if workers.in_worker(request.config):  # an xdist worker's terminal is nobody's: the controller prints it
        workers.hand_line(request.node, text)
        return
    capman: Any = request.config.pluginmanager.getplugin("capturemanager")
    tr: Any = request.config.pluginmanager.getplugin("terminalreporter")
    if capman is None or tr is None:  # plugins disabled: plain print
        print(text)
        return
    with capman.global_and_fixture_disabled():
        tr.write_line("")
        tr.write_line(text)
