"""A huge job must not stall the worker: its payload is verified and copied off the service loop.

Issue 15, point 2: a 6 GiB sparse job with a valid header and a wrong
payload digest blocked the worker's loop for ~15 s while it was hashed; the
lease of a job already running was not renewed meanwhile, the sweeper
reaped it and that job ran twice. Here the giant job is a sparse file (no
disk), sized from this machine's own hashing rate so that hashing it takes
a few times the running job's lease; the running job's lease is watched from
outside (its leased name carries its deadline) and must never be seen past
its deadline.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import select
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from steadqd import Queue, backend
from steadqd.constants import HEADER_SIZE, State
from steadqd.daemon.config import QueueSettings, parse_config
from steadqd.daemon.journal import Log
from steadqd.daemon.service import Loop
from steadqd.daemon.worker import claim, payload
from steadqd.daemon.worker.role import WorkerRole
from steadqd.errors import SteadQError
from steadqd.fs import linux, names
from steadqd.fs.records import build_header
from steadqd.fs.verify import CHUNK
from tests.daemon.conftest import DEADLINE, Daemon, Env, job_spec, payload_copies_removed, wait_for
from tests.invariants import check_tree

LEASE = 2.0  # s, of the running job: the shortest a worker allows, renewed every RENEW
RENEW = 0.5
HASH_FOR = 3 * LEASE  # s the giant job's hash should take here: well past the lease
SMALLEST, LARGEST = 256 << 20, 16 << 30  # bytes of the giant job, whatever the machine


def _hash_rate(directory: str) -> float:
    """Bytes per second this machine reads and hashes a sparse file in ``directory``, as a claim does."""
    probe = 128 << 20
    path = os.path.join(directory, ".probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, probe)
        h = hashlib.sha256()
        started = time.monotonic()
        for offset in range(0, probe, CHUNK):
            h.update(os.pread(fd, CHUNK, offset))
        return probe / max(time.monotonic() - started, 1e-6)
    finally:
        os.close(fd)
        os.unlink(path)


def _zeros_digest(size: int) -> bytes:
    h = hashlib.sha256()
    block = bytes(CHUNK)
    for offset in range(0, size, CHUNK):
        h.update(block[: min(CHUNK, size - offset)])
    return h.digest()


def plant_giant_job(queue: str, size: int, *, valid: bool = False) -> str:
    """A ready job of ``size`` zero payload bytes (a hole) with a valid header; its digest is wrong
    unless ``valid``."""
    with Queue.open(queue) as q:
        fmt = q.format
    job = os.urandom(16)
    digest = _zeros_digest(size) if valid else b"\x5a" * 32
    header = build_header(
        job_id=job, max_attempts=3, created_at_ns=1, extension=b"", payload_length=size, payload_digest=digest
    )
    shard = names.shard_of(fmt.queue_id, job, fmt.shard_count)
    name = names.make_filename(
        fmt.queue_id, names.ready_name(job, 0, 0, 3), shard=shard, lease_width_ns=fmt.lease_width_ns
    )
    staged = os.path.join(queue, f".giant-{job.hex()}")
    with open(staged, "wb") as f:
        f.write(header.encode())
        f.truncate(HEADER_SIZE + size)
    os.rename(staged, os.path.join(queue, "ready", names.shard_dir(shard), name))  # appears whole
    return job.hex()


class LeaseWatch:
    """Looks at one job's leased name from outside until stopped; notes every time it was past its deadline."""

    def __init__(self, queue: str, job_id: str) -> None:
        self.queue = queue
        self.job = bytes.fromhex(job_id)
        self.expired: list[tuple[int, int]] = []  # (boottime seen, deadline of the name seen)
        self.deadlines: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # The clock is read before the listing: a name still listed after a
            # time past its deadline was an expired lease at that time.
            now = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
            for shard in Path(self.queue, "ready").iterdir():
                for entry in os.listdir(shard):
                    try:
                        name = names.parse_name(State.LEASED, entry)
                    except SteadQError:
                        continue
                    if name.job_id == self.job and name.boottime_deadline is not None:
                        self.deadlines.add(name.boottime_deadline)
                        if now > name.boottime_deadline:
                            self.expired.append((now, name.boottime_deadline))
            self._stop.wait(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def watches() -> Iterator[Callable[[str, str], LeaseWatch]]:
    made: list[LeaseWatch] = []

    def watch(queue: str, job_id: str) -> LeaseWatch:
        made.append(LeaseWatch(queue, job_id))
        return made[-1]

    yield watch
    for w in made:
        w.stop()


def test_a_giant_corrupt_job_never_delays_the_renewals_of_a_running_job(
    denv: Env, daemons: Callable[..., Daemon], watches: Callable[[str, str], LeaseWatch]
) -> None:
    size = min(max(int(_hash_rate(str(denv.tmp)) * HASH_FOR), SMALLEST), LARGEST)
    denv.write_config(concurrency=2, lease=f"{LEASE:g}s", renew_every=f"{RENEW:g}s")
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        running = q.enqueue(job_spec(barrier={"tag": "go", "n": 2, "timeout": 3 * DEADLINE}))
    d.ready()
    denv.started(running, 1)
    watch = watches(denv.queue_path, running)
    giant = plant_giant_job(denv.queue_path, size)
    d.wait_log(rf"quarantined a corrupt object .*{giant}.*STEADQ_REASON=0x0002", timeout=DEADLINE + 4 * HASH_FOR)
    (denv.results / "go-test.here").touch()  # now the running job may end
    d.wait_log(rf"job {running[:8]} finished: ack .*STEADQ_JOB_ID={running}")
    watch.stop()
    if watch.expired:
        late = max(seen - deadline for seen, deadline in watch.expired)
        pytest.fail(f"the running job's lease was seen expired, up to {late / 1e9:.1f}s past its deadline")
    assert len(watch.deadlines) > 2, "the running job's lease was renewed while the giant job was hashed"
    assert "LEASE LOST" not in d.log(), d.log()
    assert set(denv.results_of(running)) == {1}
    tree = check_tree(denv.queue_path)
    assert tree.receipts == {running}
    payload_copies_removed(denv)


def test_a_corrupt_payload_is_read_once_before_quarantine(make_queue: Callable[..., Queue], queue_path: str) -> None:
    make_queue(shards=1).close()
    size = 64 * CHUNK
    giant = plant_giant_job(queue_path, size)
    settings = parse_config(
        f"queue: {queue_path}\nworker:\n  command: ['true']\n  concurrency: 2\n", path="t.yaml", name="t"
    )
    out = io.StringIO()
    loop = Loop()
    role = WorkerRole(settings, Log("worker", "t", journal=False, stream=out))
    try:
        with linux.trace() as events:
            role.start(loop)
            deadline = time.monotonic() + DEADLINE
            while "quarantined a corrupt object" not in out.getvalue() and time.monotonic() < deadline:
                loop.run_once(0.05)
    finally:
        role.close()
        loop.close()
    assert giant in out.getvalue(), out.getvalue()
    reads = sum(1 for e in events if e.op == "read")
    # One pass over the payload (a chunk per read) and a few small reads around it: never two.
    assert size // CHUNK <= reads < 2 * (size // CHUNK), reads
    assert "payload changed" not in out.getvalue()  # the copy never read it again
    assert wait_for(lambda: list(Path(queue_path, "quarantine").iterdir()))


# --- the preparing thread on its own ------------------------------------------------


def _worker_settings(queue_path: str, **worker: str) -> QueueSettings:
    extra = "".join(f"\n  {k}: {v}" for k, v in worker.items())
    return parse_config(f"queue: {queue_path}\nworker:\n  command: ['true']{extra}\n", path="t.yaml", name="t")


def _one(prep: claim.Preparer) -> claim.Prepared:
    """Wait (as the loop would, on the pipe) for the answer to the one request in flight."""
    ready, _, _ = select.select([prep.fileno()], [], [], DEADLINE)
    assert ready, "the preparing thread never answered"
    (done,) = prep.collect()
    return done


def test_a_long_copy_renews_its_own_lease(make_queue: Callable[..., Queue], queue_path: str, tmp_path: Path) -> None:
    make_queue(shards=1).close()
    # Hashing takes about half a second here, five renewal intervals.
    size = min(max(int(_hash_rate(str(tmp_path)) * 0.5), 16 << 20), 2 << 30)
    job = plant_giant_job(queue_path, size, valid=True)
    settings = _worker_settings(queue_path, lease="2s", renew_every="0.1s")
    assert settings.worker is not None
    prep = claim.Preparer(Queue.open(queue_path), lambda: Queue.open(queue_path))
    try:
        prep.submit(settings.worker, settings, {})
        done = _one(prep)
        assert done.error is None and done.lease is not None, done
        assert done.lease.job_id == job
        assert done.lease.generation > 1, "the claim's hash outlasted a renewal interval: the copy renewed"
        assert os.path.getsize(done.payload_path) == size
        assert done.env["STEADQ_JOB_ID"] == job and done.env["STEADQ_QUEUE"] == "t"
        with contextlib.closing(backend.open_queue(queue_path)) as q:  # the lease handed over is current
            q.ack(done.lease)
        payload.remove(done.tmpdir)
    finally:
        prep.close(DEADLINE)
    assert check_tree(queue_path).receipts == {job}


def test_a_stop_abandons_a_copy_in_progress_and_keeps_the_lease(
    make_queue: Callable[..., Queue], queue_path: str, tmp_path: Path
) -> None:
    make_queue(shards=1).close()
    # A copy of a few seconds; it is stopped in its first chunks.
    size = min(max(int(_hash_rate(str(tmp_path)) * 4), 64 << 20), 8 << 30)
    job = plant_giant_job(queue_path, size, valid=True)
    settings = _worker_settings(queue_path, lease="60s")
    assert settings.worker is not None
    base = tempfile.gettempdir()

    def copies() -> list[str]:  # this job's payload directories (the temp directory is shared)
        return [d for d in os.listdir(base) if d.startswith("steadqd-") and f"-{os.getpid()}-{job[:12]}-" in d]

    prep = claim.Preparer(Queue.open(queue_path), lambda: Queue.open(queue_path))
    try:
        prep.submit(settings.worker, settings, {})

        def copying() -> bool:
            return any(os.path.exists(os.path.join(base, d, "payload")) for d in copies())

        wait_for(copying, DEADLINE + 10 * size / 1e8, "the copy to start")
    finally:
        (done,) = prep.close(DEADLINE)
    assert isinstance(done.error, claim.Stopped), done
    assert done.lease is not None and done.lease.job_id == job
    assert not done.tmpdir and not copies()  # the partial copy is gone
    with contextlib.closing(backend.open_queue(queue_path)) as q:  # still ours: WorkerRole.close hands it back
        assert q.retry(done.lease) == "ready"
