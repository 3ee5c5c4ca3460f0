"""The .deb and the appliance bundle, built once per test session for every tier that needs them.

Why: tests/packaging checks the artefacts (contents, lintian, the bundle in a scratch root) and
tests/system/test_packages_e2e.py installs the same artefacts under a real systemd. Each used to
run its own builds, so a default run built the .deb and the bundle twice (about 100 s on the
loaded 2-core CI machine). Here a build is keyed on its script and options and runs at most once
per pytest process, into pytest's temporary directory (never the checkout's dist/); a failed
build is remembered too, so every tier reports the same failure instead of retrying it.
"""

from __future__ import annotations

import os
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


def build(tmp_path_factory: pytest.TempPathFactory, script: str, *options: str) -> Build:
    """Run ``packaging/<script> --out DIR --work DIR <options>`` unless this session already did."""
    key = (script, *options)
    if key not in _builds:
        base = tmp_path_factory.mktemp(script.removesuffix(".sh"))
        out = base / "dist"
        cmd = ["bash", str(PKG / script), "--out", str(out), "--work", str(base / "work"), *options]
        proc = subprocess.run(cmd, env=CLEAN_ENV, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        failure = None
        if proc.returncode != 0:
            failure = (
                f"{' '.join(cmd)} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
            )
        _builds[key] = Build(out, failure)
    return _builds[key]
