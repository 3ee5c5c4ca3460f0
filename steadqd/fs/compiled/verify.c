/* verify.py's read_envelope checks and records.py's JobHeader.decode on the first read, in C. */
#include "core.h"

#include <string.h>

static const unsigned char JOB_MAGIC[8] = {'S', 'D', 'Q', 'J', 'O', 'B', '1', 0};

/* JobHeader.decode, the size checks of read_envelope and check_envelope on ``h`` (head_len bytes of
 * a file st_size long): 0 if all pass (the lengths filled in), -1 a check failed, 1 the extension is
 * longer than the first read holds (read_envelope's second read is Python's). ``digest_known``: these
 * bytes are byte for byte a first read that verified before (verify.py's memo), so the envelope digest,
 * a pure function of them, is not computed again (read_envelope's memo hit; the size checks still run). */
int check_envelope_bytes(const struct sq_queue *q, const unsigned char *h, int64_t head_len, int64_t size,
                         int digest_known, uint32_t *ext_len_out, uint64_t *payload_len_out) {
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
    *ext_len_out = ext_len;
    *payload_len_out = payload_len;
    if (digest_known) return 0;
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
    return 0;
}

