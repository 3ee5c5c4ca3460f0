"""The C enqueue against the Python it mirrors, on generated payloads, options and faults (issue 35).

steadqd.fs.publish is the specification; sq_enqueue (steadqd/fs/compiled/publish.c) takes the
happy path of a small bytes payload to ready/ (the name and tag, the header and its digests, the
O_TMPFILE, the write, the nlink check, the fsync, the link in the handle's form, the directory
fsync) and hands every deviation back to it (publish._enqueue_fast). Each example enqueues one job
(a payload around the one-write limit and the queue's maximum, a content type, an attempt limit,
a given job id or a drawn one, the ready directory open or not, the direct or /proc link form, in a
batch or deferred or not, a job file already at the name), optionally with one injected syscall
fault, on both paths. Both must give the same result or error, the same poisoning and link form,
the same tree and, traced, the same syscall sequence; the untraced runs check the libc table.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadqd import Queue
from steadqd.fs import linux, names
from steadqd.fs.compiled import bridge
from steadqd.fs.context import Context
from tests.integration.core_spy import observed, on_path, paths_agree, spy_one_call
from tests.integration.test_claim_core import _normal_trace, _tree

pytestmark = pytest.mark.skipif(not bridge.available(), reason=bridge.path())

WALL = 1_800_000_000_000_000_000
MAX_PAYLOAD = 70_000
FAULT_OPS = ("tmpfile", "write", "fstat", "fsync", "link", "close", "mkdir", "openat2", "getrandom", "dup")


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    top = tempfile.mkdtemp(prefix="enqcore-")
    root = os.path.join(top, "base")
    Queue.init(root, shards=2, max_payload_length=MAX_PAYLOAD, allow_unsupported_fs=True).close()
    yield root
    shutil.rmtree(top)


def _open_fds() -> int:
    """The process's open descriptors, after a collection: an earlier run's handle caught in a reference
    cycle would otherwise close its directories whenever the collector runs, inside a later run's count
    (once in CI: a Python run "left" -1 descriptors)."""
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def _run(base: str, tag: str, case: dict[str, Any], *, pure: bool, traced: bool, fault: Any) -> dict[str, Any]:
    root = os.path.join(os.path.dirname(base), tag)
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base, root, symlinks=True)
    counter = itertools.count(1)
    fds_before = _open_fds()
    with on_path(pure, WALL) as m:
        m.setattr(linux, "boottime_ns", lambda: 5_000_000_000_000)  # a named temp's name
        m.setattr(Context, "random", lambda self, n=16: next(counter).to_bytes(n, "big"))
        q = Queue.open(root, deferred=case["deferred"], allow_unsupported_fs=True)
        try:
            ctx = q._ctx
            assert (ctx.c_core is None) == pure
            ctx.publication = case["form"]
            if case["warm"]:  # the ready directories open, as after the first enqueue into each
                for rel in ctx.ready_rels:
                    ctx.tree.ensure_dir(rel)
            job = bytes(range(1, 17)) if case["job_id"] else None
            if case["taken"]:  # a file already at the name the job gets
                shard = names.shard_of(ctx.fmt.queue_id, job or (1).to_bytes(16, "big"), ctx.fmt.shard_count)
                name = names.ready_filename(
                    ctx.fmt.queue_id, job or (1).to_bytes(16, "big"), 0, 0, case["max_attempts"], shard=shard,
                    lease_width_ns=ctx.fmt.lease_width_ns,
                )  # fmt: skip
                with open(os.path.join(root, ctx.ready_rels[shard], name), "wb") as f:
                    f.write(b"taken")
            options: dict[str, Any] = {"max_attempts": case["max_attempts"], "content_type": case["content_type"]}
            if job is not None:
                options["job_id"] = job.hex()
            with observed(traced, fault, q.batch() if case["batch"] else None) as events:
                try:
                    result: Any = q.enqueue_detailed(b"p" * case["size"], **options)
                except Exception as e:
                    result = (type(e).__name__, str(e).replace(root, "<root>"))
            poisoned, form = ctx.poisoned, ctx.publication
        finally:
            with contextlib.suppress(Exception):
                q.close()
    return {
        "result": result,
        "poisoned": None if poisoned is None else str(poisoned).replace(root, "<root>"),
        "form": form,
        "tree": _tree(root),
        "trace": _trace(events),
        "fds_left": _open_fds() - fds_before,
    }


def _trace(events: list[linux.TraceEvent]) -> list[tuple[Any, ...]]:
    """_normal_trace, with a link's descriptors (after its form) renumbered too."""
    fds: dict[int, int] = {}
    out = []
    for op, detail, failed in _normal_trace(events):
        d = list(detail)
        if op == "link":
            d[1], d[2] = (fds.setdefault(x, len(fds)) if type(x) is int else x for x in d[1:3])
        out.append((op, tuple(d), failed))
    return out


