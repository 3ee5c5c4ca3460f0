"""steadqd on real filesystems, and the refusals of init/open (layout.md).

Why these are integration tests: the guarantees rest on what the kernel's
filesystem actually does -- the statfs magic that decides whether a queue may
live there, O_TMPFILE + linkat publication, renameat2(RENAME_NOREPLACE) for
every transition. /tmp is only ext4, so ext4, xfs and btrfs each get a small
loop-device filesystem (tests/loopfs.py), and the refusals use the machine's
real tmpfs (/dev/shm) and a real overlayfs mount.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator

import pytest

from steadqd import Queue
from steadqd.constants import DOMAIN_FORMAT, FORMAT_SIZE, STATE_DIRS, State
from steadqd.errors import InvalidInput, QueueCorrupt, UnsupportedFilesystem, UnsupportedFormat
from steadqd.fs import linux
from steadqd.fs.layout import filesystem_name
from steadqd.fs.records import FormatRecord, sha256
from steadqd.fs.settle import AckResult

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loopfs import FS_MAGIC, loop_filesystem, overlay_mount  # noqa: E402

FILESYSTEMS = ("ext4", "xfs", "btrfs")
TMPFS_MAGIC = 0x01021994


# --------------------------------------------------------------------------- helpers


def files_under(root: str) -> list[str]:
    """Every non-directory entry below ``root`` (relative paths)."""
    out: list[str] = []
    for dirpath, _dirs, files in os.walk(root):
        out.extend(os.path.relpath(os.path.join(dirpath, f), root) for f in files)
    return sorted(out)


def assert_clean_scratch(root: str) -> None:
    """No leaked temp file and nothing quarantined: the operations left no debris."""
    assert files_under(os.path.join(root, "tmp")) == []
    assert os.listdir(os.path.join(root, "quarantine")) == []


@pytest.fixture(scope="module", params=FILESYSTEMS)
def mounted(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """One loop filesystem per type for the whole module: mkfs once, many queues."""
    fstype: str = request.param
    with loop_filesystem(fstype) as mnt:
        yield fstype, mnt


@pytest.fixture
def queue_dir(mounted: tuple[str, str], request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """A fresh, not yet existing queue path on the mounted filesystem."""
    fstype, mnt = mounted
    path = os.path.join(mnt, request.node.name.split("[")[0])
    yield fstype, path
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- real filesystems


@pytest.mark.loopfs
def test_statfs_detection_and_tmpfile_publication(queue_dir: tuple[str, str]) -> None:
    """open() reads the real statfs magic and O_TMPFILE publication works there."""
    fstype, path = queue_dir
    with Queue.init(path, shards=4) as q:
        assert q._ctx.fs_magic == FS_MAGIC[fstype]
        assert filesystem_name(q._ctx.fs_magic) == fstype
        with linux.trace() as events:
            job = q.enqueue(b"published through an anonymous inode")
        ops = [e.op for e in events]
        assert "tmpfile" in ops and "link" in ops
        assert "rename_noreplace" not in ops  # no named-temp fallback was needed
        assert q.publication_mode in {"direct", "proc"}
        [info] = q.inspect(job)
        assert info.state is State.READY
        assert_clean_scratch(path)


@pytest.mark.loopfs
def test_full_lifecycle(queue_dir: tuple[str, str]) -> None:
    """enqueue (ready + delayed), lease, renew, ack, retry, bury on the real filesystem."""
    _fstype, path = queue_dir
    with Queue.init(path, shards=4) as q:
        ready_job = q.enqueue(b"alpha", metadata={"n": 1}, content_type="text/plain")
        delayed_job = q.enqueue(b"later", delay=3600)
        assert [i.state for i in q.inspect(delayed_job)] == [State.DELAYED]
        assert len(files_under(os.path.join(path, "delayed"))) == 1

        lease = q.lease()
        assert lease is not None and lease.job_id == ready_job  # the delayed job is not due
        assert lease.payload() == b"alpha"
        assert lease.metadata == {"n": 1} and lease.content_type == "text/plain"
        assert q.lease() is None

        old_path, old_deadline, old_gen = lease.path, lease.wall_deadline_ns, lease.generation
        q.renew(lease, duration=120)
        assert lease.path != old_path and lease.generation == old_gen + 1
        assert lease.wall_deadline_ns > old_deadline
        assert not os.path.exists(os.path.join(path, old_path))
        assert os.path.exists(os.path.join(path, lease.path))
        assert [i.state for i in q.inspect(ready_job)] == [State.LEASED]

        assert q.ack(lease) is AckResult.ACKED
        assert q.ack(lease) is AckResult.ALREADY_ACKED
        [receipt] = q.inspect(ready_job)
        assert receipt.state is State.RECEIPT and receipt.path.startswith("receipts/")

        retried = q.enqueue(b"again", max_attempts=5)
        first = q.lease()
        assert first is not None and first.job_id == retried and first.attempt == 1
        assert q.retry(first, delay=0) == "ready"
        second = q.lease()
        assert second is not None and second.job_id == retried and second.attempt == 2
        assert second.token != first.token
        assert q.retry(second, delay=3600) == "delayed"
        assert sorted(i.state for i in q.inspect(retried)) == [State.DELAYED]

        buried = q.enqueue(b"poison")
        third = q.lease()
        assert third is not None and third.job_id == buried
        q.bury(third, reason=7)
        [dead] = q.inspect(buried)
        assert dead.state is State.DEAD and dead.name.reason == 7

        assert q.lease() is None
        assert files_under(os.path.join(path, "ready")) == []
        assert len(files_under(os.path.join(path, "delayed"))) == 2
        assert_clean_scratch(path)
        assert q.poisoned is None


@pytest.mark.loopfs
def test_named_temp_fallback(queue_dir: tuple[str, str]) -> None:
    """The named-temp path (ZFS, kernels without O_TMPFILE) publishes and cleans tmp/."""
    _fstype, path = queue_dir
    with Queue.init(path, shards=4) as q:
        q._ctx.publication = "named"
        with linux.trace() as events:
            job = q.enqueue(b"via tmp/")
        ops = [e.op for e in events]
        assert "tmpfile" not in ops and "rename_noreplace" in ops
        assert q.publication_mode == "named"
        assert os.path.isdir(os.path.join(path, "tmp", q.boot_id))  # the temp really went through tmp/
        lease = q.lease()
        assert lease is not None and lease.job_id == job and lease.payload() == b"via tmp/"
        assert q.ack(lease) is AckResult.ACKED
        assert [i.state for i in q.inspect(job)] == [State.RECEIPT]
        assert_clean_scratch(path)


# --------------------------------------------------------------------------- refused filesystems


@pytest.fixture
def shm_dir() -> Iterator[str]:
    """A scratch directory on /dev/shm (tmpfs)."""
    if not os.path.isdir("/dev/shm") or linux.statfs_type("/dev/shm") != TMPFS_MAGIC:
        pytest.skip("/dev/shm is not a tmpfs here")
    d = tempfile.mkdtemp(prefix="steadq-shm-", dir="/dev/shm")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_tmpfs_refused_by_init(shm_dir: str) -> None:
    path = os.path.join(shm_dir, "q")
    with pytest.raises(UnsupportedFilesystem, match="tmpfs"):
        Queue.init(path)
    assert not os.path.exists(os.path.join(path, "FORMAT"))


def test_tmpfs_refused_by_open_unless_allowed(shm_dir: str) -> None:
    """allow_unsupported_fs lets tmpfs through; without it open refuses the same queue."""
    path = os.path.join(shm_dir, "q")
    with Queue.init(path, shards=2, allow_unsupported_fs=True) as q:
        assert filesystem_name(q._ctx.fs_magic) == "tmpfs"
        job = q.enqueue(b"on tmpfs")
        lease = q.lease()
        assert lease is not None and lease.job_id == job
        assert q.ack(lease) is AckResult.ACKED
    with pytest.raises(UnsupportedFilesystem, match="tmpfs") as exc:
        Queue.open(path)
    assert exc.value.exit_code == 64
    Queue.open(path, allow_unsupported_fs=True).close()


def test_overlayfs_refused() -> None:
    """init through an overlay, and open of an existing queue seen through one, are refused."""
    with overlay_mount() as (merged, lower):
        Queue.init(os.path.join(lower, "existing"), shards=2).close()  # on ext4, before it is viewed via overlay
        with pytest.raises(UnsupportedFilesystem, match="overlayfs"):
            Queue.open(os.path.join(merged, "existing"))
        with pytest.raises(UnsupportedFilesystem, match="overlayfs"):
            Queue.init(os.path.join(merged, "fresh"))
        assert not os.path.exists(os.path.join(merged, "fresh", "FORMAT"))


# --------------------------------------------------------------------------- refused roots and formats


def test_symlinked_root_refused(tmp_path: str) -> None:
    real = os.path.join(tmp_path, "real")
    Queue.init(real, shards=2).close()
    link = os.path.join(tmp_path, "link")
    os.symlink(real, link)
    with pytest.raises(InvalidInput, match="symlink"):
        Queue.open(link)
    empty = os.path.join(tmp_path, "empty")
    os.mkdir(empty)
    link2 = os.path.join(tmp_path, "link2")
    os.symlink(empty, link2)
    with pytest.raises(InvalidInput, match="symlink"):
        Queue.init(link2)
    assert os.listdir(empty) == []  # nothing was created through the link
    Queue.open(real).close()  # the real directory is fine


def _rewrite_format(root: str, data: bytes) -> None:
    """FORMAT is 0400 after init; make it writable, replace it, restore the mode."""
    path = os.path.join(root, "FORMAT")
    os.chmod(path, 0o600)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o400)


def _read_format(root: str) -> bytes:
    with open(os.path.join(root, "FORMAT"), "rb") as f:
        return f.read()


def _with_major(data: bytes, major: int) -> bytes:
    """The same FORMAT with another major version and a correctly recomputed digest."""
    body = data[:8] + major.to_bytes(2, "big") + data[10:128]
    return body + sha256(DOMAIN_FORMAT + body)


@pytest.fixture
def queue_root(make_queue: Callable[..., Queue], queue_path: str) -> str:
    """A queue with no handle open: the tests rewrite its FORMAT, then open it."""
    make_queue(shards=2).close()
    return queue_path


def test_format_major_2_refused(queue_root: str) -> None:
    original = _read_format(queue_root)
    assert len(original) == FORMAT_SIZE
    assert stat.S_IMODE(os.stat(os.path.join(queue_root, "FORMAT")).st_mode) == 0o400
    # Control: the rewrite machinery reproduces a valid FORMAT byte for byte.
    assert _with_major(original, 1) == original
    v2 = _with_major(original, 2)
    assert sum(a != b for a, b in zip(v2[:128], original[:128], strict=True)) == 1  # only the version
    _rewrite_format(queue_root, v2)
    with pytest.raises(UnsupportedFormat, match="major") as exc:
        Queue.open(queue_root)
    assert exc.value.exit_code == 64
    _rewrite_format(queue_root, original)
    Queue.open(queue_root).close()


@pytest.mark.parametrize("offset", [0, 12, 16, 40, 100, 130, FORMAT_SIZE - 1])
def test_format_flipped_byte_is_corrupt(queue_root: str, offset: int) -> None:
    """Any flipped byte outside the major version makes the queue corrupt, not unsupported."""
    original = _read_format(queue_root)
    flipped = bytearray(original)
    flipped[offset] ^= 0x01
    _rewrite_format(queue_root, bytes(flipped))
    with pytest.raises(QueueCorrupt, match="FORMAT"):
        FormatRecord.decode(bytes(flipped))
    with pytest.raises(QueueCorrupt) as exc:
        Queue.open(queue_root)
    assert exc.value.exit_code == 3


def test_format_wrong_size_is_corrupt(queue_root: str) -> None:
    original = _read_format(queue_root)
    _rewrite_format(queue_root, original + b"\0")
    with pytest.raises(QueueCorrupt, match="size"):
        Queue.open(queue_root)


def test_interrupted_init_reported(queue_root: str) -> None:
    os.unlink(os.path.join(queue_root, "FORMAT"))
    with pytest.raises(QueueCorrupt, match="missing"):
        Queue.open(queue_root)
    with open(os.path.join(queue_root, ".initializing"), "wb"):
        pass
    with pytest.raises(QueueCorrupt, match="initialization was interrupted"):
        Queue.open(queue_root)


@pytest.mark.parametrize("state_dir", STATE_DIRS)
def test_missing_state_dir_is_corrupt(queue_root: str, state_dir: str) -> None:
    Queue.open(queue_root).close()  # control: intact queue opens
    shutil.rmtree(os.path.join(queue_root, state_dir))
    with pytest.raises(QueueCorrupt, match=f"{state_dir}/ is missing"):
        Queue.open(queue_root)


def test_state_dir_replaced_by_file_is_corrupt(queue_root: str) -> None:
    os.rmdir(os.path.join(queue_root, "quarantine"))
    with open(os.path.join(queue_root, "quarantine"), "wb"):
        pass
    with pytest.raises(QueueCorrupt, match="not a directory"):
        Queue.open(queue_root)
