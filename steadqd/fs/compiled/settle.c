/* The ack: settle.ack's happy path in C (lease.validate_source from its open and verify_payload, lease.c's
 * as payload() shares them; Tree.move_witnessed into receipts/). settle.py stays the specification: at the
 * first deviation sq_ack stops, and settle._ack_fast runs the Python ack from the start with these syscalls replayed. */
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
    p = put_job_fields(p, l->job_id, l->generation + 1, l->attempt, l->max_attempts);
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
 * directory's fd already (Tree.ensure_dir, cached); ``known_head``: validate_leased's. Any deviation stops it
 * (a.stage); the caller replays a.recs. */
int sq_ack(const struct sq_queue *q, const struct sq_sys *sys, struct sq_ack *a, int dir_fd, const char *name,
           uint64_t dev, uint64_t ino, uint64_t max_attempts, uint64_t payload_length, const unsigned char *job_id,
           const unsigned char *envelope_digest, const unsigned char *payload_digest, uint64_t generation,
           uint32_t attempt, const unsigned char *token, int dst_fd, uint32_t shard, uint64_t bucket,
           const uint64_t *src_dir_id, const uint64_t *dst_dir_id, int may_fsync, const unsigned char *known_head,
           int64_t known_len) {
    struct sq_lease l;
    lease_fields(&l, dev, ino, max_attempts, payload_length, job_id, envelope_digest, payload_digest);
    l.generation = generation, l.attempt = attempt;
    memcpy(l.token, token, sizeof l.token);
    const struct sq_lease *lease = &l;
    /* next_generation raises at the limit; shard_dir refuses a shard past the maximum: the Python's */
    if (!start_leased(a, name) || lease->generation == U64_MAX || lease->max_attempts > U32_MAX ||
        shard >= MAX_SHARDS)
        return a->stage;
    receipt_target(q, lease, shard, bucket, a->target);
    /* validate_source(moving=True) from its open, then verify_payload of a payload the first read holds */
    uint64_t payload_len;
    if (!validate_leased(q, sys, a, lease, dir_fd, known_head, known_len, &payload_len) ||
        !check_head_payload(a, lease, payload_len))
        return a->stage;
    const struct sq_stat *st = &a->stats[0];
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

