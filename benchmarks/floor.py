"""The floor: the syscalls a strict job needs, with nothing else.

Per job, exactly the durable steps of the strict lifecycle (protocol.md):

* enqueue: ``open(O_TMPFILE)`` in the ready dir, write, ``fsync(file)``,
  ``linkat`` to its name, ``fsync(ready dir)``;
* lease: ``renameat2(RENAME_NOREPLACE)`` within the ready dir, ``fsync(ready dir)``;
* ack: ``renameat2(RENAME_NOREPLACE)`` into a receipts dir, ``fsync(receipts dir)``,
  ``fsync(ready dir)``.

No hashing, no parsing, no verification, no name tags: whatever steadqd spends
beyond this is its own overhead. The Python version goes through
``steadqd.fs.linux`` (the same syscall wrappers, so the same cost model); the C
version, compiled with gcc at run time when available, shows how much of the
floor itself is interpreter overhead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import Any

from steadqd.fs import linux

from .common import Rate, bounded, payload_of


class PyFloor:
    """The floor sequence on one directory pair, in Python."""

    def __init__(self, root: str, prefix: str = "j") -> None:
        os.makedirs(os.path.join(root, "ready"), exist_ok=True)
        os.makedirs(os.path.join(root, "receipts"), exist_ok=True)
        self.ready = os.open(os.path.join(root, "ready"), os.O_RDONLY | os.O_DIRECTORY)
        self.receipts = os.open(os.path.join(root, "receipts"), os.O_RDONLY | os.O_DIRECTORY)
        self.prefix = prefix  # unique per process when several share the directories
        self.seq = 0

    def enqueue(self, payload: bytes) -> str:
        name = f"{self.prefix}{self.seq:012d}.r"
        self.seq += 1
        fd = linux.open_tmpfile(self.ready)
        try:
            linux.write_all(fd, payload)
            linux.fsync(fd)
            linux.link_tmpfile(fd, self.ready, name)
        finally:
            linux.close(fd)
        linux.fsync(self.ready)
        return name

    def lease(self, name: str) -> str:
        leased = name[:-2] + ".l"
        linux.rename_noreplace(self.ready, name, self.ready, leased)
        linux.fsync(self.ready)
        return leased

    def ack(self, leased: str) -> None:
        linux.rename_noreplace(self.ready, leased, self.receipts, leased[:-2] + ".rct")
        linux.fsync(self.receipts)
        linux.fsync(self.ready)

    def close(self) -> None:
        os.close(self.ready)
        os.close(self.receipts)


class ShardedFloor:
    """The floor sequence in a sharded tree, for P producers + C consumers (``drivers.run_mp``).

    One :class:`PyFloor` directory pair per shard, like steadqd's 64 shards, so
    the durable steps are exactly the floor's (O_TMPFILE, fsync, link, fsync
    dir; rename + fsync dir; rename to receipts + two fsyncs), with no hashing,
    parsing or verification. Consumers find jobs by listing the shards (no
    inotify) and claim by the no-replace rename, so two consumers never both
    win a job. Its 4+4 rate is what the file-per-job design itself allows on
    this disk, whatever the language.
    """

    name = "floor"
    at_least_once = True

    def __init__(self, path: str, shards: int = 64) -> None:
        self.shards = [PyFloor(os.path.join(path, f"{i:04x}"), prefix=f"{os.getpid():x}-") for i in range(shards)]
        self.cursor = int.from_bytes(os.urandom(2), "big") % shards

    @staticmethod
    def setup(root: str, shards: int = 64) -> str:
        """Create the tree in the parent, so the children only open it."""
        path = os.path.join(root, "floor-tree")
        ShardedFloor(path, shards).close()
        return path

    def put(self, payload: bytes) -> None:
        self.shards[int.from_bytes(os.urandom(2), "big") % len(self.shards)].enqueue(payload)

    def get(self) -> tuple[PyFloor, str] | None:
        for step in range(len(self.shards)):
            index = (self.cursor + step) % len(self.shards)
            shard = self.shards[index]
            for name in os.listdir(shard.ready):
                if not name.endswith(".r"):
                    continue
                try:
                    leased = shard.lease(name)
                except (FileNotFoundError, FileExistsError):
                    continue  # another consumer won it
                self.cursor = index
                return shard, leased
        return None

    def payload(self, handle: tuple[PyFloor, str]) -> bytes:
        shard, leased = handle
        fd = linux.open_at(shard.ready, leased, os.O_RDONLY)
        try:
            return linux.pread(fd, 1 << 20, 0)
        finally:
            linux.close(fd)

    def ack(self, handle: tuple[PyFloor, str]) -> None:
        shard, leased = handle
        shard.ack(leased)

    def close(self) -> None:
        for shard in self.shards:
            shard.close()


def run_python_floor(root: str, size: int, jobs: int, seconds: float) -> dict[str, Any]:
    """Lifecycle, enqueue-only and lease+ack-only rates of the Python floor."""
    out: dict[str, Any] = {}
    payload = payload_of(size)
    f = PyFloor(os.path.join(root, "life"))
    try:
        out["lifecycle"] = bounded(jobs, seconds, lambda _i: f.ack(f.lease(f.enqueue(payload)))).to_json()
    finally:
        f.close()
    if size > 4096:
        return out
    f = PyFloor(os.path.join(root, "split"))
    try:
        names: list[str] = []
        out["enqueue_only"] = bounded(jobs, seconds, lambda _i: names.append(f.enqueue(payload))).to_json()
        it = iter(names)
        out["lease_ack_only"] = bounded(len(names), seconds, lambda _i: f.ack(f.lease(next(it)))).to_json()
    finally:
        f.close()
    return out


C_SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) { perror(what); exit(1); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: floor DIR JOBS SIZE SECONDS\n"); return 2; }
    const char *root = argv[1]; long jobs = atol(argv[2]); long size = atol(argv[3]); double budget = atof(argv[4]);
    char path[4096];
    snprintf(path, sizeof path, "%s/ready", root); mkdir(path, 0700);
    int ready = open(path, O_RDONLY | O_DIRECTORY); if (ready < 0) die("open ready");
    snprintf(path, sizeof path, "%s/receipts", root); mkdir(path, 0700);
    int rcpt = open(path, O_RDONLY | O_DIRECTORY); if (rcpt < 0) die("open receipts");
    char *buf = malloc(size > 0 ? size : 1); memset(buf, 'x', size);
    double start = now(); long n = 0;
    for (; n < jobs; ) {
        char name[64], leased[64], receipt[64], proc[64];
        snprintf(name, sizeof name, "j%012ld.r", n);
        snprintf(leased, sizeof leased, "j%012ld.l", n);
        snprintf(receipt, sizeof receipt, "j%012ld.rct", n);
        int fd = openat(ready, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600); if (fd < 0) die("O_TMPFILE");
        for (long off = 0; off < size; ) { ssize_t w = write(fd, buf + off, size - off); if (w < 0) die("write"); off += w; }
        if (fsync(fd)) die("fsync file");
        if (linkat(fd, "", ready, name, AT_EMPTY_PATH)) {
            snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
            if (linkat(AT_FDCWD, proc, ready, name, AT_SYMLINK_FOLLOW)) die("linkat");
        }
        close(fd);
        if (fsync(ready)) die("fsync ready");
        if (renameat2(ready, name, ready, leased, RENAME_NOREPLACE)) die("renameat2 lease");
        if (fsync(ready)) die("fsync ready");
        if (renameat2(ready, leased, rcpt, receipt, RENAME_NOREPLACE)) die("renameat2 ack");
        if (fsync(rcpt)) die("fsync receipts");
        if (fsync(ready)) die("fsync ready");
        n++;
        if (now() - start > budget) break;
    }
    double secs = now() - start;
    printf("{\"jobs\": %ld, \"seconds\": %.6f, \"jobs_per_s\": %.2f}\n", n, secs, n / secs);
    return 0;
}
"""


def build_c_floor(workdir: str) -> tuple[str | None, str]:
    """Compile the C floor; returns (binary or None, reason)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None, "no C compiler (gcc) on PATH"
    src = os.path.join(workdir, "floor.c")
    binary = os.path.join(workdir, "floor")
    with open(src, "w") as f:
        f.write(C_SOURCE)
    r = subprocess.run([cc, "-O2", "-o", binary, src], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"gcc failed: {r.stderr.strip()[:300]}"
    return binary, "ok"


def run_c_floor(binary: str, root: str, size: int, jobs: int, seconds: float) -> dict[str, Any]:
    os.makedirs(root, exist_ok=True)
    r = subprocess.run(
        [binary, root, str(jobs), str(size), str(seconds)], capture_output=True, text=True, timeout=seconds + 120
    )
    if r.returncode != 0:
        return {"skipped": f"C floor failed: {r.stderr.strip()[:300]}"}
    return {"lifecycle": json.loads(r.stdout)}


def c_floor_tmpdir() -> str:
    return tempfile.mkdtemp(prefix="steadqd-bench-cc-")


__all__ = ["PyFloor", "run_python_floor", "build_c_floor", "run_c_floor", "Rate"]
