"""The demo's child processes: which program to start, with what environment, and their output.

The daemon, the producer and ``steadq`` run as separate processes, the way an
operator runs them; their lines reach the demo's one loop through a queue of
``(tag, line)`` events, ``line`` None at the end of a stream.
"""

from __future__ import annotations

import os
import queue as queue_mod
import subprocess
import sys
import threading
from typing import TextIO

Events = queue_mod.Queue[tuple[str, str | None]]


def tool(name: str, module: str) -> list[str]:
    """The console script installed next to this Python, else ``python -m module``."""
    exe = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.isfile(exe) and os.access(exe, os.X_OK):
        return [exe]
    return [sys.executable, "-m", module]


def typed(argv: list[str]) -> str:
    """A command line as a person would type it (relative paths where shorter)."""
    out = []
    for a in argv:
        if os.path.isabs(a):
            rel = os.path.relpath(a)
            a = rel if len(rel) < len(a) and not rel.startswith("../..") else a
        out.append(a)
    return " ".join(out)


def child_env() -> dict[str, str]:
    """Our environment minus what would tie the child to *our* service manager."""
    env = dict(os.environ)
    for k in (
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "JOURNAL_STREAM",
        "LISTEN_FDS",
        "LISTEN_PID",
        "STEADQ_CONFIG_DIR",
    ):
        env.pop(k, None)
    return env


def _pump(stream: TextIO, tag: str, out: Events, keep: TextIO | None) -> None:
    """Thread: forward lines of a child's pipe to the main loop (None at EOF)."""
    for raw in stream:
        raw = raw.rstrip("\n")
        if keep is not None:
            keep.write(raw + "\n")
            keep.flush()
        out.put((tag, raw))
    out.put((tag, None))


def start_pumped(
    argv: list[str], tag: str, out: Events, keep: TextIO | None, *, stderr_only: bool
) -> subprocess.Popen[str]:
    """A child whose lines reach the main loop through :func:`_pump`.

    ``stderr_only``: its stdout is discarded (the daemon logs on stderr);
    otherwise both streams are read as one (the producer's report)."""
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if stderr_only else subprocess.PIPE,
        stderr=subprocess.PIPE if stderr_only else subprocess.STDOUT,
        text=True,
        errors="replace",
        env=child_env(),
    )
    stream = child.stderr if stderr_only else child.stdout
    assert stream is not None
    threading.Thread(target=_pump, args=(stream, tag, out, keep), daemon=True).start()
    return child
