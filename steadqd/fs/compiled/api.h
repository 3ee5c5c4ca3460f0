/* The C core (issue 35): the happy paths of the claim (claim.c), ack (settle.c), payload() (lease.c) and enqueue (publish.c).
 * Declarations shared by its files (core.h includes this) and the cffi build (build.py). */
#ifndef STEADQ_CLAIM_CORE_H
#define STEADQ_CLAIM_CORE_H

#include <stdint.h>

/* Between the cdef markers: the text build.py hands to cffi as it is, its one source for
 * the constants, structs and prototypes (plain declarations and integer #defines only). */
/* cdef-begin */
#define SQ_HEAD_BYTES 4096 /* constants.ENVELOPE_READ_BYTES */
#define SQ_MAX_RECS 16
#define SQ_NAME_MAX 256
#define SQ_CHUNK_BYTES 32768 /* constants.CLAIM_SCAN_CHUNK_BYTES (bridge.py checks) */

/* Where a call stopped (sq_claim.stage). */
#define SQ_STOP_PURE 1     /* a check without a syscall failed (or was not taken): nothing to replay */
#define SQ_STOP_SYSCALL 2  /* a syscall failed; its record holds the errno */
#define SQ_STOP_CHECK 3    /* a check on what a syscall returned failed */
#define SQ_STOP_HANDOFF 4  /* a step C leaves to Python (a long extension, batching, payload beyond the first read) */
#define SQ_VERIFIED 5      /* sq_claim_verify: name, tag, shard, attempts, envelope all good */
#define SQ_MOVED 6         /* sq_claim_move: renamed, re-read, directory synced, payload verified */
#define SQ_MOVED_PAYLOAD_LEFT 7 /* renamed, re-read, synced; the payload check is Python's (past the first
                                 * read, or not matching: claim_open's end judges it) */
#define SQ_ACKED 8 /* sq_ack: validated, payload verified, renamed into receipts, directories synced */
#define SQ_PUBLISHED 9 /* sq_enqueue: written, synced, linked, its directory synced */
#define SQ_MOVED_BARRIER_LEFT 10 /* sq_ack, sq_claim_move in a batch: renamed and checked; the barriers are the tree's */
#define SQ_PAYLOAD_READ 11 /* sq_read_payload: validated, the path re-stat'ed, the payload (in the first read) verified */

/* Syscall ops recorded (sq_rec.op): the replay maps them to syscall_hook's op names. */
#define SQ_OP_OPEN 1
#define SQ_OP_FSTAT 2
#define SQ_OP_PREAD 3
#define SQ_OP_STAT 4
#define SQ_OP_RENAME 5
#define SQ_OP_FSYNC 6
#define SQ_OP_TMPFILE 7
#define SQ_OP_WRITE 8
#define SQ_OP_LINK 9

struct sq_stat {
    uint64_t dev, ino; /* dev_t and ino_t are unsigned 64-bit on Linux */
    int64_t nlink, size, uid, gid;
    uint32_t mode;
    int64_t atime, mtime, ctime; /* seconds (only carried for the replayed os.stat_result) */
};

/* The table every syscall of the core goes through: libc directly (sq_direct_table) or, when
 * syscall_hook is armed or tracing, cffi callbacks into steadqd.fs.linux (bridge.py).
 * Each returns >= 0 on success and -errno on failure. */
struct sq_sys {
    int (*openat)(int dirfd, const char *name, int flags);
    int (*fstat)(int fd, struct sq_stat *st);
    int64_t (*pread)(int fd, unsigned char *buf, int64_t n, int64_t off);
    int (*lstatat)(int dirfd, const char *name, struct sq_stat *st);
    int (*rename_noreplace)(int olddirfd, const char *oldname, int newdirfd, const char *newname);
    int (*fsync)(int fd);
    int (*tmpfile)(int dirfd, int mode);
    int64_t (*write)(int fd, const unsigned char *buf, int64_t n);
    int (*link)(int fd, int dirfd, const char *name, int proc); /* proc: the /proc/self/fd form */
    int64_t (*getdents)(int fd, unsigned char *buf, int64_t n); /* getdents64: the bytes of linux_dirent64 records */
};

