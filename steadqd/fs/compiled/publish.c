/* The enqueue: publish.py's happy path for a small bytes payload to ready/ in C.
 *
 * publish.py stays the specification. sq_enqueue mirrors _prepare after the job id and wall floor
 * (ready_filename: the name and its tag; build_header: the payload and envelope digests) and
 * _Publication._via_tmpfile: open_tmpfile, write_anonymous (one write_all of header, extension
 * and payload: one write unless it comes back short, then the nlink check), sync_anonymous, link
 * (the link form the handle uses) and the directory barrier. At the first deviation it stops
 * (e.stage) and publish._enqueue_fast runs the Python from _prepare with these syscalls replayed.
 * Its inputs are the caller's (the payload, the extension the Python encoded), never the tree's.
 */
#include "core.h"

#include <string.h>

#define ONE_WRITE (64 * 1024) /* publish._ONE_WRITE */
#define JOB_BUF (HEADER_SIZE + MAX_EXTENSION_LENGTH + ONE_WRITE)

static const unsigned char MAGIC[8] = {'S', 'D', 'Q', 'J', 'O', 'B', '1', 0};

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static void put_be64(unsigned char *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* names.ready_filename: "<job>.g0000000000000000.a00000000.m<max>", tagged over
 * "ready/-/-/<shard:04x>/<base>" (names._READY_CONTEXT), then ".sqj". */
static void ready_target(const struct sq_queue *q, const unsigned char *job_id, uint32_t max_attempts, uint32_t shard,
                         char out[SQ_NAME_MAX]) {
    char base[96], dir[32];
    char *p = base;
    p = put_job_fields(p, job_id, 0, 0, max_attempts);
    size_t base_len = (size_t)(p - base);
    char *x = dir;
    memcpy(x, "ready/-/-/", 10), x += 10;
    x = put_hex_u64(x, shard, 4), *x++ = '/';
    tagged_name(q, dir, (size_t)(x - dir), base, base_len, ".sqj", out);
}

#define PUB_REC(op, call, slot) rec_in(e->recs, &e->nrec, (op), (call), (slot))

int sq_enqueue(const struct sq_queue *q, const struct sq_sys *sys, struct sq_enqueue *e, const unsigned char *job_id,
               uint32_t max_attempts, uint64_t created_at, const unsigned char *extension, uint32_t extension_length,
               const unsigned char *payload, uint64_t payload_length, int dir_fd, uint32_t shard, int mode, int proc) {
    static _Thread_local unsigned char job[JOB_BUF];
    e->nrec = 0;
    e->fd = -1;
    e->stage = SQ_STOP_PURE;
    /* the checks _Options, _writer and _encode_header make (the caller's max_payload test included) */
    if (max_attempts == 0 || extension_length > MAX_EXTENSION_LENGTH || payload_length > ONE_WRITE) return e->stage;
    ready_target(q, job_id, max_attempts, shard, e->name);
    /* build_header: the draft with a zero envelope digest, its digest over the draft and extension */
    unsigned char *h = job;
    memset(h, 0, HEADER_SIZE);
    memcpy(h, MAGIC, 8);
    h[9] = 1;  /* major (u16) */
    h[11] = 1; /* minor: FORMAT_MINOR (u16) */
    put_be32(h + 12, extension_length);
    put_be64(h + 16, payload_length);
    h[28] = 1; /* SHA-256 */
    memcpy(h + 32, job_id, 16);
    put_be32(h + 48, max_attempts);
    put_be64(h + 56, created_at);
    SHA256_CTX s;
    SHA256_Init(&s);
    SHA256_Update(&s, payload, (size_t)payload_length);
    SHA256_Final(h + 64, &s);
    memcpy(&s, q->prefix_state[PREFIX_ENVELOPE], sizeof s);
    SHA256_Update(&s, h, HEADER_SIZE);
    SHA256_Update(&s, extension, extension_length);
    SHA256_Final(e->envelope_digest, &s);
    memcpy(h + ENVELOPE_DIGEST_OFFSET, e->envelope_digest, 32);
    memcpy(job + HEADER_SIZE, extension, extension_length);
    memcpy(job + HEADER_SIZE + extension_length, payload, (size_t)payload_length);
    int64_t total = HEADER_SIZE + (int64_t)extension_length + (int64_t)payload_length;
    /* open_anonymous */
    e->stage = SQ_STOP_SYSCALL;
    int fd = (int)PUB_REC(SQ_OP_TMPFILE, sys->tmpfile(dir_fd, mode), 0);
    if (fd < 0) return e->stage;
    e->fd = fd;
    /* write_all: a short write goes on from where it stopped, a zero-byte write is the Python's EIO */
    int64_t done = 0;
    while (done < total) {
        int64_t n = PUB_REC(SQ_OP_WRITE, sys->write(fd, job + done, total - done), 0);
        if (n <= 0 || e->nrec >= SQ_MAX_RECS - 4) return e->stage; /* the records must hold the rest */
        done += n > total - done ? total - done : n;
    }
    if (PUB_REC(SQ_OP_FSTAT, sys->fstat(fd, &e->stats[0]), 0) < 0) return e->stage;
    e->stage = SQ_STOP_CHECK;
    if (e->stats[0].nlink != 0) return e->stage;
    e->stage = SQ_STOP_SYSCALL;
    if (PUB_REC(SQ_OP_FSYNC, sys->fsync(fd), 0) < 0) return e->stage;
    if (PUB_REC(SQ_OP_LINK, sys->link(fd, dir_fd, e->name, proc), proc) < 0) return e->stage;
    if (PUB_REC(SQ_OP_FSYNC, sys->fsync(dir_fd), 0) < 0) return e->stage;
    e->stage = SQ_PUBLISHED;
    return e->stage;
}
