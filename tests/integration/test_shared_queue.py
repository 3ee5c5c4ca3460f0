"""A shared queue: producers and consumers of different users in one group.

Children are forked and drop to unprivileged uids that share only the
queue's group, exactly like a producer in the steadq group and the steadq
daemon user. Python is already loaded in the child, so nothing has to be
readable from their point of view except the queue itself.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import traceback
from collections.abc import Callable

import pytest

from steadqd import Queue
from steadqd.errors import SteadQError
from tests.invariants import check_tree

QUEUE_GID = 54321
PRODUCER = (54322, 54322)
CONSUMER = (54323, 54323)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


def is_refusal(exc: BaseException) -> bool:
    """The kernel refusing a user outside the queue's group: ``PermissionError`` with EACCES.

    A private root is ``0700``, so opening it as another user fails with
    EACCES; a ``SteadQError`` counts only when it wraps exactly that. Any
    other failure (EPERM from a privilege the test lacks, an ``OSError`` of
    another errno, a bug) is not a refusal and must fail the test.
    """
    if isinstance(exc, SteadQError):
        exc = exc.__cause__ or exc
    return isinstance(exc, PermissionError) and exc.errno == errno.EACCES


def as_user(uid_gid: tuple[int, int], fn: Callable[[], None]) -> str:
    """Run fn() in a forked child as uid/gid with only the queue group.

    Returns ``"ok"``, or ``"refused"`` when fn raised what ``is_refusal``
    accepts. Anything else the child raised (an assertion in fn included),
    or a child that died without reporting, fails the calling test with the
    child's traceback.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        os.close(read_end)
        report: dict[str, str] = {"outcome": "error", "detail": "the child reported nothing"}
        try:
            os.setgroups([QUEUE_GID])
            os.setgid(uid_gid[1])
            os.setuid(uid_gid[0])
            os.umask(0o007)
            fn()
            report = {"outcome": "ok", "detail": ""}
        except BaseException as exc:
            outcome = "refused" if is_refusal(exc) else "error"
            report = {"outcome": outcome, "detail": traceback.format_exc()}
        finally:
            with os.fdopen(write_end, "w") as out:
                out.write(json.dumps(report))
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not text:
        pytest.fail(f"child as uid {uid_gid[0]} died (exit status {code}) without a report: {text!r}")
    report = json.loads(text)
    if report["outcome"] == "error":
        pytest.fail(f"child as uid {uid_gid[0]} failed:\n{report['detail']}")
    return report["outcome"]


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

    def produce() -> None:
        with Queue.open(path) as q:
            for i in range(5):
                q.enqueue(b"job %d" % i, delay=0)
            q.enqueue(b"later", delay=3600)

    def consume() -> None:
        done = 0
        with Queue.open(path) as q:
            while (lease := q.lease()) is not None:
                assert lease.payload().startswith(b"job ")
                q.ack(lease)
                done += 1
            q.recover()  # compaction and cursor writes as the consumer user
        assert done == 5, f"consumed {done} jobs, expected 5"

    assert as_user(PRODUCER, produce) == "ok"
    assert as_user(CONSUMER, consume) == "ok"
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

    def produce() -> None:
        Queue.open(path).close()

    assert as_user(PRODUCER, produce) == "refused"
    assert check_tree(path).ids("ready") == set()