/* One syscall made: op, its result (fd / byte count / 0) or errno, and where its data is. */
struct sq_rec {
    int op;
    int err;
    int64_t ret;
    int slot; /* FSTAT/STAT: index into sq_claim.stats; PREAD: 0 = head, 1 = head2 */
};

/* Per queue: the FORMAT values a claim needs, and the SHA-256 prefixes every name of the queue shares. */
struct sq_queue {
    unsigned char queue_id[16];
    uint32_t shard_count;
    uint64_t lease_width_ns;
    uint64_t max_payload;
    unsigned char prefix_state[3][112]; /* opaque SHA256_CTX copies: name, shard, envelope domains */
    /* names.looks_ready's shape of a ready name, from names.py (bridge.Core): its extension and dot count */
    char ready_ext[8];
    uint32_t ready_ext_len, ready_dots;
};

struct sq_claim {
    /* the arguments of sq_claim_verify */
    int dir_fd;
    char name[SQ_NAME_MAX];
    int shard;
    int opened_fd; /* -1, or the fd _try_leftover opened */
    /* outputs of sq_claim_verify */
    int stage;
    int fd;
    unsigned char job_id[16];
    uint64_t generation;
    uint32_t attempt, max_attempts;
    uint64_t payload_length;
    uint32_t extension_length;
    unsigned char payload_digest[32];
    unsigned char envelope_digest[32];
    struct sq_stat stats[5]; /* 0 fstat, 1 stat source, 2 stat destination, 3 re-read fstat */
    unsigned char head[SQ_HEAD_BYTES];
    int64_t head_len;
    /* the arguments of sq_claim_move */
    unsigned char boot_id[16];
    uint64_t bt_deadline, wall_deadline;
    unsigned char token[16];
    int may_fsync; /* 0 when the tree batches barriers (tree.barrier's other branch: Python's) */
    /* outputs of sq_claim_move */
    char target[SQ_NAME_MAX];
    unsigned char head2[SQ_HEAD_BYTES];
    int64_t head2_len;
    int payload_in_head; /* 1: the payload digest was checked on head2 and matched (SQ_MOVED; in a batch, SQ_MOVED_BARRIER_LEFT) */
    /* every syscall made, in order */
    struct sq_rec recs[SQ_MAX_RECS];
    int nrec;
};

/* One ack (settle.ack after the pure checks of lease.validate_source): the leased file's checks
 * and its witnessed move into receipts/; or one payload() (sq_read_payload: the same checks, the
 * path's stat, no move; ``target`` unused). The caller closes ``fd`` (>= 0 once the open succeeded). */
struct sq_ack {
    char name[SQ_NAME_MAX];   /* the leased file, in the lease's directory */
    char target[SQ_NAME_MAX]; /* the receipt, in its bucket's shard directory */
    int stage;
    int fd;
    struct sq_stat stats[5]; /* 0 fstat, 1 stat source, 2 stat destination, 3/4 fstat source/destination dir */
    unsigned char head[SQ_HEAD_BYTES];
    int64_t head_len;
    int64_t payload_offset; /* where the payload starts in head (set once the header checked out) */
    int head_known; /* 1: head is byte for byte the caller's known verified read (verify.py's memo): no digest again */
    struct sq_rec recs[SQ_MAX_RECS];
    int nrec;
};

/* One enqueue of a small bytes payload to ready/ (publish.py's _prepare after its id and wall floor,
 * and _Publication._via_tmpfile): the name and header, then O_TMPFILE, one write, the nlink check,
 * fsync, the link, the directory fsync. The caller closes ``fd`` (>= 0 once the open succeeded). */