def _compare(base: str, case: dict[str, Any], fault: Any) -> None:
    paths_agree(
        lambda tag, pure, traced: _run(base, tag, case, pure=pure, traced=traced, fault=fault if traced else None),
        ("result", "poisoned", "form", "tree", "fds_left"),
    )


cases = st.fixed_dictionaries(
    {
        "size": st.sampled_from([0, 1, 100, 4000, 65536, 65537, MAX_PAYLOAD, MAX_PAYLOAD + 1]),
        "content_type": st.sampled_from(["application/octet-stream", "text/plain", "x" * 70_000]),
        "max_attempts": st.sampled_from([1, 3, (1 << 32) - 1]),
        "job_id": st.booleans(),
        "warm": st.booleans(),
        "form": st.sampled_from(["direct", "proc", "named"]),
        "batch": st.booleans(),
        "deferred": st.booleans(),
        "taken": st.booleans(),
    }
)
faults = st.none() | st.tuples(
    st.none() | st.sampled_from(FAULT_OPS),
    st.integers(1, 10),
    st.sampled_from([errno.EIO, errno.ENOENT, errno.EPERM, errno.ENOSPC, errno.EEXIST, errno.EOPNOTSUPP]),
    st.booleans(),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases, fault=faults)
def test_core_and_python_agree(base: str, case: dict[str, Any], fault: Any) -> None:
    _compare(base, case, fault)


PLAIN = {
    "size": 100, "content_type": "application/octet-stream", "max_attempts": 3, "job_id": False, "warm": True,
    "form": "direct", "batch": False, "deferred": False, "taken": False,
}  # fmt: skip


@pytest.mark.parametrize("after", [False, True])
@pytest.mark.parametrize("nth", range(1, 11))
@pytest.mark.parametrize("form", ["direct", "proc"])
def test_a_fault_at_each_syscall_of_an_enqueue(base: str, form: str, nth: int, after: bool) -> None:
    """Every position of a plain enqueue's syscall sequence failing (EIO, before or after its effect)."""
    _compare(base, {**PLAIN, "form": form}, (None, nth, errno.EIO, after))


@pytest.mark.parametrize("errno_", [errno.EPERM, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.EEXIST])
@pytest.mark.parametrize("form", ["direct", "proc"])
def test_a_link_form_that_fails(base: str, form: str, errno_: int) -> None:
    """The first link attempt refused: the Python tries the other form, names a temp or refuses, from C's record."""
    _compare(base, {**PLAIN, "form": form}, ("link", 1, errno_, False))


def test_a_plain_enqueue_is_the_cores(base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small job into an open ready directory is published by the core in one call, with the pinned syscalls."""
    stages, made = spy_one_call(monkeypatch, "enqueue")
    out = _run(base, "fast", PLAIN, pure=False, traced=False, fault=None)
    assert isinstance(out["result"], tuple) and len(out["result"]) == 2 and out["result"][1].startswith("ready/")
    assert stages == [bridge.PUBLISHED]
    assert made == ["tmpfile", "write", "fstat", "fsync", "link", "fsync"]
