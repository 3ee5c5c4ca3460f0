"""Prerequisites of the test tiers, and the rule that CI never drops a tier quietly.

A tier that needs root, mkfs, loop devices, /dev/fuse, systemd or the shared spec
skips on a developer's machine that lacks it. Under ``STEADQ_SYSTEM_TESTS=require``
(what ``.ci/run`` sets) every skip is turned into a failure naming the missing
prerequisite, wherever the skip came from (``pytest.skip``, ``skipif``,
``importorskip``): a tier whose prerequisite vanished from the CI machine fails the
run instead of passing with fewer tests. The only skips kept are the ones a test
declares with :func:`partial_run` (checks meaningful only when the whole tier ran
in this session, which a full CI run never triggers) and :func:`opted_out` (the
person running the suite switched a tier off, e.g. ``STEADQ_PACKAGING_TESTS=0``).

Loaded as a plugin by tests/conftest.py.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import Any, NoReturn

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The shared spec is always beside the project root (the checkout's ../shared).
SHARED_DIR = PROJECT_ROOT.parent / "shared"
SPEC_DIR = SHARED_DIR / "spec"

_PARTIAL_RUN = "partial run: "
_OPTED_OUT = "opted out: "


def required() -> bool:
    """True when missing prerequisites must fail (CI), not skip."""
    return os.environ.get("STEADQ_SYSTEM_TESTS", "") == "require"


def partial_run(reason: str) -> NoReturn:
    """Skip a check that needs the whole tier to have run in this session (never a prerequisite)."""
    pytest.skip(_PARTIAL_RUN + reason)


def opted_out(reason: str) -> NoReturn:
    """Skip because the person running the suite asked for it (e.g. STEADQ_PACKAGING_TESTS=0)."""
    pytest.skip(_OPTED_OUT + reason)


def spec_file(relative: str) -> Path:
    """A file of the shared spec; a missing spec is an error, never a skip."""
    path = SPEC_DIR / relative
    if not path.is_file():
        pytest.fail(
            f"shared spec file missing: {path} (the spec lives in ../shared beside the checkout)", pytrace=False
        )
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and required()) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if reason.startswith("Skipped: "):
        reason = reason[len("Skipped: ") :]
    if reason.startswith((_PARTIAL_RUN, _OPTED_OUT)):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid}: would have been skipped ({reason}), but STEADQ_SYSTEM_TESTS=require makes a missing "
        "prerequisite a failure: install it (./dev.sh installs every package CI needs) or unset the variable"
    )
