"""Crash lab lane 2 in CI: the oracle (LazyFS journal, own persistence model) finds no bad state.

Also: the oracle catches bugs lane 1 is blind to by construction (an fsync that
the Linux layer issues but that never reaches the file system), and the
deliberately broken protocols lane 1 catches; the FUSE server behaves like a
file system where the queue relies on it; the model is pinned on small journals.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from steadqd import Queue
from steadqd.fs import linux
from tests.crash.conftest import ORACLE_RESULTS
from tests.lab import bugs
from tests.lab.lab import format_report, format_table, run_workload
from tests.lab.lazyfs import Chmod, Create, Fsync, Link, Mkdir, Rename, Truncate, Unlink, Write, mounted
from tests.lab.lazystates import crash_states, materialise
from tests.lab.oracle import run_oracle
from tests.lab.workloads import WORKLOADS, Workload
from tests.prereq import partial_run

MIN_STATES_PER_RUN = 500


# One xdist worker runs every workload: test_enough_oracle_states_per_run counts what this process ran.
pytestmark = [pytest.mark.usefixtures("need_lazyfs"), pytest.mark.xdist_group("crash/test_oracle_lane.py")]


@pytest.fixture
def mnt() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="steadq-lazyfs-") as d:
        yield d


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_oracle_state_recovers(name: str) -> None:
    r = run_oracle(WORKLOADS[name])
    ORACLE_RESULTS.append(r)
    assert r.states > 0, f"{name}: no crash state was checked"
    assert r.failed == 0, (
        f"{name}: {r.failed} of {r.states} crash states fail the gates\n{format_report(r, syscalls='requests')}"
    )


def test_enough_oracle_states_per_run() -> None:
    if {r.workload for r in ORACLE_RESULTS} != set(WORKLOADS):
        partial_run("only meaningful when every workload ran in this session")
    assert sum(r.trees for r in ORACLE_RESULTS) >= MIN_STATES_PER_RUN, format_table(ORACLE_RESULTS)


# -- the oracle can fail, including where lane 1 cannot ------------------------------------------


def _oracle_messages(wl: Workload, mutate: Callable[[], AbstractContextManager[object]]) -> str:
    # Every failing state is kept: which kind comes first depends on the run (see below).
    r = run_oracle(wl, mutate=mutate, keep=10**6)
    assert r.failed > 0, f"the injected bug went unnoticed by the oracle\n{format_report(r, syscalls='requests')}"
    return "\n".join(m for f in r.failures for m in f["failures"])  # type: ignore[attr-defined]


# A 10 ms bucket makes the run advance the wall watermark (a 10 s bucket does so only when
# the run happens to cross a boundary); the lying fsync then breaks it too, and those
# failures must not crowd the job's out of the report.
@pytest.mark.parametrize("width", [None, 10_000_000], ids=["default-bucket", "watermark-advances"])
def test_oracle_catches_a_lying_fsync_that_lane_1_cannot_see(width: int | None) -> None:
    wl = WORKLOADS["enqueue"]
    if width is not None:
        wl = dataclasses.replace(wl, init={"delayed_width_ns": width})
    lane1 = run_workload(wl, mutate=bugs.lying_file_fsync)
    assert lane1.failed == 0, "lane 1 trusts the Linux layer's trace; if it now sees this, update docs/crash-lab.md"
    msgs = _oracle_messages(wl, bugs.lying_file_fsync)
    assert "committed job" in msgs and "quarantined" in msgs, msgs
    if width is not None:
        assert "control/wall-watermark: does not authenticate" in msgs, msgs


def test_oracle_catches_a_job_file_that_is_never_fsynced() -> None:
    msgs = _oracle_messages(WORKLOADS["enqueue"], bugs.job_file_never_fsynced)
    assert "committed job" in msgs and "quarantined" in msgs, msgs
    assert "is absent" in msgs and "allowed: ['ready']" in msgs, msgs


def test_oracle_catches_an_enqueue_many_whose_files_are_never_fsynced() -> None:
    msgs = _oracle_messages(WORKLOADS["enqueue_many"], bugs.job_file_never_fsynced)
    assert "committed job" in msgs or "violates invariants" in msgs, msgs  # lost, or torn behind its name


def test_oracle_catches_link_before_fsync() -> None:
    msgs = _oracle_messages(WORKLOADS["enqueue"], bugs.link_before_fsync)
    assert "object does not verify" in msgs and "fsck ERROR" in msgs, msgs


def test_oracle_catches_a_settle_without_its_source_barrier() -> None:
    msgs = _oracle_messages(WORKLOADS["ack"], bugs.settle_without_source_barrier)
    assert "allowed: ['receipt']" in msgs, msgs  # an acknowledged job is active again


def test_oracle_catches_a_directory_created_without_its_parent_barrier() -> None:
    msgs = _oracle_messages(WORKLOADS["retry_later"], bugs.dirs_without_parent_barrier)
    assert "allowed: ['delayed']" in msgs, msgs  # a retried-later job is ready early, or lost


# -- the FUSE server behaves like a file system where a queue relies on it ----------------------


def test_lazyfs_renames_links_and_removes(mnt: str) -> None:
    with mounted(mnt) as fs:
        d = os.path.join(mnt, "d")
        os.mkdir(d, 0o750)
        a, b = os.path.join(d, "a"), os.path.join(d, "b")
        Path(a).write_bytes(b"A")
        Path(b).write_bytes(b"B")
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(FileExistsError):
                linux.rename_noreplace(dfd, "a", dfd, "b")
            linux.rename_noreplace(dfd, "a", dfd, "c")
            os.rename(os.path.join(d, "c"), b)  # plain rename replaces
            assert sorted(os.listdir(d)) == ["b"] and Path(b).read_bytes() == b"A"
            os.link(b, os.path.join(d, "l"))
            assert os.stat(b).st_nlink == 2
            with open(b, "rb") as held:
                os.unlink(b)
                os.unlink(os.path.join(d, "l"))
                assert held.read() == b"A"  # an unlinked file stays readable while open
            os.mkdir(os.path.join(d, "sub"))
            Path(d, "sub", "x").write_bytes(b"")
            with pytest.raises(OSError, match="not empty"):
                os.rmdir(os.path.join(d, "sub"))
        finally:
            os.close(dfd)
    kinds = [type(op).__name__ for op in fs.journal]
    assert kinds.count("Rename") == 2 and kinds.count("Link") == 1 and kinds.count("Mkdir") == 2
    rename = next(op for op in fs.journal if isinstance(op, Rename) and op.replaced is not None)
    assert rename.src_name == b"c" and rename.dst_name == b"b"


def test_lazyfs_tmpfile_link_fsync_and_rewound_listing(mnt: str) -> None:
    with mounted(mnt) as fs:
        dfd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fd = os.open(mnt, os.O_TMPFILE | os.O_RDWR, 0o600)
            os.write(fd, b"payload")
            os.fsync(fd)
            os.fchmod(fd, 0o400)
            assert linux.list_dir(dfd) == []
            linux.link_tmpfile(fd, dfd, "job")  # the path steadq uses on ext4/XFS/btrfs
            os.close(fd)
            os.fsync(dfd)
            assert linux.list_dir(dfd) == [b"job"]  # the same cached fd sees the new entry
            with open(os.path.join(mnt, "job"), "r+b") as f:
                f.truncate(3)
            assert Path(mnt, "job").read_bytes() == b"pay"
            assert os.statvfs(mnt).f_namemax == 255
        finally:
            os.close(dfd)
    create, write, fsync = fs.journal[0], fs.journal[1], fs.journal[2]
    assert isinstance(create, Create) and create.parent == 0  # O_TMPFILE: no name yet
    assert write == Write(create.ino, 0, b"payload") and fsync == Fsync(create.ino, is_dir=False)
    assert Chmod(create.ino, 0o400) in fs.journal and Link(1, b"job", create.ino) in fs.journal
    assert Fsync(1, is_dir=True) in fs.journal and Truncate(create.ino, 3) in fs.journal


def test_lazyfs_hosts_a_queue(mnt: str) -> None:
    with mounted(mnt):
        root = os.path.join(mnt, "q")
        with Queue.init(root, shards=2, allow_unsupported_fs=True) as q:
            job = q.enqueue(b"hello", max_attempts=2)
            lease = q.lease(duration=30)
            assert lease is not None and lease.job_id == job and lease.payload() == b"hello"
            q.retry(lease, delay=0)
            lease = q.lease(duration=30)
            assert lease is not None
            q.ack(lease)
            assert q.fsck().errors == []
        with pytest.raises(Exception, match="unsupported|fuse|FUSE"):
            Queue.open(root)  # not a filesystem steadqd vouches for without the override


# -- the model, on small journals ----------------------------------------------------------------


def _trees(journal: list[object], k: int, base: int = 0) -> set[frozenset[tuple[str, bytes]]]:
    return {
        frozenset((e.path, e.data) for e in st.image if not e.is_dir)
        for st in crash_states(journal, base)  # type: ignore[arg-type]
        if st.point == k
    }


def test_model_unsynced_name_may_vanish_synced_one_stays() -> None:
    j = [Mkdir(1, b"d", 2, 0o700), Fsync(1, True), Create(0, b"", 3, 0o600), Write(3, 0, b"x"), Fsync(3, False)]
    j += [Link(2, b"a", 3), Fsync(2, True)]
    assert _trees(j, 6, base=2) == {frozenset(), frozenset({("d/a", b"x")})}
    assert _trees(j, 7, base=2) == {frozenset({("d/a", b"x")})}


def test_model_unsynced_data_variants() -> None:
    j = [Create(1, b"f", 2, 0o600), Fsync(1, True), Write(2, 0, b"abcd")]
    assert _trees(j, 3, base=2) == {
        frozenset({("f", b"")}),
        frozenset({("f", b"abcd")}),
        frozenset({("f", b"ab")}),
        frozenset({("f", b"\0\0\0\0")}),
    }


def test_model_rename_is_atomic_and_needs_both_directories() -> None:
    base = [Mkdir(1, b"a", 2, 0o700), Mkdir(1, b"b", 3, 0o700), Create(2, b"x", 4, 0o600), Write(4, 0, b"j")]
    j = [*base, Rename(2, b"x", 3, b"y", 4, None), Fsync(3, True), Fsync(2, True)]
    assert _trees(j, 6, base=4) == {frozenset({("a/x", b"j")}), frozenset({("b/y", b"j")})}  # never both, never none
    assert _trees(j, 7, base=4) == {frozenset({("b/y", b"j")})}


def test_model_a_change_that_persisted_took_its_directory_along() -> None:
    base = [Create(1, b"x", 2, 0o600), Write(2, 0, b"j")]
    j = [*base, Mkdir(1, b"n", 3, 0o700), Rename(1, b"x", 3, b"x", 2, None)]
    # The rename may persist only with the mkdir: never the job inside an unreachable directory.
    assert _trees(j, 4, base=2) == {frozenset({("x", b"j")}), frozenset({("n/x", b"j")})}
    # A *durable* rename into a directory whose own entry never persisted is lost with it
    # (fsync(n) says nothing about n's entry in the root): the pessimistic POSIX reading.
    base2 = [Mkdir(1, b"a", 2, 0o700), Create(2, b"x", 4, 0o600), Write(4, 0, b"j")]
    j2 = [*base2, Mkdir(1, b"n", 3, 0o700), Rename(2, b"x", 3, b"x", 4, None), Fsync(3, True), Fsync(2, True)]
    assert _trees(j2, 7, base=3) == {frozenset(), frozenset({("n/x", b"j")})}


def test_model_unlink_and_materialise(tmp_path: Path) -> None:
    j = [Mkdir(1, b"d", 2, 0o750), Create(2, b"a", 3, 0o600), Write(3, 0, b"1"), Link(2, b"b", 3), Chmod(3, 0o400)]
    j += [Unlink(2, b"a", 3)]
    states = [st for st in crash_states(j, len(j) - 1) if st.point == len(j) and st.names == "all of the undurable"]
    (st,) = [s for s in states if s.data == "synced"]
    dest = str(tmp_path / "m")
    os.mkdir(dest)
    materialise(st.image, dest)
    assert os.listdir(os.path.join(dest, "d")) == ["b"]
    assert oct(os.stat(os.path.join(dest, "d")).st_mode & 0o777) == oct(0o750)
    assert oct(os.stat(os.path.join(dest, "d", "b")).st_mode & 0o777) == oct(0o400)
    j.append(Link(2, b"c", 3))
    (st,) = [s for s in crash_states(j, len(j)) if s.point == len(j)]
    dest2 = str(tmp_path / "m2")
    os.mkdir(dest2)
    materialise(st.image, dest2)
    assert os.stat(os.path.join(dest2, "d", "b")).st_nlink == 2
