/* The claim core: the happy path of one claim transition in C (issue 35, constraint 1(b)).
 *
 * steadqd/fs/claim.py stays the specification. This file mirrors, step by step and in the
 * same syscall order, _Scan.consider / claim_open (claim.py), read_envelope and
 * reread_envelope (verify.py), JobHeader.decode and check_envelope (records.py),
 * parse_name / authenticate / shard_of / make_filename (names.py) and Tree.move_witnessed
 * (tree.py); the extension's CBOR (decode_extension) stays Python's, between the two calls. At the first deviation (a check fails, a
 * syscall fails, a step it leaves to Python) it stops and says where (sq_claim.stage); every
 * syscall it made is in sq_claim.recs, so the Python (claim_fast.py) can run the one Python
 * definition from the start with those results replayed instead of made again.
 *
 * Every syscall goes through a struct sq_sys table: libc (sq_direct_table below), or cffi
 * callbacks into steadqd.fs.linux when syscall_hook traces or injects, so traces, faults and
 * the crash lab see the same sequence on both paths.
 *
 * Input is hostile (anyone who can write ready/<S>/ chooses names and bytes): every read is
 * bounded by the buffer it lands in, every loop by a constant or by a length checked first.
 */
#define OPENSSL_SUPPRESS_DEPRECATED 1
#include "claim_core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <openssl/sha.h>

_Static_assert(sizeof(SHA256_CTX) <= 112, "sq_queue.prefix_state holds a SHA256_CTX");

#define HEADER_SIZE 128
#define ENVELOPE_DIGEST_OFFSET 96
#define MAX_EXTENSION_LENGTH 65536u
#define MAX_PAYLOAD_LENGTH ((1ull << 40) - 1)
#define U32_MAX 0xffffffffull
#define U64_MAX 0xffffffffffffffffull
#define NAME_TAG_BYTES 8
#define EINTR_RETRIES 64 /* os.* retry EINTR without end (PEP 475); a bound here, then the error */

enum { PREFIX_NAME = 0, PREFIX_SHARD = 1, PREFIX_ENVELOPE = 2 };

static const unsigned char DOMAIN_NAME[] = "SteadQ-1-name"; /* + NUL: sizeof includes it */
static const unsigned char DOMAIN_SHARD[] = "SteadQ-1-shard";
static const unsigned char DOMAIN_ENVELOPE[] = "SteadQ-1-envelope";
static const unsigned char JOB_MAGIC[8] = {'S', 'D', 'Q', 'J', 'O', 'B', '1', 0};
static const char HEXDIGITS[] = "0123456789abcdef";

/* ------------------------------------------------------------------ the direct table (libc) */

static void fill_stat(struct sq_stat *out, const struct stat *st) {
    out->dev = (uint64_t)st->st_dev;
    out->ino = (uint64_t)st->st_ino;
    out->nlink = (int64_t)st->st_nlink;
    out->size = (int64_t)st->st_size;
    out->uid = (int64_t)st->st_uid;
    out->gid = (int64_t)st->st_gid;
    out->mode = (uint32_t)st->st_mode;
    out->atime = (int64_t)st->st_atime;
    out->mtime = (int64_t)st->st_mtime;
    out->ctime = (int64_t)st->st_ctime;
}

static int d_openat(int dirfd, const char *name, int flags) {
    for (int i = 0; i < EINTR_RETRIES; i++) {
        int fd = openat(dirfd, name, flags | O_CLOEXEC, 0600); /* linux.open_at adds O_CLOEXEC */
        if (fd >= 0) return fd;
        if (errno != EINTR) return -errno;
    }
    return -EINTR;
}

static int d_fstat(int fd, struct sq_stat *out) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -errno;
    fill_stat(out, &st);
    return 0;
}

static int64_t d_pread(int fd, unsigned char *buf, int64_t n, int64_t off) {
    for (int i = 0; i < EINTR_RETRIES; i++) {
        ssize_t got = pread(fd, buf, (size_t)n, (off_t)off);
        if (got >= 0) return (int64_t)got;
        if (errno != EINTR) return -errno;
    }
    return -EINTR;
}

static int d_lstatat(int dirfd, const char *name, struct sq_stat *out) {
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return -errno;
    fill_stat(out, &st);
    return 0;
}

