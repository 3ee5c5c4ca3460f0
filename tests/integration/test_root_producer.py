"""Root producing into a private queue another user owns (issue 33 #1).

The daemon's queue belongs to `steadq` (0700/0600). Root's `steadq put`
used to leave a root-owned 0600 job there, which the owner could never
lease: the worker looped on EACCES while `put` had exited 0. Root now gives
every entry it creates to the queue root's owner; where it cannot (no
CAP_CHOWN), the put is refused in one line and nothing is published.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from steadqd import Queue
from steadqd.errors import NotCommitted
from steadqd.fs.doctor import doctor_checks
from tests.integration.test_shared_queue import PRODUCER, as_user, base  # noqa: F401 (fixture)
from tests.invariants import check_tree

OWNER = PRODUCER  # an unprivileged uid standing for the daemon's `steadq`

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


def _owned_queue(base: str, name: str) -> str:  # noqa: F811
    path = os.path.join(base, name)
    os.mkdir(path, 0o700)
    os.chown(path, *OWNER)
    assert as_user(OWNER, lambda: Queue.init(path, shards=2).close()) == "ok"
    return path


def _entries(path: str) -> list[tuple[str, os.stat_result]]:
    found = []
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            found.append((os.path.relpath(p, path), os.lstat(p)))
    return found


def test_root_put_into_the_owners_private_queue_is_leasable_by_the_owner(base):  # noqa: F811
    path = _owned_queue(base, "transcode")
    with Queue.open(path) as q:  # as root
        for i in range(3):
            q.enqueue(b"job %d" % i, delay=0)
        q.enqueue_many([b"many 1", b"many 2"])
        q.enqueue(b"later", delay=3600)  # a new delayed bucket directory
    not_owned = [rel for rel, st in _entries(path) if (st.st_uid, st.st_gid) != OWNER]
    assert not_owned == [], f"root left entries the owner does not own: {not_owned}"

    def consume() -> None:
        done = 0
        with Queue.open(path) as q:
            while (lease := q.lease()) is not None:
                q.ack(lease)
                done += 1
            q.recover()
        assert done == 5, f"the owner leased {done} of 5 jobs root produced"

    assert as_user(OWNER, consume) == "ok"
    state = check_tree(path)
    assert len(state.ids("receipt")) == 5 and len(state.ids("delayed")) == 1


def test_root_without_cap_chown_is_refused_in_one_line_and_publishes_nothing(base):  # noqa: F811
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv (util-linux) to drop CAP_CHOWN")
    steadq = shutil.which("steadq", path=os.path.dirname(sys.executable))
    assert steadq is not None
    path = _owned_queue(base, "nochown")
    r = subprocess.run(
        [setpriv, "--bounding-set", "-chown", "--inh-caps", "-chown", "--", steadq, "put", path, "-"],
        input=b"payload",
        capture_output=True,
        check=False,
        timeout=60,
    )
    err = r.stderr.decode()
    owner = f"uid {OWNER[0]}"
    assert r.returncode == 5, err
    assert len(err.splitlines()) == 1, err
    assert f"this queue belongs to {owner} and root cannot give a new job to {owner}" in err, err
    assert "steadq init --shared" in err, err
    assert r.stdout == b""
    assert check_tree(path).ids("ready") == set()


def _root_owned_job(path: str) -> str:
    """A ready job root left before it gave its jobs away: owner root:root, 0600. Returns its path."""
    with Queue.open(path) as q:
        job = q.enqueue(b"stuck", delay=0)
    rel = check_tree(path).get(job).path
    os.chown(os.path.join(path, rel), 0, 0)
    return os.path.join(path, rel)


def test_the_owners_lease_names_the_jobs_owner_and_the_fix(base):  # noqa: F811
    path = _owned_queue(base, "stuck")
    job = _root_owned_job(path)

    def lease() -> None:
        with Queue.open(path) as q:
            try:
                q.lease()
            except NotCommitted as e:
                message = e.message
            else:
                raise AssertionError("the lease of an unreadable job did not fail")
        assert "Permission denied: the job is owner root:root, mode 0600" in message, message
        assert f"run: chown {OWNER[0]}: {job}" in message, message
        assert "init --shared" in message, message

    assert as_user(OWNER, lease) == "ok"


def test_doctor_finds_jobs_the_queues_owner_cannot_read(base):  # noqa: F811
    path = _owned_queue(base, "doctor")
    checks = {c.name: c for c in doctor_checks(path)}
    assert checks["job_access"].ok, checks["job_access"]
    assert checks["job_access"].value == f"0 ready and delayed jobs, all readable by uid {OWNER[0]}"
    job = _root_owned_job(path)
    rel = os.path.relpath(job, path)
    check = {c.name: c for c in doctor_checks(path)}["job_access"]
    assert not check.ok
    assert check.value == (
        f"1 of 1 ready and delayed jobs cannot be read by uid {OWNER[0]} (the queue's owner), e.g. {rel} "
        f"(owner root:root, mode 0600); run: chown -R {OWNER[0]}: {path}, and let producers run as "
        f"uid {OWNER[0]} or use a queue made with init --shared"
    )
