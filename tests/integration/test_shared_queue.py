"""A shared queue: producers and consumers of different users in one group.

Children are forked and drop to unprivileged uids that share only the
queue's group, exactly like a producer in the steadq group and the steadq
daemon user. Python is already loaded in the child, so nothing has to be
readable from their point of view except the queue itself.
"""

from __future__ import annotations

import os
import stat

import pytest

from steadqd import Queue
from tests.invariants import check_tree

QUEUE_GID = 54321
PRODUCER = (54322, 54322)
CONSUMER = (54323, 54323)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


def as_user(uid_gid: tuple[int, int], fn) -> int:
    """Run fn() in a forked child as uid/gid with the queue group; return its exit status."""
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.setgroups([QUEUE_GID])
            os.setgid(uid_gid[1])
            os.setuid(uid_gid[0])
            os.umask(0o007)
            code = fn()
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("shared")
    os.chmod(d, 0o755)  # traversable by the test users; the queue guards itself
    parent = str(d)
    while parent != "/":  # pytest's base dirs are 0700 by default
        os.chmod(parent, os.stat(parent).st_mode | 0o011)
        parent = os.path.dirname(parent)
    return str(d)


def test_group_members_produce_and_consume(base):
    path = os.path.join(base, "q")
    os.mkdir(path, 0o700)
    os.chown(path, 0, QUEUE_GID)
    Queue.init(path, shards=4, shared=True).close()
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o2770 and st.st_gid == QUEUE_GID

    def produce() -> int:
        with Queue.open(path) as q:
            for i in range(5):
                q.enqueue(b"job %d" % i, delay=0)
            q.enqueue(b"later", delay=3600)
        return 0

    def consume() -> int:
        done = 0
        with Queue.open(path) as q:
            while (lease := q.lease()) is not None:
                assert lease.payload().startswith(b"job ")
                q.ack(lease)
                done += 1
            q.recover()  # compaction and cursor writes as the consumer user
        return 0 if done == 5 else 2

    assert as_user(PRODUCER, produce) == 0
    assert as_user(CONSUMER, consume) == 0
    state = check_tree(path)
    assert len(state.ids("receipt")) == 5 and len(state.ids("delayed")) == 1
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            st = os.lstat(os.path.join(dirpath, name))
            assert st.st_gid == QUEUE_GID, f"{dirpath}/{name} lost the queue group"
            assert st.st_mode & 0o060, f"{dirpath}/{name} is not group accessible"


def test_private_queue_refuses_other_users(base):
    path = os.path.join(base, "private")
    Queue.init(path, shards=2).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700

    def produce() -> int:
        try:
            Queue.open(path)
        except Exception:
            return 3
        return 0

    assert as_user(PRODUCER, produce) == 3
    assert check_tree(path).ids("ready") == set()
