"""One small interface over steadqd and every peer, so each is driven by the same loops.

A backend is opened from a picklable :class:`Spec` (so multi-process runs open
their own handle in each child) and offers ``put``, ``get`` (a handle or None),
``payload`` and ``ack``. Every peer is configured for the same durability as
steadqd strict: each committed operation is fsynced before it returns. The
exact settings are in each class's ``DESCRIPTION`` and end up in the results.
"""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from .common import log


@dataclass(frozen=True)
class Spec:
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


class Backend:
    """Interface; ``get`` returns None when nothing is available right now."""

    name = "?"
    DESCRIPTION = ""
    at_least_once = True

    def put(self, payload: bytes) -> None:
        raise NotImplementedError

    def get(self) -> Any:
        raise NotImplementedError

    def payload(self, handle: Any) -> bytes:
        raise NotImplementedError

    def ack(self, handle: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


# ------------------------------------------------------------------ steadqd


class Steadq(Backend):
    name = "steadqd"
    DESCRIPTION = (
        "steadqd strict: Queue.open(path) (deferred=False): every enqueue, claim and ack is "
        "durable when it returns (file fsync before link, directory fsyncs after each rename); "
        "64 shards; lease.payload() re-verifies the SHA-256 digest; ack re-hashes the payload."
    )

    def __init__(self, path: str, wait: float = 0.05, deferred: bool = False) -> None:
        from steadqd import Queue

        self.q = Queue.open(path, deferred=deferred)
        self.wait = wait

    def put(self, payload: bytes) -> None:
        self.q.enqueue(payload)

    def get(self) -> Any:
        return self.q.lease(wait=self.wait)

    def payload(self, handle: Any) -> bytes:
        return handle.payload()

    def ack(self, handle: Any) -> None:
        self.q.ack(handle)

    def close(self) -> None:
        self.q.close()


def setup_steadq(root: str, shards: int = 64) -> Spec:
    from steadqd import Queue

    path = os.path.join(root, "steadq")
    Queue.init(path, shards=shards).close()
    return Spec("steadq", {"path": path})


# ------------------------------------------------------------------ persist-queue


class PersistQueue(Backend):
    name = "persist-queue"
    DESCRIPTION = (
        "persistqueue.SQLiteAckQueue(path, auto_commit=True, multithreading=False, auto_resume=False) "
        "(WAL, its default) with PRAGMA synchronous=FULL set on its connection: put, get (status "
        "-> unack) and ack (status -> acked) are each one committed, fsynced transaction. get is a "
        "SELECT then an UPDATE guarded only by a thread lock, so several processes can be handed "
        "the same row (duplicates are counted)."
    )

    def __init__(self, path: str) -> None:
        import persistqueue

        self._empty = persistqueue.Empty
        self.q = persistqueue.SQLiteAckQueue(
            path, auto_commit=True, multithreading=False, auto_resume=False, timeout=30
        )
        self.q._conn.execute("PRAGMA synchronous=FULL")
        self.synchronous = self.q._conn.execute("PRAGMA synchronous").fetchone()[0]

    def put(self, payload: bytes) -> None:
        self.q.put(payload)

    def get(self) -> Any:
        try:
            return self.q.get(block=False, raw=True)
        except self._empty:
            return None

    def payload(self, handle: Any) -> bytes:
        return handle["data"]

    def ack(self, handle: Any) -> None:
        self.q.ack(id=handle["pqid"])

    def close(self) -> None:
        self.q.close()


# ------------------------------------------------------------------ litequeue


class Litequeue(Backend):
    name = "litequeue"
    DESCRIPTION = (
        "litequeue.LiteQueue(path) (WAL, autocommit) with PRAGMA synchronous=FULL set after "
        "construction (it sets NORMAL itself, which does not fsync each commit in WAL mode): put "
        "(INSERT), pop (UPDATE ... RETURNING in a BEGIN IMMEDIATE transaction) and done (UPDATE) "
        "each commit and fsync the WAL. Payloads are TEXT (latin-1 round trip)."
    )

    def __init__(self, path: str) -> None:
        from litequeue import LiteQueue

        self.q = LiteQueue(path, timeout=30)
        self.q.conn.execute("PRAGMA synchronous=FULL")
        self.synchronous = self.q.conn.execute("PRAGMA synchronous").fetchone()[0]

    def put(self, payload: bytes) -> None:
        self.q.put(payload.decode("latin-1"))

    def get(self) -> Any:
        return self.q.pop()

    def payload(self, handle: Any) -> bytes:
        return handle.data.encode("latin-1")

    def ack(self, handle: Any) -> None:
        self.q.done(handle.message_id)

    def close(self) -> None:
        self.q.close()


# ------------------------------------------------------------------ huey


class Huey(Backend):
    name = "huey"
    DESCRIPTION = (
        "huey.SqliteHuey(filename=..., fsync=True) (WAL, PRAGMA synchronous=FULL), driven through "
        "its storage API: storage.enqueue(data) and storage.dequeue(). dequeue DELETEs the row in "
        "the same transaction that reads it, so there is no ack and a crash after dequeue loses "
        "the job: at-most-once, one fsynced commit fewer than an acknowledging queue."
    )
    at_least_once = False

    def __init__(self, path: str) -> None:
        from huey import SqliteHuey

        self.huey = SqliteHuey(name="bench", filename=path, fsync=True, timeout=30)
        self.storage = self.huey.storage
        conn = self.storage.conn
        self.synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]

    def put(self, payload: bytes) -> None:
        self.storage.enqueue(payload)

    def get(self) -> Any:
        return self.storage.dequeue()

    def payload(self, handle: Any) -> bytes:
        return bytes(handle)

    def ack(self, handle: Any) -> None:
        pass  # deleted on dequeue

    def close(self) -> None:
        self.storage.close()


