"""A queue is shared only when its root says so the way ``init --shared`` makes it.

Issue 15, point 9: the reference, run under ``umask 022``, can leave a queue
whose root is ``0755`` (the group may read it, not write it) and whose
contents are ``0700``/``0600``. steadqd took "the group may read the root" for
"shared" and created ``2770`` directories and ``0660`` files in it, widening a
private queue. These tests fabricate such a queue, drive every operation that
creates something (delayed and receipt buckets, the cursor, leases, temps)
through the library and the command line, and check every mode in the tree.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.constants import FORMAT_FILE, PRIVATE_MODES, SHARED_MODES, modes_for_root
from tests.cli.helpers import steadq

PRIVATE_ROOT = 0o755  # what a umask-022 mkdir gives the root the reference was pointed at


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The umask the issue's reproduction ran under; steadq subprocesses inherit it."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def fabricate_reference_private_queue(path: str) -> None:
    """The tree the reference leaves: root 0755, directories 0700, files 0600, FORMAT 0400."""
    Queue.init(path, shards=2).close()
    os.chmod(path, PRIVATE_ROOT)
    for dirpath, dirnames, filenames in os.walk(path):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o700)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o600)
    os.chmod(os.path.join(path, FORMAT_FILE), 0o400)


def modes_in(path: str) -> dict[str, int]:
    """Every entry beneath the root (not the root itself) and its permission bits."""
    out: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, path)] = stat.S_IMODE(os.lstat(full).st_mode)
    return out


def assert_modes(path: str, *, dirs: int, files: int, fmt: int) -> dict[str, int]:
    tree = modes_in(path)
    wrong = {}
    for rel, mode in tree.items():
        full = os.path.join(path, rel)
        want = fmt if rel == FORMAT_FILE else files if os.path.isfile(full) else dirs
        if mode != want:
            wrong[rel] = f"{mode:04o}, want {want:04o}"
    assert not wrong, wrong
    return tree


def assert_workload_created(tree: dict[str, int]) -> None:
    """The modes checked include the kinds of entry the issue names, or the test proves nothing."""
    sep = os.sep
    assert any(r.startswith(f"delayed{sep}") and r.count(sep) == 3 for r in tree), "no delayed job"
    assert any(r.startswith(f"receipts{sep}") and r.count(sep) == 3 for r in tree), "no receipt"
    # Every ready job was consumed, so a job file in ready/<shard>/ is the held lease.
    assert any(r.startswith(f"ready{sep}") and r.count(sep) == 2 for r in tree), "no lease"
    assert f"control{sep}recovery-cursor.json" in tree, "no recovery cursor"


def test_only_a_setgid_group_writable_root_is_shared() -> None:
    for shared in (0o2770, 0o2775, 0o2777):
        assert modes_for_root(stat.S_IFDIR | shared) is SHARED_MODES, oct(shared)
    for private in (0o700, 0o755, 0o750, 0o770, 0o775, 0o2700, 0o2750, 0o2755):
        assert modes_for_root(stat.S_IFDIR | private) is PRIVATE_MODES, oct(private)


def test_library_keeps_a_reference_made_private_queue_private(queue_path: str, umask_022: None) -> None:
    fabricate_reference_private_queue(queue_path)
    with Queue.open(queue_path) as q:
        q.enqueue(b"later", delay=30)
        q.enqueue(b"now")
        lease = q.lease()
        assert lease is not None
        q.ack(lease)
        q.enqueue(b"held")
        assert q.lease(duration=60) is not None
        q.recover()
    tree = assert_modes(queue_path, dirs=0o700, files=0o600, fmt=0o400)
    assert_workload_created(tree)
    assert stat.S_IMODE(os.stat(queue_path).st_mode) == PRIVATE_ROOT


def test_named_temp_publication_keeps_a_private_queue_private(queue_path: str, umask_022: None) -> None:
    """The named-temp path (ZFS, kernels without O_TMPFILE) creates its file in tmp/ first."""
    fabricate_reference_private_queue(queue_path)
    with Queue.open(queue_path) as q:
        q._ctx.publication = "named"  # what ZFS gets
        q.enqueue(b"named")
        q.enqueue(b"named later", delay=30)
    assert_modes(queue_path, dirs=0o700, files=0o600, fmt=0o400)


def test_cli_keeps_a_reference_made_private_queue_private(tmp_path: Path, queue_path: str, umask_022: None) -> None:
    fabricate_reference_private_queue(queue_path)
    for args, stdin in (
        (("put", queue_path, "--delay", "30s"), b"later"),
        (("put", queue_path), b"now"),
        (("lease", queue_path, "--handle-file", tmp_path / "h1"), None),
        (("ack", queue_path, "--handle-file", tmp_path / "h1"), None),
        (("put", queue_path), b"held"),
        (("lease", queue_path, "--handle-file", tmp_path / "h2", "--duration-seconds", "60"), None),
        (("recover", queue_path), None),
    ):
        r = steadq(*args, stdin=stdin)
        assert r.code == 0, (args, r.err)
    tree = assert_modes(queue_path, dirs=0o700, files=0o600, fmt=0o400)
    assert_workload_created(tree)
    assert stat.S_IMODE(os.stat(queue_path).st_mode) == PRIVATE_ROOT


def test_a_shared_root_still_shares(queue_path: str, umask_022: None) -> None:
    """``init --shared`` (2770) keeps giving the group everything created inside."""
    Queue.init(queue_path, shards=2, shared=True).close()
    with Queue.open(queue_path) as q:
        q.enqueue(b"later", delay=30)
        q.enqueue(b"now")
        lease = q.lease()
        assert lease is not None
        q.ack(lease)
        q.enqueue(b"held")
        assert q.lease(duration=60) is not None
        q.recover()
    tree = assert_modes(queue_path, dirs=0o2770, files=0o660, fmt=0o440)
    assert_workload_created(tree)
