/* names.py's hashing in C: the per-queue SHA-256 prefixes (sq_queue_init) and the name tag. */
#include "core.h"

#include <string.h>

_Static_assert(sizeof(SHA256_CTX) <= 112, "sq_queue.prefix_state holds a SHA256_CTX");

static const unsigned char DOMAIN_NAME[] = "SteadQ-1-name"; /* + NUL: sizeof includes it */
static const unsigned char DOMAIN_SHARD[] = "SteadQ-1-shard";
static const unsigned char DOMAIN_ENVELOPE[] = "SteadQ-1-envelope";

/* The tag of ``ctx`` (names.compute_tag): SHA256(domain || queue id || context), first 8 bytes. */
void name_tag(const struct sq_queue *q, const char *ctx, size_t len, unsigned char tag[NAME_TAG_BYTES]) {
    SHA256_CTX h;
    unsigned char d[32];
    memcpy(&h, q->prefix_state[PREFIX_NAME], sizeof h);
    SHA256_Update(&h, ctx, len);
    SHA256_Final(d, &h);
    memcpy(tag, d, NAME_TAG_BYTES);
}

/* A name's final form, "<base>.k<tag><suffix>", the tag over "<dir><base>" (names: the ready and receipt
 * names both take this shape; ``dir`` is the state's context up to and with the shard's "/"). */
void tagged_name(const struct sq_queue *q, const char *dir, size_t dir_len, const char *base, size_t base_len,
                 const char suffix[5], char out[SQ_NAME_MAX]) {
    char ctx[256];
    memcpy(ctx, dir, dir_len);
    memcpy(ctx + dir_len, base, base_len);
    unsigned char tag[NAME_TAG_BYTES];
    name_tag(q, ctx, dir_len + base_len, tag);
    char *t = out;
    memcpy(t, base, base_len), t += base_len;
    *t++ = '.', *t++ = 'k';
    t = put_hex(t, tag, NAME_TAG_BYTES);
    memcpy(t, suffix, 5);
}

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
