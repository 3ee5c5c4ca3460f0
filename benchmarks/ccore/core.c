/* Issue 35, prototype (b): the envelope and payload checks of a job file in C.
 *
 * Built only into a scratch copy of steadqd (benchmarks/ccore, hook.patch):
 * it lost the measurement, so the product has no C envelope check. The
 * Python in steadqd/fs/records.py and steadqd/fs/verify.py is the
 * definition; this file only *accepts* what it accepts. Every function
 * answers "accepted" or "not accepted", never why: on "not accepted" the
 * caller runs the Python on the same bytes, which raises the error the spec
 * names (or takes the slow path, e.g. an extension larger than the first
 * read). So there is one set of messages, error types and quarantine
 * reasons, and the differential test (tests/test_ccore_bench.py) only has
 * to show that this accepts exactly what the Python accepts.
 *
 * No system calls: the bytes were read by Python through the syscall hook,
 * so linux.trace(), linux.inject() and the crash lab see the same
 * operations on either path.
 *
 * Input is hostile (any group member writes job files): every offset is
 * checked against the buffer length before it is read, and lengths from the
 * header are range-checked before any addition that could overflow.
 */

#include <stdint.h>
#include <string.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#define SQ_HEADER_SIZE 128u
#define SQ_ENV_DIGEST_OFFSET 96u
#define SQ_MAX_EXTENSION 65536u
#define SQ_MAX_PAYLOAD ((UINT64_C(1) << 40) - 1)

static const unsigned char JOB_MAGIC[8] = {'S', 'D', 'Q', 'J', 'O', 'B', '1', 0};
static const unsigned char DOMAIN_ENVELOPE[] = "SteadQ-1-envelope"; /* + its NUL: 18 bytes */

static uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

static int all_zero(const unsigned char *p, size_t n) {
    unsigned char acc = 0;
    for (size_t i = 0; i < n; i++) acc |= p[i];
    return acc == 0;
}

/* JobHeader.decode's checks, in its order (the order only matters to the
 * Python, which reports the first failure; here any failure is "no"). */
static int header_ok(const unsigned char *h) {
    if (memcmp(h, JOB_MAGIC, 8) != 0) return 0;
    if (be16(h + 8) != 1) return 0;            /* major */
    if (be32(h + 24) != 0) return 0;           /* flags */
    if (h[28] != 1) return 0;                  /* digest algorithm: SHA-256 */
    if (!all_zero(h + 29, 3) || !all_zero(h + 52, 4)) return 0;
    if (be32(h + 48) == 0) return 0;           /* maximum_attempts */
    if (be64(h + 16) > SQ_MAX_PAYLOAD) return 0;
    if (be32(h + 12) > SQ_MAX_EXTENSION) return 0;
    return 1;
}

/* 0: not accepted (the caller runs the Python); 1: header, sizes and
 * envelope digest accepted; 2: that, and the payload was wholly in `head`
 * and its digest matched.
 *
 * `head` is the file's first bytes (verify.read_envelope's one read),
 * `file_size` the descriptor's st_size, `max_payload` the queue's limit. */
int sq_envelope(const unsigned char *head, size_t head_len, uint64_t file_size, uint64_t max_payload) {
    if (head_len < SQ_HEADER_SIZE) return 0;
    if (!header_ok(head)) return 0;
    uint64_t ext_len = be32(head + 12);        /* <= 65536, checked */
    uint64_t payload_len = be64(head + 16);    /* < 2^40, checked: no overflow below */
    if (payload_len > max_payload) return 0;
    if (file_size != SQ_HEADER_SIZE + ext_len + payload_len) return 0;
    if (SQ_HEADER_SIZE + ext_len > head_len) return 0; /* the extension needs another read: Python's path */

    unsigned char digest[SHA256_DIGEST_LENGTH];
    static const unsigned char zero[32];
    SHA256_CTX c;
    SHA256_Init(&c);
    SHA256_Update(&c, DOMAIN_ENVELOPE, sizeof DOMAIN_ENVELOPE);
    SHA256_Update(&c, head, SQ_ENV_DIGEST_OFFSET);
    SHA256_Update(&c, zero, sizeof zero);
    SHA256_Update(&c, head + SQ_HEADER_SIZE, (size_t)ext_len);
    SHA256_Final(digest, &c);
    if (CRYPTO_memcmp(digest, head + SQ_ENV_DIGEST_OFFSET, sizeof digest) != 0) return 0;

    uint64_t payload_end = SQ_HEADER_SIZE + ext_len + payload_len;
    if (payload_end > head_len) return 1;
    SHA256(head + SQ_HEADER_SIZE + ext_len, (size_t)payload_len, digest);
    return CRYPTO_memcmp(digest, head + 64, sizeof digest) == 0 ? 2 : 1;
}

/* 1 iff SHA-256(data[offset:offset+length]) == digest (32 bytes); 0 when
 * it differs or the range is not inside `data` (then the caller's Python
 * decides). For a payload re-read after the claim's rename. */
int sq_payload(const unsigned char *data, size_t data_len, uint64_t offset, uint64_t length,
               const unsigned char *digest) {
    if (offset > data_len || length > data_len - offset) return 0;
    unsigned char got[SHA256_DIGEST_LENGTH];
    SHA256(data + offset, (size_t)length, got);
    return CRYPTO_memcmp(got, digest, sizeof got) == 0;
}
