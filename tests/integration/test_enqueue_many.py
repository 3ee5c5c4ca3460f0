"""Queue.enqueue_many: many jobs, one group of file fsyncs, then the links.

What is pinned here: the syscall order the durability argument rests on
(every file fsynced before the first link of its group, one directory fsync
per distinct directory after the links, none before the batch barrier inside
a batch), the bound on open files, the partial-failure contract
(EnqueueIncomplete with a prefix of the input, or the plain cause when
nothing was published) and the fallbacks enqueue() has (named temps, a
deleted destination directory).
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from steadqd import (
    ErrorKind,
    NotCommitted,
    OutcomeUnknown,
    Queue,
    State,
)
from steadqd.errors import EnqueueIncomplete
from steadqd.fs import linux, publish
from steadqd.fs.json_records import EnqueueTicket
from tests.invariants import check_tree

PAYLOADS = [b"first", bytes(range(256)) * 8, b"", b"fourth" * 100, b"fifth"]


def _drain(q: Queue) -> dict[str, bytes]:
    """Lease and ack everything ready: job id -> verified payload."""
    got: dict[str, bytes] = {}
    while (lease := q.lease(duration=60)) is not None:
        got[lease.job_id] = lease.payload()
        q.ack(lease)
    return got


def _anonymous_fds(root: str) -> int:
    """Open unlinked files of this process inside the queue (an O_TMPFILE shows as '<dir>/#<ino> (deleted)')."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += target.startswith(os.path.realpath(root) + "/") and target.endswith(" (deleted)")
    return n


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _ops(events: list[linux.TraceEvent]) -> list[str]:
    return [e.op for e in events]


def _split_fsyncs(events: list[linux.TraceEvent]) -> tuple[list[int], list[int]]:
    """Positions of file fsyncs and of directory fsyncs (a job file got a writeback hint first)."""
    files = {e.detail[0] for e in events if e.op == "sync_file_range"}
    fsyncs = [(i, e.detail[0]) for i, e in enumerate(events) if e.op == "fsync"]
    return [i for i, fd in fsyncs if fd in files], [i for i, fd in fsyncs if fd not in files]


HOUR_NS = 3600 * 1_000_000_000


def _warm_queue(make_queue: Callable[..., Queue], shards: int) -> Queue:
    """A queue whose syscall counts are stable for a test: bucket widths of an hour
    (no watermark advance mid-test) and one enqueue already done, so the link form
    is known (one link call per job) and the wall floor is cached. The warm-up job
    is removed again: the tree starts empty."""
    q = make_queue(shards=shards, delayed_width_ns=HOUR_NS, terminal_width_ns=HOUR_NS)
    _job, rel = q.enqueue_detailed(b"warm-up")
    os.unlink(os.path.join(q.path, rel))
    for shard in range(shards):  # every ready directory cached: the fd count is stable
        q._ctx.ready_dir(shard)
    return q


@pytest.fixture
def queue(make_queue: Callable[..., Queue]) -> Queue:
    return _warm_queue(make_queue, 4)


@pytest.fixture
def one_shard(make_queue: Callable[..., Queue]) -> Queue:
    """A queue with a single ready directory: the number of directory fsyncs is known."""
    return _warm_queue(make_queue, 1)


# --------------------------------------------------------------------------- the happy path


def test_round_trip_in_order_with_options(queue: Queue) -> None:
    ids = queue.enqueue_many(PAYLOADS, max_attempts=5, content_type="text/plain", metadata={"k": "v"})
    assert len(ids) == len(set(ids)) == len(PAYLOADS)
    ts = check_tree(queue.path, allow_quarantine=False)
    assert ts.ready == frozenset(ids)
    for job in ids:
        obj = ts.get(job)
        assert obj is not None and obj.name.max_attempts == 5 and (obj.generation, obj.attempt) == (0, 0)
    lease = queue.lease(duration=60)
    assert lease is not None and lease.content_type == "text/plain"
    ext = queue.read_extension(lease)
    assert ext is not None and ext.metadata == {"k": "v"}
    queue.retry(lease)
    got = _drain(queue)
    assert [got[j] for j in ids] == PAYLOADS  # ids are in input order


def test_empty_input_does_nothing(queue: Queue) -> None:
    before = check_tree(queue.path).paths()
    with linux.trace() as events:
        assert queue.enqueue_many([]) == []
        assert queue.enqueue_many(iter(())) == []
    assert events == []
    assert check_tree(queue.path).paths() == before


