"""cffi (API, out-of-line) build of ``steadqd.fs.claimcore._claim_core`` from claim_core.c (``setup.py`` runs it).

``python steadqd/fs/claimcore/claim_core_build.py`` builds it in place by hand; ``pip install -e .``
does it through setup.py's ``cffi_modules``. SHA-256 comes from the system's OpenSSL libcrypto
(build: libssl-dev; run: libssl3 / libcrypto, which Python's own hashlib links on Debian).
Without the module the claim runs in pure Python (steadqd.fs.claim_fast says which path runs).
"""

from __future__ import annotations

import os

import cffi

HERE = os.path.dirname(os.path.abspath(__file__))

CDEF = """
#define SQ_HEAD_BYTES 4096
#define SQ_MAX_RECS 16
#define SQ_NAME_MAX 256
#define SQ_STOP_PURE 1
#define SQ_STOP_SYSCALL 2
#define SQ_STOP_CHECK 3
#define SQ_STOP_HANDOFF 4
#define SQ_VERIFIED 5
#define SQ_MOVED 6
#define SQ_MOVED_PAYLOAD_LEFT 7
#define SQ_OP_OPEN 1
#define SQ_OP_FSTAT 2
#define SQ_OP_PREAD 3
#define SQ_OP_STAT 4
#define SQ_OP_RENAME 5
#define SQ_OP_FSYNC 6
struct sq_stat {
    uint64_t dev, ino; /* dev_t and ino_t are unsigned 64-bit on Linux */
    int64_t nlink, size, uid, gid;
    uint32_t mode;
    int64_t atime, mtime, ctime;
};
struct sq_sys {
    int (*openat)(int dirfd, const char *name, int flags);
    int (*fstat)(int fd, struct sq_stat *st);
    int64_t (*pread)(int fd, unsigned char *buf, int64_t n, int64_t off);
    int (*lstatat)(int dirfd, const char *name, struct sq_stat *st);
    int (*rename_noreplace)(int olddirfd, const char *oldname, int newdirfd, const char *newname);
    int (*fsync)(int fd);
};
struct sq_rec { int op; int err; int64_t ret; int slot; };
struct sq_queue {
    unsigned char queue_id[16];
    uint32_t shard_count;
    uint64_t lease_width_ns;
    uint64_t max_payload;
    unsigned char prefix_state[3][112];
};
struct sq_claim {
    int dir_fd;
    char name[256];
    int shard;
    int opened_fd;
    int stage;
    int fd;
    unsigned char job_id[16];
    uint64_t generation;
    uint32_t attempt, max_attempts;
    uint64_t payload_length;
    uint32_t extension_length;
    unsigned char payload_digest[32];
    unsigned char envelope_digest[32];
    struct sq_stat stats[5];
    unsigned char head[4096];
    int64_t head_len;
    unsigned char boot_id[16];
    uint64_t bt_deadline, wall_deadline;
    unsigned char token[16];
    int may_fsync;
    char target[256];
    unsigned char head2[4096];
    int64_t head2_len;
    int payload_in_head;
    struct sq_rec recs[16];
    int nrec;
};
void sq_queue_init(struct sq_queue *q);
int sq_claim_verify(const struct sq_queue *q, const struct sq_sys *sys, struct sq_claim *c, int dir_fd,
                    const char *name, int shard, int opened_fd);
int sq_claim_move(const struct sq_queue *q, const struct sq_sys *sys, struct sq_claim *c, const unsigned char *boot_id,
                  uint64_t bt_deadline, uint64_t wall_deadline, const unsigned char *token, int may_fsync);
const struct sq_sys *sq_direct_table(void);
extern "Python" int sq_py_openat(int, const char *, int);
extern "Python" int sq_py_fstat(int, struct sq_stat *);
extern "Python" int64_t sq_py_pread(int, unsigned char *, int64_t, int64_t);
extern "Python" int sq_py_lstatat(int, const char *, struct sq_stat *);
extern "Python" int sq_py_rename_noreplace(int, const char *, int, const char *);
extern "Python" int sq_py_fsync(int);
"""

ffibuilder = cffi.FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "steadqd.fs.claimcore._claim_core",
    '#include "claim_core.h"',
    sources=[os.path.relpath(os.path.join(HERE, "claim_core.c"))],
    include_dirs=[os.path.relpath(HERE)],
    depends=[os.path.relpath(os.path.join(HERE, "claim_core.h"))],
    libraries=["crypto"],
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=os.path.join(HERE, "..", "..", ".."), verbose=True)