static int d_rename_noreplace(int olddirfd, const char *oldname, int newdirfd, const char *newname) {
    /* renameat2(RENAME_NOREPLACE) as libc.renameat2 makes it: the raw syscall needs no glibc 2.28 */
    long r = syscall(SYS_renameat2, olddirfd, oldname, newdirfd, newname, 1u /* RENAME_NOREPLACE */);
    return r == 0 ? 0 : -errno;
}

static int d_fsync(int fd) {
    for (int i = 0; i < EINTR_RETRIES; i++) {
        if (fsync(fd) == 0) return 0;
        if (errno != EINTR) return -errno;
    }
    return -EINTR;
}

static const struct sq_sys direct_table = {d_openat, d_fstat, d_pread, d_lstatat, d_rename_noreplace, d_fsync};

const struct sq_sys *sq_direct_table(void) { return &direct_table; }

/* ------------------------------------------------------------------ helpers */

/* Note one syscall in recs[*nrec]; returns its result. The record array is larger than any path's count. */
static int64_t rec_in(struct sq_rec *recs, int *nrec, int op, int64_t ret, int slot) {
    if (*nrec < SQ_MAX_RECS) {
        struct sq_rec *r = &recs[(*nrec)++];
        r->op = op;
        r->err = ret < 0 ? (int)-ret : 0;
        r->ret = ret < 0 ? -1 : ret;
        r->slot = slot;
    }
    return ret;
}

static int64_t rec(struct sq_claim *c, int op, int64_t ret, int slot) { return rec_in(c->recs, &c->nrec, op, ret, slot); }