def test_options_are_validated_even_for_empty_input(queue: Queue) -> None:
    with pytest.raises(NotCommitted) as info:
        queue.enqueue_many([], max_attempts=0)
    assert info.value.kind is ErrorKind.INVALID_INPUT
    with pytest.raises(NotCommitted) as info:
        queue.enqueue_many([b"x"], delay=5, not_before_ns=1)
    assert info.value.kind is ErrorKind.INVALID_INPUT


def test_streamed_payloads_are_written_before_the_next_is_pulled(queue: Queue, tmp_path: Path) -> None:
    """A generator may close each stream when asked for the next one (what the CLI does)."""
    bodies = [b"streamed %d " % i * (200 * i + 1) for i in range(4)]
    files = []
    for i, body in enumerate(bodies):
        p = tmp_path / f"p{i}"
        p.write_bytes(body)
        files.append(p)
    closed: list[bool] = []

    def streams() -> Iterator[io.BufferedReader]:
        for p, body in zip(files, bodies, strict=True):
            with open(p, "rb") as f:
                yield f
                assert f.tell() == len(body)  # written whole before the next pull
            closed.append(f.closed)

    ids = queue.enqueue_many(streams())
    assert closed == [True] * 4  # the end of the input is found by resuming the generator
    ids += queue.enqueue_many([io.BytesIO(b"in memory"), b"bytes too"])
    got = _drain(queue)
    assert [got[j] for j in ids] == [*bodies, b"in memory", b"bytes too"]


def test_delayed_jobs_land_in_delayed(queue: Queue) -> None:
    ids = queue.enqueue_many([b"later 1", b"later 2", b"later 3"], delay=3600)
    ts = check_tree(queue.path, allow_quarantine=False)
    assert ts.delayed == frozenset(ids) and ts.ready == frozenset()
    nb = {ts.get(j).name.not_before for j in ids}  # type: ignore[union-attr]
    assert all(n is not None and n > 0 for n in nb)
    assert queue.lease() is None
    at = queue.enqueue_many([b"absolute"], not_before_ns=2**62)
    assert check_tree(queue.path).state_of(at[0]) == State.DELAYED


# --------------------------------------------------------------------------- syscall order


def test_every_file_is_fsynced_before_the_first_link(queue: Queue) -> None:
    with linux.trace() as events:
        ids = queue.enqueue_many(PAYLOADS)
    ops = _ops(events)
    n = len(PAYLOADS)
    assert ops.count("tmpfile") == ops.count("sync_file_range") == ops.count("link") == n
    file_syncs, dir_syncs = _split_fsyncs(events)
    assert len(file_syncs) == n
    links = [i for i, op in enumerate(ops) if op == "link"]
    writebacks = [i for i, op in enumerate(ops) if op == "sync_file_range"]
    last_write = max(i for i, op in enumerate(ops) if op in ("write", "pwrite"))
    assert last_write < min(writebacks) and max(writebacks) < min(file_syncs)  # (a), then (b), then (c)
    assert max(file_syncs) < min(links)  # no name before every file of the group is durable
    # (e): each distinct destination directory fsynced exactly once, after the last link.
    ts = check_tree(queue.path)
    dirs = {os.path.dirname(ts.get(j).path) for j in ids}  # type: ignore[union-attr]
    assert len(dir_syncs) == len(dirs) and min(dir_syncs) > max(links)
    assert len({events[i].detail[0] for i in dir_syncs}) == len(dir_syncs)
    # The links are in input order.
    names = [e.detail[3] for e in events if e.op == "link"]
    assert [name[:32] for name in names] == ids


def test_one_directory_fsync_for_a_shared_directory(one_shard: Queue) -> None:
    with linux.trace() as events:
        one_shard.enqueue_many([b"a", b"b", b"c", b"d"])
    file_syncs, dir_syncs = _split_fsyncs(events)
    assert (len(file_syncs), len(dir_syncs)) == (4, 1)


def test_inside_a_batch_no_directory_fsync_until_the_barrier(one_shard: Queue) -> None:
    with linux.trace() as events:
        with one_shard.batch():
            one_shard.enqueue_many([b"a", b"b", b"c"])
            one_shard.enqueue_many([b"d"])
            inside = len(events)
            assert one_shard._ctx.tree.pending_barriers == 1
    file_syncs, dir_syncs = _split_fsyncs(events)
    assert len(file_syncs) == 4
    assert len(dir_syncs) == 1 and dir_syncs[0] >= inside  # issued by the batch's sync, once
    assert one_shard._ctx.tree.pending_barriers == 0


