"""What ``steadq --version`` and ``steadqd --version`` print: the installed version, the spawn and the claim path.

Issue 35's compiled part is the job spawn (``steadqd/daemon/worker/run/spawn.c``); a source tree or a
machine without a compiler runs the Popen fallback, which works but costs more CPU per job. An operator
who wonders which one a machine runs asks ``--version`` (or ``steadq doctor``), so both programs print
the same lines. The claim's happy path is compiled too (``steadqd/fs/compiled``), with the pure Python as
its fallback, so the third line says which claim path runs. The text is built only when asked: the CLI
builds its parser on every call.

This module imports nothing else from steadqd; the programs pass the spawn and the claim path in.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["VersionAction", "installed_version"]


def installed_version() -> str:
    """The installed distribution's version: the one ``pip`` and ``dpkg`` report."""
    try:
        return version("steadqd")
    except PackageNotFoundError:
        return "unknown (not installed)"


class VersionAction(argparse.Action):
    """``--version``: ``<prog> <version>``, then ``job spawn: <path>`` and ``claim: <path>``; exits 0.

    argparse's own version action reflows its text into one paragraph and needs it when the
    parser is built; this one prints its lines as given and calls ``spawn_path`` and ``claim_path`` only when used.
    """

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        spawn_path: Callable[[], str],
        claim_path: Callable[[], str],
        **kw: Any,
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)
        self.spawn_path = spawn_path
        self.claim_path = claim_path

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        sys.stdout.write(
            f"{parser.prog} {installed_version()}\njob spawn: {self.spawn_path()}\nclaim: {self.claim_path()}\n"
        )
        parser.exit(0)