# ------------------------------------------------------------------ redis + rq


class RedisList(Backend):
    name = "redis"
    DESCRIPTION = (
        "redis-server (Debian package) on 127.0.0.1, --appendonly yes --appendfsync always "
        "--save '': the reliable-queue pattern with redis-py: LPUSH (enqueue), LMOVE queue -> "
        "processing (lease), LREM processing (ack). Each command is appended to the AOF and "
        "fsynced before the reply (Redis groups the fsync of all clients served in one event-loop "
        "pass)."
    )

    def __init__(self, port: int) -> None:
        import redis

        self.r = redis.Redis(host="127.0.0.1", port=port)

    def put(self, payload: bytes) -> None:
        self.r.lpush("bench:q", payload)

    def get(self) -> Any:
        return self.r.lmove("bench:q", "bench:processing", "RIGHT", "LEFT")

    def payload(self, handle: Any) -> bytes:
        return handle

    def ack(self, handle: Any) -> None:
        self.r.lrem("bench:processing", 1, handle)

    def close(self) -> None:
        self.r.close()


_RQ_SEEN: list[int] = []


def rq_job(payload: bytes) -> None:
    """The rq job function: records which job ran (SimpleWorker runs it in-process)."""
    _RQ_SEEN.append(int(payload[:10]))


class Rq(Backend):
    name = "rq"
    DESCRIPTION = (
        "rq (Redis Queue) on the same redis-server (appendfsync always): Queue.enqueue(rq_job, "
        "payload) and a SimpleWorker (no fork per job) in burst mode running the job and recording "
        "its result; each job is several Redis commands (job hash, queue list, registries), each "
        "fsynced."
    )

    def __init__(self, port: int) -> None:
        import redis
        import rq

        self.r = redis.Redis(host="127.0.0.1", port=port)
        self.queue = rq.Queue("bench", connection=self.r)
        self._rq = rq

    def put(self, payload: bytes) -> None:
        self.queue.enqueue(rq_job, payload)

    def drain(self) -> list[int]:
        """Run every queued job with a burst SimpleWorker; returns ids seen since the last call."""
        worker = self._rq.SimpleWorker([self.queue], connection=self.r)
        worker.work(burst=True, logging_level="WARNING")
        seen = list(_RQ_SEEN)
        _RQ_SEEN.clear()
        return seen

    def close(self) -> None:
        self.r.close()


def setup_floor(root: str) -> Spec:
    """The floor's syscall sequence as a backend (multi-process runs only)."""
    from .floor import ShardedFloor

    return Spec("floor", {"path": ShardedFloor.setup(root)})


def _floor(path: str) -> Backend:
    from .floor import ShardedFloor

    return ShardedFloor(path)  # type: ignore[return-value]


KINDS: dict[str, Any] = {
    "floor": _floor,
    "steadq": Steadq,
    "persist-queue": PersistQueue,
    "litequeue": Litequeue,
    "huey": Huey,
    "redis": RedisList,
    "rq": Rq,
}
MODULES = {"persist-queue": "persistqueue", "litequeue": "litequeue", "huey": "huey", "redis": "redis", "rq": "rq"}


def open_backend(spec: Spec) -> Backend:
    return KINDS[spec.kind](**spec.params)


def available(kind: str) -> str | None:
    """None if the peer's Python package imports, else the reason it is skipped."""
    mod = MODULES.get(kind)
    if mod is None:
        return None
    try:
        importlib.import_module(mod)
    except Exception as e:  # noqa: BLE001 - any import failure means "skipped"
        return f"python package {mod!r} not importable: {type(e).__name__}: {e}"
    return None


def setup_sqlite_peer(kind: str, root: str) -> Spec:
    """A fresh database for one peer; created in the parent so children only open it."""
    d = os.path.join(root, kind)
    os.makedirs(d, exist_ok=True)
    path = d if kind == "persist-queue" else os.path.join(d, "queue.db")
    b = open_backend(Spec(kind, {"path": path}))
    b.close()
    return Spec(kind, {"path": path})


# ------------------------------------------------------------------ redis-server


class RedisServer:
    """A private redis-server with appendfsync always; stopped by PID."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @staticmethod
    def binary() -> str | None:
        return (
            shutil.which("redis-server")
            or (os.path.exists("/usr/bin/redis-server") and "/usr/bin/redis-server")
            or None
        )

    def start(self) -> None:
        binary = self.binary()
        if binary is None:
            raise RuntimeError("redis-server not installed (apt-get install -y redis-server)")
        os.makedirs(self.workdir, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        argv = [
            binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.workdir,
            "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
            "--protected-mode", "yes", "--logfile", os.path.join(self.workdir, "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        log(f"redis-server pid {self.proc.pid} on 127.0.0.1:{self.port}")
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not answer PING within 10 s")

    def flush(self) -> None:
        import redis

        redis.Redis(host="127.0.0.1", port=self.port).flushall()

    def config(self) -> dict[str, str]:
        import redis

        r = redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)
        out: dict[str, str] = {}
        for key in ("appendonly", "appendfsync", "save"):
            out.update(r.config_get(key))
        return out

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()  # our own child, by PID
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