def test_deferred_mode_defers_the_directory_fsyncs(tmp_path: Path) -> None:
    path = str(tmp_path / "q")
    Queue.init(path, shards=1, delayed_width_ns=HOUR_NS, terminal_width_ns=HOUR_NS).close()
    with Queue.open(path, deferred=True) as q:
        with linux.trace() as events:
            ids = q.enqueue_many([b"a", b"b"])
        assert len(_split_fsyncs(events)[1]) == 0 and q._ctx.tree.pending_barriers == 1
        q.sync()
        assert check_tree(path).ready == frozenset(ids)


# --------------------------------------------------------------------------- groups


def test_groups_are_bounded_and_published_in_order(queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "ENQUEUE_MANY_GROUP", 3)
    seen: list[tuple[int, int]] = []  # (visible jobs, open anonymous files) at every pull

    def payloads() -> Iterator[bytes]:
        for i in range(8):
            seen.append((len(check_tree(queue.path).all_ids), _anonymous_fds(queue.path)))
            yield b"job %d" % i

    with linux.trace() as events:
        ids = queue.enqueue_many(payloads())
    # A group's files are open only while it is written; the next group starts with none open
    # and with every job of the earlier groups already published.
    assert seen == [(0, 0), (0, 1), (0, 2), (3, 0), (3, 1), (3, 2), (6, 0), (6, 1)]
    runs: list[tuple[str, int]] = []
    for op in _ops(events):
        if op in ("tmpfile", "sync_file_range", "link"):
            if runs and runs[-1][0] == op:
                runs[-1] = (op, runs[-1][1] + 1)
            else:
                runs.append((op, 1))
    assert runs == [("tmpfile", 3), ("sync_file_range", 3), ("link", 3)] * 2 + [
        ("tmpfile", 2),
        ("sync_file_range", 2),
        ("link", 2),
    ]
    got = _drain(queue)
    assert [got[j] for j in ids] == [b"job %d" % i for i in range(8)]


def test_a_failure_in_a_later_group_keeps_the_earlier_groups(one_shard: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "ENQUEUE_MANY_GROUP", 2)
    path = one_shard.path
    fds = _fd_count()
    # fsyncs: group 1 = 2 files + 1 directory; the 4th is group 2's first file.
    with linux.inject(nth=4, errno=errno.ENOSPC, op="fsync"), pytest.raises(EnqueueIncomplete) as info:
        one_shard.enqueue_many([b"g1 a", b"g1 b", b"g2 a", b"g2 b", b"g3 a"])
    e = info.value
    assert len(e.published) == 2 and isinstance(e.cause, NotCommitted)
    assert e.kind is e.cause.kind is ErrorKind.RESOURCE_EXHAUSTED and e.exit_code == 4
    assert check_tree(path, allow_quarantine=False).all_ids == frozenset(e.published)
    assert _fd_count() == fds and _anonymous_fds(path) == 0
    assert one_shard.poisoned is None
    assert set(_drain(one_shard)) == set(e.published)


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize("op", ["tmpfile", "write", "fstat", "sync_file_range", "fsync"])
@pytest.mark.parametrize("nth", [1, 3])
def test_a_failure_before_the_links_publishes_nothing(op: str, nth: int, queue: Queue) -> None:
    before = check_tree(queue.path).paths()
    fds = _fd_count()
    with linux.inject(nth=nth, errno=errno.EIO, op=op) as fault, pytest.raises(NotCommitted) as info:
        queue.enqueue_many(PAYLOADS)
    assert fault.fired and not isinstance(info.value, EnqueueIncomplete)
    assert info.value.kind is ErrorKind.IO_FAILURE
    assert check_tree(queue.path, allow_quarantine=False).paths() == before
    assert _fd_count() == fds and _anonymous_fds(queue.path) == 0  # every file of the group was closed
    assert queue.poisoned is None
    assert len(queue.enqueue_many(PAYLOADS)) == len(PAYLOADS)  # safe to retry


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ESPIPE])
def test_writeback_hint_unsupported_is_ignored(code: int, queue: Queue) -> None:
    with linux.inject(nth=2, errno=code, op="sync_file_range") as fault:
        ids = queue.enqueue_many([b"a", b"b", b"c"])
    assert fault.fired
    assert check_tree(queue.path).ready == frozenset(ids)


def test_an_invalid_payload_fails_its_group_only(queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "ENQUEUE_MANY_GROUP", 2)
    with pytest.raises(NotCommitted) as first:
        queue.enqueue_many([b"ok", 42])  # type: ignore[list-item]
    assert first.value.kind is ErrorKind.INVALID_INPUT
    assert check_tree(queue.path).all_ids == frozenset()
    with pytest.raises(EnqueueIncomplete) as info:
        queue.enqueue_many([b"a", b"b", b"c", "not bytes"])  # type: ignore[list-item]
    assert len(info.value.published) == 2 and info.value.kind is ErrorKind.INVALID_INPUT
    assert check_tree(queue.path).all_ids == frozenset(info.value.published)


