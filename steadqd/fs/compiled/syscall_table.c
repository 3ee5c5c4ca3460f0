/* The libc syscall table (struct sq_sys): every syscall of the C core goes through it, or through
 * the cffi callbacks into steadqd.fs.linux (bridge.py) when syscall_hook traces or injects, so
 * traces, faults and the crash lab see the same sequence on both paths. Each entry mirrors the
 * steadqd.fs.linux wrapper the Python uses and returns >= 0 on success, -errno on failure. */
#define _GNU_SOURCE 1 /* O_TMPFILE, AT_EMPTY_PATH */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#define EINTR_RETRIES 64 /* os.* retry EINTR without end (PEP 475); a bound here, then the error */

static void fill_stat(struct sq_stat *out, const struct stat *st) {
    out->dev = (uint64_t)st->st_dev;
    out->ino = (uint64_t)st->st_ino;
    out->nlink = (int64_t)st->st_nlink;
    out->size = (int64_t)st->st_size;
    out->uid = (int64_t)st->st_uid;
    out->gid = (int64_t)st->st_gid;
    out->mode = (uint32_t)st->st_mode;
    out->atime = (int64_t)st->st_atime;
    out->mtime = (int64_t)st->st_mtime;
    out->ctime = (int64_t)st->st_ctime;
}

static int d_openat(int dirfd, const char *name, int flags) {
    for (int i = 0; i < EINTR_RETRIES; i++) {
        int fd = openat(dirfd, name, flags | O_CLOEXEC, 0600); /* linux.open_at adds O_CLOEXEC */
        if (fd >= 0) return fd;
        if (errno != EINTR) return -errno;
    }
    return -EINTR;
}

static int d_fstat(int fd, struct sq_stat *out) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -errno;
    fill_stat(out, &st);
    return 0;
}

static int64_t d_pread(int fd, unsigned char *buf, int64_t n, int64_t off) {
    for (int i = 0; i < EINTR_RETRIES; i++) {
        ssize_t got = pread(fd, buf, (size_t)n, (off_t)off);
        if (got >= 0) return (int64_t)got;
        if (errno != EINTR) return -errno;
    }
    return -EINTR;
}

static int d_lstatat(int dirfd, const char *name, struct sq_stat *out) {
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return -errno;
    fill_stat(out, &st);
    return 0;
}

static int d_rename_noreplace(int olddirfd, const char *oldname, int newdirfd, const char *newname) {
    /* renameat2(RENAME_NOREPLACE) as libc.renameat2 makes it: the raw syscall needs no glibc 2.28 */
    long r = syscall(SYS_renameat2, olddirfd, oldname, newdirfd, newname, 1u /* RENAME_NOREPLACE */);
    return r == 0 ? 0 : -errno;
}

static int d_fsync(int fd) {
    for (int i = 0; i < EINTR_RETRIES; i++) {
        if (fsync(fd) == 0) return 0;
        if (errno != EINTR) return -errno;
    }
    return -EINTR;
}

static int d_tmpfile(int dirfd, int mode) { /* linux.open_tmpfile */
    for (int i = 0; i < EINTR_RETRIES; i++) {
        int fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, mode);
        if (fd >= 0) return fd;
        if (errno != EINTR) return -errno;
    }
    return -EINTR;
}

static int64_t d_write(int fd, const unsigned char *buf, int64_t n) { /* one os.write (write_all loops) */
    for (int i = 0; i < EINTR_RETRIES; i++) {
        ssize_t got = write(fd, buf, (size_t)n);
        if (got >= 0) return (int64_t)got;
        if (errno != EINTR) return -errno;
    }
    return -EINTR;
}

static int d_link(int fd, int dirfd, const char *name, int proc) { /* linux._link_direct / _link_proc */
    int r;
    if (proc) {
        char src[64];
        snprintf(src, sizeof src, "/proc/self/fd/%d", fd);
        r = linkat(AT_FDCWD, src, dirfd, name, AT_SYMLINK_FOLLOW);
    } else {
        r = linkat(fd, "", dirfd, name, AT_EMPTY_PATH);
    }
    return r == 0 ? 0 : -errno;
}

static int64_t d_getdents(int fd, unsigned char *buf, int64_t n) { /* libc.getdents's one call, no retry */
    long r = syscall(SYS_getdents64, fd, buf, (unsigned long)n);
    return r >= 0 ? (int64_t)r : -errno;
}

static const struct sq_sys direct_table = {d_openat, d_fstat,   d_pread, d_lstatat, d_rename_noreplace,
                                           d_fsync,  d_tmpfile, d_write, d_link,    d_getdents};

const struct sq_sys *sq_direct_table(void) { return &direct_table; }
