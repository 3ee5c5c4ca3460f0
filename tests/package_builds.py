"""The .deb and the appliance bundle, built once per test session for every tier that needs them.

Why: tests/packaging checks the artefacts (contents, lintian, the bundle in a scratch root) and
tests/system/test_packages_e2e.py installs the same artefacts under a real systemd. Each used to
run its own builds, so a default run built the .deb and the bundle twice (about 100 s on the
loaded 2-core CI machine). Here a build is keyed on its script and options and runs at most once
per test run, into pytest's temporary directory (never the checkout's dist/); a failed build is
remembered too, so every tier reports the same failure instead of retrying it. Under pytest-xdist
the two workers share the run's temporary directory, and one lock there makes every build wait
for the one before: a worker that needs a build the other already made reuses it, and two builds
never run at once (they may apt-get build dependencies, and dpkg takes one at a time).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "packaging"
# Debian's tools only: no pyenv shims or virtualenv from the developer's PATH.
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.environ.get("HOME", "/root"), "LC_ALL": "C.UTF-8"}
BUILD_TIMEOUT_S = 900  # the first build on a fresh machine apt-get installs build dependencies


@dataclass(frozen=True)
class Build:
    out: Path  # the script's --out directory: only this build's artefacts
    failure: str | None  # None when it built; else the command, its status and the end of its output


_builds: dict[tuple[str, ...], Build] = {}
_FAILURE = "failure.txt"  # in a build's directory: why it failed (absent when it built)
_DONE = "done"  # in a build's directory: the build finished, either way


def _run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory every process of this test run shares: an xdist worker's base temp is one level below."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build(tmp_path_factory: pytest.TempPathFactory, script: str, *options: str) -> Build:
    """Run ``packaging/<script> --out DIR --work DIR <options>`` unless this test run already did."""
    key = (script, *options)
    if key not in _builds:
        builds = _run_dir(tmp_path_factory) / "package-builds"
        builds.mkdir(exist_ok=True)
        with open(builds / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _builds[key] = _build_once(builds / re.sub(r"[^\w.-]+", "_", "_".join(key)), script, options)
    return _builds[key]


def _build_once(base: Path, script: str, options: tuple[str, ...]) -> Build:
    """The build in ``base``, made now unless an earlier process of this run finished it there."""
    out = base / "dist"
    if not (base / _DONE).exists():
        shutil.rmtree(base, ignore_errors=True)  # a worker that died mid-build leaves a partial one
        base.mkdir()
        cmd = ["bash", str(PKG / script), "--out", str(out), "--work", str(base / "work"), *options]
        proc = subprocess.run(cmd, env=CLEAN_ENV, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            (base / _FAILURE).write_text(
                f"{' '.join(cmd)} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
            )
        (base / _DONE).touch()
    failure = base / _FAILURE
    return Build(out, failure.read_text() if failure.exists() else None)


def package_depends() -> list[str]:
    """The steadqd package's literal Depends in packaging/debian/control (the ${...} substitutions left out):
    what an offline root that sees the host's packages needs on the host, and so what dev.sh installs."""
    text = (PKG / "debian" / "control").read_text()
    stanza = text[text.index("Package: steadqd\n") :].split("\n\n", 1)[0]
    field = re.search(r"^Depends:(.*?)(?=^\S)", stanza + "\nEnd:", re.S | re.M)
    assert field is not None, "packaging/debian/control: the steadqd package has no Depends"
    names = [d.strip().split()[0] for d in field.group(1).split(",") if d.strip()]
    return [n for n in names if not n.startswith("${")]