@pytest.mark.parametrize(
    ("code", "kind"), [(errno.EIO, ErrorKind.IO_FAILURE), (errno.EEXIST, ErrorKind.IDENTITY_COLLISION)]
)
def test_a_failed_kth_link_publishes_the_jobs_before_it(code: int, kind: ErrorKind, queue: Queue) -> None:
    fds = _fd_count()
    with linux.trace() as events:
        with linux.inject(nth=3, errno=code, op="link"), pytest.raises(EnqueueIncomplete) as info:
            queue.enqueue_many(PAYLOADS)
    e = info.value
    assert isinstance(e.cause, NotCommitted) and e.cause.kind is kind and e.kind is kind
    assert e.cause.job_id is not None and e.cause.job_id not in e.published
    names = [ev.detail[3][:32] for ev in events if ev.op == "link"]
    assert e.published == names[:2]  # the first two payloads, in order
    ts = check_tree(queue.path, allow_quarantine=False)
    assert ts.all_ids == frozenset(e.published)
    # The two published jobs got their directory barrier after the failed link.
    _, dir_syncs = _split_fsyncs(events)
    assert len(dir_syncs) == len({os.path.dirname(ts.get(j).path) for j in e.published})  # type: ignore[union-attr]
    assert _fd_count() == fds and _anonymous_fds(queue.path) == 0
    assert queue.poisoned is None
    got = _drain(queue)
    assert set(got) == set(e.published) and [got[j] for j in e.published] == PAYLOADS[:2]


def test_a_failed_link_inside_a_batch_defers_the_published_jobs(one_shard: Queue) -> None:
    with pytest.raises(EnqueueIncomplete) as info:
        with one_shard.batch():
            with linux.inject(nth=2, errno=errno.ENOSPC, op="link"):
                one_shard.enqueue_many([b"a", b"b", b"c"])
    assert len(info.value.published) == 1 and info.value.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert one_shard._ctx.tree.pending_barriers == 1  # the published job's barrier waits for a sync
    one_shard.sync()
    assert check_tree(one_shard.path).ready == frozenset(info.value.published)


def test_a_failed_directory_barrier_is_outcome_unknown_for_every_linked_job(one_shard: Queue) -> None:
    with linux.inject(nth=4, errno=errno.EIO, op="fsync"), pytest.raises(OutcomeUnknown) as info:
        one_shard.enqueue_many([b"a", b"b", b"c"])  # 3 file fsyncs, then the directory's
    tickets = info.value.ticket
    assert isinstance(tickets, tuple) and len(tickets) == 3
    assert all(isinstance(t, EnqueueTicket) and t.state == "ready" for t in tickets)
    ts = check_tree(one_shard.path, allow_quarantine=False)
    assert ts.ready == frozenset(t.job_id.hex() for t in tickets)
    assert {ts.get(t.job_id.hex()).path for t in tickets} == {t.path for t in tickets}  # type: ignore[union-attr]
    assert one_shard.poisoned is not None
    for call in (lambda: one_shard.enqueue(b"x"), lambda: one_shard.enqueue_many([b"x"])):
        with pytest.raises(NotCommitted) as probe:
            call()
        assert probe.value.kind is ErrorKind.QUEUE_POISONED


def test_a_failed_barrier_of_a_later_group_is_incomplete_with_unknown_cause(
    one_shard: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publish, "ENQUEUE_MANY_GROUP", 2)
    with linux.inject(nth=6, errno=errno.EIO, op="fsync"), pytest.raises(EnqueueIncomplete) as info:
        one_shard.enqueue_many([b"a", b"b", b"c", b"d"])  # group 2's directory fsync is the 6th
    e = info.value
    assert len(e.published) == 2 and isinstance(e.cause, OutcomeUnknown) and e.exit_code == 2
    assert len(e.cause.ticket) == 2 and one_shard.poisoned is not None
    unknown = {t.job_id.hex() for t in e.cause.ticket}
    assert check_tree(one_shard.path).ready == frozenset(e.published) | unknown


# --------------------------------------------------------------------------- fallbacks


