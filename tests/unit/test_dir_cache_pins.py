"""The directory cache is unpinned and trimmed after every lease, copy and ack.

Queue.copy_payload and guards.guarded (Queue.lease's checks and first scan run under it) write Tree.pin and
Tree.unpin out (no call); the cache must still end each operation unpinned and trimmed to ``max_cached`` as
Tree.unpin leaves it.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from steadqd import Queue
from steadqd.fs.tree import Tree


def _settled(q: Queue) -> tuple[int, int]:
    tree = q._ctx.tree
    return tree._pins, len(tree._dirs)


def test_lease_copy_and_ack_leave_the_cache_unpinned_and_trimmed(tmp_path: Path) -> None:
    root = os.path.join(tmp_path, "q")
    Queue.init(root, shards=4, allow_unsupported_fs=True).close()
    with Queue.open(root, allow_unsupported_fs=True) as q:
        for i in range(6):
            q.enqueue(b"payload %d" % i)
        q._ctx.tree.max_cached = 1  # this handle's cache: every operation opens more than that
        for _ in range(3):
            lease = q.lease(wait=0, duration=60)
            assert lease is not None
            assert _settled(q) == (0, 1)
            out = io.BytesIO()
            q.copy_payload(lease, out)
            assert out.getvalue().startswith(b"payload ")
            assert _settled(q) == (0, 1)
            q.ack(lease)
            assert _settled(q) == (0, 1)
        with q.batch():
            leases = [q.lease(wait=0, duration=60) for _ in range(3)]
            assert _settled(q) == (0, 1)
            for lease in leases:
                assert lease is not None
                q.ack(lease)
                assert _settled(q) == (0, 1)
        assert q.lease(wait=0, duration=60) is None
        assert _settled(q) == (0, 1)


def test_every_cached_lookup_makes_its_directory_the_most_recently_used(tmp_path: Path) -> None:
    """cached_fd, cached_fds, cached_fd_pair, dir and ensure_dir share one lookup rule: a hit is touched
    (kept at the next trim), a miss opens nothing; only dir and ensure_dir open on a miss."""
    names = ["a", "b", "c", "d", "e", "f"]
    for name in names:
        (tmp_path / name).mkdir()
    root_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    tree = Tree(root_fd, 1)
    try:
        fds = {name: tree.dir(name) for name in names[:5]}  # LRU order a..e
        assert tree.cached_fd("a") == fds["a"]
        assert tree.cached_fds(["b", None, "f"]) == [fds["b"], None, None]
        assert tree.cached_fd_pair("c", "f") == (fds["c"], None)
        assert tree.ensure_dir("d") == fds["d"]
        assert list(tree._dirs) == ["e", "a", "b", "c", "d"]  # "f" was not opened by a lookup
        tree.max_cached = 4
        tree.pin()
        tree.unpin()  # trims the least recently used: "e", which no lookup touched
        assert list(tree._dirs) == ["a", "b", "c", "d"]
    finally:
        tree.close()
        os.close(root_fd)
