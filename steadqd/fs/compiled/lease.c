/* lease.validate_source from its open, in C: what the ack (settle.c, sq_ack) and payload() (sq_read_payload)
 * share, and payload()'s happy path itself. lease.py and verify.py stay the specification: at the first
 * deviation the caller (settle._ack_fast, lease.core_payload) runs the Python from the start with these
 * syscalls replayed. The leased file is hostile input (a group member may replace or rewrite it): every
 * read is bounded by the head buffer, every length is checked against the file's size before it is used. */
#include "core.h"

#include <fcntl.h>
#include <string.h>

#define LEASED_REC(op, call, slot) rec_in(a->recs, &a->nrec, (op), (call), (slot))

int start_leased(struct sq_ack *a, const char *name) {
    a->nrec = 0;
    a->fd = -1;
    a->head_len = 0;
    a->payload_offset = 0;
    a->head_known = 0;
    a->stage = SQ_STOP_PURE;
    size_t len = strnlen(name, SQ_NAME_MAX);
    if (len >= SQ_NAME_MAX) return 0;
    memcpy(a->name, name, len + 1);
    return 1;
}

void lease_fields(struct sq_lease *l, uint64_t dev, uint64_t ino, uint64_t max_attempts, uint64_t payload_length,
                  const unsigned char *job_id, const unsigned char *envelope_digest,
                  const unsigned char *payload_digest) {
    l->dev = dev, l->ino = ino, l->max_attempts = max_attempts, l->payload_length = payload_length;
    memcpy(l->job_id, job_id, sizeof l->job_id);
    memcpy(l->envelope_digest, envelope_digest, sizeof l->envelope_digest);
    memcpy(l->payload_digest, payload_digest, sizeof l->payload_digest);
}

int validate_leased(const struct sq_queue *q, const struct sq_sys *sys, struct sq_ack *a,
                    const struct sq_lease *lease, int dir_fd, const unsigned char *known_head, int64_t known_len,
                    uint64_t *payload_len_out) {
    a->stage = SQ_STOP_SYSCALL;
    int fd = (int)LEASED_REC(SQ_OP_OPEN, sys->openat(dir_fd, a->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK), 0);
    if (fd < 0) return 0;
    a->fd = fd;
    if (LEASED_REC(SQ_OP_FSTAT, sys->fstat(fd, &a->stats[0]), 0) < 0) return 0;
    const struct sq_stat *st = &a->stats[0];
    a->stage = SQ_STOP_CHECK;
    if (st->dev != lease->dev || st->ino != lease->ino) return 0;
    /* read_envelope: check_object_stat and the size floor before the read */
    if (!single_regular(st) || st->size < HEADER_SIZE) return 0;
    int64_t n = st->size < SQ_HEAD_BYTES ? st->size : SQ_HEAD_BYTES;
    int64_t got = LEASED_REC(SQ_OP_PREAD, sys->pread(fd, a->head, n, 0), 0);
    if (got < 0) {
        a->stage = SQ_STOP_SYSCALL;
        return 0;
    }
    a->head_len = got > n ? n : got;
    /* read_envelope's memo: exactly the bytes of a read that verified (its file: this dev/ino) */
    a->head_known =
        known_head != NULL && known_len == a->head_len && memcmp(a->head, known_head, (size_t)known_len) == 0;
    uint32_t ext_len;
    uint64_t payload_len;
    int r = check_envelope_bytes(q, a->head, a->head_len, st->size, a->head_known, &ext_len, &payload_len);
    if (r != 0) {
        a->stage = r > 0 ? SQ_STOP_HANDOFF : SQ_STOP_CHECK;
        return 0;
    }
    /* the header against the lease */
    const unsigned char *h = a->head;
    if (memcmp(h + 32, lease->job_id, 16) != 0 || be32(h + 48) != lease->max_attempts ||
        memcmp(h + ENVELOPE_DIGEST_OFFSET, lease->envelope_digest, 32) != 0 || payload_len != lease->payload_length ||
        memcmp(h + 64, lease->payload_digest, 32) != 0)
        return 0;
    a->payload_offset = HEADER_SIZE + (int64_t)ext_len;
    *payload_len_out = payload_len;
    return 1;
}

int check_head_payload(struct sq_ack *a, const struct sq_lease *lease, uint64_t payload_len) {
    /* payload_offset <= HEADER_SIZE + MAX_EXTENSION_LENGTH and payload_len <= MAX_PAYLOAD_LENGTH: no overflow */
    if ((uint64_t)a->payload_offset + payload_len > (uint64_t)a->head_len) {
        a->stage = SQ_STOP_HANDOFF;
        return 0;
    }
    if (a->head_known) return 1;
    unsigned char d[32];
    SHA256_CTX sh;
    SHA256_Init(&sh);
    SHA256_Update(&sh, a->head + a->payload_offset, (size_t)payload_len);
    SHA256_Final(d, &sh);
    if (memcmp(d, lease->payload_digest, 32) != 0) {
        a->stage = SQ_STOP_CHECK;
        return 0;
    }
    return 1;
}

/* Queue.read_payload after checked_path's pure checks: validate_source(moving=False) from its open (the
 * open, fstat, identity, read_envelope, the header against the lease, then the stat that proves the path
 * still names the opened file), then verify.read_payload of a payload the first read holds. The payload is
 * a->head[a->payload_offset .. + payload_length] at SQ_PAYLOAD_READ (``known_head``: validate_leased's); the
 * caller closes a->fd (>= 0 once the open succeeded). Any deviation stops it (a->stage); the caller replays a->recs. */
int sq_read_payload(const struct sq_queue *q, const struct sq_sys *sys, struct sq_ack *a, int dir_fd, const char *name,
                    uint64_t dev, uint64_t ino, uint64_t max_attempts, uint64_t payload_length,
                    const unsigned char *job_id, const unsigned char *envelope_digest,
                    const unsigned char *payload_digest, const unsigned char *known_head, int64_t known_len) {
    if (!start_leased(a, name)) return a->stage;
    struct sq_lease l;
    lease_fields(&l, dev, ino, max_attempts, payload_length, job_id, envelope_digest, payload_digest);
    const struct sq_lease *lease = &l;
    uint64_t payload_len;
    if (!validate_leased(q, sys, a, lease, dir_fd, known_head, known_len, &payload_len)) return a->stage;
    /* validate_source's non-moving end: the path still names the lease's file (identity only) */
    a->stage = SQ_STOP_SYSCALL;
    if (LEASED_REC(SQ_OP_STAT, sys->lstatat(dir_fd, a->name, &a->stats[1]), 1) < 0) return a->stage;
    a->stage = SQ_STOP_CHECK;
    if (a->stats[1].dev != lease->dev || a->stats[1].ino != lease->ino) return a->stage;
    /* read_payload: _head_payload, _check_head_payload's digest */
    if (!check_head_payload(a, lease, payload_len)) return a->stage;
    a->stage = SQ_PAYLOAD_READ;
    return a->stage;
}
