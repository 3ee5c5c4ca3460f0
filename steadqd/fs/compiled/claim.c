/* The claim: the happy path of one claim transition in C (issue 35, constraint 1(b)).
 *
 * steadqd/fs/claim.py stays the specification. This file mirrors, step by step and in the
 * same syscall order, _Scan.consider / claim_open (claim.py), read_envelope and
 * reread_envelope (verify.py), JobHeader.decode and check_envelope (records.py),
 * parse_name / authenticate / shard_of / make_filename (names.py) and Tree.move_witnessed
 * (tree.py); the extension's CBOR (decode_extension) stays Python's, between the two calls. At the first deviation (a check fails, a
 * syscall fails, a step it leaves to Python) it stops and says where (sq_claim.stage); every
 * syscall it made is in sq_claim.recs, so the Python (bridge.py) can run the one Python
 * definition from the start with those results replayed instead of made again.
 *
 * Every syscall goes through a struct sq_sys table: libc (syscall_table.c), or cffi
 * callbacks into steadqd.fs.linux when syscall_hook traces or injects, so traces, faults and
 * the crash lab see the same sequence on both paths.
 *
 * Input is hostile (anyone who can write ready/<S>/ chooses names and bytes): every read is
 * bounded by the buffer it lands in, every loop by a constant or by a length checked first.
 */
#include "core.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>

static int64_t rec(struct sq_claim *c, int op, int64_t ret, int slot) { return rec_in(c->recs, &c->nrec, op, ret, slot); }


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


/* check_envelope_bytes on c->head, then check_name_matches: 0, -1 or 1 as check_envelope_bytes. */
static int check_envelope(const struct sq_queue *q, struct sq_claim *c, int64_t size) {
    const unsigned char *h = c->head;
    uint32_t ext_len;
    uint64_t payload_len;
    int r = check_envelope_bytes(q, h, c->head_len, size, 0, &ext_len, &payload_len);
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
    p = put_job_fields(p, c->job_id, c->generation + 1, (uint64_t)c->attempt + 1, c->max_attempts);
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
 * of a payload the re-read holds (in a batch, no barrier: SQ_MOVED_BARRIER_LEFT, payload_in_head set
 * when that payload matched its digest). Needs sq_claim_verify's SQ_VERIFIED and the clock/token inputs;
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
    /* verify_payload's digest on the re-read, when it holds the whole payload (_head_payload): no
     * syscall, so computed here, before the barrier, for a batch too (payload_in_head: it matched).
     * Where it is not set, claim_open's end (check_claimed_payload) checks the payload after the barrier. */
    uint64_t end = payload_offset + c->payload_length;
    if (end <= (uint64_t)c->head2_len) {
        unsigned char d[32];
        SHA256_CTX h; /* the low-level calls: OpenSSL 3's one-shot SHA256() fetches an EVP method each time */
        SHA256_Init(&h);
        SHA256_Update(&h, c->head2 + payload_offset, (size_t)c->payload_length);
        SHA256_Final(d, &h);
        c->payload_in_head = memcmp(d, c->payload_digest, 32) == 0;
    }
    /* the barrier (Tree._barrier_pair: one directory, one fsync, forced); a batch postpones it:
     * Tree.finish_move's (fstat, dup, the batch's list), then claim_open's end, are the Python's */
    c->stage = SQ_MOVED_BARRIER_LEFT;
    if (!c->may_fsync) return c->stage;
    c->stage = SQ_STOP_SYSCALL;
    if (rec(c, SQ_OP_FSYNC, sys->fsync(c->dir_fd), 0) < 0) return c->stage;
    c->stage = c->payload_in_head ? SQ_MOVED : SQ_MOVED_PAYLOAD_LEFT;
    return c->stage;
}