static int hexval(char ch) { /* lowercase hex only: names.md's grammar */
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

/* ``width`` lowercase hex digits at s into a u64 (width <= 16); -1 if any is not. */
static int parse_hex_u64(const char *s, int width, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < width; i++) {
        int d = hexval(s[i]);
        if (d < 0) return -1;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return 0;
}

static int parse_hex_bytes(const char *s, int nbytes, unsigned char *out) {
    for (int i = 0; i < nbytes; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

static char *put_hex(char *p, const unsigned char *b, int n) {
    for (int i = 0; i < n; i++) {
        *p++ = HEXDIGITS[b[i] >> 4];
        *p++ = HEXDIGITS[b[i] & 15];
    }
    return p;
}

static char *put_hex_u64(char *p, uint64_t v, int width) {
    for (int i = width - 1; i >= 0; i--) *p++ = HEXDIGITS[(v >> (4 * i)) & 15];
    return p;
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t be64(const unsigned char *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

static int single_regular(const struct sq_stat *st) { /* tree.is_single_regular */
    return S_ISREG(st->mode) && st->nlink == 1;
}

/* Witness.names_single_file */
static int names_single_file(const struct sq_stat *witness, const struct sq_stat *st) {
    return st->dev == witness->dev && st->ino == witness->ino && single_regular(st);
}

/* The tag of ``ctx`` (names.compute_tag): SHA256(domain || queue id || context), first 8 bytes. */
static void name_tag(const struct sq_queue *q, const char *ctx, size_t len, unsigned char tag[NAME_TAG_BYTES]) {
    SHA256_CTX h;
    unsigned char d[32];
    memcpy(&h, q->prefix_state[PREFIX_NAME], sizeof h);
    SHA256_Update(&h, ctx, len);
    SHA256_Final(d, &h);
    memcpy(tag, d, NAME_TAG_BYTES);
}

/* ------------------------------------------------------------------ entry points */

void sq_queue_init(struct sq_queue *q) {
    SHA256_CTX h;
    SHA256_Init(&h);
    SHA256_Update(&h, DOMAIN_NAME, sizeof DOMAIN_NAME); /* the NUL is part of the domain */
    SHA256_Update(&h, q->queue_id, 16);
    memcpy(q->prefix_state[PREFIX_NAME], &h, sizeof h);
    SHA256_Init(&h);
    SHA256_Update(&h, DOMAIN_SHARD, sizeof DOMAIN_SHARD);
    SHA256_Update(&h, q->queue_id, 16);
    memcpy(q->prefix_state[PREFIX_SHARD], &h, sizeof h);
    SHA256_Init(&h);
    SHA256_Update(&h, DOMAIN_ENVELOPE, sizeof DOMAIN_ENVELOPE);
    memcpy(q->prefix_state[PREFIX_ENVELOPE], &h, sizeof h);
}

/* A ready name is "<32 hex>.g<16 hex>.a<8 hex>.m<8 hex>.k<16 hex>.sqj" (names.parse_name, READY). */
#define READY_BASE_LEN 70 /* up to the ".k" */
#define READY_NAME_LEN (READY_BASE_LEN + 2 + 16 + 4)

/* names.parse_name(READY), authenticate, shard_of and the attempts test of _Scan.consider:
 * 0 if the name passes them all (the parsed fields filled in), else -1. */
static int check_ready_name(const struct sq_queue *q, struct sq_claim *c, unsigned char tag[NAME_TAG_BYTES]) {
    const char *n = c->name;
    size_t len = strnlen(n, SQ_NAME_MAX);
    uint64_t a, m;
    if (len != READY_NAME_LEN) return -1;
    if (parse_hex_bytes(n, 16, c->job_id) || n[32] != '.' || n[33] != 'g' ||
        parse_hex_u64(n + 34, 16, &c->generation) || n[50] != '.' || n[51] != 'a' || parse_hex_u64(n + 52, 8, &a) ||
        n[60] != '.' || n[61] != 'm' || parse_hex_u64(n + 62, 8, &m) || n[70] != '.' || n[71] != 'k' ||
        parse_hex_bytes(n + 72, NAME_TAG_BYTES, tag) || memcmp(n + 88, ".sqj", 4) != 0)
        return -1;
    c->attempt = (uint32_t)a;
    c->max_attempts = (uint32_t)m;
    /* authenticate: the tag over "ready/-/-/<shard:04x>/<base>" (names.tag_context, READY) */
    char ctx[16 + READY_BASE_LEN];
    int k = snprintf(ctx, sizeof ctx, "ready/-/-/%04x/", (unsigned)c->shard & 0xffffu);
    if (k != 15) return -1;
    memcpy(ctx + k, n, READY_BASE_LEN);
    unsigned char want[NAME_TAG_BYTES];
    name_tag(q, ctx, (size_t)k + READY_BASE_LEN, want);
    if (memcmp(want, tag, NAME_TAG_BYTES) != 0) return -1;
    /* shard_of: low bits of the first big-endian u32 of SHA256(shard domain || queue id || job id) */
    SHA256_CTX h;
    unsigned char d[32];
    memcpy(&h, q->prefix_state[PREFIX_SHARD], sizeof h);
    SHA256_Update(&h, c->job_id, 16);
    SHA256_Final(d, &h);
    if ((be32(d) & (q->shard_count - 1)) != (uint32_t)c->shard) return -1;
    if (c->attempt >= c->max_attempts) return -1; /* exhausted: exhausted_to_dead is Python's */
    return 0;
}

/* JobHeader.decode, the size checks of read_envelope and check_envelope on ``h`` (head_len bytes of
 * a file st_size long): 0 if all pass (the lengths filled in), -1 a check failed, 1 the extension is
 * longer than the first read holds (read_envelope's second read is Python's). */
static int check_envelope_bytes(const struct sq_queue *q, const unsigned char *h, int64_t head_len, int64_t size,
                                uint32_t *ext_len_out, uint64_t *payload_len_out) {
    if (head_len < HEADER_SIZE) return -1;
    if (memcmp(h, JOB_MAGIC, 8) != 0) return -1;
    if (be32(h + 8) >> 16 != 1) return -1;          /* major (u16 at 8) */
    uint32_t ext_len = be32(h + 12);                /* extension length (u32 at 12) */
    uint64_t payload_len = be64(h + 16);            /* payload length (u64 at 16) */
    if (be32(h + 24) != 0) return -1;               /* flags */
    if (h[28] != 1) return -1;                      /* digest algorithm: SHA-256 */
    if (h[29] | h[30] | h[31]) return -1;           /* reserved */
    uint32_t max_attempts = be32(h + 48);           /* after the job id (32..48) */
    if (h[52] | h[53] | h[54] | h[55]) return -1;   /* reserved */
    if (max_attempts == 0) return -1;
    if (payload_len > MAX_PAYLOAD_LENGTH) return -1;
    if (ext_len > MAX_EXTENSION_LENGTH) return -1;
    if (payload_len > q->max_payload) return -1;    /* read_envelope: the queue's maximum */
    if ((uint64_t)size != HEADER_SIZE + (uint64_t)ext_len + payload_len) return -1;
    /* An extension beyond the first read: read_envelope's second pread is Python's. */
    if ((int64_t)(HEADER_SIZE + ext_len) > head_len) return 1;
    /* check_envelope: SHA256(envelope domain || header[:96] || 32 zero bytes || extension) */
    static const unsigned char zero[32];
    SHA256_CTX s;
    unsigned char d[32];
    memcpy(&s, q->prefix_state[PREFIX_ENVELOPE], sizeof s);
    SHA256_Update(&s, h, ENVELOPE_DIGEST_OFFSET);
    SHA256_Update(&s, zero, sizeof zero);
    SHA256_Update(&s, h + HEADER_SIZE, ext_len);
    SHA256_Final(d, &s);
    if (memcmp(d, h + ENVELOPE_DIGEST_OFFSET, 32) != 0) return -1;
    *ext_len_out = ext_len;
    *payload_len_out = payload_len;
    return 0;
}

/* check_envelope_bytes on c->head, then check_name_matches: 0, -1 or 1 as check_envelope_bytes. */
static int check_envelope(const struct sq_queue *q, struct sq_claim *c, int64_t size) {
    const unsigned char *h = c->head;
    uint32_t ext_len;
    uint64_t payload_len;
    int r = check_envelope_bytes(q, h, c->head_len, size, &ext_len, &payload_len);
    if (r != 0) return r;
    /* check_name_matches */
    if (memcmp(h + 32, c->job_id, 16) != 0 || be32(h + 48) != c->max_attempts) return -1;
    c->extension_length = ext_len;
    c->payload_length = payload_len;
    memcpy(c->payload_digest, h + 64, 32);
    memcpy(c->envelope_digest, h + ENVELOPE_DIGEST_OFFSET, 32);
    return 0;
}

/* _Scan._try_name / _try_leftover + consider + the verifying half of claim_open, up to the
 * clock reads (which stay Python's, between this call and sq_claim_move). */
int sq_claim_verify(const struct sq_queue *q, const struct sq_sys *sys, struct sq_claim *c, int dir_fd,
                    const char *name, int shard, int opened_fd) {
    unsigned char tag[NAME_TAG_BYTES];
    c->nrec = 0;
    c->dir_fd = dir_fd;
    c->shard = shard;
    c->opened_fd = opened_fd;
    c->fd = opened_fd;
    c->head_len = 0;
    c->stage = SQ_STOP_PURE;
    size_t len = strnlen(name, SQ_NAME_MAX);
    if (len >= SQ_NAME_MAX) return c->stage; /* longer than any name a directory holds */
    memcpy(c->name, name, len + 1);
    if (check_ready_name(q, c, tag) != 0) return c->stage;
    if (c->fd < 0) {
        int fd = (int)rec(c, SQ_OP_OPEN, sys->openat(c->dir_fd, c->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK), 0);
        if (fd < 0) {
            c->stage = SQ_STOP_SYSCALL;
            return c->stage;
        }
        c->fd = fd;
    }
    /* read_envelope */
    if (rec(c, SQ_OP_FSTAT, sys->fstat(c->fd, &c->stats[0]), 0) < 0) {
        c->stage = SQ_STOP_SYSCALL;
        return c->stage;
    }
    const struct sq_stat *st = &c->stats[0];
    c->stage = SQ_STOP_CHECK;
    if (!single_regular(st) || st->size < HEADER_SIZE) return c->stage;
    int64_t n = st->size < SQ_HEAD_BYTES ? st->size : SQ_HEAD_BYTES;
    int64_t got = rec(c, SQ_OP_PREAD, sys->pread(c->fd, c->head, n, 0), 0);
    if (got < 0) {
        c->stage = SQ_STOP_SYSCALL;
        return c->stage;
    }
    c->head_len = got > n ? n : got; /* a callback cannot hand back more than asked */
    int r = check_envelope(q, c, st->size);
    if (r != 0) {
        c->stage = r > 0 ? SQ_STOP_HANDOFF : SQ_STOP_CHECK;
        return c->stage;
    }
    c->stage = SQ_VERIFIED;
    return c->stage;
}

/* The leased name (trusted_leased_name + make_filename): "<ready fields, generation and
 * attempt bumped>.o<boot>.b<bt>.w<wall>.t<token>.k<tag>.sqj", tagged over
 * "leased/<boot dashed>/<bt // width:016x>/<shard:04x>/<base>" (names.tag_context, LEASED). */
static void make_target(const struct sq_queue *q, struct sq_claim *c) {
    char base[200], ctx[300];
    char *p = base;
    p = put_hex(p, c->job_id, 16);
    *p++ = '.', *p++ = 'g';
    p = put_hex_u64(p, c->generation + 1, 16);
    *p++ = '.', *p++ = 'a';
    p = put_hex_u64(p, (uint64_t)c->attempt + 1, 8);
    *p++ = '.', *p++ = 'm';
    p = put_hex_u64(p, c->max_attempts, 8);
    *p++ = '.', *p++ = 'o';
    p = put_hex(p, c->boot_id, 16);
    *p++ = '.', *p++ = 'b';
    p = put_hex_u64(p, c->bt_deadline, 16);
    *p++ = '.', *p++ = 'w';
    p = put_hex_u64(p, c->wall_deadline, 16);
    *p++ = '.', *p++ = 't';
    p = put_hex(p, c->token, 16);
    size_t base_len = (size_t)(p - base);
    char *x = ctx;
    memcpy(x, "leased/", 7), x += 7;
    x = put_hex(x, c->boot_id, 4), *x++ = '-';
    x = put_hex(x, c->boot_id + 4, 2), *x++ = '-';
    x = put_hex(x, c->boot_id + 6, 2), *x++ = '-';
    x = put_hex(x, c->boot_id + 8, 2), *x++ = '-';
    x = put_hex(x, c->boot_id + 10, 6), *x++ = '/';
    x = put_hex_u64(x, c->bt_deadline / q->lease_width_ns, 16), *x++ = '/';
    x = put_hex_u64(x, (uint64_t)c->shard, 4), *x++ = '/';
    memcpy(x, base, base_len), x += base_len;
    unsigned char tag[NAME_TAG_BYTES];
    name_tag(q, ctx, (size_t)(x - ctx), tag);
    char *t = c->target;
    memcpy(t, base, base_len), t += base_len;
    *t++ = '.', *t++ = 'k';
    t = put_hex(t, tag, NAME_TAG_BYTES);
    memcpy(t, ".sqj", 5);
}

/* The moving half of claim_open: Tree.move_witnessed (stat witness, no-replace rename, stat of
 * the destination, the after-rename reread_envelope, the directory barrier) and verify_payload
 * of a payload the re-read holds. Needs sq_claim_verify's SQ_VERIFIED and the clock/token inputs;
 * the caller has checked that generation and attempt can be bumped (next_generation/next_attempt). */
int sq_claim_move(const struct sq_queue *q, const struct sq_sys *sys, struct sq_claim *c, const unsigned char *boot_id,
                  uint64_t bt_deadline, uint64_t wall_deadline, const unsigned char *token, int may_fsync) {
    const struct sq_stat *witness = &c->stats[0];
    memcpy(c->boot_id, boot_id, 16);
    memcpy(c->token, token, 16);
    c->bt_deadline = bt_deadline;
    c->wall_deadline = wall_deadline;
    c->may_fsync = may_fsync;
    c->head2_len = 0;
    c->payload_in_head = 0;
    make_target(q, c);
    c->stage = SQ_STOP_SYSCALL;
    if (rec(c, SQ_OP_STAT, sys->lstatat(c->dir_fd, c->name, &c->stats[1]), 1) < 0) return c->stage;
    c->stage = SQ_STOP_CHECK;
    if (!names_single_file(witness, &c->stats[1])) return c->stage;
    c->stage = SQ_STOP_SYSCALL;
    if (rec(c, SQ_OP_RENAME, sys->rename_noreplace(c->dir_fd, c->name, c->dir_fd, c->target), 0) < 0) return c->stage;
    if (rec(c, SQ_OP_STAT, sys->lstatat(c->dir_fd, c->target, &c->stats[2]), 2) < 0) return c->stage;
    c->stage = SQ_STOP_CHECK;
    if (!names_single_file(witness, &c->stats[2])) return c->stage;
    /* after(): reread_envelope */
    c->stage = SQ_STOP_SYSCALL;
    if (rec(c, SQ_OP_FSTAT, sys->fstat(c->fd, &c->stats[3]), 3) < 0) return c->stage;
    const struct sq_stat *st = &c->stats[3];
    c->stage = SQ_STOP_CHECK;
    if (!single_regular(st) || st->size != witness->size || st->dev != witness->dev || st->ino != witness->ino) return c->stage;
    int64_t n = st->size < SQ_HEAD_BYTES ? st->size : SQ_HEAD_BYTES;
    int64_t got = rec(c, SQ_OP_PREAD, sys->pread(c->fd, c->head2, n, 0), 1);
    if (got < 0) {
        c->stage = SQ_STOP_SYSCALL;
        return c->stage;
    }
    c->head2_len = got > n ? n : got;
    uint64_t payload_offset = HEADER_SIZE + (uint64_t)c->extension_length; /* Envelope.payload_offset */
    if (c->head2_len != c->head_len || memcmp(c->head2, c->head, (size_t)payload_offset) != 0) return c->stage;
    /* the barrier (Tree._barrier_pair: one directory, one fsync, forced) */
    c->stage = SQ_STOP_HANDOFF;
    if (!c->may_fsync) return c->stage;
    c->stage = SQ_STOP_SYSCALL;
    if (rec(c, SQ_OP_FSYNC, sys->fsync(c->dir_fd), 0) < 0) return c->stage;
    /* verify_payload on the re-read, when it holds the whole payload (_head_payload); else, or
     * when it does not match, claim_open's end (check_claimed_payload) takes it from here */
    c->stage = SQ_MOVED_PAYLOAD_LEFT;
    uint64_t end = payload_offset + c->payload_length;
    if (end > (uint64_t)c->head2_len) return c->stage;
    unsigned char d[32];
    SHA256_CTX h; /* the low-level calls: OpenSSL 3's one-shot SHA256() fetches an EVP method each time */
    SHA256_Init(&h);
    SHA256_Update(&h, c->head2 + payload_offset, (size_t)c->payload_length);
    SHA256_Final(d, &h);
    if (memcmp(d, c->payload_digest, 32) != 0) return c->stage;
    c->payload_in_head = 1;
    c->stage = SQ_MOVED;
    return c->stage;
}

/* ------------------------------------------------------------------ the ack */

#define ACK_REC(op, call, slot) rec_in(a->recs, &a->nrec, (op), (call), (slot))

/* settle.ack from lease.validate_source's open on (its pure checks are the caller's, before this
 * call): the open, fstat and identity check, read_envelope, the header against the lease,
 * verify_payload of a payload the first read holds, then Tree.move_witnessed(force=True) into the
 * receipt directory: stat witness, no-replace rename, stat of the destination, the destination's
 * fsync, _same_dir (an fstat of each directory whose id the tree has not learnt yet) and the
 * source's fsync. The caller has the receipt directory's fd already (Tree.ensure_dir, cached) and
 * does not batch barriers. Any deviation stops it (a.stage); the caller replays a.recs. */
int sq_ack(const struct sq_queue *q, const struct sq_sys *sys, struct sq_ack *a, const struct sq_lease *lease,
           int dir_fd, const char *name, int dst_fd, const char *target, const uint64_t *src_dir_id,
           const uint64_t *dst_dir_id) {
    a->nrec = 0;
    a->fd = -1;
    a->head_len = 0;
    a->stage = SQ_STOP_PURE;
    size_t len = strnlen(name, SQ_NAME_MAX), tlen = strnlen(target, SQ_NAME_MAX);
    if (len >= SQ_NAME_MAX || tlen >= SQ_NAME_MAX) return a->stage;
    memcpy(a->name, name, len + 1);
    memcpy(a->target, target, tlen + 1);
    /* validate_source */
    a->stage = SQ_STOP_SYSCALL;
    int fd = (int)ACK_REC(SQ_OP_OPEN, sys->openat(dir_fd, a->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK), 0);
    if (fd < 0) return a->stage;
    a->fd = fd;
    if (ACK_REC(SQ_OP_FSTAT, sys->fstat(fd, &a->stats[0]), 0) < 0) return a->stage;
    const struct sq_stat *st = &a->stats[0];
    a->stage = SQ_STOP_CHECK;
    if (st->dev != lease->dev || st->ino != lease->ino) return a->stage;
    /* read_envelope */
    if (!single_regular(st) || st->size < HEADER_SIZE) return a->stage;
    int64_t n = st->size < SQ_HEAD_BYTES ? st->size : SQ_HEAD_BYTES;
    int64_t got = ACK_REC(SQ_OP_PREAD, sys->pread(fd, a->head, n, 0), 0);
    if (got < 0) {
        a->stage = SQ_STOP_SYSCALL;
        return a->stage;
    }
    a->head_len = got > n ? n : got;
    uint32_t ext_len;
    uint64_t payload_len;
    int r = check_envelope_bytes(q, a->head, a->head_len, st->size, &ext_len, &payload_len);
    if (r != 0) {
        a->stage = r > 0 ? SQ_STOP_HANDOFF : SQ_STOP_CHECK;
        return a->stage;
    }
    /* the header against the lease */
    const unsigned char *h = a->head;
    if (memcmp(h + 32, lease->job_id, 16) != 0 || be32(h + 48) != lease->max_attempts ||
        memcmp(h + ENVELOPE_DIGEST_OFFSET, lease->envelope_digest, 32) != 0 || payload_len != lease->payload_length ||
        memcmp(h + 64, lease->payload_digest, 32) != 0)
        return a->stage;
    /* verify_payload, on the first read (_head_payload); a longer payload is iter_payload's */
    uint64_t payload_offset = HEADER_SIZE + (uint64_t)ext_len;
    if (payload_offset + payload_len > (uint64_t)a->head_len) {
        a->stage = SQ_STOP_HANDOFF;
        return a->stage;
    }
    unsigned char d[32];
    SHA256_CTX sh;
    SHA256_Init(&sh);
    SHA256_Update(&sh, h + payload_offset, (size_t)payload_len);
    SHA256_Final(d, &sh);
    if (memcmp(d, lease->payload_digest, 32) != 0) return a->stage;
    /* Tree.move_witnessed */
    a->stage = SQ_STOP_SYSCALL;
    if (ACK_REC(SQ_OP_STAT, sys->lstatat(dir_fd, a->name, &a->stats[1]), 1) < 0) return a->stage;
    a->stage = SQ_STOP_CHECK;
    if (!names_single_file(st, &a->stats[1])) return a->stage;
    a->stage = SQ_STOP_SYSCALL;
    if (ACK_REC(SQ_OP_RENAME, sys->rename_noreplace(dir_fd, a->name, dst_fd, a->target), 0) < 0) return a->stage;
    if (ACK_REC(SQ_OP_STAT, sys->lstatat(dst_fd, a->target, &a->stats[2]), 2) < 0) return a->stage;
    a->stage = SQ_STOP_CHECK;
    if (!names_single_file(st, &a->stats[2])) return a->stage;
    /* _barrier_pair(always_both=False, force=True): the destination, then the source unless the same directory */
    a->stage = SQ_STOP_SYSCALL;
    if (ACK_REC(SQ_OP_FSYNC, sys->fsync(dst_fd), 0) < 0) return a->stage;
    if (dir_fd != dst_fd) {
        uint64_t src_dev, src_ino, dst_dev, dst_ino;
        if (src_dir_id) {
            src_dev = src_dir_id[0], src_ino = src_dir_id[1];
        } else {
            if (ACK_REC(SQ_OP_FSTAT, sys->fstat(dir_fd, &a->stats[3]), 3) < 0) return a->stage;
            src_dev = a->stats[3].dev, src_ino = a->stats[3].ino;
        }
        if (dst_dir_id) {
            dst_dev = dst_dir_id[0], dst_ino = dst_dir_id[1];
        } else {
            if (ACK_REC(SQ_OP_FSTAT, sys->fstat(dst_fd, &a->stats[4]), 4) < 0) return a->stage;
            dst_dev = a->stats[4].dev, dst_ino = a->stats[4].ino;
        }
        if ((src_dev != dst_dev || src_ino != dst_ino) && ACK_REC(SQ_OP_FSYNC, sys->fsync(dir_fd), 0) < 0)
            return a->stage;
    }
    a->stage = SQ_ACKED;
    return a->stage;
}
