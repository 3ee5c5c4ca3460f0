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


def _compile(workdir: str, name: str, source: str, *flags: str) -> tuple[str | None, str]:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None, "no C compiler (gcc) on PATH"
    src = os.path.join(workdir, f"{name}.c")
    binary = os.path.join(workdir, name)
    with open(src, "w") as f:
        f.write(source)
    r = subprocess.run([cc, "-O2", "-o", binary, src, *flags], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"gcc failed: {r.stderr.strip()[:300]}"
    return binary, "ok"


def build_c_floor(workdir: str) -> tuple[str | None, str]:
    """Compile the C floor; returns (binary or None, reason)."""
    return _compile(workdir, "floor", C_SOURCE)


def run_c_floor(binary: str, root: str, size: int, jobs: int, seconds: float) -> dict[str, Any]:
    os.makedirs(root, exist_ok=True)
    r = subprocess.run(
        [binary, root, str(jobs), str(size), str(seconds)], capture_output=True, text=True, timeout=seconds + 120
    )
    if r.returncode != 0:
        return {"skipped": f"C floor failed: {r.stderr.strip()[:300]}"}
    return {"lifecycle": json.loads(r.stdout)}


SPAWN_C_SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The spawner floor: per job, the queue syscalls steadqd's worker makes to claim and settle
   a job (strace'd, see benchmarks/floor.py), one posix_spawn of the command and a wait.
   CONCURRENCY threads in one process, like the daemon's slots; each runs one job at a time. */

extern char **environ;
#define MAXSHARDS 4096
#define LEASED_TAG ".o00000000000000000000000000000000.b0000000000000000.w0000000000000000.t00000000000000000000000000000000.k0000000000000000.lsd"

struct dent { uint64_t ino; int64_t off; unsigned short reclen; unsigned char type; char name[]; };

static void die(const char *what) { perror(what); exit(1); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int nshards, ready_fd[MAXSHARDS], rcpt_fd[MAXSHARDS], bucket_fd = -1, receipts_root;
static char shard[MAXSHARDS][16], bucket[32];
static char dbuf[32768];
static long dpos, dlen;
static int cursor;                  /* shard being listed, under mu */
static long settled;
static double t_first, t_last;
static const char *command;

static int cmp(const void *a, const void *b) { return strcmp(a, b); }

/* The next ready job, listing one shard at a time with getdents64 (one listing shared by all threads). */
static int next_job(int *s, char *name) {
    pthread_mutex_lock(&mu);
    for (;;) {
        while (dpos < dlen) {
            struct dent *d = (struct dent *)(dbuf + dpos);
            dpos += d->reclen;
            size_t n = strlen(d->name);
            if (n > 4 && strcmp(d->name + n - 4, ".sqj") == 0) {
                *s = cursor; memcpy(name, d->name, n + 1);
                pthread_mutex_unlock(&mu);
                return 1;
            }
        }
        if (cursor >= nshards) { pthread_mutex_unlock(&mu); return 0; }
        long n = syscall(SYS_getdents64, ready_fd[cursor], dbuf, sizeof dbuf);
        if (n < 0) die("getdents64");
        if (n == 0) cursor++;
        dpos = 0; dlen = n;
    }
}

/* receipts/<bucket>/<shard>, made on first use as steadqd makes it. */
static int receipt_dir(int s) {
    pthread_mutex_lock(&mu);
    if (bucket_fd < 0) {
        if (mkdirat(receipts_root, bucket, 0700) && errno != EEXIST) die("mkdir bucket");
        bucket_fd = openat(receipts_root, bucket, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (bucket_fd < 0) die("open bucket");
    }
    if (rcpt_fd[s] < 0) {
        if (mkdirat(bucket_fd, shard[s], 0700) && errno != EEXIST) die("mkdir receipt shard");
        rcpt_fd[s] = openat(bucket_fd, shard[s], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rcpt_fd[s] < 0) die("open receipt shard");
    }
    int fd = rcpt_fd[s];
    pthread_mutex_unlock(&mu);
    return fd;
}

static void read_job(int dir, const char *name, char *buf) {
    int fd = openat(dir, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) die("open job");
    if (pread(fd, buf, 4096, 0) < 0) die("pread");
    close(fd);
}

static void *worker(void *arg) {
    (void)arg;
    char name[256], leased[512], receipt[512], buf[4096];
    char *argv[] = {(char *)command, NULL};
    int s;
    while (next_job(&s, name)) {
        int dir = ready_fd[s];
        size_t base = strlen(name) - 4;
        snprintf(leased, sizeof leased, "%.*s%s", (int)base, name, LEASED_TAG);
        snprintf(receipt, sizeof receipt, "%.*s.rct", (int)base, name);
        /* claim: read the job, rename it to its leased name, read it again, the directory barrier */
        int fd = openat(dir, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) die("open job");
        if (pread(fd, buf, sizeof buf, 0) < 0) die("pread");
        if (renameat2(dir, name, dir, leased, RENAME_NOREPLACE)) die("renameat2 claim");
        if (pread(fd, buf, sizeof buf, 0) < 0) die("pread");
        close(fd);
        if (fsync(dir)) die("fsync ready shard");
        /* the payload's read for the command's copy */
        read_job(dir, leased, buf);
        /* the command */
        pid_t pid;
        int err = posix_spawn(&pid, command, NULL, NULL, argv, environ);
        if (err) { errno = err; die("posix_spawn"); }
        int status;
        if (waitpid(pid, &status, 0) != pid) die("waitpid");
        /* settle: read the lease source, rename into receipts, both directory barriers */
        read_job(dir, leased, buf);
        int rdir = receipt_dir(s);
        if (renameat2(dir, leased, rdir, receipt, RENAME_NOREPLACE)) die("renameat2 ack");
        if (fsync(rdir)) die("fsync receipts shard");
        if (fsync(dir)) die("fsync ready shard");
        double t = now();
        pthread_mutex_lock(&mu);
        if (settled++ == 0) t_first = t;
        t_last = t;
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: spawnfloor QUEUE CONCURRENCY COMMAND\n"); return 2; }
    int conc = atoi(argv[2]);
    command = argv[3];
    if (conc < 1 || conc > 256) { fprintf(stderr, "concurrency 1..256\n"); return 2; }
    char path[4096];
    snprintf(path, sizeof path, "%s/ready", argv[1]);
    int ready_root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (ready_root < 0) die("open ready");
    snprintf(path, sizeof path, "%s/receipts", argv[1]);
    receipts_root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (receipts_root < 0) die("open receipts");
    /* the shard directories, opened once (steadqd's directory cache keeps them open too) */
    long n;
    while ((n = syscall(SYS_getdents64, ready_root, dbuf, sizeof dbuf)) > 0)
        for (long p = 0; p < n;) {
            struct dent *d = (struct dent *)(dbuf + p);
            p += d->reclen;
            if (d->name[0] != '.' && nshards < MAXSHARDS && strlen(d->name) < sizeof shard[0])
                strcpy(shard[nshards++], d->name);
        }
    if (n < 0) die("getdents64 ready");
    qsort(shard, nshards, sizeof shard[0], cmp);
    for (int i = 0; i < nshards; i++) {
        ready_fd[i] = openat(ready_root, shard[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (ready_fd[i] < 0) die("open ready shard");
        rcpt_fd[i] = -1;
    }
    struct timespec wall; clock_gettime(CLOCK_REALTIME, &wall);
    snprintf(bucket, sizeof bucket, "%016llx", (unsigned long long)(wall.tv_sec / 3600));
    pthread_t th[256];
    double start = now();
    for (int i = 0; i < conc; i++)
        if (pthread_create(&th[i], NULL, worker, NULL)) die("pthread_create");
    for (int i = 0; i < conc; i++) pthread_join(th[i], NULL);
    double end = now(), span = t_last - t_first;
    printf("{\"settled\": %ld, \"threads\": %d, \"first_to_last_settle_s\": %.6f, \"jobs_per_s\": %.2f, \"wall_s\": %.6f}\n",
           settled, conc, span, settled > 1 && span > 0 ? (settled - 1) / span : 0.0, end - start);
    return 0;
}
"""


def build_spawn_floor(workdir: str) -> tuple[str | None, str]:
    """Compile the spawner floor (``SPAWN_C_SOURCE``); returns (binary or None, reason)."""
    return _compile(workdir, "spawnfloor", SPAWN_C_SOURCE, "-pthread")


def run_spawn_floor(binary: str, queue: str, concurrency: int, command: str, timeout: float) -> dict[str, Any]:
    """Drain ``queue``'s ready jobs with the spawner floor; its own account (settled, first to last settle)."""
    r = subprocess.run([binary, queue, str(concurrency), command], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"spawner floor failed ({r.returncode}): {r.stderr.strip()[:300]}")
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def c_floor_tmpdir() -> str:
    return tempfile.mkdtemp(prefix="steadqd-bench-cc-")


__all__ = [
    "PyFloor",
    "run_python_floor",
    "build_c_floor",
    "run_c_floor",
    "build_spawn_floor",
    "run_spawn_floor",
    "Rate",
]
