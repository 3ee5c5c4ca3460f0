"""Spies on the C core's calls (steadqd.fs.compiled.bridge.Core), for tests that show which path ran.

Each returns the lists it fills as the calls happen: the stage every call ended at, and the syscalls
the core made itself (by syscall_hook's op names), so a test can say "the core did this whole, with
these syscalls" or "the Python took over here".
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from steadqd.fs import linux, verify
from steadqd.fs.compiled import bridge
from steadqd.fs.context import Context


def spy_one_call(monkeypatch: pytest.MonkeyPatch, method: str) -> tuple[list[int], list[str]]:
    """Spy on ``Core.ack``, ``Core.read_payload`` or ``Core.enqueue`` (one call, returning (stage, record, ...))."""
    stages: list[int] = []
    made: list[str] = []
    real = getattr(bridge.Core, method)

    def spy(self: bridge.Core, *a: Any) -> Any:
        out = real(self, *a)
        stage, rec = out[0], out[1]
        stages.append(stage)
        made.extend(bridge._OP_NAMES[r.op] for r in rec.recs[0 : rec.nrec])
        return out

    monkeypatch.setattr(bridge.Core, method, spy)
    return stages, made


def spy_claim(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[str]]:
    """Spy on the claim's two calls, ``Core.verify`` and ``Core.move`` (the syscalls: the record after the move)."""
    stages: list[int] = []
    made: list[str] = []
    real_verify, real_move = bridge.Core.verify, bridge.Core.move

    def verify(self: bridge.Core, *a: Any) -> Any:
        stage, c = real_verify(self, *a)
        stages.append(stage)
        return stage, c

    def move(self: bridge.Core, c: Any, *a: Any) -> Any:
        stage = real_move(self, c, *a)
        stages.append(stage)
        made.extend(bridge._OP_NAMES[r.op] for r in c.recs[0 : c.nrec])
        return stage

    monkeypatch.setattr(bridge.Core, "verify", verify)
    monkeypatch.setattr(bridge.Core, "move", move)
    return stages, made


@contextlib.contextmanager
def on_path(pure: bool, wall: int) -> Iterator[pytest.MonkeyPatch]:
    """A patch context on the pure or the compiled path (the switch is read at Queue.open), the wall floor fixed."""
    with pytest.MonkeyPatch.context() as m:
        if pure:
            m.setenv(bridge.SWITCH, "1")
        else:
            m.delenv(bridge.SWITCH, raising=False)
        m.setattr(Context, "wall_floor", lambda self: wall)
        yield m


def set_memo(path: str, max_payload: int, remember: bool) -> None:
    """verify.py's memo of verified bytes emptied, then (``remember``) holding the job file at ``path`` as
    after a claim that verified it whole: each run of a differential test starts from the same memo, and a
    reused inode number of an earlier run's file cannot decide which reads skip their digests."""
    verify._VERIFIED.clear()
    if remember:
        fd = os.open(path, os.O_RDONLY)
        try:
            env = verify.read_envelope(fd, max_payload)
            verify.verify_payload(fd, env)  # remembers a small file whose payload verified
        finally:
            os.close(fd)


# The four runs of a differential test: (tag, pure, traced). Untraced, the C core calls libc through its direct
# table; traced, through the hooked callbacks: both tables are compared with the Python.
PATHS = (("py", True, True), ("c", False, True), ("py0", True, False), ("c0", False, False))


def paths_agree(
    run: Callable[[str, bool, bool], dict[str, Any]], keys: Sequence[str] = ("result", "poisoned", "tree")
) -> dict[str, dict[str, Any]]:
    """Run one operation on the four PATHS (``run(tag, pure, traced)``, on its own copy of the queue) and require
    the C core's ``keys`` to be the Python's, each table against the Python run the same way, and the traced
    runs' syscalls (``"trace"``) to be the same sequence. Returns the runs for a test's own further checks."""
    runs = {tag: run(tag, pure, traced) for tag, pure, traced in PATHS}
    for key in keys:
        assert runs["c"][key] == runs["py"][key], key
        assert runs["c0"][key] == runs["py0"][key], key
    assert runs["c"]["trace"] == runs["py"]["trace"]
    return runs


@contextlib.contextmanager
def observed(
    traced: bool, fault: tuple[Any, int, int, bool] | None, batch: Any = None
) -> Iterator[list[linux.TraceEvent]]:
    """The operation's surroundings in a differential run: its syscalls traced (the list yielded, empty when
    not), inside ``batch`` (``Queue.batch()``, or None), with ``fault`` = (op, nth, errno, after) injected."""
    events: list[linux.TraceEvent] = []
    with contextlib.ExitStack() as stack:
        if traced:
            events = stack.enter_context(linux.trace())
        if batch is not None:
            stack.enter_context(batch)
        if fault is not None:
            op, nth, err, after = fault
            stack.enter_context(linux.inject(nth=nth, errno=err, op=op, after=after))
        yield events
