/* claim.py's read of a ready shard's chunk in C (_Scan._read_ready): one getdents64 through the
 * syscall table, the records' names but "." and "..", and _ready_looking's sorting of them: ASCII
 * names of a ready name's shape (names.looks_ready: its extension, its count of dots) are candidates,
 * names with a byte past ASCII are ignored (a str cannot hold them), the rest skipped. The names are
 * hostile (anyone who may write ready/ creates them): every read is bounded by the record it is in,
 * and a record is bounded by the bytes the call returned. */
#include "core.h"

#include <errno.h>
#include <string.h>

#define DIRENT_NAME_AT 19 /* linux_dirent64: d_ino u64, d_off s64, d_reclen u16, d_type u8, then the name */

/* names.looks_ready on an ASCII name: ends with the ready extension and has the ready count of dots. */
static int looks_ready(const struct sq_queue *q, const char *name, size_t len) {
    if (len < q->ready_ext_len || memcmp(name + len - q->ready_ext_len, q->ready_ext, q->ready_ext_len) != 0) return 0;
    uint32_t dots = 0;
    for (size_t i = 0; i < len; i++) dots += name[i] == '.';
    return dots == q->ready_dots;
}

static void append(char *list, int64_t *used, int64_t *count, const char *name, size_t len) {
    if (*count) list[(*used)++] = '/';
    memcpy(list + *used, name, len);
    *used += (int64_t)len;
    list[*used] = 0;
    ++*count;
}

int64_t sq_read_ready(const struct sq_queue *q, const struct sq_sys *sys, struct sq_chunk *k, int dir_fd) {
    k->listed = k->ready_count = k->ignored_count = 0;
    k->ready[0] = k->ignored[0] = 0;
    int64_t n = sys->getdents(dir_fd, k->buf, SQ_CHUNK_BYTES);
    if (n < 0) return n;
    if (n > SQ_CHUNK_BYTES) return -EIO; /* never from the kernel or the hooked table */
    int64_t ready_used = 0, ignored_used = 0;
    for (int64_t pos = 0; pos < n;) {
        if (n - pos < DIRENT_NAME_AT) return -EIO; /* a torn record: never from the kernel */
        unsigned reclen = (unsigned)k->buf[pos + 16] | (unsigned)k->buf[pos + 17] << 8; /* little-endian u16 */
        if (reclen <= DIRENT_NAME_AT || reclen > n - pos) return -EIO;
        const char *name = (const char *)k->buf + pos + DIRENT_NAME_AT;
        size_t len = strnlen(name, reclen - DIRENT_NAME_AT);
        pos += reclen;
        if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.')) continue;
        k->listed++;
        int ascii = 1;
        for (size_t i = 0; i < len; i++) ascii &= (unsigned char)name[i] < 0x80;
        if (!ascii)
            append(k->ignored, &ignored_used, &k->ignored_count, name, len);
        else if (looks_ready(q, name, len))
            append(k->ready, &ready_used, &k->ready_count, name, len);
    }
    return k->listed;
}