def test_named_temp_fallback_publishes_one_at_a_time(queue: Queue) -> None:
    queue._ctx.publication = "named"  # what ZFS gets
    with linux.trace() as events:
        ids = queue.enqueue_many([b"a", io.BytesIO(b"streamed" * 100), b"c"])
    ops = _ops(events)
    assert "tmpfile" not in ops and "sync_file_range" not in ops
    assert ops.count("rename_noreplace") == 3
    renames = [i for i, op in enumerate(ops) if op == "rename_noreplace"]
    file_syncs = [i for i, e in enumerate(events) if e.op == "fsync"]
    assert any(renames[0] < i < renames[1] for i in file_syncs)  # one job at a time
    ts = check_tree(queue.path, allow_quarantine=False)
    assert ts.ready == frozenset(ids) and ts.temps == []
    got = _drain(queue)
    assert [got[j] for j in ids] == [b"a", b"streamed" * 100, b"c"]


def test_named_temp_fallback_partial_failure(queue: Queue) -> None:
    queue._ctx.publication = "named"
    with linux.inject(nth=2, errno=errno.EIO, op="rename_noreplace"), pytest.raises(EnqueueIncomplete) as info:
        queue.enqueue_many([b"a", b"b", b"c"])
    assert len(info.value.published) == 1 and isinstance(info.value.cause, NotCommitted)
    ts = check_tree(queue.path, allow_quarantine=False)
    assert ts.all_ids == frozenset(info.value.published) and ts.temps == []


def test_tmpfile_unsupported_switches_to_named_temps(queue: Queue) -> None:
    with linux.inject(nth=1, errno=errno.EOPNOTSUPP, op="tmpfile"):
        ids = queue.enqueue_many([b"a", b"b", b"c"])
    assert queue.publication_mode == "named"
    assert check_tree(queue.path, allow_quarantine=False).ready == frozenset(ids)
    got = _drain(queue)
    assert [got[j] for j in ids] == [b"a", b"b", b"c"]


def test_tmpfile_unsupported_mid_group_finishes_the_group_first(queue: Queue) -> None:
    with linux.trace() as events:
        with linux.inject(nth=3, errno=errno.EOPNOTSUPP, op="tmpfile"):
            ids = queue.enqueue_many([b"a", b"b", b"c", b"d"])
    ops = _ops(events)
    assert ops.count("link") == 2 and ops.count("rename_noreplace") == 2
    assert max(i for i, op in enumerate(ops) if op == "link") < ops.index("rename_noreplace")
    got = _drain(queue)
    assert [got[j] for j in ids] == [b"a", b"b", b"c", b"d"]


def test_deleted_destination_directory_is_recreated(one_shard: Queue) -> None:
    q = one_shard
    q.enqueue(b"caches the shard directory")
    lease = q.lease()
    assert lease is not None
    q.ack(lease)
    os.rmdir(os.path.join(q.path, "ready", "0000"))
    ids = q.enqueue_many([b"a", b"b", b"c"])
    assert q.publication_mode != "named"  # a deleted directory is not "O_TMPFILE unsupported"
    got = _drain(q)
    assert [got[j] for j in ids] == [b"a", b"b", b"c"]


def test_closed_handle_is_refused(tmp_path: Path) -> None:
    q = Queue.init(str(tmp_path / "q"), shards=2)
    q.close()
    with pytest.raises(NotCommitted) as info:
        q.enqueue_many([b"x"])
    assert info.value.kind is ErrorKind.QUEUE_POISONED


# --------------------------------------------------------------------------- the Linux layer


def test_sync_file_range_wrapper(tmp_path: Path) -> None:
    """A traced, injectable op; a real kernel answer (ESPIPE on a pipe) comes back as OSError."""
    assert "sync_file_range" in linux.OPS
    fd = os.open(tmp_path, os.O_TMPFILE | os.O_RDWR, 0o600)
    r, w = os.pipe()
    try:
        os.write(fd, b"x" * 10_000)
        with linux.trace() as events:
            linux.sync_file_range(fd, 0, 0, linux.SYNC_FILE_RANGE_WRITE)
        assert events == [linux.TraceEvent("sync_file_range", (fd, 0, 0, linux.SYNC_FILE_RANGE_WRITE))]
        with pytest.raises(OSError) as info:
            linux.sync_file_range(r, 0, 0, linux.SYNC_FILE_RANGE_WRITE)
        assert info.value.errno == errno.ESPIPE
        with linux.inject(nth=1, errno=errno.EIO, op="sync_file_range"), pytest.raises(OSError) as info:
            linux.sync_file_range(fd, 0, 0, linux.SYNC_FILE_RANGE_WRITE)
        assert info.value.errno == errno.EIO
    finally:
        for x in (fd, r, w):
            os.close(x)