struct sq_enqueue {
    char name[SQ_NAME_MAX];
    int stage;
    int fd;
    struct sq_stat stats[1];
    unsigned char envelope_digest[32];
    struct sq_rec recs[SQ_MAX_RECS];
    int nrec;
};

/* One chunk of a ready shard read by the claim scan (sq_read_ready, scan.c): the names of its entries
 * but "." and "..", sorted as claim._Scan._ready_looking sorts them. Names hold no "/" and no NUL,
 * so each list is its names joined by "/" (NUL-terminated); every record holds more bytes than its
 * name and a separator, so a list always fits. */
struct sq_chunk {
    unsigned char buf[SQ_CHUNK_BYTES];
    int64_t listed;                 /* entries read but "." and ".." */
    int64_t ready_count;            /* ASCII names of a ready name's shape (names.looks_ready) */
    char ready[SQ_CHUNK_BYTES + 1];
    int64_t ignored_count;          /* names with a byte past ASCII: never jobs (ScanReport.ignored) */
    char ignored[SQ_CHUNK_BYTES + 1];
};

void sq_queue_init(struct sq_queue *q);
/* One getdents64 of dir_fd through the table into k: k->listed (>= 0), or -errno. */
int64_t sq_read_ready(const struct sq_queue *q, const struct sq_sys *sys, struct sq_chunk *k, int dir_fd);
int sq_claim_verify(const struct sq_queue *q, const struct sq_sys *sys, struct sq_claim *c, int dir_fd,
                    const char *name, int shard, int opened_fd);
int sq_claim_move(const struct sq_queue *q, const struct sq_sys *sys, struct sq_claim *c, const unsigned char *boot_id,
                  uint64_t bt_deadline, uint64_t wall_deadline, const unsigned char *token, int may_fsync);
/* The ack (settle.c). The lease's fields as arguments, as sq_read_payload's (converting them is cheaper
 * than filling a struct): job_id, token 16 bytes, the digests 32 bytes each (the caller checks). */
int sq_ack(const struct sq_queue *q, const struct sq_sys *sys, struct sq_ack *a, int dir_fd, const char *name,
           uint64_t dev, uint64_t ino, uint64_t max_attempts, uint64_t payload_length, const unsigned char *job_id,
           const unsigned char *envelope_digest, const unsigned char *payload_digest, uint64_t generation,
           uint32_t attempt, const unsigned char *token, int dst_fd, uint32_t shard, uint64_t bucket,
           const uint64_t *src_dir_id,
           const uint64_t *dst_dir_id, /* the directories' {dev, ino} when the tree knows them, else NULL */
           int may_fsync, /* 0 in a batch: stop before the barriers (SQ_MOVED_BARRIER_LEFT) */
           const unsigned char *known_head, int64_t known_len); /* verify.py's memo for the lease's file, or NULL */
int sq_enqueue(const struct sq_queue *q, const struct sq_sys *sys, struct sq_enqueue *e, const unsigned char *job_id,
               uint32_t max_attempts, uint64_t created_at, const unsigned char *extension, uint32_t extension_length,
               const unsigned char *payload, uint64_t payload_length, int dir_fd, uint32_t shard, int mode, int proc);
/* Lease.payload() of a payload the first read holds. The lease's fields as sq_ack's (the caller checks). */
int sq_read_payload(const struct sq_queue *q, const struct sq_sys *sys, struct sq_ack *a, int dir_fd, const char *name,
                    uint64_t dev, uint64_t ino, uint64_t max_attempts, uint64_t payload_length,
                    const unsigned char *job_id, const unsigned char *envelope_digest,
                    const unsigned char *payload_digest,
                    const unsigned char *known_head, int64_t known_len); /* verify.py's memo for the file, or NULL */
const struct sq_sys *sq_direct_table(void); /* the libc table */
/* cdef-end */

#endif
