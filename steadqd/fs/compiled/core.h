/* What the C core's files share (not part of the cffi declarations: api.h is).
 *
 * The files mirror the Python modules that are their specification: names.c (names.py: the tag and
 * the hash prefixes), verify.c (verify.py and records.py: the envelope), claim.c (claim.py, tree.py's
 * witnessed move), lease.c (lease.validate_source: what the ack and payload() share, and payload()),
 * settle.c (settle.py: the ack), scan.c (claim.py: a ready shard's chunk of names), publish.c (publish.py: the enqueue) and syscall_table.c (the libc table
 * every syscall goes through unless syscall_hook traces or injects). Input is hostile: every read is
 * bounded by the buffer it lands in, every loop by a constant or a length checked first.
 */
#ifndef STEADQ_CORE_H
#define STEADQ_CORE_H

#define OPENSSL_SUPPRESS_DEPRECATED 1
#include "api.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <openssl/sha.h>

#define HEADER_SIZE 128
#define ENVELOPE_DIGEST_OFFSET 96
#define MAX_EXTENSION_LENGTH 65536u
#define MAX_PAYLOAD_LENGTH ((1ull << 40) - 1)
#define U32_MAX 0xffffffffull
#define U64_MAX 0xffffffffffffffffull
#define NAME_TAG_BYTES 8

enum { PREFIX_NAME = 0, PREFIX_SHARD = 1, PREFIX_ENVELOPE = 2 };

/* names.c */
void name_tag(const struct sq_queue *q, const char *ctx, size_t len, unsigned char tag[NAME_TAG_BYTES]);
void tagged_name(const struct sq_queue *q, const char *dir, size_t dir_len, const char *base, size_t base_len,
                 const char suffix[5], char out[SQ_NAME_MAX]);

/* verify.c */
int check_envelope_bytes(const struct sq_queue *q, const unsigned char *h, int64_t head_len, int64_t size,
                         int digest_known, uint32_t *ext_len_out, uint64_t *payload_len_out);

/* What a lease says about its file (the Lease fields validate_source compares) and names its receipt by:
 * sq_ack's and sq_read_payload's arguments, gathered once in C (generation, attempt, token: the ack's only). */
struct sq_lease {
    uint64_t dev, ino, max_attempts, payload_length;
    unsigned char job_id[16];
    unsigned char envelope_digest[32];
    unsigned char payload_digest[32];
    uint64_t generation;
    uint32_t attempt;
    unsigned char token[16];
};

/* lease.c: lease.validate_source from its open, shared by sq_ack and sq_read_payload. Each returns 1 when
 * its step passed, else 0 with a->stage saying where it stopped. */
/* Reset ``a`` for one call on the leased file ``name``: 0 if the name cannot be one (too long). */
int start_leased(struct sq_ack *a, const char *name);
/* The fields validate_leased compares, from the arguments (job_id 16 bytes, the digests 32: the caller's check). */
void lease_fields(struct sq_lease *l, uint64_t dev, uint64_t ino, uint64_t max_attempts, uint64_t payload_length,
                  const unsigned char *job_id, const unsigned char *envelope_digest,
                  const unsigned char *payload_digest);
/* The open, fstat and identity check, read_envelope's checks on the first read and the header against the
 * lease; a->fd (the caller closes it), a->stats[0], a->head, a->payload_offset and a->head_known set, the
 * payload length out. ``known_head`` (known_len bytes, or NULL): the first read of the lease's file that
 * verified whole before, verify.py's memo entry; a read equal to it byte for byte is not hashed again. */
int validate_leased(const struct sq_queue *q, const struct sq_sys *sys, struct sq_ack *a,
                    const struct sq_lease *lease, int dir_fd, const unsigned char *known_head, int64_t known_len,
                    uint64_t *payload_len_out);
/* verify._head_payload and the digest of _check_head_payload: the payload whole in the first read
 * (else SQ_STOP_HANDOFF: iter_payload's) and hashing to the lease's digest (else SQ_STOP_CHECK); not
 * hashed when a->head_known (_check_head_payload's memo hit). */
int check_head_payload(struct sq_ack *a, const struct sq_lease *lease, uint64_t payload_len);

/* ------------------------------------------------------------------ small helpers */


/* Note one syscall in recs[*nrec]; returns its result. The record array is larger than any path's count. */
static inline int64_t rec_in(struct sq_rec *recs, int *nrec, int op, int64_t ret, int slot) {
    if (*nrec < SQ_MAX_RECS) {
        struct sq_rec *r = &recs[(*nrec)++];
        r->op = op;
        r->err = ret < 0 ? (int)-ret : 0;
        r->ret = ret < 0 ? -1 : ret;
        r->slot = slot;
    }
    return ret;
}

static inline int hexval(char ch) { /* lowercase hex only: names.md's grammar */
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

/* ``width`` lowercase hex digits at s into a u64 (width <= 16); -1 if any is not. */
static inline int parse_hex_u64(const char *s, int width, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < width; i++) {
        int d = hexval(s[i]);
        if (d < 0) return -1;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return 0;
}

static inline int parse_hex_bytes(const char *s, int nbytes, unsigned char *out) {
    for (int i = 0; i < nbytes; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

static const char HEXDIGITS[] = "0123456789abcdef";

static inline char *put_hex(char *p, const unsigned char *b, int n) {
    for (int i = 0; i < n; i++) {
        *p++ = HEXDIGITS[b[i] >> 4];
        *p++ = HEXDIGITS[b[i] & 15];
    }
    return p;
}

static inline char *put_hex_u64(char *p, uint64_t v, int width) {
    for (int i = width - 1; i >= 0; i--) *p++ = HEXDIGITS[(v >> (4 * i)) & 15];
    return p;
}

/* The fields every job name starts with, "<job>.g<generation:016x>.a<attempt:08x>.m<max:08x>"
 * (names._COMMON_FORMAT): the ready, leased and receipt names' common part, made in one place. */
static inline char *put_job_fields(char *p, const unsigned char *job_id, uint64_t generation, uint64_t attempt,
                                   uint64_t max_attempts) {
    p = put_hex(p, job_id, 16);
    *p++ = '.', *p++ = 'g';
    p = put_hex_u64(p, generation, 16);
    *p++ = '.', *p++ = 'a';
    p = put_hex_u64(p, attempt, 8);
    *p++ = '.', *p++ = 'm';
    return put_hex_u64(p, max_attempts, 8);
}

static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t be64(const unsigned char *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

static inline int single_regular(const struct sq_stat *st) { /* tree.is_single_regular */
    return S_ISREG(st->mode) && st->nlink == 1;
}

/* Witness.names_single_file */
static inline int names_single_file(const struct sq_stat *witness, const struct sq_stat *st) {
    return st->dev == witness->dev && st->ino == witness->ino && single_regular(st);
}


#endif
