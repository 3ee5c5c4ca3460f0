/* The ack: settle.ack's happy path in C (lease.validate_source from its open, verify_payload,
 * Tree.move_witnessed into receipts/). settle.py stays the specification: at the first deviation
 * sq_ack stops, and settle._ack_fast runs the Python ack from the start with these syscalls replayed. */
#include "core.h"

#include <fcntl.h>
#include <string.h>

#define MAX_SHARDS 4096u /* constants.MAX_SHARDS */

/* names.receipt_filename of the lease's receipt: "<job>.g<generation + 1>.a<attempt>.m<max>.t<token>",
 * tagged over "receipts/-/<bucket:016x>/<shard:04x>/<base>" (names._RECEIPT_CONTEXT), then ".rct". */
static void receipt_target(const struct sq_queue *q, const struct sq_lease *l, uint32_t shard, uint64_t bucket,
                           char out[SQ_NAME_MAX]) {
    char base[128], dir[48];
    char *p = base;
    p = put_hex(p, l->job_id, 16);
    *p++ = '.', *p++ = 'g';
    p = put_hex_u64(p, l->generation + 1, 16);
    *p++ = '.', *p++ = 'a';
    p = put_hex_u64(p, l->attempt, 8);
    *p++ = '.', *p++ = 'm';
    p = put_hex_u64(p, l->max_attempts, 8);
    *p++ = '.', *p++ = 't';
    p = put_hex(p, l->token, 16);
    size_t base_len = (size_t)(p - base);
    char *x = dir;
    memcpy(x, "receipts/-/", 11), x += 11;
    x = put_hex_u64(x, bucket, 16), *x++ = '/';
    x = put_hex_u64(x, shard, 4), *x++ = '/';
    tagged_name(q, dir, (size_t)(x - dir), base, base_len, ".rct", out);
}

#define ACK_REC(op, call, slot) rec_in(a->recs, &a->nrec, (op), (call), (slot))

/* settle.ack from lease.validate_source's open on (its pure checks are the caller's, before this
 * call): the open, fstat and identity check, read_envelope, the header against the lease,
 * verify_payload of a payload the first read holds, then Tree.move_witnessed(force=True) into the
 * receipt directory: stat witness, no-replace rename, stat of the destination, the destination's
 * fsync, _same_dir (an fstat of each directory whose id the tree has not learnt yet) and the
 * source's fsync (in a batch, the barriers are left to Tree.finish_move). The caller has the receipt
 * directory's fd already (Tree.ensure_dir, cached). Any deviation stops it (a.stage); the caller replays a.recs. */
int sq_ack(const struct sq_queue *q, const struct sq_sys *sys, struct sq_ack *a, const struct sq_lease *lease,
           int dir_fd, const char *name, int dst_fd, uint32_t shard, uint64_t bucket, const uint64_t *src_dir_id,
           const uint64_t *dst_dir_id, int may_fsync) {
    a->nrec = 0;
    a->fd = -1;
    a->head_len = 0;
    a->stage = SQ_STOP_PURE;
    size_t len = strnlen(name, SQ_NAME_MAX);
    /* next_generation raises at the limit; shard_dir refuses a shard past the maximum: the Python's */
    if (len >= SQ_NAME_MAX || lease->generation == U64_MAX || lease->max_attempts > U32_MAX || shard >= MAX_SHARDS)
        return a->stage;
    memcpy(a->name, name, len + 1);
    receipt_target(q, lease, shard, bucket, a->target);
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
    /* a batch postpones the barriers: Tree.finish_move's (fstat, dup, the batch's list) */
    a->stage = SQ_MOVED_BARRIER_LEFT;
    if (!may_fsync) return a->stage;
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

